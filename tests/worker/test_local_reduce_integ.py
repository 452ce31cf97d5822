"""Local reduction (issue 35) in real jobs: 2 machines x 3 local workers, 2 servers.

Every worker lands the same bits, and they are those of a replay of the two-level sum:
each machine's partition summed in numpy in local-rank order (float32, rounded to the
tensor's dtype), compressed once per machine by a compressor of its own (its error
feedback carried over the rounds), the machines' payloads summed and compressed by the
server's key (``KeyState``, the server's own rules), decoded and averaged. One peer's inf
(``OVERFLOW``) makes its machine's sum of one partition infinite: its owner pushes that
round ``nonfinite``, every worker of both machines lands NaN there, and every owner restarts
that key's error feedback. The servers see one push per machine, owners are spread evenly,
and ``GRADPRESS_LOCAL_REDUCE=0`` restores one push per worker.
"""
import json
import zlib

import numpy as np
import pytest

from gradpress.compressors.spec import CodecSpec
from gradpress.placement import make_key
from gradpress.errors import NonFiniteInput
from gradpress.server.store import KeyState, Payload, Refused

pytestmark = pytest.mark.integ
MACHINES, LOCAL, STEPS = 2, 3, 3
WORKERS = MACHINES * LOCAL
PART_BYTES = 4000
SIZES = {"one": 700, "many": 3500}  # one partition; four (the last one short)
CASES = {
    "none": None,
    "fp16": {"compressor": "fp16"},
    "onebit": {"compressor": "onebit", "ef": "vanilla", "scaling": True},
    "topk": {"compressor": "topk", "k": 0.1, "ef": "vanilla"},
    "randomk": {"compressor": "randomk", "k": 0.1, "ef": "vanilla", "seed": 5},
    "half": None,  # a float16 tensor, uncompressed: summed in float32 locally, as a server does
    "double": None,  # a float64 tensor, uncompressed: summed in float64
}
DTYPE = {"half": "float16", "double": "float64"}
# (worker, step, element) of an inf in the "many" tensor of the codecs with error feedback:
# a peer (local rank 1) of machine 1, in partition 1 (elements 1000 to 1999)
OVERFLOW = {"worker": 4, "step": 1, "element": 1500, "cases": ["onebit", "topk"]}

WORKER = """
import json, os, zlib, numpy as np
from gradpress.compressors.spec import CodecSpec
from gradpress.config import Settings
from gradpress.worker import WorkerClient
cases, sizes = json.loads(os.environ["GP_CASES"]), json.loads(os.environ["GP_SIZES"])
overflow = json.loads(os.environ["GP_OVERFLOW"])
steps, dtypes = int(os.environ["GP_STEPS"]), json.loads(os.environ["GP_DTYPES"])
c = WorkerClient(Settings.load(os.environ))
c.start()
r, n = c.rank, c.size
out = {}
for step in range(steps):
    futures = []
    for case, params in cases.items():
        spec = CodecSpec.from_params(params) if params else None
        for size_name, size in sizes.items():
            name = f"{case}.{size_name}"
            rng = np.random.default_rng([r, step, zlib.crc32(name.encode()), size])
            src = rng.standard_normal(size).astype(dtypes.get(case, "float32"))
            if (r, step, size_name) == (overflow["worker"], overflow["step"], "many") and case in overflow["cases"]:
                src[overflow["element"]] = np.inf
            dst = np.empty_like(src)
            divisor = 1 if case == "half" else n
            futures.append((name, c.push_pull_async(name, src, dst, divisor, 0, spec), dst))
    for name, fut, dst in futures:
        fut.result(60)
        out[f"{name}.{step}"] = dst
ids = {name: t.tensor_id for name, t in c.tensors.items()}
np.savez(os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.npz"), **out)
with open(os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.json"), "w") as fh:
    owned = [wk.key for t in c.tensors.values() for wk in t.keys if wk.pushers]
    json.dump({"ids": ids, "local": c.book.local_size, "pushed": c.bytes_pushed, "owned": owned,
               "handed": c.comm.stages.bytes_local}, fh)
c.finish()
"""


def _run(cluster, local_reduce: str = "1"):
    env = {"BYTEPS_PARTITION_BYTES": str(PART_BYTES), "BYTEPS_MIN_COMPRESS_BYTES": "0",
           "GRADPRESS_LOCAL_REDUCE": local_reduce}
    c = cluster(workers=MACHINES, servers=2, env=env)
    c.start_machines(WORKER, LOCAL, worker_env={"GP_CASES": json.dumps(CASES), "GP_SIZES": json.dumps(SIZES),
                                                "GP_STEPS": str(STEPS), "GP_DTYPES": json.dumps(DTYPE),
                                                "GP_OVERFLOW": json.dumps(OVERFLOW)})
    c.assert_success(150)
    outs = [dict(np.load(c.tmp / f"w{r}.npz")) for r in range(WORKERS)]
    info = [json.loads((c.tmp / f"w{r}.json").read_text()) for r in range(WORKERS)]
    return outs, info


def _bounds(case: str, size: int) -> list[int]:
    """Where the tensor's partitions start, and its end."""
    elems = PART_BYTES // np.dtype(DTYPE.get(case, "float32")).itemsize
    return list(range(0, size, elems)) + [size]


def _src(r: int, step: int, name: str, size: int, dtype: str) -> np.ndarray:
    src = np.random.default_rng([r, step, zlib.crc32(name.encode()), size]).standard_normal(size).astype(dtype)
    case, size_name = name.split(".")
    if (r, step, size_name) == (OVERFLOW["worker"], OVERFLOW["step"], "many") and case in OVERFLOW["cases"]:
        src[OVERFLOW["element"]] = np.inf
    return src


def _replay(case: str, size_name: str, tensor_id: int) -> list[np.ndarray]:
    """The aggregate every worker must land, per step."""
    params, size, dtype = CASES[case], SIZES[size_name], DTYPE.get(case, "float32")
    name = f"{case}.{size_name}"
    spec = CodecSpec.from_params(params) if params else None
    machine_codecs = [spec.build("worker") for _ in range(MACHINES)] if spec else []
    decoder = spec.build("worker") if spec else None
    bounds = _bounds(case, size)
    wide = np.float64 if dtype == "float64" else np.float32
    servers = {}
    results = []
    for step in range(STEPS):
        srcs = [_src(r, step, name, size, dtype) for r in range(WORKERS)]
        result = np.empty(size, dtype)
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            key = make_key(tensor_id, i)
            sums = []
            for m in range(MACHINES):  # the local stage: local rank 0 first, in float32 (float64)
                acc = srcs[m * LOCAL][lo:hi].astype(wide)
                for j in range(1, LOCAL):
                    acc += srcs[m * LOCAL + j][lo:hi]
                sums.append(acc.astype(dtype))
            if spec is None:
                total = sums[0].astype(wide) + sums[1]
                if dtype == "float16":
                    result[lo:hi] = total.astype(np.float16)
                else:
                    np.divide(total, WORKERS, out=result[lo:hi])
                continue
            state = servers.setdefault(key, KeyState(key, name, hi - lo, dtype, MACHINES,
                                                     compression_params=spec.compression_params))
            for m in range(MACHINES):
                try:
                    meta, buffers = machine_codecs[m].compress(sums[m], key=key, round=step, lr=None)
                except NonFiniteInput as e:  # its owner's push: no data, the round skipped
                    state.push(f"m{m}".encode(), step, Refused(str(e), overflow=True))
                    continue
                state.push(f"m{m}".encode(), step, Payload(meta, [np.ascontiguousarray(b).tobytes() for b in buffers]))
            (reply,) = state.pull(b"m0", step)
            if "nonfinite" in reply.fields:  # NaN on every worker, and every owner's state restarts
                result[lo:hi] = np.nan
                for codec in machine_codecs:
                    codec.restart(key)
                continue
            decoder.decompress(reply.fields["meta"], [memoryview(b) for b in reply.buffers], result[lo:hi],
                               key=key, round=step, divisor=WORKERS)
        results.append(result)
    return results


def test_sums_match_a_replay_of_the_two_level_sum_on_every_local_worker(cluster):
    outs, info = _run(cluster)
    assert all(i["local"] == LOCAL for i in info), info
    ids = info[0]["ids"]
    skipped = _replay("onebit", "many", ids["onebit.many"])[OVERFLOW["step"]]
    assert np.isnan(skipped[1000:2000]).all() and np.isfinite(np.delete(skipped, range(1000, 2000))).all()
    for case in CASES:
        for size_name in SIZES:
            name = f"{case}.{size_name}"
            expected = _replay(case, size_name, ids[name])
            for step in range(STEPS):
                want = expected[step]
                for r in range(WORKERS):
                    got = outs[r][f"{name}.{step}"]
                    assert got.tobytes() == want.tobytes(), (
                        f"{name} step {step} worker {r}: max difference {np.abs(got - want).max()} from the replay")
    # every key has exactly one owner on each machine, and the owners share the keys evenly
    every_key = {make_key(tid, i) for name, tid in ids.items()
                 for i in range(len(_bounds(name.split(".")[0], SIZES[name.split(".")[1]])) - 1)}
    for m in range(MACHINES):
        owned = [info[m * LOCAL + j]["owned"] for j in range(LOCAL)]
        assert sorted(k for keys in owned for k in keys) == sorted(every_key), f"machine {m}: owners {owned}"
        assert all(owned), f"machine {m}: a local worker owns no key: {owned}"
        for name, tid in ids.items():  # a tensor's partitions go round the owners
            counts = [sum(k >> 16 == tid for k in keys) for keys in owned]
            assert max(counts) - min(counts) <= 1, f"machine {m}: {name}'s partitions per owner {counts}"


def test_servers_see_one_push_per_machine_and_zero_restores_one_per_worker(cluster):
    outs, info = _run(cluster)
    flat_outs, flat = _run(cluster, local_reduce="0")
    assert all(i["local"] == 1 for i in flat), flat
    assert all(i["handed"] == 0 for i in flat), "with GRADPRESS_LOCAL_REDUCE=0 nothing goes through a local owner"
    pushed, flat_pushed = sum(i["pushed"] for i in info), sum(i["pushed"] for i in flat)
    # uncompressed tensors carry the same bytes per push: exactly one push per machine instead of per worker
    # (compressed ones differ a little per push; the total still shrinks by about LOCAL)
    assert pushed * LOCAL == pytest.approx(flat_pushed, rel=0.05), (pushed, flat_pushed)
    for r in range(WORKERS):  # each worker hands its raw values of the keys it does not own to their owner
        assert info[r]["handed"] > 0
    # the flat job's uncompressed sums are the plain sum of six workers, in the servers' order
    for size_name, size in SIZES.items():
        for step in range(STEPS):
            srcs = [_src(r, step, f"none.{size_name}", size, "float32") for r in range(WORKERS)]
            got = flat_outs[0][f"none.{size_name}.{step}"]
            np.testing.assert_allclose(got, np.sum(srcs, axis=0) / WORKERS, rtol=1e-5, atol=1e-6)
            assert all(o[f"none.{size_name}.{step}"].tobytes() == got.tobytes() for o in flat_outs)
