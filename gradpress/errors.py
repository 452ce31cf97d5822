"""Exceptions a user of gradpress can catch."""


class JobError(RuntimeError):
    """The job cannot go on: a node was lost, the scheduler said so, a deadline passed."""


class RegistrationRefused(JobError):
    """The scheduler refused this node's registration (a taken DMLC_WORKER_ID, a wrong setting)."""


class NodeLostError(JobError):
    """A peer (named in the message by role and rank) died or stopped heartbeating."""


class TensorMismatchError(JobError):
    """Workers disagree on a tensor's size, dtype or partitioning."""


class OpTimeoutError(JobError):
    """A push_pull, declare or barrier missed its deadline (GRADPRESS_OP_TIMEOUT_S)."""
