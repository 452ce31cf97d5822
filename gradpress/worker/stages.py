"""The stages a partition goes through on a worker, one method each (after BytePS's
``core_loops.cc``): compress -> push -> pull -> land.

A compressed key's pipeline is compress, push (frames), pull, land (decompress); an
uncompressed one skips compress and, with a server on the same host, pushes through
shared memory and lands from the server's result slot. An uncompressed CUDA tensor's
partitions move by DMA: the device copies straight into the shared push segment (a chunk
registered with the driver) or into a pinned buffer of the key's own, and the result goes
back to the device at its size and is divided there. Which stages a partition takes is
decided by its key (codec, co-location), not by branches in the caller.
All of it runs on the communication thread, which owns the sockets; only the waits for
copies off a GPU happen elsewhere (``host_copies.py``).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import zmq

from ..compressors.arrays import is_device_array
from ..net import shm, transport
from ..net.protocol import Op
from ..trace import Tracer, now_us
from . import nonfinite, raw_results, sparse
from .host_copies import HostCopies, end_gpu_work
from .jobs import PartitionOp
from .keys import WorkerKey

Payload = tuple[dict[str, Any], list[Any]]  # header fields and data buffers of a PUSH
DRAIN_S = 4.0  # at the job's end, how long the GPU's queued work may take (the client waits for it)


class PartitionStages:
    def __init__(self, sender: str, servers: list[zmq.Socket], local: list[bool], tracer: Tracer,
                 host_copies: HostCopies):
        self.sender = sender
        self.host_copies = host_copies  # waits for copies off the GPU, off this thread
        self.servers = servers
        self.local = local          # per server: same host, so uncompressed keys use shared memory
        self.tracer = tracer
        self.bytes_pushed = 0       # payload bytes (compressed size where compressed)
        self.bytes_pulled = 0
        self.bytes_local = 0        # raw values handed to the owners of keys we do not own (local.py)
        self.push_arena = shm.Arena("w")        # our push areas, one region per shared key
        self.device_arenas: dict[Any, shm.Arena] = {}  # the same for CUDA tensors, registered for DMA, by device
        self.host_stages: dict[int, np.ndarray] = {}    # key -> pinned buffer of a CUDA key pushed as frames
        self.peer_chunks = shm.PeerChunks()     # the servers' result slots, mapped

    @staticmethod
    def endpoint(wk: WorkerKey) -> int:
        """The socket of ``wk``'s pushes and pulls (``WorkerKey.endpoint``)."""
        return wk.endpoint

    def _shared(self, wk: WorkerKey) -> bool:
        # compressed payloads are small; sparse ones change size every round; a local owner
        # takes raw values whatever the codec
        return (self.local[self.endpoint(wk)] and wk.tensor.layout is None
                and (wk.tensor.compressor is None or wk.via is not None))

    # ---- before the first push of a key ----------------------------------------

    def introduce(self, wk: WorkerKey, source: Any = None) -> None:
        """INIT_KEY once per key (naming our shared push segment), then any checkpointed server
        state. ``source`` is the tensor pushed: a CUDA one gets a segment registered for DMA."""
        sock, t = self.servers[self.endpoint(wk)], wk.tensor
        if wk.via is not None:
            wk.state_to_load = None  # the key's owner restores the server's state (torch/elastic.py)
        if not wk.inited:
            extra: dict[str, Any] = {"compression_params": t.spec.compression_params} \
                if t.spec and wk.via is None else {}
            if wk.pushers:
                extra["pushers"] = wk.pushers
            if t.layout is not None:
                extra["sparse"] = t.layout.wire()
            if self._shared(wk):
                arena = self._device_arena(source) if is_device_array(source) else self.push_arena
                wk.push_region = region = arena.alloc(wk.count * np.dtype(t.dtype).itemsize)
                wk.push_view = region.array(t.dtype, wk.count)
                extra["shm"] = region.ref
                if is_device_array(source):  # we register the result slots too: the server never punches them
                    extra["dma"] = True
            transport.send(sock, Op.INIT_KEY, self.sender, key=wk.key, name=t.name, count=wk.count,
                           dtype=t.dtype, **extra)
            wk.inited = True
        if wk.state_to_load is not None:
            residual, lr = wk.state_to_load
            wk.state_to_load = None
            transport.send(sock, Op.STATE, self.sender, [np.ascontiguousarray(residual, np.float32)],
                           key=wk.key, **({} if lr is None else {"lr": float(lr)}))

    def _device_arena(self, source: Any) -> shm.Arena:
        from ..kernels.cuda import device
        where = getattr(source, "device", None)
        if where not in self.device_arenas:
            # the device alone: the first gradient pushed would be kept as long as the arena
            def pin(chunk: shm.Chunk, on=SimpleNamespace(device=where)) -> Any:
                with device.on_device_of(on):
                    return device.pin_host(chunk.map, chunk.nbytes)
            self.device_arenas[where] = shm.Arena("w", pin=pin)
        return self.device_arenas[where]

    def forget(self, tensors: list) -> None:
        """Released tensors: their shared push segments go back to their arena (every round
        of them has been pulled, so the servers have read them)."""
        for t in tensors:
            for wk in t.keys:
                self.host_stages.pop(wk.key, None)
                if wk.push_region is not None:
                    arena = next((a for a in self.device_arenas.values() if wk.push_region.chunk in a.chunks),
                                 self.push_arena)
                    arena.free(wk.push_region)
                    wk.push_region = wk.push_view = None

    # ---- the stages ---------------------------------------------------------------

    def compress(self, op: PartitionOp) -> Payload | None:
        """The compressed payload of a compressed key (None otherwise).

        Raises:
            ValueError: the input cannot be compressed (NaN/inf); the compressor's state is unchanged.
        """
        job, t = op.job, op.job.tensor
        self.await_source(job)
        if t.layout is not None:  # a row-sparse share: its indices and values
            return sparse.push_payload(op)
        if t.compressor is None or op.wkey.via is not None:  # to a local owner: raw values
            return None
        early = job.early_payload(op.wkey, op.round)  # made with the tensor's other partitions
        if early is not None:
            return early
        start = now_us()
        chunk = op.chunk
        if is_device_array(chunk):  # on the tensor's own GPU (not device 0), on gradpress's stream there
            from ..kernels.cuda.device import working_on
            with working_on(chunk):
                meta, buffers = t.compressor.compress(chunk, key=op.wkey.key, round=op.round, lr=op.job.lr)
        else:
            meta, buffers = t.compressor.compress(chunk, key=op.wkey.key, round=op.round, lr=op.job.lr)
        self.tracer.add("compress", start, now_us(), key=op.wkey.key, round=op.round)
        return _wire(t, meta, buffers)

    @staticmethod
    def compresses_together(job) -> bool:
        """Whether ``job``'s tensor may have its partitions compressed at once: a CUDA tensor
        whose compressor can (``compress_partitions``)."""
        return getattr(job.tensor.compressor, "compress_partitions", None) is not None and is_device_array(job.src)

    @staticmethod
    def encodes_on_device(op: PartitionOp) -> bool:
        """Whether ``op``'s compress runs an encoder on a GPU (and ends waiting for its
        payload's copy): a CUDA chunk through a codec, its payload not made already."""
        job, wk = op.job, op.wkey
        return (job.tensor.compressor is not None and job.tensor.layout is None and wk.via is None
                and not (job.compressed and wk.key in job.compressed) and is_device_array(job.src))

    def compress_tensor(self, job, rounds: list[int]) -> None:
        """Compress all of ``job``'s CUDA tensor's partitions at once (``compresses_together``),
        key i in round ``rounds[i]``, each payload kept in ``job.compressed`` for its turn. The
        flight marked every key as this job's (``compressed_by``); where the compressor
        declines, the keys go key by key, and each is unmarked at its own compress."""
        t = job.tensor
        self.await_source(job)
        start = now_us()
        from ..kernels.cuda.device import working_on
        with working_on(job.src):
            payloads = t.compressor.compress_partitions(job.src, [wk.key for wk in t.keys], t.parts[0], lr=job.lr,
                                                        rounds=rounds)
        if payloads is None:
            return
        self.tracer.add("compress", start, now_us(), key=t.keys[0].key, round=rounds[0])
        for wk, made_for, payload in zip(t.keys, rounds, payloads):
            job.compressed[wk.key] = (made_for, payload if isinstance(payload, ValueError) else _wire(t, *payload))

    @staticmethod
    def refusal(reason: str) -> Payload:
        """The push of a round this worker's codec refused (``reason``): no data; the server
        fails the round for every worker with it (server/store.py)."""
        return {"refused": reason}, []

    @staticmethod
    def await_source(job) -> None:
        """Order what reads ``job.src`` after what fills it (``job.ready``, once per job): a
        CUDA tensor's producer event is waited for by gradpress's stream on the device (no
        host wait); a host buffer filled by an asynchronous copy, by this thread."""
        if job.ready is None:
            return
        ready, job.ready = job.ready, None
        from ..kernels.cuda import device, streams
        if is_device_array(job.src):
            device.wait_for(ready, job.src)
        else:
            with streams.on_event_device(ready):  # its GPU current: not a context on GPU 0
                ready.synchronize()

    def send(self, op: PartitionOp, payload: Payload | None) -> None:
        """Push ``op``'s round and pull it, in one message (a PUSH with ``pull``: one send,
        and one message for the server to take, instead of two). A CUDA chunk's raw values
        are first copied to the host (the shared push segment, or the key's pinned buffer)
        without waiting: its push goes once the copy is done (``HostCopies``), while this
        thread goes on."""
        chunk = op.chunk if payload is None else None  # (a sparse share has a payload and no chunk)
        if is_device_array(chunk):
            wk = op.wkey
            host = wk.push_view if wk.push_view is not None else self._host_stage(wk, chunk)
            self.host_copies.copy(chunk, host, lambda: self._send_copied(op, host), wk.describe)
            return
        self._push(op, payload, chunk)

    def _send_copied(self, op: PartitionOp, host: np.ndarray) -> None:
        if op.wkey.in_flight is not op:
            return  # failed meanwhile (its deadline passed): the round never goes out
        self._push(op, None, host)

    def _push(self, op: PartitionOp, payload: Payload | None, values: Any) -> None:
        wk, t = op.wkey, op.job.tensor
        fields: dict[str, Any] = {"key": wk.key, "round": op.round, "dtype": t.dtype, "count": wk.count,
                                  "pull": True}
        if op.job.lr is not None:
            fields["lr"] = float(op.job.lr)
        sock = self.servers[self.endpoint(wk)]
        if payload is not None:
            extra, buffers = payload
            transport.send(sock, Op.PUSH, self.sender, buffers, **{**fields, **extra})  # sparse: its own count
            self._count_push(wk, sum(b.nbytes for b in buffers))
        elif wk.push_view is not None:
            if values is not wk.push_view:
                np.copyto(wk.push_view, values)
            transport.send(sock, Op.PUSH, self.sender, shm=True, **fields)
            self._count_push(wk, wk.push_view.nbytes)
        else:
            transport.send(sock, Op.PUSH, self.sender, [values], **fields)
            self._count_push(wk, values.nbytes)
        op.sent_us = now_us()

    def _count_push(self, wk: WorkerKey, nbytes: int) -> None:
        if wk.via is None:
            self.bytes_pushed += nbytes
        else:
            self.bytes_local += nbytes

    def land(self, op: PartitionOp, h: dict, frames: list) -> None:
        """Write the pulled aggregate (divided by the job's divisor) into the job's output.

        Raises:
            ValueError, OSError, TypeError, KeyError: a reply that does not fit the key.
        """
        wk, job, t = op.wkey, op.job, op.job.tensor
        self.tracer.add("push to reply", op.sent_us, now_us(), key=wk.key, round=op.round)
        if t.layout is not None:
            sparse.land(op, h, frames)
            self.bytes_pulled += sum(len(f.buffer) for f in frames)
            return
        if h["dtype"] != t.dtype or h["count"] != wk.count:
            raise ValueError(f"{h['count']} {h['dtype']} elements, expected {wk.count} {t.dtype}")
        dst = op.destination
        if "nonfinite" in h and t.compressor is not None and not frames:  # a skipped round
            nonfinite.land(op, h)
        elif t.compressor is not None:
            if h.get("codec") != t.compressor.name or "meta" not in h:
                raise ValueError(f"encoded as {h.get('codec', 'raw values')!r}, expected {t.compressor.name!r}")
            start = now_us()
            # averaged as it lands: a second pass over dst was 20% of the pulls' CPU
            t.compressor.decompress(h["meta"], [f.buffer for f in frames], dst, key=wk.key, round=op.round,
                                    divisor=job.divisor)
            self.tracer.add("decompress", start, now_us(), key=wk.key, round=op.round)
        else:
            summed = raw_results.result_of(h, frames, wk.count, t.dtype, self.peer_chunks)
            raw_results.land(summed, dst, job.divisor, h, self.peer_chunks)
        if wk.via is None:
            self.bytes_pulled += sum(len(f.buffer) for f in frames)

    def _host_stage(self, wk: WorkerKey, chunk: Any) -> np.ndarray:
        """The key's pinned host buffer (in ``chunk``'s GPU's context), which its CUDA chunk is
        copied into. A round's buffer is reused only by the key's next round, which starts
        after this one's pull came back (the server had read the push by then)."""
        buffer = self.host_stages.get(wk.key)
        if buffer is None:
            from ..kernels.cuda import device
            buffer = self.host_stages[wk.key] = device.pinned_host(wk.count, np.dtype(wk.tensor.dtype), chunk)
        return buffer

    def close(self) -> None:
        chunks = [c for a in self.device_arenas.values() for c in a.chunks] + self.peer_chunks.mapped()
        end_gpu_work(self.host_copies, [c for c in chunks if c.pinned], DRAIN_S)
        self.push_arena.close()  # the memory itself goes with the last mapping
        for arena in self.device_arenas.values():
            arena.close()


def _wire(t, meta: dict, buffers: list) -> Payload:  # a compressed push's fields and buffers
    return {"codec": t.compressor.name, "meta": meta}, buffers

