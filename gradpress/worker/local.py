"""The local group: the workers of one machine, which sum each partition before it leaves it.

As in BytePS, a machine's gradient crosses the network once: every partition key of a dense
tensor has one owner among the machine's ``L`` workers (``owner``: a tensor's partitions in turn,
from a start its name gives; deterministic everywhere, and the same in a resumed job). A
worker that does not own a key treats its owner as the key's server: its ordinary stages
(``stages.py``) send INIT_KEY, PUSH (raw values, through a shared-memory segment when the
host allows it) and PULL to the owner, and land the reply as they would a server's. The
owner (``relay.py``) sums the ``L`` contributions, compresses once, pushes, pulls, and
forwards the server's reply unchanged to its peers. Servers count one push per machine
for such keys (INIT_KEY's ``pushers``); row-sparse keys bypass the group (each worker's rows
are its own).

Sockets: each worker binds a ROUTER before it registers (its port goes into the address
book) and, once the job has agreed to reduce locally (the address book's ``local_size``),
connects a DEALER to every other worker of its machine; the communication thread polls them
with the rest. The job's security (CURVE or none) applies, through ``transport``.
"""
from __future__ import annotations

import logging
import zlib

import zmq

from ..config import Settings
from ..net import transport
from ..net.node import AddressBook
from .keys import Tensor

log = logging.getLogger(__name__)


def identity_of(rank: int) -> bytes:
    """The DEALER identity worker ``rank`` uses towards its local peers."""
    return f"local {rank}".encode()


class LocalGroup:
    """This worker's place in its machine's group: sockets, ranks and who owns which key."""

    def __init__(self, settings: Settings, ctx: zmq.Context):
        self.s = settings
        self.ctx = ctx
        self.router, self.port = transport.router(ctx, settings, 0)
        self.size = 1                 # workers in the group (the address book decides)
        self.me = settings.local_rank
        self.base_rank = 0            # the group's first worker rank
        self.machines = 0             # DMLC_NUM_WORKER: pushes that complete a round of an owned key
        self.first_endpoint = 0       # index of the first peer among the stages' endpoints
        self.peers: list[zmq.Socket] = []   # DEALERs to the other workers, by local rank (ours skipped)

    @classmethod
    def bind(cls, settings: Settings, ctx: zmq.Context) -> "LocalGroup | None":
        """The group's listening socket, bound before registration; None where this worker
        reduces with nobody (a machine of one worker, async mode, or GRADPRESS_LOCAL_REDUCE=0)."""
        if not settings.local_reduce or settings.local_size < 2 or settings.enable_async or settings.worker_id < 0:
            return None
        return cls(settings, ctx)

    def join(self, book: AddressBook, num_servers: int) -> list[zmq.Socket]:
        """Connect to the machine's other workers, where the job reduces locally (returns
        the DEALERs, the stages' endpoints after the servers); [] where it does not."""
        if book.local_size < 2:
            return []
        self.size = book.local_size
        self.base_rank = book.rank - self.me
        self.machines = book.num_workers // self.size
        self.first_endpoint = num_servers
        workers = {n.rank: n for n in book.nodes if n.role == "worker"}
        for j in range(self.size):
            if j == self.me:
                continue
            node = workers.get(self.base_rank + j)
            if node is None:
                raise ValueError(f"worker {book.rank}: the address book lists no worker {self.base_rank + j} "
                                 f"(local rank {j} of its machine)")
            self.peers.append(transport.dealer(self.ctx, self.s, node.host, node.port, identity_of(book.rank)))
        return self.peers

    @property
    def active(self) -> bool:
        return self.size > 1

    def endpoint(self, local_rank: int) -> int:
        """The stages' endpoint index of local worker ``local_rank`` (not ourselves)."""
        return self.first_endpoint + (local_rank if local_rank < self.me else local_rank - 1)

    def local_rank_of(self, endpoint: int) -> int:
        j = endpoint - self.first_endpoint
        return j if j < self.me else j + 1

    def owner(self, name: str, index: int) -> int:
        """The local rank that owns partition ``index`` of tensor ``name``: a tensor's partitions
        go round the group; by name, not tensor id, so that a resumed job (whose ids follow its
        own declarations) gives each key the owner whose error feedback was saved for it."""
        return (zlib.crc32(name.encode()) + index) % self.size

    def assign(self, t: Tensor) -> None:
        """Give each of ``t``'s keys its owner: ours are pushed once per machine, the others
        go through their owner. Row-sparse tensors keep each worker's own push."""
        if t.layout is not None:
            return
        for wk in t.keys:
            owner = self.owner(t.name, wk.index)
            if owner == self.me:
                wk.pushers = self.machines
            else:
                wk.via = self.endpoint(owner)

    def describe(self, endpoint: int) -> str:
        """Who stands behind an endpoint index: a server, or a local worker (a key's owner)."""
        if endpoint < self.first_endpoint or not self.active:
            return f"server {endpoint}"
        return f"local worker {self.base_rank + self.local_rank_of(endpoint)} (the key's owner)"

    def close(self) -> None:
        for sock in self.peers:
            sock.close()
        self.router.close()
