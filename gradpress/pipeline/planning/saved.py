"""A plan as checkpoint text and back (``AutoPlanner.checkpoint`` / ``restore``)."""
from __future__ import annotations

import dataclasses
import json

from ...planner.decide import Plan


def plan_json(plan: Plan) -> str:
    """``plan`` without its alternatives, as plain JSON text: torch.load's weights_only takes
    it (the plan's figures may be numpy floats)."""
    fields = dataclasses.asdict(dataclasses.replace(plan, alternatives=()))
    del fields["alternatives"]
    return json.dumps(fields, default=float)


def plan_from_json(text: str) -> Plan:
    """The plan ``plan_json`` wrote."""
    fields = json.loads(text)
    fields["groups"] = tuple(tuple(int(i) for i in g) for g in fields["groups"])
    fields["options"], fields["low_rank"] = tuple(fields["options"]), tuple(int(i) for i in fields["low_rank"])
    return Plan(**fields)
