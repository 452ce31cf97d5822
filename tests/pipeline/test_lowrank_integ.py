"""PowerSGD and ACP-SGD in real jobs (gradpress/pipeline/lowrank.py), against a numpy replay.

Every worker's gradient is known exactly (the loss is sum(p * T) for random T per worker
and step), so the test replays both methods in numpy float32 (its own Gram-Schmidt, its own
products) and checks the system's averaged gradients against it to float32 rounding; that
every worker gets bit-identical gradients and the same first factors; that the shapes (1-D,
tiny, tall, wide, a 4-D kernel, a rank larger than a side, a matrix that is exactly zero)
travel the right way without a NaN; that the trace shows each method's rounds; that an
optimizer rebuilt from a checkpoint continues bit for bit (with 2 workers: a server's sum of
3 pushes depends on their order); and ACP-SGD on OneBitAdam's and ZeroOneAdam's momentum
paths (identical workers, resumed bit for bit).
"""
from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.integ
STEPS, SAVE_AT, RANK, RATE, SEED = 6, 3, 4, 0.9, 7
SHAPES = {"bias": (50,), "tiny": (4, 3), "tall": (300, 20), "wide": (20, 300), "conv": (16, 8, 3, 3),
          "side": (3, 1000), "zero": (40, 30)}
RAW = ["bias", "tiny"]  # 1-D, and tiny: rank 3 factors of 4 x 3 are not RATE times smaller

WORKER = f"""
import io, os, torch, gradpress.torch as bps
SHAPES, STEPS, SAVE_AT = {SHAPES!r}, {STEPS}, {SAVE_AT}
bps.init()
r = bps.rank()

def build(method):
    params = {{f"{{method}}.{{n}}": torch.nn.Parameter(torch.zeros(s)) for n, s in SHAPES.items()}}
    opt = bps.DistributedOptimizer(torch.optim.SGD(list(params.values()), lr=0.1),
                                   named_parameters=list(params.items()),
                                   compression_params=dict(compressor=method, rank={RANK},
                                                           min_compression_rate={RATE}, seed={SEED}))
    return params, opt

def run(params, opt, method, steps):
    out = []
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + r)
        targets = {{f"{{method}}.{{n}}": torch.randn(s, generator=g) for n, s in SHAPES.items() if n != "zero"}}
        opt.zero_grad()
        sum((params[n] * t).sum() for n, t in targets.items()).backward()  # "zero" gets no gradient
        opt.step()
        out.append({{n: p.grad.clone() for n, p in params.items()}})
    return out

result = {{}}
for method in ("powersgd", "acpsgd"):
    params, opt = build(method)
    grads = run(params, opt, method, [0])
    factors = opt._gradpress.lowrank.reducer.factors()
    grads += run(params, opt, method, range(1, SAVE_AT))
    saved = io.BytesIO()
    torch.save(opt.state_dict(), saved)
    grads += run(params, opt, method, range(SAVE_AT, STEPS))
    params2, opt2 = build(method)  # fresh parameters of the same names, the optimizer from the checkpoint
    saved.seek(0)
    opt2.load_state_dict(torch.load(saved))
    resumed = run(params2, opt2, method, range(SAVE_AT, STEPS))
    result[method] = {{"grads": grads, "factors": factors, "resumed": resumed,
                      "raw": [n for n, _, _ in opt._gradpress.lowrank.reducer.raw]}}

def onebit(state=None):  # OneBitAdam with ACP-SGD on the momentum after a 2-step warm-up
    lin = torch.nn.Linear(30, 20)
    if state is not None:
        lin.load_state_dict(state)
    opt = bps.OneBitAdam(lin.parameters(), lr=0.01, freeze_step=2, named_parameters=[
        (f"onebit.{{n}}", p) for n, p in lin.named_parameters()], compression_params=dict(compressor="acpsgd", rank=2))
    return lin, opt

def onebit_run(lin, opt, steps):
    out = []
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + r)
        x, y = torch.randn(8, 30, generator=g), torch.randn(8, 20, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(lin(x), y).backward()
        opt.step()
        out.append([p.detach().clone() for p in lin.parameters()])
    return out

torch.manual_seed(0)
lin, opt = onebit()
params = onebit_run(lin, opt, range(SAVE_AT))
saved, model_at = io.BytesIO(), {{k: v.clone() for k, v in lin.state_dict().items()}}
torch.save(opt.state_dict(), saved)
params += onebit_run(lin, opt, range(SAVE_AT, STEPS))
lin2, opt2 = onebit(model_at)
saved.seek(0)
opt2.load_state_dict(torch.load(saved))
reducer = opt._momenta.lowrank.reducer

def zero_one(state=None):  # ZeroOneAdam with ACP-SGD on the momentum and the synced updates
    lin = torch.nn.Linear(30, 20)
    if state is not None:
        lin.load_state_dict(state)
    opt = bps.ZeroOneAdam(lin.parameters(), lr=0.01, var_freeze_step=3, var_update_scaler=1, local_step_scaler=2,
                          local_step_clipper=2, named_parameters=[(f"zero_one.{{n}}", p) for n, p in
                                                                  lin.named_parameters()],
                          compression_params=dict(compressor="acpsgd", rank=2))
    return lin, opt

torch.manual_seed(0)
zlin, zopt = zero_one()
zparams = onebit_run(zlin, zopt, range(SAVE_AT))
zsaved, zmodel_at = io.BytesIO(), {{k: v.clone() for k, v in zlin.state_dict().items()}}
torch.save(zopt.state_dict(), zsaved)
zparams += onebit_run(zlin, zopt, range(SAVE_AT, STEPS))
zlin2, zopt2 = zero_one(zmodel_at)
zsaved.seek(0)
zopt2.load_state_dict(torch.load(zsaved))
result["zero_one"] = {{"params": zparams, "resumed": onebit_run(zlin2, zopt2, range(SAVE_AT, STEPS)),
                      "reducers": sorted(pipe.lowrank.reducer.prefix for pipe in (zopt._momenta, zopt._deltas)
                                    if pipe.lowrank is not None)}}
refused = []  # where a step's matrices are not at hand: a clear error, before anything travels
from gradpress.torch.parallel import DistributedDataParallel
for attempt in (lambda: DistributedDataParallel(torch.nn.Linear(4, 4), compression_params=dict(compressor="acpsgd")),
                lambda: bps.push_pull(torch.zeros(3), name="x", compression_params=dict(compressor="powersgd"))):
    try:
        attempt()
        refused.append(None)
    except ValueError as e:
        refused.append(str(e))
result["refused"] = refused
result["onebit"] = {{"params": params, "resumed": onebit_run(lin2, opt2, range(SAVE_AT, STEPS)),
                    "steps": reducer.step, "matrices": [m.name for m in reducer.matrices]}}
torch.save(result, os.path.join(os.environ["GP_TEST_DIR"], f"w{{r}}.pt"))
bps.shutdown()
"""


def orth(vectors: np.ndarray) -> np.ndarray:
    """Modified Gram-Schmidt on the rows of ``vectors`` (float64 dots, float32 updates); a zero or
    dependent vector (what remains is below 1e-4 of its norm) becomes zero."""
    v = vectors.astype(np.float32).copy()
    for k in range(v.shape[0]):
        before = np.sqrt(np.sum(v[k].astype(np.float64) ** 2))
        for j in range(k):
            v[k] -= np.float32(np.dot(v[k].astype(np.float64), v[j].astype(np.float64))) * v[j]
        norm = np.sqrt(np.sum(v[k].astype(np.float64) ** 2))
        v[k] = 0.0 if norm == 0 or norm <= 1e-4 * before else v[k] * np.float32(1.0 / norm)
    return v


def replay(method: str, workers: int) -> list[dict[str, np.ndarray]]:
    """Each step's averaged gradient per tensor name, computed the way the method defines it."""
    names = [f"{method}.{n}" for n in SHAPES]
    mats = {n: (SHAPES[n.split(".")[1]][0], int(np.prod(SHAPES[n.split(".")[1]][1:]))) for n in names
            if n.split(".")[1] not in RAW}
    rank = {n: min(RANK, *mats[n]) for n in mats}
    error = {n: [np.zeros(mats[n], np.float32) for _ in range(workers)] for n in mats}
    qt = {}
    for n in mats:  # the seeded first Q, as every worker draws it
        g = torch.Generator().manual_seed(SEED * 1_000_003 + zlib.crc32(n.encode()))
        qt[n] = orth(torch.randn(rank[n], mats[n][1], generator=g).numpy())
    p = {}
    out = []
    for step in range(STEPS):
        grads = []
        for w in range(workers):
            g = torch.Generator().manual_seed(1000 * step + w)
            t = {f"{method}.{k}": torch.randn(s, generator=g).numpy() for k, s in SHAPES.items() if k != "zero"}
            t[f"{method}.zero"] = np.zeros(SHAPES["zero"], np.float32)
            grads.append(t)
        avg = {}
        for n in names:
            if n not in mats:
                avg[n] = sum(gr[n] for gr in grads) / np.float32(workers)
                continue
            x = [grads[w][n].reshape(mats[n]) + error[n][w] for w in range(workers)]
            if method == "powersgd":
                p[n] = orth(sum(xi @ qt[n].T for xi in x).T).T
                own = [p[n].T @ xi for xi in x]
                error[n] = [xi - p[n] @ q for xi, q in zip(x, own)]
                qt[n] = sum(own)
            elif step % 2 == 0:  # ACP-SGD, P step
                qt[n] = orth(qt[n])
                own = [xi @ qt[n].T for xi in x]
                error[n] = [xi - pi @ qt[n] for xi, pi in zip(x, own)]
                p[n] = sum(own)
            else:  # ACP-SGD, Q step
                p[n] = orth(p[n].T).T
                own = [p[n].T @ xi for xi in x]
                error[n] = [xi - p[n] @ q for xi, q in zip(x, own)]
                qt[n] = sum(own)
            avg[n] = (p[n] @ qt[n] / np.float32(workers)).reshape((-1,) + SHAPES[n.split(".")[1]][1:])
        out.append(avg)
    return out


@pytest.mark.parametrize("workers,servers", [(2, 1), (3, 2)])
def test_lowrank_matches_replay_and_resumes_bit_for_bit(cluster, tmp_path, workers, servers):
    job = cluster(workers=workers, servers=servers, env={"GRADPRESS_TRACE": str(tmp_path / "trace.json")})
    job.start(WORKER, {"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    job.assert_success(timeout_s=120)
    events = json.loads((tmp_path / "trace-worker0.json").read_text())["traceEvents"]
    spans = {e["name"] for e in events if e["ph"] == "X"}
    for name in ("powersgd round P", "powersgd round Q", "acpsgd round P", "acpsgd round Q", "acpsgd factors",
                 "acpsgd reconstruct"):
        assert name in spans, f"trace: no {name!r} span"
    results = [torch.load(job.tmp / f"w{r}.pt") for r in range(workers)]
    for method in ("powersgd", "acpsgd"):
        mine = [res[method] for res in results]
        assert mine[0]["raw"] == [f"{method}.{n}" for n in RAW], f"{method}: uncompressed tensors {mine[0]['raw']}"
        for other in mine[1:]:
            for name, (p0, q0) in mine[0]["factors"].items():
                p1, q1 = other["factors"][name]
                assert torch.equal(p0, p1) and torch.equal(q0, q1), f"{method}: first factors of {name} differ"
            for step, (a, b) in enumerate(zip(mine[0]["grads"], other["grads"])):
                for name in a:
                    assert torch.equal(a[name], b[name]), f"{method} step {step}: {name} differs between workers"
        expected = replay(method, workers)
        for step, (got, want) in enumerate(zip(mine[0]["grads"], expected)):
            for name, ref in want.items():
                g = got[name].numpy()
                assert g.shape == ref.shape and np.isfinite(g).all(), f"{method} step {step}: {name}"
                scale = max(1.0, float(np.abs(ref).max()))
                err = float(np.abs(g - ref).max())
                assert err <= 2e-4 * scale, f"{method} step {step}: {name} off the replay by {err:.3g} ({scale:.3g})"
        assert all((step[f"{method}.zero"] == 0).all() for step in mine[0]["grads"]), f"{method}: zero matrix"
        check_resumed(mine[0]["grads"][SAVE_AT:], mine[0]["resumed"], workers, method)
    ddp, push_pull = results[0]["refused"]
    assert ddp and "use DistributedOptimizer" in ddp and "acpsgd" in ddp, ddp
    assert push_pull and "through DistributedOptimizer" in push_pull and "powersgd" in push_pull, push_pull
    onebit = [res["onebit"] for res in results]  # ACP-SGD on OneBitAdam's momentum path
    assert onebit[0]["matrices"] == ["onebit.weight"] and onebit[0]["steps"] == STEPS - 2
    for other in onebit[1:]:
        for step, (a, b) in enumerate(zip(onebit[0]["params"], other["params"])):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), f"OneBitAdam: parameters differ at step {step}"
    assert all(torch.isfinite(x).all() for step in onebit[0]["params"] for x in step)
    check_resumed([dict(enumerate(s)) for s in onebit[0]["params"][SAVE_AT:]],
                  [dict(enumerate(s)) for s in onebit[0]["resumed"]], workers, "OneBitAdam")
    zero_one = [res["zero_one"] for res in results]  # ZeroOneAdam: its momentum steps factored
    assert any(p.startswith("ZeroOneAdam.momentum.") for p in zero_one[0]["reducers"]), zero_one[0]["reducers"]
    assert all(torch.isfinite(x).all() for step in zero_one[0]["params"] for x in step)
    check_resumed([dict(enumerate(s)) for s in zero_one[0]["params"][SAVE_AT:]],
                  [dict(enumerate(s)) for s in zero_one[0]["resumed"]], workers, "ZeroOneAdam")


def check_resumed(first, resumed, workers: int, what: str) -> None:
    for step, (a, b) in enumerate(zip(first, resumed)):
        for name in a:
            # a server adds 2 pushes in either order to the same bits; 3 in arrival order (float32
            # addition is not associative), so with 3 workers a rerun matches to rounding only
            same = torch.equal(a[name], b[name]) if workers == 2 else torch.allclose(a[name], b[name], 1e-4, 1e-5)
            assert same, f"{what}: resumed run differs at step {SAVE_AT + step} ({name})"
