"""Predict an iteration's time for a plan: the timeline simulator.

The model follows one worker (workers are symmetric: same gradients, same plan) through
an iteration, with every resource the way gradpress uses it:

- gradients become ready at their profiled times; a fused group is ready when its last
  member is, plus the copy of its members into the group buffer (training thread);
- the worker's communication thread is one serial resource: it compresses a partition
  before pushing it and decompresses a reply when it lands, replies first (as its loop
  does), and spends ``message_s`` per partition on the messages themselves; it takes
  ready partitions highest priority first, within the credit (pushes not yet taken by a
  server);
- links: the worker's and each server's link carry ``alpha + bytes / rate`` per message and
  direction; a server's link carries every worker's copy of a push or reply;
- a server sums a round's pushes and recompresses the aggregate on the engine thread its
  key is pinned to (least loaded by bytes, as the server pins them), once every push is in;
- a group is cut into partitions of ``partition_bytes`` on the wire, as the worker cuts it:
  a codec's at float32 (it widens half precision), the raw path's at the members' dtype,
  ``fp16_raw``'s at float16. So the model cuts each group at the finest any option needs
  (slots) and an option that sends two slots' bytes in one partition takes the pair as one
  (``_merged``);
- partitions go to servers as the scheduler places them (least loaded by bytes, at the
  bytes each option declares);
- the iteration ends when backward is done and every group has landed, plus the
  optimizer's step (a fused group hands its average back as views of its buffer:
  ``torch/fusion.py``);
- where a machine's workers reduce locally (``Profile.local_size`` L > 1,
  docs/local-reduce.md), each worker owns a partition in L: for those it sums L raw
  contributions before compressing, for the others it copies its raw partition into a
  shared segment; the comm thread's cost per partition is that mix's mean (an option with
  no codec, raw or ``fp16_raw``, hands its payload over as it travels and the owner adds
  the peers' payloads). The machine's
  link carries one copy of each partition (the worker's link above stands for it), and a
  server sums one push per machine;
- where workers and servers share a host's CPUs (``Profile.host``), an iteration takes at
  least the CPU work of the processes on rank 0's host divided by its cores: each of its
  workers' training and communication thread work, each of its servers' share of the sums,
  the recompressions and the messages (``message_s`` per worker and partition: a server
  measured 0.17-0.2 cores busy where its codec work came to 0.03). On a 2-core machine
  with two workers and two servers that bound, not the timeline, set the MLP's iteration: the
  timeline alone predicted it 12-24% short.

``Layout`` turns a grouping into per-partition tables once; ``Layout.predict`` then costs
one compiled simulation (``kernels/cpu/timeline.py``) per plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels.cpu.timeline import finish_iteration, place_partitions, simulate_iteration
from .profile import LinearCost, Profile

Group = tuple[int, ...]  # indices into Profile.tensors, consecutive in ready order


@dataclass
class Layout:
    """A grouping of a profile's tensors, tabulated for every option."""
    profile: Profile
    groups: list[Group]
    options: list[str]

    def __post_init__(self) -> None:
        prof, opts = self.profile, self.options
        sizes, ready, prio, group_of = [], [], [], []
        none = prof.codecs["none"]
        # a fused group's gather: one memory pass on the host; on a GPU a device copy, noise
        # beside the partitions' trips over the bus
        copy = none.decompress if prof.device == "cpu" else LinearCost(0.0, 0.0)
        self.group_bytes, raw_ratio, first = [], [], []
        for g, members in enumerate(self.groups):
            # a group is ready with its last member (a re-based timeline keeps the decision's
            # order, so "last" is the latest, not the final index)
            nbytes = sum(prof.tensors[i].nbytes for i in members)
            self.group_bytes.append(nbytes)
            # the raw path sends a group in its members' dtype where they share one (float16:
            # half of ``nbytes``, which counts float32 as a codec takes them), else in float32
            sizes_of = {prof.tensors[i].itemsize for i in members}
            ratio = sizes_of.pop() / 4 if len(sizes_of) == 1 else 1.0
            fused = len(members) > 1
            # (the gather at the raw path's bytes: a codec's float32 buffer of half members
            # reads those and writes twice as many)
            at = max(prof.tensors[i].ready_s for i in members) + (copy(nbytes * ratio) if fused else 0.0)
            pr = max(prof.tensors[i].priority for i in members)
            # slots: float32 cuts, or float64's finer ones where the raw path sends 8 bytes
            parts = _partitions(nbytes, int(prof.partition_bytes / max(1.0, ratio)))
            first.append(len(sizes))
            sizes += parts
            raw_ratio.append(ratio)
            ready += [at] * len(parts)
            prio += [pr] * len(parts)
            group_of += [g] * len(parts)
        self.group_of = np.array(group_of, np.int64)
        self.ready = np.array(ready, np.float64)
        self.sizes = np.array(sizes, np.float64)
        by_ready = np.argsort(self.ready, kind="stable").astype(np.int64)
        # group, priority, ready order; then each option's server and engine (filled below)
        self.ints = np.empty((3 + 2 * len(opts), len(sizes)), np.int64)
        self.ints[:3] = self.group_of, np.array(prio, np.int64), by_ready
        # payload, compress, decompress, serve, whether the slot starts a partition of the
        # option; per option and slot
        self.tables = np.empty((5, len(opts), len(sizes)))
        raw_add, L = prof.codecs["none"].add, prof.local_size
        # a peer's copy into its segment (from the device: the raw path's device-to-host copy)
        handover = none.decompress if prof.device == "cpu" else none.compress
        group_ratio = np.array(raw_ratio)[self.group_of]
        group_finest, first = np.maximum(1.0, group_ratio), np.array(first, np.int64)
        cuts: dict[object, tuple] = {}   # by the dtype an option's partitions are cut at
        for o, name in enumerate(opts):
            c = prof.codecs[name]
            raw = name == "none"
            # that dtype against float32: the members' on the raw path, float16 for
            # ``fp16_raw``, float32 for a codec
            wire = "raw" if raw else (c.payload_ratio if c.uncompressed else 1.0)
            if wire not in cuts:
                fp32, starts = _merged(self.sizes, self.group_of, first,
                                      np.rint(group_finest / (group_ratio if raw else wire)).astype(np.int64))
                # the bytes of a partition as this option takes it: a codec's float32, raw its dtype's
                b = fp32 * group_ratio if raw else fp32
                # the scheduler places the partitions as declared: at those bytes
                placed = np.empty((2, len(sizes)), np.int64)
                place_partitions(b, prof.servers, prof.engine_threads, placed[0], placed[1])
                cuts[wire] = b, starts, placed
            b, starts, self.ints[3 + 2 * o:5 + 2 * o] = cuts[wire]
            local_s = (L - 1) * (raw_add.fixed_s + raw_add.per_byte_s * b)   # an owner's sum of its peers' parts
            handover_s = handover.fixed_s + handover.per_byte_s * b
            # the raw path's compress: nothing on a host; the copy off the device on a GPU
            compress = 0.0 if raw and prof.device == "cpu" else c.compress.fixed_s + c.compress.per_byte_s * b
            self.tables[0, o] = b if raw else np.maximum(c.payload_ratio * b, 1.0)
            if L == 1:
                self.tables[1, o] = compress
            elif raw or c.uncompressed:
                # every worker's own part goes over as it travels (on a GPU its copy off the
                # device is the hand-over, on a host a copy into its segment); the owner adds
                # the L - 1 peers' parts (the servers' add of that payload)
                ratio = 1.0 if raw else c.payload_ratio
                peer = handover_s * ratio if prof.device == "cpu" else 0.0
                self.tables[1, o] = compress + (L - 1) * (c.add.fixed_s + c.add.per_byte_s * b + peer) / L
            else:  # the owner compresses the machine's sum of raw parts
                self.tables[1, o] = (compress + local_s + (L - 1) * handover_s) / L
            self.tables[2, o] = c.decompress.fixed_s + c.decompress.per_byte_s * b
            self.tables[3, o] = prof.pushers * (c.add.fixed_s + c.add.per_byte_s * b) + \
                (0.0 if raw else c.recompress.fixed_s + c.recompress.per_byte_s * b)
            self.tables[:4, o] *= starts   # a slot merged into the one before costs nothing
            self.tables[4, o] = starts
        self.job = np.array([prof.pushers, prof.servers, prof.engine_threads, prof.credit,
                             prof.link.bytes_per_s, prof.link.alpha_s, prof.message_s], np.float64)
        self._land = np.empty(len(sizes))
        self._group_land = np.empty(len(self.groups))
        self._work = np.empty(3)

    def predict(self, assignment: np.ndarray) -> float:
        """Seconds per iteration when group g travels with option ``options[assignment[g]]``."""
        prof = self.profile
        simulate_iteration(assignment, self.ints, self.ready, self.tables, self.job, self._land, self._work)
        t = finish_iteration(self.group_of, self._land, prof.backward_end_s, self._group_land) + prof.step_s
        return max(t, self.host_bound_s(self._work[0], self._work[1], self._work[2]))

    def host_bound_s(self, comm_s: float, served_s: float, pushed_bytes: float) -> float:
        """Rank 0's host's CPU work per iteration over its cores (0 where no CPU is shared):
        ``comm_s`` is one worker's communication thread's work, ``served_s`` every server's,
        ``pushed_bytes`` what one worker pushes (and pulls back). Each byte costs its sender's
        and its receiver's sockets ``wire_s_per_byte``: a worker moves 2 ``pushed_bytes``, a
        server 2 ``pushed_bytes`` x workers / servers."""
        h, prof = self.profile.host, self.profile
        if h is None:
            return 0.0
        # with local reduction a worker's sockets carry only the partitions it owns
        sockets = h.wire_s_per_byte * 2 * pushed_bytes * (h.workers / prof.local_size
                                                          + h.servers * prof.pushers / prof.servers)
        work = h.workers * (h.train_cpu_s + comm_s) + h.servers * served_s / prof.servers + sockets
        return work / h.cores

    def cpu_s(self) -> float:
        """The last ``predict``'s ``host_bound_s``: rank 0's host's CPU work per iteration over
        its cores (0 where no CPU is shared)."""
        return self.host_bound_s(self._work[0], self._work[1], self._work[2])

    def floor_s(self) -> float:
        """No plan of this grouping is faster: backward and the step (or the host's CPU for
        training alone, where it is shared and that is more)."""
        return max(self.profile.backward_end_s + self.profile.step_s,
                   self.host_bound_s(0.0, 0.0, 0.0))

    def landings(self) -> np.ndarray:
        """When each group landed in the last ``predict`` (s after the iteration started)."""
        return self._group_land.copy()


def _merged(sizes: np.ndarray, group_of: np.ndarray, first: np.ndarray, merge: np.ndarray,
           ) -> tuple[np.ndarray, np.ndarray]:
    """Slots taken ``merge[p]`` at a time within their group (``first[g]``: group g's first
    slot): (each slot's float32 bytes as the partition it starts, 0 where it starts none;
    1.0 where it starts one, else 0.0)."""
    if (merge == 1).all():
        return sizes, np.ones(len(sizes))
    k = np.arange(len(sizes)) - first[group_of]                     # the slot's place in its group
    starts = (k % merge == 0).astype(np.float64)
    ends = np.minimum(np.arange(len(sizes)) + merge, np.append(first[1:], len(sizes))[group_of])
    total = np.concatenate(([0.0], np.cumsum(sizes)))
    return (total[ends] - total[:len(sizes)]) * starts, starts


def _partitions(nbytes: int, partition_bytes: int) -> list[int]:
    if nbytes <= 0:
        return [0]
    full, rest = divmod(nbytes, partition_bytes)
    return [partition_bytes] * full + ([rest] if rest else [])


def predict(profile: Profile, groups: list[Group], options: list[str]) -> float:
    """Seconds per iteration for ``groups`` sent with ``options`` (one name per group)."""
    names = sorted(set(options))
    layout = Layout(profile, groups, names)
    return layout.predict(np.array([names.index(o) for o in options], np.int64))
