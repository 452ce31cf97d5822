"""A worker's two CUDA streams under Numba's simulator (gradpress/kernels/cuda/streams.py):
results land on a stream of their own, apart from the push stream whose copies wait for
the backward pass, with device scratch kept per stream; decodes there match the host's, their payloads
uploaded through pinned staging.
The simulator must be chosen before numba is imported: the cases run in a subprocess."""
from pathlib import Path

import pytest
from cudasim_run import simulated_cases

SCRIPT = Path(__file__).with_name("cudasim_lanes.py")


@pytest.mark.integ  # starts a process
@pytest.mark.timeout(150)
def test_landings_have_their_own_stream_and_scratch():
    results = {c["case"]: c["problem"] for c in simulated_cases(SCRIPT, 130)}
    assert set(results) == {"streams-apart", "lane-named", "lane-restored", "scratch-per-lane", "scratch-reused",
                            "decode/topk", "decode/onebit", "decode/dithering", "upload/bytes", "upload/stage-reused",
                            "upload/stage-per-class-and-role", "upload/stage-per-lane", "upload/back-to-back",
                            "upload/one-at-a-time"}
    failures = {name: problem for name, problem in results.items() if problem}
    assert not failures, failures
