"""A low-rank checkpoint checked whole before it is loaded: error buffers of matrices not
compressed here (another prefix: torch.compile's _orig_mod., DDP's module.) or of another
size are refused, naming them, and the reducer is left as it was."""
import pytest
import torch

from fake_comm import FakeComm
from gradpress.compressors.lowrank import LowRankParams
from gradpress.pipeline.lowrank import LowRankReducer


def reducer(names):
    ts = [torch.zeros(32, 16) for _ in names]
    return LowRankReducer(list(zip(names, ts)), LowRankParams.parse({"compressor": "powersgd", "rank": 2}),
                          "t.", comm=FakeComm(size=2)), ts


def test_errors_of_unknown_names_are_refused():
    a, ts = reducer(["fc.weight"])
    a.reduce({id(t): torch.randn(32, 16) for t in ts})
    saved = a.state_dict()
    assert saved["errors"]["fc.weight"].abs().sum() > 0
    b, _ = reducer(["_orig_mod.fc.weight"])   # same shapes, other names: p and q fit
    q = b.q.clone()
    with pytest.raises(ValueError, match="fc.weight"):
        b.load_state_dict(saved)
    assert b.step == 0 and torch.equal(b.q, q), "a refused state was loaded in part"


def test_error_of_wrong_shape_names_the_matrix():
    a, ts = reducer(["fc.weight"])
    a.reduce({id(t): torch.randn(32, 16) for t in ts})
    saved = a.state_dict()
    saved["errors"]["fc.weight"] = torch.zeros(16, 30)   # p/q still fit
    b, _ = reducer(["fc.weight"])
    with pytest.raises(ValueError, match="fc.weight"):
        b.load_state_dict(saved)
