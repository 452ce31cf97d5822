"""The owner's side of local reduction: sum a machine's contributions, relay the reply.

For each key it owns (``local.py``), the owner takes every local peer's raw partition of a
round (a PUSH: from the peer's shared push segment named at INIT_KEY, or in a frame) and its
own. Once all ``L`` are in, it sums them in local-rank order (0..L-1) into a float32 (float64
for float64) accumulator, exactly as a server sums pushes, rounds the sum to the key's dtype
and hands it back to the flight (``PartitionFlight.push_summed``), which compresses it with
this worker's compressor (one error-feedback state per machine and partition), pushes and
pulls. The server's reply is forwarded unchanged to every peer that pulled the round (a
compressed payload, each peer decoding it alike; or the sum, in frames or the server's shared
result slot), so every worker of the machine lands the same bits.

A peer's push is acknowledged at once (its credit is free, as a server's ack frees it), and
so is the owner's own contribution: credit held until all ``L`` arrive would deadlock workers
that start keys in different orders. Runs on the communication thread.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import zmq

from .. import logs
from ..compressors.arrays import is_device_array
from ..kernels.cpu import server_sum
from ..net import shm, transport
from ..net.protocol import Op, op_fields
from .host_copies import HostCopies
from .jobs import PartitionOp
from .local import LocalGroup
from .stages import PartitionStages

log = logging.getLogger(__name__)


@dataclass
class _Owned:
    """One owned key's local rounds."""
    views: dict[int, np.ndarray] = field(default_factory=dict)        # peer local rank -> its push segment
    pushed: dict[int, dict[int, Any]] = field(default_factory=dict)   # round -> local rank -> values
    own: dict[int, PartitionOp] = field(default_factory=dict)         # round -> our op
    pulls: dict[int, list[bytes]] = field(default_factory=dict)       # round -> peers waiting
    reply: tuple[int, Op, dict, list] | None = None                    # the last round relayed
    acc: np.ndarray | None = None                                      # the sum, reused every round
    host: np.ndarray | None = None                                     # our CUDA chunk copied to the host
    copying: set[int] = field(default_factory=set)                     # rounds whose copy is still under way


@dataclass
class _Refused:
    """A peer's push of a round that it refused (``PartitionStages.refusal``): no values."""
    why: str


class Flight(Protocol):
    """What the relay hands a summed round back to (``PartitionFlight``)."""
    def push_summed(self, op: PartitionOp) -> None: ...
    def fail_local(self, op: PartitionOp, message: str) -> None: ...


class Relay:
    def __init__(self, group: LocalGroup, sender: str, peer_chunks: shm.PeerChunks, flight: Flight,
                 host_copies: HostCopies):
        self.group = group
        self.host_copies = host_copies
        self.sender = sender
        self.peer_chunks = peer_chunks
        self.flight = flight
        self.keys: dict[int, _Owned] = {}
        self.identities = {f"local {group.base_rank + j}".encode(): j for j in range(group.size) if j != group.me}

    # ---- our own contribution and the server's answer ------------------------------

    def contribute(self, op: PartitionOp, filling: object | None = None) -> None:
        """``op``'s round of a key this worker sums for the machine; ``filling``: the event of
        the copy still filling its host source (a CUDA tensor staged through pinned memory),
        waited for off the communication thread, as a chunk's own copy off the device is."""
        owned = self.keys.setdefault(op.wkey.key, _Owned())
        owned.own[op.round] = op
        if filling is not None:
            owned.copying.add(op.round)
            self.host_copies.after(filling, lambda: self._copied(op), what=op.wkey.describe)
            return
        mine = op.chunk
        if is_device_array(mine):  # to the host now, while the peers' pushes come in (``HostCopies``)
            from ..kernels.cuda import device
            if owned.host is None:  # pinned, as the stages' own staging buffers: the copy is DMA
                owned.host = device.pinned_host(op.wkey.count, np.dtype(op.wkey.tensor.dtype), mine)
            owned.copying.add(op.round)
            self.host_copies.copy(mine, owned.host, lambda: self._copied(op), op.wkey.describe)
            return
        self._try(op.wkey.key, op.round)

    def _copied(self, op: PartitionOp) -> None:
        owned = self.keys.get(op.wkey.key)
        if owned is None or op.wkey.in_flight is not op:
            return  # failed meanwhile (its deadline passed)
        owned.copying.discard(op.round)
        self._try(op.wkey.key, op.round)

    def waiting_for(self, op: PartitionOp) -> list[int]:
        """The worker ranks whose push of ``op``'s round has not reached us."""
        owned = self.keys.get(op.wkey.key)
        pushed = owned.pushed.get(op.round, {}) if owned is not None and op.round in owned.own else None
        if pushed is None:
            return []
        return [self.group.base_rank + j for j in range(self.group.size) if j != self.group.me and j not in pushed]

    def waits_on(self, op: PartitionOp, left: dict[int, str]) -> str:
        """Why ``op`` can never complete, where it needs a worker of ``left`` (rank: why it
        left): its push of ``op``'s round, which has not reached us (a key we own, its round
        not summed yet: once summed, the server answers it), or its sum (a key it owns); ""
        where it needs none of them."""
        owned = self.keys.get(op.wkey.key)
        if op.wkey.pushers and op.wkey.in_flight is op and (owned is None or op.round not in owned.own):
            return ""
        pushed = owned.pushed.get(op.round, {}) if owned is not None else {}
        for rank, why in left.items():
            j = rank - self.group.base_rank
            if 0 <= j < self.group.size and j != self.group.me and (
                    j not in pushed if op.wkey.pushers else op.wkey.via == self.group.endpoint(j)):
                return why
        return ""

    def relay(self, key: int, rnd: int, op: Op, h: dict, frames: list) -> None:
        """Forward a server's PULL_REPLY (or ERROR) of ``key``'s round ``rnd`` to every peer
        that pulled it, and keep it for a pull still on its way."""
        owned = self.keys.setdefault(key, _Owned())
        fields = op_fields(op, h)
        owned.reply = (rnd, op, fields, [f.buffer if hasattr(f, "buffer") else f for f in frames])
        for identity in owned.pulls.pop(rnd, []):
            self._answer(identity, owned.reply)

    def tell(self, key: int, rnd: int, op: Op, h: dict) -> None:
        """Pass a server's word on our round ``rnd`` of ``key`` (STALLED) to the peers waiting
        for it; unlike a reply, nothing is kept for a pull still on its way."""
        owned = self.keys.get(key)
        fields = op_fields(op, h)
        for identity in owned.pulls.get(rnd, []) if owned is not None else []:
            self._send(identity, op, **fields)

    def fail(self, key: int, rnd: int, message: str) -> None:
        """Our round ``rnd`` of ``key`` failed here: the peers waiting for it hear why, and a
        peer's push coming after it sums nothing (our op, its source, are the caller's again)."""
        owned = self.keys.get(key)
        if owned is not None:
            owned.own.pop(rnd, None)
            owned.pushed.pop(rnd, None)
            owned.copying.discard(rnd)
        self.relay(key, rnd, Op.ERROR, {"message": message, "key": key, "round": rnd}, [])

    def forget(self, keys: list[int]) -> None:
        for key in keys:
            self.keys.pop(key, None)

    # ---- peers' messages --------------------------------------------------------------

    def drain(self) -> None:
        while self.group.router.poll(0):
            identity, h, frames = transport.recv(self.group.router, routed=True)
            if h is None:
                continue
            j = self.identities.get(identity)
            if j is None:
                log.warning("dropped %s from %s: not a worker of this machine", h["op"].name, logs.peer(identity))
                continue
            try:
                self._from_peer(identity, j, h, frames)
            except ValueError as e:
                self._send(identity, Op.ERROR, message=f"{self.sender}: {e}", key=h.get("key", 0),
                           **({"round": h["round"]} if "round" in h else {}))

    def _from_peer(self, identity: bytes, j: int, h: dict, frames: list) -> None:
        op, key = h["op"], h.get("key")
        if op == Op.INIT_KEY:
            if "shm" in h:
                nbytes = h["count"] * np.dtype(h["dtype"]).itemsize
                try:
                    region = self.peer_chunks.region(h["shm"], nbytes)
                except OSError as e:
                    raise ValueError(f"key {key}: cannot map local worker {self.group.base_rank + j}'s shared "
                                     f"memory ({e})") from None
                self.keys.setdefault(key, _Owned()).views[j] = region.array(h["dtype"], h["count"])
        elif op == Op.PUSH:
            owned = self.keys.setdefault(key, _Owned())
            if "refused" in h:  # its push_pull failed before this partition went: the machine's round fails
                values = _Refused(f"worker {self.group.base_rank + j} refused its push: {h['refused']}")
            elif h.get("shm"):
                values = owned.views.get(j)
                if values is None:
                    raise ValueError(f"key {key}: a shared-memory push, but worker {self.group.base_rank + j} "
                                     f"named no segment")
            elif len(frames) == 1:
                values = np.frombuffer(frames[0].buffer, h["dtype"])  # the frame stays alive with it
            else:
                raise ValueError(f"key {key}: a local push carries {len(frames)} frames, expected 1")
            if not isinstance(values, _Refused) and (values.size != h["count"]
                                                      or values.dtype != np.dtype(h["dtype"])):
                raise ValueError(f"key {key}: a local push of {h['count']} {h['dtype']} elements does not match "
                                 f"its {values.size} {values.dtype} segment")
            round_pushes = owned.pushed.setdefault(h["round"], {})
            if j in round_pushes:
                raise ValueError(f"key {key}: a second push of round {h['round']} from the same worker")
            round_pushes[j] = values
            self._send(identity, Op.PUSH_ACK, key=key, round=h["round"])
            self._try(key, h["round"])
            if h.get("pull"):
                self._pull(identity, owned, h["round"])
        elif op == Op.PULL:
            self._pull(identity, self.keys.setdefault(key, _Owned()), h["round"])
        else:  # STATE and the like: the owner speaks to the server for the machine
            log.debug("ignored %s of key %s from a local peer", op.name, key)

    def _pull(self, identity: bytes, owned: "_Owned", rnd: int) -> None:
        if owned.reply is not None and owned.reply[0] == rnd:
            self._answer(identity, owned.reply)
        else:
            owned.pulls.setdefault(rnd, []).append(identity)

    # ---- the sum ------------------------------------------------------------------------

    def _try(self, key: int, rnd: int) -> None:
        owned = self.keys[key]
        op = owned.own.get(rnd)
        pushes = owned.pushed.get(rnd, {})
        if op is None or len(pushes) < self.group.size - 1 or rnd in owned.copying:
            return
        del owned.own[rnd]
        owned.pushed.pop(rnd)
        wk = op.wkey
        if op.job.future.done():  # failed meanwhile: its caller may be rewriting the tensor we would read
            self.flight.fail_local(op, f"push_pull of {wk.describe()}, round {rnd}: its push_pull failed before "
                                       f"the machine's sum")
            return
        try:
            op.summed = self._sum(owned, op, pushes)
        except ValueError as e:
            self.flight.fail_local(op, f"push_pull of {wk.describe()}, round {rnd}: {e}")
            return
        self.flight.push_summed(op)

    def _sum(self, owned: _Owned, op: PartitionOp, pushes: dict[int, Any]) -> np.ndarray:
        """The machine's sum of ``op``'s round, local rank 0 first, as a server sums pushes.
        An uncompressed key pushed through shared memory is summed straight into its push
        segment, which then goes out as it is; float32 and float64 add the first two
        contributions in one pass. Both save passes over the host memory, which bounds an
        uncompressed GPU job (the sum, then its copy, were 7 passes over each byte, now 3)."""
        wk, dtype = op.wkey, np.dtype(op.wkey.tensor.dtype)
        PartitionStages.await_source(op.job)  # what fills src comes before this read
        mine = owned.host if is_device_array(op.chunk) else op.chunk  # (copied in ``contribute``)
        values = []
        for j in range(self.group.size):
            v = mine if j == self.group.me else pushes[j]
            if isinstance(v, _Refused):
                raise ValueError(v.why)
            if v.size != wk.count or v.dtype != dtype:
                raise ValueError(f"worker {self.group.base_rank + j} pushed {v.size} {v.dtype} "
                                 f"elements; the key holds {wk.count} {dtype}")
            values.append(np.ascontiguousarray(v))
        segment = wk.push_view if wk.push_view is not None and op.job.tensor.compressor is None else None
        if dtype in (np.float32, np.float64) and len(values) > 1:
            out = segment if segment is not None else self._accumulator(owned, wk.count, dtype)
            server_sum.sum_pair(out, values[0], values[1])
            values = values[2:]
        else:
            out = self._accumulator(owned, wk.count, np.float64 if dtype == np.float64 else np.float32)
            server_sum.accumulate(out, values.pop(0), first=True)
        for v in values:
            server_sum.accumulate(out, v, first=False)
        if dtype == np.float16:
            return server_sum.to_half(out, segment)
        return out if out.dtype == dtype else out.astype(dtype)

    @staticmethod
    def _accumulator(owned: _Owned, count: int, dtype: Any) -> np.ndarray:
        """The key's sum when it is not summed in its push segment: one array, reused every round."""
        if owned.acc is None or owned.acc.dtype != dtype:
            owned.acc = np.empty(count, dtype)
        return owned.acc

    # ---- sending --------------------------------------------------------------------------

    def _answer(self, identity: bytes, reply: tuple) -> None:
        _, op, fields, buffers = reply
        self._send(identity, op, buffers, **fields)

    def _send(self, identity: bytes, op: Op, buffers=(), **fields) -> None:
        # never blocking: a peer that reads nothing (stopped, its queue full) must not stop this
        # thread, its heartbeats and every other key; that peer misses this message, and its
        # deadline names this owner
        try:
            transport.send(self.group.router, op, self.sender, buffers, identity=identity, nonblocking=True, **fields)
        except zmq.Again:
            log.warning("dropped %s to %s: its queue is full (it reads nothing)", op.name, logs.peer(identity))
        except zmq.ZMQError as e:  # the peer is gone: the scheduler names it to everyone
            log.warning("could not send %s to %s: %s", op.name, logs.peer(identity), e)
