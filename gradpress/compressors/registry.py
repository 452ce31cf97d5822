"""The compressor registry and ``build_compressor``, the one place that turns BytePS's
``compression_params`` into a (possibly wrapped) compressor."""
from typing import TYPE_CHECKING

from gradpress.compressors.params import choice, number

if TYPE_CHECKING:
    from gradpress.compressors.base import Compressor

COMPRESSORS: dict = {}  # name -> Compressor subclass
ROLES = ("worker", "server")
ERROR_FEEDBACK_KINDS = ("vanilla", "corrected")
MOMENTUM_KINDS = ("nesterov",)
# keys read here rather than by a codec
COMMON_PARAMS = {
    "compressor": "codec name",
    "ef": "error feedback: vanilla | corrected",
    "momentum": "worker momentum: nesterov",
    "mu": "momentum coefficient in [0, 1), default 0.9",
}


def register(cls: type) -> type:
    """Class decorator: make ``cls`` buildable by its ``name``."""
    if cls.name in COMPRESSORS:
        raise ValueError(f"compressor {cls.name!r} registered twice")
    COMPRESSORS[cls.name] = cls
    return cls


def build_compressor(params: dict, role: str) -> "Compressor":
    """The compressor a node of ``role`` uses for ``params``.

    Args:
        params: BytePS ``compression_params`` (``compressor`` defaults to ``none``).
        role: ``worker`` gives ``Momentum(ErrorFeedback(codec))`` as the params ask;
            ``server`` gives ``ErrorFeedback(codec)`` (servers never apply momentum).
    Raises:
        ValueError: unknown role, codec, key or value; the message lists what is accepted.
    """
    from gradpress.compressors.error_feedback import ErrorFeedback
    from gradpress.compressors.momentum import Momentum

    if role not in ROLES:
        raise ValueError(f"role {role!r}; accepted: {', '.join(ROLES)}")
    if not isinstance(params, dict):
        raise ValueError(f"compression_params must be a dict, got {type(params).__name__}")
    name = choice(params, "compressor", sorted(COMPRESSORS), "none")
    codec_class = COMPRESSORS[name]
    accepted = {**COMMON_PARAMS, **codec_class.ACCEPTED_PARAMS}
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"unknown compression_params {unknown} for compressor {name!r}; "
                         f"accepted: {', '.join(sorted(accepted))}")
    compressor = codec_class.from_params(params)
    ef = choice(params, "ef", ERROR_FEEDBACK_KINDS, None)
    momentum = choice(params, "momentum", MOMENTUM_KINDS, None)
    mu = number(params, "mu", 0.9, 0.0, 0.999999)
    if ef is not None:
        compressor = ErrorFeedback(compressor, corrected=ef == "corrected")
    if momentum is not None and role == "worker":
        compressor = Momentum(compressor, mu=mu)
    return compressor
