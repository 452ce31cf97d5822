"""The message format: operations, header fields, and the one encoder/decoder.

A message is multipart: frame 0 is a msgpack map (the header), frames 1..n are raw
buffers. Every header is checked here on receipt against the schema of its
operation, so the roles only ever see well-formed headers; anything else raises
:class:`ProtocolError`, which the receiving loop logs before dropping the message.
No pickle, ever: msgpack decodes only plain data.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Any

import msgpack

from ..errors import Terminated

PROTOCOL_VERSION = 1
# Largest header accepted; headers are a few hundred bytes, data travels in frames.
MAX_HEADER_BYTES = 1 << 20
# The longest reason an ABORT carries (a failed node's first error line; a repr can be long).
MAX_REASON_CHARS = 500
# Lists and maps inside a header, at most this deep, the header itself 1 (the protocol's own go
# to 4: the address book's nodes and their ports): deeper ones are refused at decoding, where
# the messages and logs that quote them would have raised RecursionError (msgpack takes 1023).
MAX_DEPTH = 8


class ProtocolError(ValueError):
    """A message that does not follow the protocol."""


class Op(IntEnum):
    REGISTER = 1       # node -> scheduler: who I am and where I listen
    ADDRESS_BOOK = 2   # scheduler -> node: everyone's role, rank and address
    BARRIER = 3        # node -> scheduler: I reached barrier `seq` of `group`
    BARRIER_DONE = 4   # scheduler -> node: everyone in `group` reached `seq`
    HEARTBEAT = 5      # both ways between scheduler and each node
    NODE_LOST = 6      # scheduler -> all: a node stopped heartbeating or failed
    SHUTDOWN = 7       # scheduler -> all: the job is over
    FINISH = 8         # worker -> scheduler: this worker is done
    DECLARE = 9        # worker -> scheduler: a tensor's name, size, dtype, partitions
    DECLARED = 10      # scheduler -> workers and its servers: the tensor's id and each partition's server
    INIT_KEY = 11      # worker -> server: a partition key's size, dtype and codec
    PUSH = 12          # worker -> server: a round's contribution to a key
    PULL = 13          # worker -> server: ask for a round's aggregate of a key
    PULL_REPLY = 14    # server -> worker: the aggregate
    ERROR = 15         # any -> any: what went wrong, with the key/tensor concerned
    PUSH_ACK = 16      # server -> worker: a push was taken (frees the worker's credit)
    STATE_GET = 17     # worker -> server: send me this key's error-feedback state (checkpoints)
    STATE = 18         # both ways: a key's error-feedback state (reply, or install before a push)
    ABORT = 19         # worker or launcher -> scheduler: a worker failed; `reason` is its first error line
    SHUTDOWN_ACK = 20  # node -> scheduler: SHUTDOWN received; the scheduler exits once every member sent it
    RELEASE = 21       # worker -> server: forget a key (every worker has left its tensor: an old plan's group)
    LEFT = 22          # scheduler -> servers, workers: a worker finished while others go on; no later round completes
    STALLED = 23       # server -> worker: the round it waits in has waited long for the push of the workers named


# Schema: op -> (required fields, optional fields), each field name -> accepted types.
_INT = (int,)
_STR = (str,)
_NUM = (int, float)
_SCHEMA: dict[Op, tuple[dict[str, tuple], dict[str, tuple]]] = {
    # machine: which nodes share CPUs (host.machine_id); the address book repeats it per node
    # ports: a server's lanes, each tied to one of its I/O threads (net/transport.lanes_router), port first
    # local_reduce: the worker's GRADPRESS_LOCAL_REDUCE (the job must agree); a worker's port is
    # where its local peers reach it (worker/local.py); server_id: the rank a server asks for
    Op.REGISTER: ({"role": _STR, "host": _STR, "port": _INT, "worker_id": _INT,
                   "local_rank": _INT, "local_size": _INT, "pid": _INT}, {"machine": _STR, "local_reduce": (bool,),
                                                           "ports": (list,), "server_id": _INT,
                                                           "enable_async": (bool,), "launch": _STR,
                                                           "agree": (dict,)}),
    # local_size: the workers of a machine reduce locally in groups of this many (absent: each pushes its own)
    Op.ADDRESS_BOOK: ({"rank": _INT, "nodes": (list,), "num_workers": _INT, "num_servers": _INT},
                      {"local_size": _INT}),
    Op.BARRIER: ({"group": _STR, "seq": _INT}, {}),
    Op.BARRIER_DONE: ({"group": _STR, "seq": _INT}, {}),
    Op.HEARTBEAT: ({}, {}),
    # name: who it was, where it had no rank (a worker refused at registration: "worker (pid 7)")
    Op.NODE_LOST: ({"role": _STR, "rank": _INT, "reason": _STR}, {"name": _STR}),
    Op.SHUTDOWN: ({"reason": _STR}, {}),
    Op.FINISH: ({}, {"busy": (bool,)}),  # busy: push_pulls of its own still under way
    Op.DECLARE: ({"name": _STR, "count": _INT, "dtype": _STR, "parts": (list,)},
                 {"compression_params": (dict,)}),
    # part_bytes: each partition's bytes (the servers holding them learn what the job declared)
    Op.DECLARED: ({"name": _STR, "tensor_id": _INT, "servers": (list,)}, {"part_bytes": (list,)}),
    # shm: where the worker writes this key's pushes, [pid, fd, inode, offset] of its sealed memfd
    # chunk (same host only; net/shm.py)
    # sparse: a row-sparse tensor's layout {rows, width, seed, servers} (row_placement.RowLayout)
    # pushers: how many pushes complete a round (one per machine under local reduction; absent: every worker)
    # dma: a GPU worker that will register the result slots with the CUDA driver (pages never punched)
    Op.INIT_KEY: ({"key": _INT, "name": _STR, "count": _INT, "dtype": _STR},
                  {"compression_params": (dict,), "shm": (list,), "sparse": (dict,), "pushers": _INT,
                   "dma": (bool,)}),
    # shm: the data is in the region named at INIT_KEY, not in a frame;
    # sparse: `count` rows travel as two frames, indices and values (server/sparse.py checks them)
    # refused: the worker's codec refused this round (why); nonfinite: its input held NaN/inf
    # (why; the round is skipped); either carries no data (server/store.py)
    Op.PUSH: ({"key": _INT, "round": _INT, "dtype": _STR, "count": _INT},
              {"codec": _STR, "meta": (dict,), "lr": _NUM, "shm": (bool,), "sparse": (bool,), "refused": _STR,
               "nonfinite": _STR, "pull": (bool,)}),
    Op.PULL: ({"key": _INT, "round": _INT}, {}),
    # shm/slot: the aggregate is in slot `slot` of the server's region `shm` ([pid, fd, inode, offset]);
    # dma: that region's chunk never has pages punched (a reader may register it for DMA)
    # sparse: "rows" (indices, values) or "bitmap" (over the `known` rows published before, new indices, values)
    # nonfinite: the round was skipped, NaN/inf from those it names; no data (the worker lands NaN)
    Op.PULL_REPLY: ({"key": _INT, "round": _INT, "dtype": _STR, "count": _INT},
                    {"codec": _STR, "meta": (dict,), "shm": (list,), "slot": _INT, "dma": (bool,), "sparse": _STR,
                     "known": _INT, "nonfinite": _STR}),
    # what the error concerns: a key (and round), a tensor's `name`, or barrier `seq` of `group`
    Op.ERROR: ({"message": _STR}, {"key": _INT, "round": _INT, "name": _STR, "group": _STR, "seq": _INT}),
    Op.PUSH_ACK: ({"key": _INT, "round": _INT}, {}),
    Op.STATE_GET: ({"key": _INT}, {}),
    # the residual travels as one float32 frame; none when the key has no residual yet
    Op.STATE: ({"key": _INT}, {"lr": _NUM}),
    # pid/worker_id/local_rank name the failed worker when the sender is not it (its launcher),
    # or when it failed before registering; role "server": the pid is a server's (its launcher)
    Op.ABORT: ({"reason": _STR}, {"pid": _INT, "worker_id": _INT, "local_rank": _INT, "role": _STR, "launch": _STR}),
    Op.SHUTDOWN_ACK: ({}, {}),
    Op.RELEASE: ({"key": _INT}, {}),
    Op.LEFT: ({"rank": _INT, "reason": _STR}, {}),
    Op.STALLED: ({"key": _INT, "round": _INT, "message": _STR}, {}),
}

# Common fields every header carries.
_COMMON = {"v": _INT, "op": _INT, "from": _STR}

# dtypes that travel as data; names are numpy's.
DTYPES = ("float16", "float32", "float64")


def encode(op: Op, sender: str, **fields: Any) -> bytes:
    """The header frame for ``op`` sent by ``sender`` (e.g. ``"worker 0"``)."""
    header = {"v": PROTOCOL_VERSION, "op": int(op), "from": sender}
    header.update(fields)
    _check(header)  # a bug in the sender should fail there, not at the receiver
    return msgpack.packb(header, use_bin_type=True)


def decode(frame: bytes | memoryview) -> dict[str, Any]:
    """Decode and check a header frame.

    Returns:
        the header with ``op`` converted to :class:`Op`.
    Raises:
        ProtocolError: saying what is wrong with it.
    """
    if len(frame) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(frame)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Terminated:
        raise
    except Exception as e:  # msgpack raises several unrelated types
        raise ProtocolError(f"header is not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a {type(header).__name__}, not a map")
    if not _CONTAINERS.isdisjoint(map(type, header.values())) and _too_deep(header):  # (most have none)
        raise ProtocolError(f"header nests lists and maps deeper than {MAX_DEPTH}")
    _check(header)
    header["op"] = Op(header["op"])
    return header


def op_fields(op: Op, header: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``header`` that ``op`` defines, without the common ones: what a node
    passes on. A field that a newer (or hostile) sender added is left behind: passed on as
    a keyword, it could name a parameter of the sending call."""
    required, optional = _SCHEMA[op]
    return {k: v for k, v in header.items() if k in required or k in optional}


_CONTAINERS = frozenset((dict, list))


def _too_deep(header: dict) -> bool:
    """Whether ``header`` nests lists and maps past MAX_DEPTH; without recursion, which is what
    such a header would exhaust."""
    stack = [(header, 1)]
    while stack:
        value, depth = stack.pop()
        items = value.values() if isinstance(value, dict) else value
        for item in items:
            if isinstance(item, (dict, list)):
                if depth >= MAX_DEPTH:
                    return True
                stack.append((item, depth + 1))
    return False


def _check(header: dict[str, Any]) -> None:
    for name, types in _COMMON.items():
        _check_field(header, name, types, "header")
    if header["v"] != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header['v']} from {header['from']!r}; "
                            f"this node speaks {PROTOCOL_VERSION}")
    try:
        op = Op(header["op"])
    except ValueError:
        raise ProtocolError(f"unknown operation {header['op']} from {header['from']!r}") from None
    required, optional = _SCHEMA[op]
    for name, types in required.items():
        _check_field(header, name, types, op.name)
    for name, types in optional.items():
        if name in header:
            _check_field(header, name, types, op.name)
    if "dtype" in header and header["dtype"] not in DTYPES:
        raise ProtocolError(f"{op.name}: dtype {header['dtype']!r} is not one of {DTYPES}")
    for name in ("count", "key", "round", "known"):
        if name in header and header[name] < 0:
            raise ProtocolError(f"{op.name}: {name} is negative ({header[name]})")


def _check_field(header: dict, name: str, types: tuple, where: str) -> None:
    if name not in header:
        raise ProtocolError(f"{where}: missing field {name!r}")
    value = header[name]
    # bool is an int in Python; it is only valid where a bool is asked for
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise ProtocolError(f"{where}: field {name!r} is {type(value).__name__}, expected "
                            f"{' or '.join(t.__name__ for t in types)}")
