"""``planned``: the planner's plan applied: fused buckets, each compressed as the plan says
(``fp16_raw``: cast to float16 and sent uncompressed, ``Compression.fp16``'s way), and the
matrices it factors reduced together.

A new plan starts from the residuals of the one it replaces (``carry``): each member's
share of the old plan's error feedback (this worker's, and on rank 0 the servers') joins
its next tensor, so no gradient is lost in a switch.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ...compressors.auto import raw_halves
from ...compressors.lowrank import LowRankParams
from ...compressors.spec import CodecSpec
from ...planner.decide import Plan
from ...planner.profile import Profile
from ...torch.compression import Compression
from ..comm import Comm
from ..lowrank import LowRankReducer
from . import Route
from .bucket import Bucket
from .lowrank import LowRankRoute


class PlannedRoute(Route):
    """``plan`` applied to ``params`` (named ``names``; the profile's tensors index the plan).

    Args:
        options: the planner's options by name (each a ``compression_params`` dict).
        tag: names this plan's keys: ``Plan<version>.`` plus the planner's label.
        carry: residuals handed over from the previous plan, by member id (flat tensors).
        matrix_names: the factored matrices' names in the reducer (by id; default ``names``):
            a matrix's first factor is seeded by it, so the parameter table's names make a
            planned matrix start as the same one under its own low-rank rule would.
    """
    kind = "planned"

    def __init__(self, plan: Plan, profile: Profile, params: list[torch.Tensor], names: dict[int, str],
                 priority: dict[int, int], lr_of: Callable[[torch.Tensor], float], options: dict[str, dict],
                 version: int, label: str, comm: Comm, views: bool, min_bytes: int,
                 carry: dict[int, torch.Tensor] | None = None, matrix_names: dict[int, str] | None = None):
        by_name = {names[id(p)]: p for p in params}
        self.plan, self.comm = plan, comm
        self.carry = carry if carry is not None else {}
        self.groups: list[Bucket] = []
        for g, (members, option) in enumerate(zip(plan.groups, plan.options)):
            group = [by_name[profile.tensors[i].name] for i in members]
            halves = option != "none" and raw_halves(options[option])   # float16 uncompressed
            spec = None if option == "none" or halves else CodecSpec.from_params(options[option])
            self.groups.append(Bucket(f"Plan{version}.{g}.{names[id(group[0])]}", group, spec,
                                      max(priority[id(p)] for p in group), comm, lr_of, views,
                                      compression=Compression.fp16 if halves else Compression.none, carry=self.carry))
        self.group_of = {id(p): grp for grp in self.groups for p in grp.members}
        self.factored = [by_name[profile.tensors[i].name] for i in plan.low_rank]
        self.lowrank: LowRankRoute | None = None
        if self.factored:
            reducer = LowRankReducer([((matrix_names or names)[id(p)], p) for p in self.factored],
                                     LowRankParams.parse(options[plan.low_rank_option]),
                                     f"Plan{version}.{label}.", min_bytes, min(priority.values()) - 1, comm)
            self.lowrank = LowRankRoute(self.factored, reducer, self.carry)
        super().__init__([p for grp in self.groups for p in grp.members] + self.factored)

    @property
    def reducer(self) -> LowRankReducer | None:
        return self.lowrank.reducer if self.lowrank is not None else None

    def submit(self, p: torch.Tensor, tensor: torch.Tensor) -> None:
        group = self.group_of.get(id(p))
        (group or self.lowrank).submit(p, tensor)

    def flush(self) -> None:
        for group in self.groups:
            group.flush()
        if self.lowrank is not None:
            self.lowrank.flush()

    def finish(self, p: torch.Tensor | None = None) -> dict[int, torch.Tensor]:
        self.flush()
        out = {}
        for part in self.groups + ([self.lowrank] if self.lowrank is not None else []):
            out.update(part.finish())
        return out

    def clear(self) -> None:
        for part in self.groups + ([self.lowrank] if self.lowrank is not None else []):
            part.clear()

    def key_names(self) -> list[str]:
        """Every tensor this plan pushes: what leaving it releases."""
        return [g.name for g in self.groups] + (self.reducer.key_names() if self.reducer is not None else [])

    def residuals(self, with_servers: bool) -> dict[int, torch.Tensor]:
        """The plan's error feedback by member (id -> flat tensor, on the member's device):
        this worker's, the servers' too with ``with_servers`` (rank 0's share, so that they
        join the sum once), plus what is still carried from an earlier plan."""
        client = self.comm.client
        out = {pid: part.clone() for pid, part in self.carry.items()}

        def add(pid: int, part: torch.Tensor) -> None:
            out[pid] = out[pid] + part if pid in out else part
        for group in self.groups:
            if group.spec is None:
                continue
            parts = client.tensor(group.name).parts
            flat = _flat_residual(client.compressor_state(group.name), parts)
            if with_servers:
                server = client.server_state(group.name)
                flat += _flat_residual({"residuals": {i: r for i, (r, _) in server.items() if r is not None}}, parts)
            flat_t = torch.from_numpy(flat).to(group.members[0].device)
            for q, part in zip(group.members, group.split(flat_t)):
                add(id(q), part.reshape(-1).clone())
        # a factored matrix's error buffer is this worker's only residual (servers sum factors exactly)
        for pid, error in (self.reducer.errors() if self.reducer is not None else {}).items():
            add(pid, error)
        return out


def _flat_residual(state: dict | None, parts: list[int]) -> np.ndarray:
    """An error-feedback state's residuals laid out like the tensor (zeros where a partition has none)."""
    residuals = (state or {}).get("residuals") or {}
    return np.concatenate([np.asarray(residuals[i], np.float32) if i in residuals else np.zeros(n, np.float32)
                           for i, n in enumerate(parts)])
