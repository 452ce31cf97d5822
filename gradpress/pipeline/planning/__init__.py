"""``compressor: auto``: the planner that measures a job's steps, agrees on a plan with the
other workers and applies it as a ``PlannedRoute``. ``gradpress.planner`` (free of torch)
holds the profile, the simulator and the decision."""
from .planner import AutoPlanner, PlanStage
from .tuning import PlanTuning

__all__ = ["AutoPlanner", "PlanStage", "PlanTuning"]
