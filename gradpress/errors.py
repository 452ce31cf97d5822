"""Exceptions a user of gradpress can catch."""
import signal


class JobError(RuntimeError):
    """The job cannot go on: a node was lost, the scheduler said so, a deadline passed."""


class Terminated(JobError):
    """SIGTERM or SIGHUP reached gradpress-launch (a pod deleted, a scheduler's preemption):
    what it runs stops as for Ctrl-C, its children sent SIGTERM, then SIGKILL. Raised by
    the signal's handler wherever the main thread is: a handler of ``Exception`` on its way
    (a malformed message's, a key's failed work) lets it through, or the stop is lost."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.status = 128 + signum  # the exit status, as shells give one killed by the signal


class RegistrationRefused(JobError):
    """The scheduler refused this node's registration (a taken DMLC_WORKER_ID, a wrong setting)."""


class NodeLostError(JobError):
    """A peer (named in the message by role and rank) died or stopped heartbeating."""


class TensorMismatchError(JobError):
    """Workers disagree on a tensor's size, dtype or partitioning."""


class NotInitializedError(JobError, ValueError):
    """gradpress.torch was used before ``init()`` (a ValueError too: BytePS raises one)."""


class OpTimeoutError(JobError):
    """A push_pull, declare or barrier missed its deadline (GRADPRESS_OP_TIMEOUT_S)."""


class NonFiniteInput(ValueError):
    """A codec met NaN or inf (an overflowed gradient, or a sum or codec that overflowed):
    the round is skipped on every worker (a NaN average) rather than failed; the state of the
    step that raised it is unchanged (server/store.py)."""
