"""resume()'s arguments, checked before it changes anything (tests/torch/test_elastic_integ.py runs it)."""
import os

import pytest

from gradpress.torch import elastic


@pytest.mark.parametrize("local_rank, global_rank", [(0, 1), (1, 0), (1, 4), (0, -2)])
def test_a_global_rank_this_local_worker_cannot_take_is_refused_before_anything_changes(monkeypatch, local_rank,
                                                                                         global_rank):
    # BYTEPS_LOCAL_RANK stays (it picks the GPU): rank() would have been another than asked
    monkeypatch.setattr(elastic, "_carried", {})
    monkeypatch.setenv("BYTEPS_LOCAL_SIZE", "2")
    monkeypatch.setenv("BYTEPS_LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    monkeypatch.setenv("DMLC_WORKER_ID", "1")
    with pytest.raises(ValueError, match=rf"global_rank={global_rank}\): this worker is local rank {local_rank} "
                                         r"of BYTEPS_LOCAL_SIZE=2, so its rank is k \* 2 \+ " + str(local_rank)):
        elastic.resume(1, 1, global_rank=global_rank)
    assert (os.environ["DMLC_NUM_WORKER"], os.environ["DMLC_WORKER_ID"]) == ("2", "1")
