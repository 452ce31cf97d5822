"""The scheduler role: rendezvous, address book, barriers, heartbeats, declarations."""
from .scheduler import Scheduler, run_scheduler

__all__ = ["Scheduler", "run_scheduler"]
