"""The gradient pipeline: how every front end's tensors travel (``GradientPipeline``), the
routes they take, and the planner of ``compressor: auto``."""
from .comm import OPS, Comm
from .pipeline import GradientPipeline, frozen, gradient_or_zeros
from .table import ParameterTable

__all__ = ["Comm", "OPS", "GradientPipeline", "frozen", "gradient_or_zeros", "ParameterTable"]
