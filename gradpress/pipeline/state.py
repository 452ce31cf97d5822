"""What a pipeline's checkpoint holds: the low-rank reducer's state, the plan's residuals and,
where asked, both sides' error-feedback residuals of the tensors that travel on their own.

Residuals are keyed by parameter name (names survive a new job; keys may not). Each worker
saves and loads its own: residuals differ between workers. The servers' residuals are read
from the servers (STATE_GET) and sent back ahead of each key's first push after a restore.
"""
from __future__ import annotations

import numpy as np
import torch

from ..worker.keys import scaled_server_states


class PipelineState:
    """``state_dict`` / ``load_state_dict`` of ``GradientPipeline`` (a mixin: it reads the
    pipeline's table, names, routes, planner and comm)."""

    def state_dict(self, residuals: bool = False) -> dict:
        """``lowrank``: the reducer's step, factors and error buffers (or None); with
        ``residuals`` also ``worker_residuals`` / ``server_residuals`` (by parameter name, of
        the tensors compressed on their own), ``planned_residuals`` (the plan's, by parameter
        name: what a new plan would start from) and ``plan``: the plan in force with its
        buckets' residuals and its factors' state, which a restore resumes exactly."""
        out = {"lowrank": self.lowrank.reducer.state_dict() if self.lowrank is not None else None}
        if residuals:
            out["workers"] = self.comm.size()  # the servers' residuals are sums over this many
            out["worker_residuals"], out["server_residuals"] = self._save_states(self._own_tensors())
            if self.planner is not None:
                out["planned_residuals"] = {self.table.names[pid]: part
                                            for pid, part in self.planner.residuals().items()}
                out["plan"] = self.planner.checkpoint()
                route = self.planner.route
                if out["plan"] is not None:
                    groups = {g.name: g.name for g in route.groups if g.spec is not None}
                    out["plan"]["worker_residuals"], out["plan"]["server_residuals"] = self._save_states(groups)
                    out["plan"]["lowrank"] = route.reducer.state_dict() if route.reducer is not None else None
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``: the next step continues where the saved one left off."""
        if state.get("lowrank") is not None:
            if self.lowrank is None:
                raise ValueError(f"{self.owner}: this state holds powersgd / acpsgd state, but no tensor here "
                                 "has low-rank compression")
            self.lowrank.reducer.load_state_dict(state["lowrank"])
        # a job of another size: each server residual still adds to the average what it lacked
        scale = self.comm.size() / state.get("workers", self.comm.size())
        if "worker_residuals" in state:  # saved with residuals: those it lacks were none then
            self._clear_unsaved(self._own_tensors(), state["worker_residuals"], state.get("server_residuals", {}))
        if state.get("worker_residuals") or state.get("server_residuals"):
            self._load_states(self._own_tensors(), state.get("worker_residuals", {}), state.get("server_residuals", {}),
                              scale)
        planned, plan = state.get("planned_residuals") or {}, state.get("plan")
        if (planned or plan) and self.planner is None:
            raise ValueError(f"{self.owner}: the state holds a planned path (compressor 'auto'); this one has no "
                             "'auto' compression to take it")
        if plan is not None:  # the plan in force resumes under its own keys, its residuals in place
            route = self.planner.restore(plan)
            groups = {g.name: g.name for g in route.groups if g.spec is not None}
            self._load_states(groups, plan["worker_residuals"], plan["server_residuals"], scale)
            if plan.get("lowrank") is not None:
                route.reducer.load_state_dict(plan["lowrank"])
        elif planned:  # profiled when saved: the residuals join the first plan's pushes
            self._load_planned(planned)

    def _own_tensors(self) -> dict[str, str]:
        return {self.table.names[id(p)]: self.names[id(p)] for p in self.table.trainable}

    def _save_states(self, tensors: dict[str, str]) -> tuple[dict, dict]:
        """(this worker's, the servers') error-feedback states of ``{label: tensor name}``, of
        the tensors compressed so far."""
        client = self.comm.client
        workers, servers = {}, {}
        for label, tensor in tensors.items():
            state = client.compressor_state(tensor)
            if state is not None:
                workers[label] = to_torch(state)
                servers[label] = to_torch(client.server_state(tensor))
        return workers, servers

    def _clear_unsaved(self, tensors: dict[str, str], workers: dict, servers: dict) -> None:
        """Tensors compressed here since the checkpoint was saved (before their first
        compressed step: a rollback in the same job) start again from no residuals, here and
        on the servers, as they did then: their live ones would steer the replayed steps."""
        client = self.comm.client
        for label, name in tensors.items():
            live = client.compressor_state(name) if label not in workers else None
            if live is not None:
                client.load_compressor_state(name, _emptied(live))
            t = client.tensor(name) if label not in servers else None
            if t is None or t.spec is None:
                continue
            if any(residual is not None for residual, _ in client.server_state(name).values()):
                client.load_server_state(name, {i: (np.zeros(n, np.float32), None) for i, n in enumerate(t.parts)})

    def _load_states(self, tensors: dict[str, str], workers: dict, servers: dict, scale: float = 1.0) -> None:
        """``_save_states``' output back to this worker and (at each key's next push) the
        servers, theirs times ``scale``."""
        client = self.comm.client
        unknown = sorted((set(workers) | set(servers)) - set(tensors))
        if unknown:
            raise ValueError(f"{self.owner}: the state's residuals name unknown tensors {unknown[:5]}")
        for label, state in workers.items():
            client.load_compressor_state(tensors[label], to_numpy(state))
        for label, states in servers.items():
            kept = {i: (r, lr) for i, (r, lr) in to_numpy(states).items() if r is not None}
            client.load_server_state(tensors[label], scaled_server_states(kept, scale))

    def _load_planned(self, saved: dict[str, torch.Tensor]) -> None:
        """A checkpoint's plan residuals: added to each parameter's first planned push."""
        by_name = {self.table.names[id(p)]: p for p in self.planner.params}
        unknown = sorted(set(saved) - set(by_name))
        if unknown:
            raise ValueError(f"{self.owner}: the checkpoint's planned residuals name unknown parameters {unknown[:5]}")
        for name, part in saved.items():
            p = by_name[name]
            if part.numel() != p.numel():
                raise ValueError(f"{self.owner}: {name}: the checkpoint's planned residual has {part.numel()} "
                                 f"elements, the parameter {p.numel()}")
            self.planner.carry[id(p)] = part.reshape(-1).to(p.device, torch.float32).clone()


def to_torch(state):
    """numpy arrays in a nested state as torch tensors (torch.load's weights_only accepts those)."""
    if isinstance(state, dict):
        return {k: to_torch(v) for k, v in state.items()}
    if isinstance(state, tuple):
        return tuple(to_torch(v) for v in state)
    return torch.from_numpy(state.copy()) if isinstance(state, np.ndarray) else state


def to_numpy(state):
    if isinstance(state, dict):
        return {k: to_numpy(v) for k, v in state.items()}
    if isinstance(state, (tuple, list)):
        return tuple(to_numpy(v) for v in state)
    # (a checkpoint loaded with map_location="cuda:..." brings its residuals to the GPU)
    return state.detach().cpu().numpy() if torch.is_tensor(state) else state


def _emptied(state):
    """A compressor's state with every per-key map emptied (no residual, momentum or learning
    rate of any key): its state before its first compressed step."""
    if isinstance(state, dict):
        if state and all(isinstance(k, int) for k in state):
            return {}
        return {k: _emptied(v) for k, v in state.items()}
    return state
