"""OneBitAdam and ZeroOneAdam with a sparse embedding (``nn.Embedding(sparse=True)``), two real
workers: every kind of step runs (a warm-up or variance step's average of the rows failed in
torch's ``addcmul_``, which has no sparse kernel) and ends where the same model with a dense
embedding ends. The optimizers' multi-tensor path, which only a GPU takes, run here over whole
lists gives the same bits as the host's one tensor at a time. Under a GradScaler (the
optimizers take the scale themselves, optim/loss_scaling.py) the sparse run gives the
unscaled run's bits: the scale is a power of two."""
import pytest
import torch
from adam_jobs import PREAMBLE

pytestmark = pytest.mark.integ

WORKER = PREAMBLE + """
for opt_name in ("OneBitAdam", "ZeroOneAdam"):
    for sparse, whole, scaled in ((False, False, False), (True, False, False), (True, True, False),
                                  (True, False, True)):
        # whole lists: the chunks a GPU's parameters get, here on the host
        lists(whole)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if scaled else None
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(40, 8, sparse=sparse), torch.nn.Linear(8, 4)
        named = [(f"{opt_name}.{sparse}.{whole}.{scaled}.emb.{n}", p) for n, p in emb.named_parameters()] + \\
                [(f"{opt_name}.{sparse}.{whole}.{scaled}.head.{n}", p) for n, p in head.named_parameters()]
        params = [p for _, p in named]
        opt = build(opt_name, params, named, 2)
        steps, kinds = [], []
        for step in range(8):
            g = torch.Generator().manual_seed(100 * step + r)
            idx, y = torch.randint(0, 40, (16,), generator=g), torch.randn(16, 4, generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(head(emb(idx)), y)
            (scaler.scale(loss) if scaled else loss).backward()
            assert emb.weight.grad.is_sparse == sparse
            phase = "frozen" if getattr(opt, "frozen", False) else "warm-up"
            if scaled:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            steps.append([p.detach().clone() for p in params])
            kinds.append(getattr(opt, "last_kind", phase))
        out[(opt_name, sparse, "scaled" if scaled else whole)] = {"steps": steps, "kinds": kinds}
torch.save(out, os.path.join(os.environ["GP_TEST_DIR"], f"w{r}.pt"))
bps.shutdown()
"""


def test_a_sparse_embedding_trains_through_both_optimizers(cluster):
    c = cluster(workers=2, servers=1, env={"BYTEPS_MIN_COMPRESS_BYTES": "0"})
    c.start(WORKER).assert_success()
    got = [torch.load(c.tmp / f"w{r}.pt") for r in range(2)]
    assert got[0][("OneBitAdam", True, False)]["kinds"] == ["warm-up"] * 2 + ["frozen"] * 6
    kinds = got[0][("ZeroOneAdam", True, False)]["kinds"]
    assert {"variance", "momentum", "sync", "local"} <= set(kinds), kinds
    for opt_name in ("OneBitAdam", "ZeroOneAdam"):
        sparse, dense = got[0][(opt_name, True, False)], got[0][(opt_name, False, False)]
        for step, kind in enumerate(sparse["kinds"]):
            if kind != "local":
                assert all(torch.equal(a, b) for a, b in zip(sparse["steps"][step],
                                                              got[1][(opt_name, True, False)]["steps"][step])), \
                    f"{opt_name}: the workers differ after step {step + 1} ({kind})"
            # the rows' average and the dense one are the same numbers; a sparse add into m
            # may round differently from a dense one, by an ulp
            for a, b in zip(sparse["steps"][step], dense["steps"][step]):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6,
                                           msg=f"{opt_name}: sparse against dense after step {step + 1} ({kind})")
        assert not all(torch.equal(a, b) for a, b in zip(sparse["steps"][0], sparse["steps"][-1])), "nothing trained"
        for r in range(2):
            whole, each = got[r][(opt_name, True, True)]["steps"], got[r][(opt_name, True, False)]["steps"]
            assert all(torch.equal(a, b) for x, y in zip(whole, each) for a, b in zip(x, y)), \
                f"{opt_name}, worker {r}: whole lists differ from one tensor at a time"
            scaled = got[r][(opt_name, True, "scaled")]["steps"]
            assert all(torch.equal(a, b) for x, y in zip(scaled, each) for a, b in zip(x, y)), \
                f"{opt_name}, worker {r}: under a GradScaler, not the unscaled run's bits"
