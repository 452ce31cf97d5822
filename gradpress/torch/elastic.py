"""``suspend()`` / ``resume()``: leave the job and join another, keeping the model and state.

As in BytePS's elastic training: ``suspend()`` stops this worker's communication (the
job ends once every worker suspended, so its scheduler and servers exit), while the
model, the optimizer and everything else in the process stay as they are.
``resume(num_workers, num_servers)`` joins the next job, which the operator starts
with a scheduler and servers of its own, possibly with a different number of workers.

What lives in gradpress itself is carried across: each compressed tensor's worker
error-feedback residuals and the servers' residuals (checkpointed at suspend, installed
before the tensor's first push in the new job, by rank 0 for the servers', or by each key's
owner where workers reduce locally), so a compressed run continues the same trajectory.
``suspend()`` first lets every push_pull under way end (up to its deadline: a
``CrossBarrier``'s ``step()`` returns with them in flight), so that every worker's
checkpoint is taken after the same rounds. The servers' residuals are sums over the
workers; where the new job has another number of workers they are scaled to it, so that
each still adds to the average what it lacked before (as every optimizer's push_pulls
average: a compressed ``push_pull(average=False)``'s are scaled all the same). A tensor carried in but not used
in a job is carried on to the next one as it was (two scale events in a row).
"""
from __future__ import annotations

import os
from typing import Any

from ..errors import JobError
from ..worker.keys import scaled_server_states
from . import handles, ops

_carried: dict[str, tuple[Any, dict | None]] | None = None
_carried_size = 0                                     # the workers of the job they come from
_loaded: dict[str, tuple[Any, dict | None]] = {}      # what resume() installed, as it was


def suspend() -> None:
    """Stop communicating: leave the job (waiting for every worker to suspend too)."""
    global _carried, _carried_size
    client = ops.client()
    handles.settle(client.s.op_timeout_s + 5)
    carried = {name: state for name, state in _loaded.items() if not client.took_loaded(name)}
    for name, tensor in client.tensors.items():
        if tensor.spec is None:
            continue
        servers = client.server_state(name)
        if all(residual is None for residual, _ in servers.values()):
            servers = None
        carried[name] = (client.compressor_state(name), servers)
    for name, states in client.pending_loaded().items():  # loaded (a checkpoint's) for tensors not used yet
        carried.setdefault(name, states)
    size = ops.size()
    ops.shutdown()
    _carried, _carried_size = carried, size
    _loaded.clear()


def resume(num_workers: int, num_servers: int, global_rank: int | None = None, context: Any = None) -> None:
    """Join the next job: ``num_workers`` worker machines and ``num_servers`` servers.

    Args:
        num_workers: DMLC_NUM_WORKER of the new job.
        num_servers: DMLC_NUM_SERVER of the new job.
        global_rank: this worker's rank in the new job (sets DMLC_WORKER_ID to
            ``global_rank // BYTEPS_LOCAL_SIZE``); None keeps DMLC_WORKER_ID as it is. Its
            local part, ``global_rank % BYTEPS_LOCAL_SIZE``, must be this process's
            BYTEPS_LOCAL_RANK (which picks its GPU): a rank it cannot have is refused.
        context: accepted for BytePS compatibility; unused.
    The scheduler is found at DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT as they are now.
    """
    global _carried
    if _carried is None:
        raise JobError("resume() needs a suspend() first")
    if num_workers < 1 or num_servers < 1:
        raise ValueError(f"resume({num_workers}, {num_servers}): both counts must be at least 1")
    local_size = int(os.environ.get("BYTEPS_LOCAL_SIZE") or 1)
    local_rank = int(os.environ.get("BYTEPS_LOCAL_RANK") or 0)
    if global_rank is not None and (global_rank < 0 or global_rank % local_size != local_rank):
        raise ValueError(f"resume(global_rank={global_rank}): this worker is local rank {local_rank} of "
                         f"BYTEPS_LOCAL_SIZE={local_size}, so its rank is k * {local_size} + {local_rank}; "
                         f"rank() would not be the rank asked for")
    os.environ["DMLC_NUM_WORKER"] = str(num_workers)
    os.environ["DMLC_NUM_SERVER"] = str(num_servers)
    if global_rank is not None:
        os.environ["DMLC_WORKER_ID"] = str(global_rank // local_size)
    ops.init()
    client = ops.client()
    scale = ops.size() / _carried_size
    for name, (worker_state, server_state) in _carried.items():
        if server_state is not None:
            server_state = scaled_server_states(server_state, scale)
        _loaded[name] = (worker_state, server_state)
        if worker_state is not None:
            client.load_compressor_state(name, worker_state)
        # rank 0 restores the servers' residuals; where a machine's workers reduce locally, every
        # worker loads them and each key's owner sends its own (the same state from every machine)
        if server_state is not None and (ops.rank() == 0 or client.book.local_size > 1):
            client.load_server_state(name, server_state)
    _carried = None
