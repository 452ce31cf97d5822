"""The momentum path of OneBitAdam and ZeroOneAdam: which codecs it carries, the floored
denominator, and every accepted codec training through real processes."""
import json

import pytest
import torch

from cluster import LocalCluster
from gradpress.compressors.spec import CodecSpec
from gradpress.optim.momentum_codecs import floored_denominator, momentum_codec_problem

ONEBIT = {"compressor": "onebit", "scaling": "l2", "ef": "vanilla"}
CARRIED = {  # name -> compression_params the momentum path accepts ("none": the uncompressed baseline)
    "none": {"compressor": "none"},
    "onebit": ONEBIT,
    "topk": {"compressor": "topk", "k": 0.1, "ef": "vanilla"},
    "randomk": {"compressor": "randomk", "k": 0.1, "seed": 3, "ef": "corrected"},
    "dithering": {"compressor": "dithering", "s": 7},
    "dithering_ef": {"compressor": "dithering", "s": 7, "ef": "vanilla"},
}
# a codec's loss after 40 steps, as a fraction of its start, is below this (measured: 0.04-0.6;
# uncompressed 0.03-0.04; scaled randomk, refused now, 1e9 and more)
LOSS_BOUND = 0.75
REFUSED = {  # compression_params -> what the error must say
    "topk without ef": ({"compressor": "topk", "k": 0.01}, "needs error feedback"),
    "randomk without ef": ({"compressor": "randomk", "k": 0.01}, "needs error feedback"),
    "scaled randomk with ef": ({"compressor": "randomk", "k": 0.01, "scaling": True, "ef": "vanilla"},
                               "not contractive"),
    "scaled randomk without ef": ({"compressor": "randomk", "k": 0.1, "scaling": True}, "fed back through"),
    "onebit without scale": ({"compressor": "onebit", "ef": "vanilla"}, "needs 'scaling'"),
    "onebit scaling false": ({"compressor": "onebit", "scaling": False, "ef": "vanilla"}, "needs 'scaling'"),
    "worker momentum": ({**ONEBIT, "momentum": "nesterov"}, "worker momentum"),
}


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_momentum_path_carries(name):
    params = CARRIED[name]
    CodecSpec.from_params(params)  # a valid spec to begin with
    assert momentum_codec_problem(params) is None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_momentum_path_refuses(name):
    params, fragment = REFUSED[name]
    CodecSpec.from_params(params)  # valid compression_params: only the momentum path refuses them
    problem = momentum_codec_problem(params)
    assert problem is not None and fragment in problem, problem


def test_floored_denominator_bounds_the_step():
    v = torch.tensor([0.0, 1e-12, 4.0, 16.0])
    d = floored_denominator(v, 0.25, 1e-8)
    floor = 0.25 * float(v.sqrt().mean())
    assert torch.allclose(d, torch.tensor([floor, floor, 2.0, 4.0]) + 1e-8)
    assert torch.equal(floored_denominator(v, 0.0, 1e-8), v.sqrt() + 1e-8), "floor 0 is Adam's denominator"
    # the floor never reaches the host (on a GPU that read waits for the device, every
    # parameter of every ZeroOneAdam step): a meta tensor, whose values cannot be read, works
    assert floored_denominator(torch.empty(10, device="meta"), 0.25, 1e-8).shape == (10,)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):  # the same bits as the floor taken as a host float
        v = torch.rand(int(torch.randint(1, 3000, (1,), generator=g)), generator=g) ** 4
        want = v.sqrt()
        torch.clamp_(want, min=float(0.1 * want.mean()))
        assert torch.equal(floored_denominator(v, 0.1, 1e-8), want.add_(1e-8))


WORKER = """
import json, os, torch, gradpress.torch as bps
bps.init()
r = bps.rank()
client = bps.ops.client()
results = {}
for codec, params in json.loads(os.environ["GP_CODECS"]).items():
    for kind in ("OneBitAdam", "ZeroOneAdam"):
        torch.manual_seed(0)
        model = torch.nn.Linear(40, 30)
        teacher = torch.randn(40, 30, generator=torch.Generator().manual_seed(7)) * 0.3
        named = [(f"{codec}.{kind}.{n}", p) for n, p in model.named_parameters()]
        common = dict(lr=0.02, named_parameters=named, compression_params=params,
                      compression_rules=[("*bias", {"compressor": "none"})])
        if kind == "OneBitAdam":
            opt = bps.OneBitAdam(model.parameters(), freeze_step=5, **common)
        else:
            opt = bps.ZeroOneAdam(model.parameters(), var_freeze_step=20, var_update_scaler=2, local_step_scaler=5,
                                  local_step_clipper=4, variance_compression_params={"compressor": "fp16"}, **common)
        losses, compressed_bytes, synced, variance_bytes = [], [], [], []
        for step in range(40):
            g = torch.Generator().manual_seed(1000 * step + r)
            x = torch.randn(32, 40, generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
            loss.backward()
            before = client.bytes_pushed
            opt.step()
            losses.append(loss.item())
            if (kind == "OneBitAdam" and opt.frozen and step >= 5) or getattr(opt, "last_kind", "") == "momentum":
                compressed_bytes.append(client.bytes_pushed - before)
            if getattr(opt, "last_kind", "") == "variance":
                variance_bytes.append(client.bytes_pushed - before)
            if getattr(opt, "in_sync", True):
                synced.append(model.weight.detach().clone())
        results[f"{codec}/{kind}"] = {"losses": losses, "bytes": compressed_bytes, "synced": synced,
                                      "variance_bytes": variance_bytes}
torch.save(results, os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.pt"))
bps.shutdown()
"""


@pytest.mark.integ
def test_every_accepted_codec_trains_through_both_optimizers(tmp_path):
    """Each codec the path accepts, under OneBitAdam and ZeroOneAdam, for 40 steps of a
    regression: compressed steps push a fraction of the raw bytes (ZeroOneAdam's variance
    steps, fp16 here, exactly half), workers hold the same weights after every synchronising
    step, and the loss falls."""
    c = LocalCluster(tmp_path, workers=2, servers=1,
                     env={"BYTEPS_PARTITION_BYTES": "2048", "BYTEPS_MIN_COMPRESS_BYTES": "0"})
    try:
        c.start(WORKER, worker_env={"GP_CODECS": json.dumps(CARRIED)}).assert_success()
    finally:
        c.kill()
    results, other = (torch.load(tmp_path / f"w{r}.pt") for r in range(2))
    raw = 40 * 30 * 4
    assert len(results) == 2 * len(CARRIED)
    fallen = {name: sum(got["losses"][-3:]) / sum(got["losses"][:3]) for name, got in results.items()}
    print("loss after 40 steps / at the start:", {k: round(v, 3) for k, v in fallen.items()})
    for name, got in results.items():
        if name.startswith("none/"):  # the problem is learnable in 40 steps
            assert fallen[name] < 0.1, f"{name}: uncompressed, the loss only fell to {fallen[name]:.3g}"
            continue
        assert got["bytes"] and max(got["bytes"]) < raw / 3 + 30 * 4, f"{name}: the momentum went uncompressed"
        assert len(got["synced"]) >= 20 and all(
            torch.equal(a, b) for a, b in zip(got["synced"], other[name]["synced"])), \
            f"{name}: workers differ after a synchronising step"
        if name.endswith("ZeroOneAdam"):
            assert got["variance_bytes"] and set(got["variance_bytes"]) == {(40 * 30 + 30) * 2}, name
        assert fallen[name] < LOSS_BOUND, f"{name}: the loss only fell to {fallen[name]:.3g} of its start, " \
            f"uncompressed to {fallen['none/' + name.split('/')[1]]:.3g}"


def test_only_trainable_parameters_need_a_name():
    """As in BytePS: frozen parameters may be left out of named_parameters (fine-tuning);
    a trainable one left out, or a name given twice, is refused."""
    from gradpress.compressors.policy import CompressionPolicy
    from gradpress.pipeline import ParameterTable
    frozen, a, b = (torch.nn.Parameter(torch.zeros(n)) for n in (2, 3, 4))
    frozen.requires_grad_(False)
    table = ParameterTable([frozen, a, b], [("a", a), ("b", b)], CompressionPolicy())
    assert table.names[id(a)] == "a" and table.names[id(b)] == "b"
    missing = r"1 trainable parameter\(s\) of the optimizer are missing from named_parameters \(shapes \[\(4,\)\]"
    with pytest.raises(ValueError, match=missing):
        ParameterTable([frozen, a, b], [("a", a)], CompressionPolicy())
    with pytest.raises(ValueError, match="parameter names must be unique"):
        ParameterTable([frozen, a, b], [("a", a), ("a", b)], CompressionPolicy())


def test_a_float16_parameters_momentum_is_compressed_by_its_float32_bytes():
    """BYTEPS_MIN_COMPRESS_BYTES is compared with the bytes a tensor travels in: a float16
    parameter's gradient at 2 bytes an element, its OneBitAdam momentum (float32 state) at 4."""
    from gradpress.compressors.policy import CompressionPolicy
    from gradpress.optim.momentum_codecs import state_dtype
    from gradpress.pipeline import ParameterTable
    half, late = (torch.nn.Parameter(torch.zeros(1000, dtype=torch.float16)) for _ in range(2))
    policy = CompressionPolicy({"compressor": "onebit", "ef": "vanilla"}, min_bytes=3000)   # 2000 < 3000 < 4000
    grads = ParameterTable([half], [("h", half)], policy)
    momenta = grads.with_policy(policy, state_dtype)
    assert grads.spec[id(half)] is None and momenta.spec[id(half)] is not None
    momenta.adopt(late, "late")   # unfrozen after the optimizer was built
    assert momenta.spec[id(late)] is not None
    assert grads.with_policy(policy).spec[id(half)] is None
