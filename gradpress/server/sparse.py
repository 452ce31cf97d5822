"""A row-sparse key on a server: this server's hash share of a sparse tensor's rows.

Each push carries (indices, values) for the rows of this share a worker touched. Every
field is checked before anything is summed: the dtype and the row width against the
layout, the row count against the table, and the indices (below ``rows``, strictly
increasing, owned by this server under the one shared hash). A push that fails any
check is refused with an ERROR naming the tensor, and the round's sum is untouched.
Checked pushes are merged into the round's sorted accumulator (a sorted merge-and-sum
in float32, float64 for float64 tensors); when all workers have pushed, every pull of
the round gets the union: its rows and their sums, in the tensor's dtype.

The union travels either as its indices or, where smaller, as a bitmap over the rows
this key has published before ("known" rows, which every worker also keeps, since
every worker receives every round) plus the indices not seen before.

Rounds follow ``KeyState``'s rules: a push for round r + 1 waits until round r is
complete; pulls of a round wait for it. No async mode and no error feedback: a sparse
sum is exact, and float16 values are summed in float32 and rounded once.
"""
from __future__ import annotations

import numpy as np

from ..kernels.cpu import rows as kernels
from ..net.protocol import Op
from ..placement import split_key
from ..row_placement import RowLayout
from ..trace import Tracer
from .sink import Reply, sum_dtype
from .store import PushError

_PROBLEMS = {kernels.ROWS_OUT_OF_RANGE: "is out of range", kernels.ROWS_UNSORTED: "is not above the one before it "
             "(indices must be strictly increasing: sorted, no duplicates)",
             kernels.ROWS_NOT_OWNED: "belongs to another server under the row hash"}


def init_key(keys: dict, h: dict, num_workers: int, async_mode: bool, tracer: Tracer) -> list:
    """INIT_KEY where either side is sparse: create the key's state, or check a repeat."""
    state = keys.get(h["key"])
    if state is None:
        if "shm" in h or "compression_params" in h:
            raise PushError(f"key {h['key']} (tensor {h['name']!r}): a sparse key takes neither "
                            f"shared memory nor compression_params")
        keys[h["key"]] = SparseKeyState(h["key"], h["name"], h["count"], h["dtype"], h["sparse"],
                                        num_workers, async_mode, tracer)
        return []
    if not isinstance(state, SparseKeyState) or "sparse" not in h:
        raise PushError(f"{state.describe()}: workers disagree on whether the tensor is sparse")
    state.check_init(h["name"], h["count"], h["dtype"], h["sparse"])
    return []


class SparseKeyState:
    def __init__(self, key: int, name: str, count: int, dtype: str, layout: dict, num_workers: int,
                 async_mode: bool, tracer: Tracer):
        self.key, self.name, self.dtype = key, name, dtype
        self.count = count
        self.num_workers = num_workers
        self.tracer = tracer
        if async_mode:
            raise PushError(f"{self.describe()}: sparse tensors are not supported with BYTEPS_ENABLE_ASYNC=1")
        try:
            self.layout = RowLayout.from_wire(layout, self.describe())
        except ValueError as e:
            raise PushError(str(e)) from None
        self.shard = split_key(key)[1]
        if self.shard >= self.layout.num_servers:
            raise PushError(f"{self.describe()}: share {self.shard} of a layout over {self.layout.num_servers} servers")
        if count != 1:  # a share is declared as one element (RowLayout.declared_parts)
            raise PushError(f"{self.describe()}: INIT_KEY declares {count} elements for a share; "
                            f"a row-sparse tensor's shares are declared as 1")
        self.stream = self.layout.stream
        self.acc_dtype = sum_dtype(dtype)
        self.index_dtype = self.layout.index_dtype
        self.round, self.done_round = 0, -1
        self.pushed: set = set()
        self.early: dict = {}
        self.waiting: list = []
        self.acc = self._empty()
        self.known = np.empty(0, self.index_dtype)  # rows published in earlier rounds
        self.result: tuple[dict, list] | None = None
        self.rows_received = 0                      # every pushed row, for balance figures

    def describe(self) -> str:
        return f"key {self.key} (sparse tensor {self.name!r})"

    def _empty(self) -> tuple[np.ndarray, np.ndarray]:
        return np.empty(0, self.index_dtype), np.empty((0, self.layout.width), self.acc_dtype)

    def check_init(self, name: str, count: int, dtype: str, layout: dict) -> None:
        if (name, count, dtype, layout) != (self.name, self.count, self.dtype, self.layout.wire()):
            raise PushError(f"{self.describe()}: INIT_KEY for {name!r} with {count} {dtype} elements, layout "
                            f"{layout}; the key holds {self.count} {self.dtype}, layout {self.layout.wire()}")

    def server_state(self) -> tuple[None, None]:
        return None, None  # an exact sum keeps no residual

    def load_server_state(self, residual: np.ndarray, lr: float | None) -> None:
        raise PushError(f"{self.describe()}: it has no server error feedback to restore")

    # ---- pushes ---------------------------------------------------------------

    def decode(self, h: dict, frames: list) -> tuple[np.ndarray, np.ndarray]:
        """A push's (indices, values), checked field by field before any is used."""
        what = f"{self.describe()}: push of round {h['round']}"
        if not h.get("sparse") or "codec" in h or h.get("shm"):
            raise PushError(f"{what} is not a sparse push (rows and values in two frames)")
        if h["dtype"] != self.dtype:
            raise PushError(f"{what}: values are {h['dtype']}; the tensor is {self.dtype}")
        n, width = h["count"], self.layout.width
        if n > self.layout.rows:
            raise PushError(f"{what}: {n} rows, but the table has {self.layout.rows}")
        if len(frames) != 2:
            raise PushError(f"{what}: {len(frames)} data frames, expected 2 (indices, values)")
        idx_buf, val_buf = (f.buffer if hasattr(f, "buffer") else f for f in frames)
        if len(idx_buf) != n * self.index_dtype.itemsize:
            raise PushError(f"{what}: {len(idx_buf)} bytes of indices for {n} rows of {self.index_dtype}")
        itemsize = np.dtype(self.dtype).itemsize
        if len(val_buf) != n * width * itemsize:
            per_row = len(val_buf) / itemsize / n if n else len(val_buf)
            raise PushError(f"{what}: {len(val_buf)} bytes of values for {n} rows of width {width} "
                            f"({per_row:g} values per row)")
        indices = np.frombuffer(idx_buf, self.index_dtype)
        code, at = kernels.check_rows(indices, self.layout.rows, self.stream, self.layout.num_servers, self.shard)
        if code != kernels.ROWS_OK:
            raise PushError(f"{what}: row index {int(indices[at])} at position {at} {_PROBLEMS[code]} "
                            f"(table of {self.layout.rows} rows, server share {self.shard})")
        values = np.frombuffer(val_buf, self.dtype).reshape(n, width)
        return indices, values

    def push(self, sender: bytes, rnd: int, values: tuple, lr: float | None = None) -> list[Reply]:
        if rnd == self.round:
            if sender in self.pushed:
                raise PushError(f"{self.describe()}: second push of round {rnd} from the same worker")
            self._absorb(*values)
            self.pushed.add(sender)
            return self._complete() if len(self.pushed) == self.num_workers else []
        if rnd == self.round + 1:
            if sender in self.early:
                raise PushError(f"{self.describe()}: a third round in flight from one worker (round {rnd})")
            self.early[sender] = (values[0].copy(), values[1].copy())  # the frames are not ours to keep
            return []
        raise PushError(f"{self.describe()}: push for round {rnd}, but the key is at round {self.round}")

    def _absorb(self, indices: np.ndarray, values: np.ndarray) -> None:
        self.rows_received += indices.shape[0]
        with self.tracer.span("sparse merge", key=self.key, round=self.round):
            a_idx, a_val = self.acc
            n = a_idx.shape[0] + indices.shape[0]
            out = np.empty(n, self.index_dtype), np.empty((n, self.layout.width), self.acc_dtype)
            rows = kernels.merge_sum(a_idx, a_val, indices, values.astype(self.acc_dtype, copy=False), *out)
            if rows < 0:  # cannot happen with out sized a + b; checked all the same
                raise PushError(f"{self.describe()}: merge overflowed its {n} rows")
            self.acc = out[0][:rows], out[1][:rows]

    # ---- completion and pulls ---------------------------------------------------

    def _complete(self) -> list[Reply]:
        with self.tracer.span("sparse publish", key=self.key, round=self.round):
            self.result = self._encode(*self.acc)
        self.done_round, self.round = self.round, self.round + 1
        self.acc, self.pushed = self._empty(), set()
        replies = [self._reply(s, self.done_round) for s in self.waiting]
        self.waiting = []
        early, self.early = self.early, {}
        for sender, values in early.items():
            replies += self.push(sender, self.round, values)
        return replies

    def _encode(self, indices: np.ndarray, sums: np.ndarray) -> tuple[dict, list]:
        """The reply of a completed round: its rows, or a bitmap over the known rows where smaller."""
        values = sums.astype(self.dtype, copy=False)
        n, isz = indices.shape[0], self.index_dtype.itemsize
        fields = {"dtype": self.dtype, "count": n, "sparse": "rows"}
        frames = [indices, values]
        known = self.known
        if n and (known.shape[0] + 7) // 8 < n * isz:
            bitmap = np.empty((known.shape[0] + 7) // 8, np.uint8)
            fresh = np.empty(n, self.index_dtype)
            k = kernels.to_bitmap(known, indices, bitmap, fresh)
            if 0 <= k and bitmap.nbytes + k * isz < n * isz:
                fields.update(sparse="bitmap", known=known.shape[0])
                frames = [bitmap, fresh[:k], values]
        self.known = _union(known, indices)
        return fields, frames

    def pull(self, sender: bytes, rnd: int) -> list[Reply]:
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
        return rnd in (self.round, self.done_round)

    def _reply(self, to: bytes, rnd: int) -> Reply:
        fields, frames = self.result
        return Reply(to, Op.PULL_REPLY, dict(fields, key=self.key, round=rnd), frames)


def _union(known: np.ndarray, indices: np.ndarray) -> np.ndarray:
    out = np.empty(known.shape[0] + indices.shape[0], known.dtype)
    n = kernels.union(known, indices, out)
    return out[:n]
