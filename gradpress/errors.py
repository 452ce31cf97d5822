"""Exceptions a user of gradpress can catch."""


class JobError(RuntimeError):
    """The job cannot go on: a node was lost, the scheduler said so, a deadline passed."""


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
