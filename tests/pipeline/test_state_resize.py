"""A pipeline's checkpoint restored into a job of another number of workers: the servers'
residuals, sums over the saving job's workers, are scaled to the restoring job's, as
``suspend()``/``resume()`` scale them; the workers' own are restored as they were."""
from types import SimpleNamespace

import numpy as np
import torch

from gradpress.pipeline.state import PipelineState


class Client:
    def __init__(self):
        self.workers, self.servers = {}, {}

    def compressor_state(self, name):
        return {"residuals": {0: np.full(4, 3.0, np.float32)}}

    def server_state(self, name):
        return {0: (np.full(4, 2.0, np.float32), None), 1: (None, None)}

    def load_compressor_state(self, name, state):
        self.workers[name] = state

    def load_server_state(self, name, states):
        self.servers[name] = states


def pipeline(workers: int) -> PipelineState:
    p = torch.zeros(8)
    state = PipelineState()
    state.lowrank = state.planner = None
    state.owner = "the pipeline"
    state.table = SimpleNamespace(names={id(p): "w"}, trainable=[p])
    state.names = {id(p): "Gradient.w"}
    state.comm = SimpleNamespace(size=lambda: workers, client=Client())
    return state


def test_servers_residuals_are_scaled_to_the_restoring_jobs_workers():
    saved = pipeline(4).state_dict(residuals=True)
    assert saved["workers"] == 4
    for workers, factor in ((4, 1.0), (2, 0.5), (8, 2.0)):
        restored = pipeline(workers)
        restored.load_state_dict(saved)
        client = restored.comm.client
        residual, lr = client.servers["Gradient.w"][0]
        assert residual.dtype == np.float32 and np.array_equal(residual, np.full(4, 2.0 * factor, np.float32))
        assert list(client.servers["Gradient.w"]) == [0]   # partitions without a residual are left out
        assert np.array_equal(client.workers["Gradient.w"]["residuals"][0], np.full(4, 3.0, np.float32))
