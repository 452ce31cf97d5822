"""What the workers of the OneBitAdam/ZeroOneAdam integration tests share (``PREAMBLE``, put
before each script): ``lists(whole)`` sets the chunks a GPU's parameters get (a list per
dtype) or the host's (one tensor each), ``Scale`` is a module of one float32 parameter
(``SCALE``, the GPU test's too), and ``build(opt_name, params, named, freeze)`` makes either
optimizer as those tests run it: OneBitAdam frozen after ``freeze`` steps, ZeroOneAdam's
variance frozen at step ``freeze + 1`` with every kind of step soon after."""

# a module of one float32 parameter, to put amid a float16 model's
SCALE = """
class Scale(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.s = torch.nn.Parameter(torch.ones(n))
    def forward(self, x):
        return x * self.s.to(x.dtype)
"""

PREAMBLE = """
import io, os, torch, gradpress.torch as bps
from gradpress.optim import adam_math
per_tensor = adam_math.chunks
def lists(whole):  # whole: a list per dtype, as on a GPU
    adam_math.chunks = (lambda ts: [[t for t in ts if t.dtype == d] for d in dict.fromkeys(t.dtype for t in ts)]
                        ) if whole else per_tensor
def build(opt_name, params, named, freeze):
    if opt_name == "OneBitAdam":
        return bps.OneBitAdam(params, lr=0.01, weight_decay=0.01, freeze_step=freeze, named_parameters=named)
    return bps.ZeroOneAdam(params, lr=0.01, weight_decay=0.01, named_parameters=named, var_freeze_step=freeze + 1,
                           var_update_scaler=1, local_step_scaler=1, local_step_clipper=2)
bps.init()
r = bps.rank()
out = {}
""" + SCALE
