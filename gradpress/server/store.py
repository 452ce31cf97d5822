"""One key's state on a server and the rules of its rounds (no sockets here).

Sync mode, per key: the first push of round r is stored into the accumulator,
later ones are added; once all workers have pushed, round r is complete, its
result is kept as the reply and every pull waiting for r is answered. A pull that
arrives early waits; a push for round r+1 that arrives before r completes is
held aside and applied after, so rounds never mix.

Async mode (BYTEPS_ENABLE_ASYNC=1), as BytePS defines it: the key holds parameters.
Round 0 is synchronous and initialises them (rank 0 pushes its values, the others
zeros, every pull of round 0 waits for the sum); after it, a push (a worker's
parameter delta) is added into the store at once and a pull reads the store as it
is, whatever round the worker is at. Compressed keys are refused in async mode.

A compressed key decompresses every push into the fp32 sum and, once the round
is complete, compresses the sum with the server's own error feedback
(s = sum_i D(c_i) + e_s; c_s = C(s); e_s = s - D(c_s)). Every worker of a round
receives those same bytes, so parameters never drift apart.

A worker that could not encode its round still pushes, without data, so that the round
completes: ``nonfinite`` for NaN/inf in its input, ``refused`` for any other failure; the
server's residual stays as it was. A ``nonfinite`` push, or an aggregate whose compression
meets NaN/inf, skips the round (a ``nonfinite`` PULL_REPLY without data, which every worker
lands as NaN: worker/nonfinite.py); a ``refused`` one fails it (an ERROR to every pull).

Methods return the replies to send as ``Reply`` tuples; the engine sends them. Where
an aggregate lives and what a pull's reply carries is the key's result sink's
business (sink.py): frames by default, shared-memory slots when the engine shares them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..compressors import ErrorFeedback
from ..compressors.spec import CodecSpec
from ..errors import NonFiniteInput
from ..net.limits import check_lr
from ..net.protocol import Op
from ..trace import Tracer
from ..kernels.cpu import server_sum as kernels
from .sink import FrameSink, Reply, ResultSink, SharedSlots
from .values_sum import ValuesSum


class PushError(ValueError):
    """A push or pull this key cannot accept; the message names why."""


class Payload(NamedTuple):
    """A compressed push: the codec's header and its buffers."""
    meta: dict
    buffers: list


class Refused(NamedTuple):
    """A push without data (``why``: who, and why); ``overflow``: NaN/inf, the round is skipped."""
    why: str
    overflow: bool = False


_NO_TRACE = Tracer("")


@dataclass
class KeyState:
    key: int
    name: str
    count: int
    dtype: str
    num_workers: int
    async_mode: bool = False
    compression_params: dict | None = None  # as INIT_KEY carried them; None: uncompressed
    tracer: Tracer = _NO_TRACE
    round: int = 0                          # the round being accumulated
    pushed: set = field(default_factory=set)
    early: dict = field(default_factory=dict)   # sender -> values or Payload of round + 1
    waiting: list = field(default_factory=list)  # senders whose pull waits for `round`
    done_round: int = -1                    # last completed round
    failure: str = ""                       # why the last round produced no aggregate
    refusals: list = field(default_factory=list)  # this round's pushes without data (Refused)
    skipped: str = ""                       # who made the last round non-finite ("": nobody)
    broken: str = ""                        # why the key takes no more rounds (an internal error)
    lr: float | None = None                 # learning rate pushed with this round
    sink: ResultSink | None = None          # holds completed aggregates; None: a FrameSink

    def __post_init__(self) -> None:
        if self.sink is None:
            self.sink = FrameSink(self.key, self.count, self.dtype)
        self.acc = self.sink.accumulator(self.round)
        self.compressor = None
        if self.async_mode and self.compression_params is not None:
            raise PushError(f"{self.describe()}: compressed keys are not supported with BYTEPS_ENABLE_ASYNC=1")
        if self.compression_params is not None:
            try:  # untrusted input: checked here, once, like the policy checks a user's dict
                spec = CodecSpec.from_params(self.compression_params, "INIT_KEY compression_params")
                if spec is not None:
                    spec.check_dtype(self.dtype, self.describe())
                    self.compressor = spec.build("server")
            except ValueError as e:
                raise PushError(f"{self.describe()}: {e}") from None
        # random-k without scaling sums k values per push, not n (values_sum.py)
        self.values_sum = None if self.compressor is None else \
            ValuesSum.for_key(self.compressor, self.key, self.count)

    def share_results(self, slots: SharedSlots) -> None:
        """Keep results in shared-memory slots from now on; the round in progress carries over."""
        if self.compressor is not None:
            raise PushError(f"{self.describe()}: compressed keys travel in frames, not shared memory")
        acc = slots.accumulator(self.round)
        if self.pushed and acc is not self.acc:
            acc[:] = self.acc
        self.sink, self.acc = slots, acc

    def server_state(self) -> tuple[np.ndarray | None, float | None]:
        """This key's error-feedback residual and last learning rate (None, None without EF)."""
        if not isinstance(self.compressor, ErrorFeedback):
            return None, None
        state = self.compressor.state_dict()
        return state["residuals"].get(self.key), state["lrs"].get(self.key)

    def load_server_state(self, residual: np.ndarray, lr: float | None) -> None:
        """Install a checkpointed residual (used at the next completed round)."""
        if not isinstance(self.compressor, ErrorFeedback):
            raise PushError(f"{self.describe()}: it has no server error feedback to restore")
        if residual.dtype != np.float32 or residual.size != self.count:
            raise PushError(f"{self.describe()}: a restored residual of {residual.size} {residual.dtype} "
                            f"values; the key holds {self.count} float32")
        if lr is not None:
            check_lr(lr, self.describe(), PushError)
        if not np.isfinite(residual).all():  # it would fail every later round's compression
            raise PushError(f"{self.describe()}: a restored residual holds NaN or inf")
        self.compressor.load_state_dict({"residuals": {self.key: residual.copy()},
                                    "lrs": {} if lr is None else {self.key: lr}})
        if self.values_sum is not None:
            self.values_sum.recheck()

    def describe(self) -> str:
        return f"key {self.key} (tensor {self.name!r})"

    def check_init(self, name: str, count: int, dtype: str, compression_params: dict | None) -> None:
        if (name, count, dtype) != (self.name, self.count, self.dtype):
            raise PushError(f"{self.describe()}: INIT_KEY for {name!r} with {count} {dtype} elements; "
                            f"the key holds {self.count} {self.dtype} elements of {self.name!r}")
        if compression_params != self.compression_params:
            raise PushError(f"{self.describe()}: workers disagree on its compression: "
                            f"{compression_params} against {self.compression_params}")

    def decode(self, header: dict, frames: list) -> np.ndarray | Payload:
        """The pushed values (an array, or a Payload for a compressed key), checked against the key."""
        if header["dtype"] != self.dtype or header["count"] != self.count:
            raise PushError(f"{self.describe()}: push of {header['count']} {header['dtype']} elements; "
                            f"the key holds {self.count} {self.dtype}")
        if getattr(self.compressor, "corrected", False) and not header.get("lr"):
            raise PushError(f"{self.describe()}: corrected error feedback needs each push's learning rate "
                            f"(> 0); this push has {header.get('lr')!r}")
        bufs = [f.buffer if hasattr(f, "buffer") else f for f in frames]
        if self.compressor is not None:
            if header.get("codec") != self.compressor.name or "meta" not in header:
                raise PushError(f"{self.describe()}: push encoded as {header.get('codec', 'raw values')!r}; "
                                f"the key is compressed with {self.compressor.name!r}")
            return Payload(header["meta"], bufs)
        if "codec" in header:
            raise PushError(f"{self.describe()}: a {header['codec']!r} push for an uncompressed key")
        if len(bufs) != 1:
            raise PushError(f"{self.describe()}: push has {len(bufs)} data frames, expected 1")
        expected = self.count * np.dtype(self.dtype).itemsize
        if len(bufs[0]) != expected:
            raise PushError(f"{self.describe()}: push carries {len(bufs[0])} bytes, expected {expected}")
        return np.frombuffer(bufs[0], dtype=self.dtype)

    def push(self, sender: bytes, rnd: int, values: np.ndarray | Payload | Refused,
             lr: float | None = None) -> list[Reply]:
        if lr is not None:  # every push's, whatever it carries (a refused one's is kept too)
            check_lr(lr, self.describe(), PushError)
        if self.async_mode and self.done_round >= 0:  # initialised: add the delta at once
            if not isinstance(values, Refused):
                self._absorb(values, rnd, first=False)
            return []
        if rnd == self.round:
            if sender in self.pushed:
                raise PushError(f"{self.describe()}: second push of round {rnd} from the same worker")
            if isinstance(values, Refused):
                self.refusals.append(values)
            else:  # the first values absorbed are stored, the others added
                self._absorb(values, rnd, first=len(self.pushed) == len(self.refusals))
            self.pushed.add(sender)
            if lr is not None:
                self.lr = lr
            return self._complete() if len(self.pushed) == self.num_workers else []
        if rnd == self.round + 1:
            if sender in self.early:
                raise PushError(f"{self.describe()}: a third round in flight from one worker (round {rnd})")
            # checked now, not when round rnd - 1 completes: a bad payload is its sender's error
            # alone, and the frames' memory belongs to ZeroMQ messages we do not keep
            self.early[sender] = (self._decoded(values, rnd) if isinstance(values, Payload)
                                  else values if isinstance(values, Refused) else values.copy(), lr)
            return []
        raise PushError(f"{self.describe()}: push for round {rnd}, but the key is at round {self.round}")

    def pull(self, sender: bytes, rnd: int) -> list[Reply]:
        if self.async_mode and self.done_round >= 0:
            return [self.sink.snapshot(sender, rnd, self.acc)]
        if rnd == self.done_round:
            return [self._reply(sender, rnd)]
        if rnd == self.round:
            if sender not in self.waiting:  # (a pull repeated gets one reply)
                self.waiting.append(sender)
            return []
        raise PushError(f"{self.describe()}: pull for round {rnd}; the key completed round "
                        f"{self.done_round} and is accumulating round {self.round}")

    def pullable(self, rnd: int) -> bool:
        """Whether a pull of round ``rnd`` is taken now (answered, or waiting for its round)."""
        return (self.async_mode and self.done_round >= 0) or rnd in (self.round, self.done_round)

    def _decoded(self, payload: Payload, rnd: int) -> np.ndarray:
        """An early push's payload decompressed (and so checked) into float32 values of its own."""
        values = np.empty(self.count, np.float32)
        try:
            self.compressor.decompress(payload.meta, payload.buffers, values, key=self.key, round=rnd)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise PushError(f"{self.describe()}: malformed {self.compressor.name} payload for round {rnd}: "
                            f"{e}") from None
        return values

    def _absorb(self, values: np.ndarray | Payload, rnd: int, first: bool) -> None:
        if isinstance(values, Payload):
            with self.tracer.span("server sum", key=self.key, round=rnd):
                try:
                    if self.values_sum is not None:
                        if self.values_sum.take(values.meta, values.buffers, first):
                            return
                        first = self.values_sum.to_dense(self.acc, rnd, first)
                    decode = self.compressor.decompress if first else self.compressor.decompress_add
                    decode(values.meta, values.buffers, self.acc, key=self.key, round=rnd)
                # the codec checks a payload before it writes: the sum is intact
                except (ValueError, TypeError, KeyError, IndexError) as e:
                    raise PushError(f"{self.describe()}: malformed {self.compressor.name} payload: {e}") from None
        else:
            with self.tracer.span("server sum", key=self.key, round=rnd):
                if self.values_sum is not None:
                    first = self.values_sum.to_dense(self.acc, rnd, first)
                kernels.accumulate(self.acc, values, first=first)

    def _complete(self) -> list[Reply]:
        self.failure = self.skipped = ""
        store = self.acc.copy() if self.async_mode else None  # the initial parameters stay the store
        refused = [r.why for r in self.refusals if not r.overflow]
        if refused:  # no aggregate, and the server's residual stays as it was
            self.failure = f"{self.describe()}: round {self.round} has no aggregate: refused by {'; '.join(refused)}"
        elif self.refusals:  # the same, but every worker lands NaN and goes on
            self.skipped = "; ".join(r.why for r in self.refusals)
        elif self.compressor is not None:
            self._compress_aggregate()
        else:
            self.sink.publish(self.round, self.acc)
        self.refusals = []
        self.done_round, self.round = self.round, self.round + 1
        self.acc = self.sink.accumulator(self.round) if store is None else store
        self.pushed = set()
        replies = [self._reply(s, self.done_round) for s in self.waiting]
        self.waiting = []
        early, self.early = self.early, {}
        for sender, (values, lr) in early.items():
            try:
                replies += self.push(sender, self.round, values, lr)
            except PushError as e:  # that sender's error: the replies to the others still go out
                replies.append(Reply(sender, Op.ERROR, {"message": str(e), "key": self.key, "round": self.round}, []))
        return replies

    def _compress_aggregate(self) -> None:
        with self.tracer.span("server compress", key=self.key, round=self.round):
            try:
                if self.values_sum is not None and self.values_sum.active:
                    meta, buffers = self.values_sum.compress(self.round, self.lr)
                else:
                    meta, buffers = self.compressor.compress(self.acc, key=self.key, round=self.round, lr=self.lr)
                    if self.values_sum is not None:
                        self.values_sum.recheck()
            except NonFiniteInput as e:  # every push was finite, their sum or its encoding is not
                self.skipped = f"this server (the aggregate: {e})"
                return
            except ValueError as e:
                self.failure = f"{self.describe()}: the aggregate of round {self.round} cannot be compressed: {e}"
                return
        # the next round overwrites the accumulator while this reply may still be on its way
        buffers = [np.array(b, copy=True) if np.shares_memory(b, self.acc) else b for b in buffers]
        self.sink.publish_compressed(self.round, {"codec": self.compressor.name, "meta": meta}, buffers)

    def _reply(self, to: bytes, rnd: int) -> Reply:
        """The answer to a pull of completed round ``rnd`` (async pulls read a snapshot instead)."""
        if self.failure:
            return Reply(to, Op.ERROR, {"message": self.failure, "key": self.key, "round": rnd}, [])
        if self.skipped:
            return Reply(to, Op.PULL_REPLY, dict(self.sink.fields(rnd), nonfinite=self.skipped), [])
        return self.sink.reply(to, rnd)
