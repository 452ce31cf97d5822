"""Run by test_lanes_cuda.py with NUMBA_ENABLE_CUDASIM=1: a worker's two CUDA streams (the
push lane and the landing lane, kernels/cuda/streams.py) and the scratch kept per lane;
prints one JSON line per case ("problem" empty when it holds)."""
import json
import os
import sys

import numpy as np

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run under the CUDA simulator"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

import simulated  # noqa: E402

simulated.prepare()  # before any kernel runs

from numba import cuda  # noqa: E402

from gradpress.compressors import build_compressor  # noqa: E402
from gradpress.kernels.cuda import scratch, streams, uploads  # noqa: E402

x = cuda.to_device(np.arange(8, dtype=np.float32))


def cases():
    with streams.working_on(x):
        push, push_scratch = streams.stream(), scratch.device_array((16,), np.uint8)
        with streams.working_on(x, landing=True):
            landing, landing_scratch = streams.stream(), scratch.device_array((16,), np.uint8)
            lane = streams.current_lane()
        after, lane_after = streams.stream(), streams.current_lane()
        again = scratch.device_array((16,), np.uint8)
    yield "streams-apart", "" if push is not landing else "the landing lane shares the push stream"
    yield "lane-named", "" if (lane, lane_after) == (streams.LANDING, streams.PUSH) else f"lanes {lane}, {lane_after}"
    yield "lane-restored", "" if after is push else "leaving a landing left the landing stream current"
    yield "scratch-per-lane", "" if landing_scratch is not push_scratch else "one scratch array on both streams"
    yield "scratch-reused", "" if again is push_scratch else "the push lane's scratch was not reused"
    # a decode into a device array (on the landing lane) between two encodes of the key
    rng = np.random.default_rng(3)
    for codec in ({"compressor": "topk", "k": 0.25}, {"compressor": "onebit", "scaling": True},
                  {"compressor": "dithering", "s": 7}):
        worker, reference = build_compressor(codec, "worker"), build_compressor(codec, "worker")
        problem = ""
        for rnd in range(3):
            g = rng.standard_normal(64).astype(np.float32)
            meta, buffers = worker.compress(cuda.to_device(g), key=1, round=rnd)
            out, want = cuda.device_array(64, np.float32), np.empty(64, np.float32)
            worker.decompress(meta, buffers, out, key=1, round=rnd, divisor=2)
            ref_meta, ref_buffers = reference.compress(g, key=1, round=rnd)
            reference.decompress(ref_meta, ref_buffers, want, key=1, round=rnd, divisor=2)
            if out.copy_to_host().tobytes() != want.tobytes():
                problem = f"round {rnd}: the device decode differs from the host's"
        yield f"decode/{codec['compressor']}", problem


def upload_cases():
    """Pulled payloads through pinned staging (``uploads``): the frame may be rewritten once
    the call returns; a stage the device has read is reused by its role's next payload of the
    same size class, one per lane and role, and never shared with a larger class."""
    frame = np.arange(100, dtype=np.float32)

    def kinds():  # (device, lane, role, size class) of each stage made, without its turn
        return {key[:-1] for key in uploads._local.__dict__.get("stages", {})}
    earlier = kinds()  # the decodes' above
    with streams.working_on(x, landing=True):
        first = uploads.upload(frame, "test-role")
        frame[:] = -1  # the pulled frame's memory goes back to ZeroMQ
        landed = first.copy_to_host()
        stages = uploads._local.stages
        before = {key: stage.host for key, stage in stages.items()}
        uploads.upload(np.ones(90, np.float32), "test-role")          # 360 bytes: 400's class (512)
        reused = {key: stage.host for key, stage in stages.items()} == before
        uploads.upload(np.ones(200, np.float32), "test-role")         # 800 bytes: a class of its own
        uploads.upload(np.ones(90, np.float32), "other-role")
        count = len(kinds() - earlier)
    with streams.working_on(x):
        pushed = uploads.upload(np.arange(100, dtype=np.float32), "test-role").copy_to_host()
        lanes = len(kinds() - earlier) - count
    yield "upload/bytes", "" if landed.tobytes() == np.arange(100, dtype=np.float32).tobytes() else \
        f"the device got {landed[:4]}: the frame was read after the call returned"
    yield "upload/stage-reused", "" if reused else "a payload of the same size class took a new stage"
    yield "upload/stage-per-class-and-role", "" if count == 3 else f"{count} kinds of stage for 3 classes and roles"
    yield "upload/stage-per-lane", "" if lanes == 1 and pushed.tobytes() == np.arange(100, dtype=np.float32).tobytes() \
        else f"the push lane took {lanes} new kinds of stage (1 expected), or its bytes differ"


def back_to_back_cases():
    """A tensor's partitions landing one after another (their servers' replies read in one
    turn of the loop): no upload waits on the host for the copy of the one before it (the
    simulator's copies end at once: these events stay pending until waited for)."""
    class Pending:
        def __init__(self):
            self.pending, self.waited = False, 0

        def record(self, stream):
            self.pending = True

        def synchronize(self):
            self.waited += self.pending
            self.pending = False

        def query(self):
            return not self.pending
    made, real = [], uploads._Stage

    class Stage(real):
        def __init__(self, nbytes):
            super().__init__(nbytes)
            self.done = Pending()
            made.append(self)
    uploads._Stage = Stage
    try:
        with streams.working_on(x, landing=True):
            for part in range(uploads._TURNS):
                uploads.upload(np.full(1000, part, np.float32), "back-to-back")
    finally:
        uploads._Stage = real
    waits = sum(stage.done.waited for stage in made)
    yield "upload/back-to-back", "" if waits == 0 else f"{waits} host waits for the previous partition's copy"
    for stage in made:  # the device has read them all: one buffer serves uploads one at a time
        stage.done.pending = False
    uploads._Stage = Stage
    try:
        with streams.working_on(x, landing=True):
            for part in range(3 * uploads._TURNS):
                uploads.upload(np.full(1000, part, np.float32), "one-at-a-time")
                made[-1].done.pending = False
    finally:
        uploads._Stage = real
    used = len([key for key in uploads._local.stages if key[2] == "one-at-a-time"])
    yield "upload/one-at-a-time", "" if used == 1 else f"{used} buffers for uploads the device read one by one"


for name, problem in list(cases()) + list(upload_cases()) + list(back_to_back_cases()):
    print(json.dumps({"case": name, "problem": problem}), flush=True)
