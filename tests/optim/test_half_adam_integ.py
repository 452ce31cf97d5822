"""OneBitAdam and ZeroOneAdam on a float16 or bfloat16 model (its parameters of that dtype,
not AMP, but for one float32 parameter amid them), two real workers. Adam's state in float16
does not work:
eps = 1e-8 is 0 there and ``g * g`` is 0 for every |g| below 2.4e-4, so a coordinate gets
an infinite step and the first compressed momentum is refused ("error feedback met
NaN/inf"). The optimizers keep a float16 parameter's state in float32, as 1-bit Adam's
float32 optimizer state does in DeepSpeed; the model trains, the workers agree, and a
checkpoint keeps the float32 state bit for bit (torch's ``load_state_dict`` would cast it
to the parameter's float16). In bfloat16 the variance never decays (``0.999 * v`` rounds
back to ``v``): its state is float32 too. The multi-tensor path a GPU takes, run here over a list per
dtype (the float32 parameter's list after the float16 ones'), gives the same bits."""
import pytest
import torch
from adam_jobs import PREAMBLE

pytestmark = pytest.mark.integ

WORKER = PREAMBLE + """
for opt_name in ("OneBitAdam", "ZeroOneAdam"):
    for reload, whole in ((False, False), (True, False), (False, True)):
        # whole lists: the chunks a GPU's parameters get (float16 parameters, float32 state, in one op)
        lists(whole)
        torch.manual_seed(0)
        half = getattr(torch, os.environ["GP_HALF"])
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), Scale(32), torch.nn.Linear(32, 4))
        model = model.to(half)
        model[2].s = torch.nn.Parameter(torch.ones(32))  # one float32 parameter amid half ones
        named = [(f"{opt_name}.{reload}.{whole}.{n}", p) for n, p in model.named_parameters()]
        params = [p for _, p in named]
        opt = build(opt_name, params, named, 3)
        g = torch.Generator().manual_seed(7)
        x_eval = torch.randn(64, 16, generator=g).to(half)
        y_eval = torch.tanh(x_eval.float() @ torch.randn(16, 4, generator=g))
        def loss_of(x, y):
            return torch.nn.functional.mse_loss(model(x).float(), y)
        losses, steps, kinds = [loss_of(x_eval, y_eval).item()], [], []
        for step in range(14):
            if reload and step == 7:  # a checkpoint through bytes, loaded into the same optimizer
                buf = io.BytesIO()
                torch.save(opt.state_dict(), buf)
                buf.seek(0)
                opt.load_state_dict(torch.load(buf))
            idx = torch.Generator().manual_seed(100 * step + r)
            rows = torch.randint(0, 64, (32,), generator=idx)
            opt.zero_grad()
            loss_of(x_eval[rows], y_eval[rows]).backward()
            phase = "frozen" if getattr(opt, "frozen", False) else "warm-up"
            opt.step()
            steps.append([p.detach().clone() for p in params])
            kinds.append(getattr(opt, "last_kind", phase))
            losses.append(loss_of(x_eval, y_eval).item())
        dtypes = {k: v.dtype for st in opt.state.values() for k, v in st.items() if torch.is_tensor(v)}
        out[(opt_name, reload, whole)] = {"steps": steps, "kinds": kinds, "losses": losses, "dtypes": dtypes}
torch.save(out, os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.pt"))
bps.shutdown()
"""


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_trains_through_both_optimizers(cluster, half):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(WORKER, worker_env={"GP_HALF": str(half).removeprefix("torch.")}).assert_success()
    got = [torch.load(c.tmp / f"w{r}.pt") for r in range(2)]
    assert got[0][("OneBitAdam", False, False)]["kinds"] == ["warm-up"] * 3 + ["frozen"] * 11
    assert {"variance", "momentum", "sync", "local"} <= set(got[0][("ZeroOneAdam", False, False)]["kinds"])
    for opt_name in ("OneBitAdam", "ZeroOneAdam"):
        run = got[0][(opt_name, False, False)]
        assert set(run["dtypes"].values()) == {torch.float32}, (opt_name, run["dtypes"])
        assert [p.dtype for p in run["steps"][-1]] == [half] * 2 + [torch.float32] + [half] * 2
        assert all(torch.isfinite(p).all() for p in run["steps"][-1])
        assert run["losses"][-1] < 0.7 * run["losses"][0], (opt_name, run["losses"])
        other = got[1][(opt_name, False, False)]["steps"]
        for step, kind in enumerate(run["kinds"]):
            if kind != "local":
                assert all(torch.equal(a, b) for a, b in zip(run["steps"][step], other[step])), \
                    f"{opt_name}: the workers differ after step {step + 1} ({kind})"
        for r in range(2):
            plain = got[r][(opt_name, False, False)]["steps"]
            for variant, what in (((True, False), "a checkpoint loaded mid-run"), ((False, True), "whole lists")):
                other = got[r][(opt_name, *variant)]["steps"]
                assert all(torch.equal(a, b) for x, y in zip(plain, other) for a, b in zip(x, y)), \
                    f"{opt_name}, worker {r}: {what} changed the trajectory"
