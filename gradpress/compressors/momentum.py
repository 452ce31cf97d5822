"""Nesterov momentum before error feedback, per key, on workers only:
m = mu * m + g; p = mu * m + g; push C(p) through the wrapped compressor.

The first step of a key starts from m = 0. NaN/inf in m raises NonFiniteInput and leaves the
momentum unchanged; so does any error of the wrapped compressor. Where a round is skipped
(``restart``), the key's momentum starts again from zero.
"""
from typing import Any

from gradpress.compressors.array_ops import check_same_layout, ops_for, to_host
from gradpress.compressors.wrapper import Wrapper
from gradpress.compressors.base import Header, Buffers
from gradpress.errors import NonFiniteInput


class Momentum(Wrapper):
    """Wraps ErrorFeedback (or a bare codec); same compress/decompress interface."""

    def __init__(self, inner: Any, mu: float = 0.9) -> None:
        if not 0.0 <= mu < 1.0:
            raise ValueError(f"momentum mu must be in [0, 1), got {mu}")
        super().__init__(inner)
        self.mu = mu
        self._momenta: dict = {}  # key -> m
        self._spares: dict = {}  # key -> (m scratch, p scratch)

    def compress(self, x: Any, key: int, round: int,
                 lr: float | None = None) -> tuple[Header, Buffers]:
        ops = ops_for(x)
        g = ops.working(x)
        momentum = self._momenta.get(key)
        if momentum is not None:
            momentum = ops.adopt(momentum, g)
            check_same_layout(momentum, g, key, "momentum")
        m_new, p = self._spares.get(key) or (ops.empty_like(g), ops.empty_like(g))
        if momentum is None:
            ops.add_scaled(m_new, g, 0.0, g)  # m = g
        else:
            ops.add_scaled(m_new, g, self.mu, momentum)
        if not ops.all_finite(m_new):
            raise NonFiniteInput(f"key {key}: momentum met NaN/inf in the input; state left "
                             f"unchanged")
        ops.add_scaled(p, g, self.mu, m_new)
        header, buffers = self.inner.compress(p, key, round, lr)
        self._momenta[key] = m_new
        self._spares[key] = (momentum if momentum is not None else ops.empty_like(g), p)
        return header, buffers

    def restart(self, key: int) -> None:
        """``key``'s round was skipped on every worker: its momentum, which took in a step no
        worker applies, starts again from zero with the next step, and so does the wrapped
        compressor's state."""
        self._momenta.pop(key, None)
        self.inner.restart(key)

    def state_dict(self) -> dict:
        """Momenta (numpy copies) per key, and the wrapped compressor's state."""
        inner = self.inner.state_dict() if hasattr(self.inner, "state_dict") else {}
        return {"momenta": {k: to_host(v) for k, v in self._momenta.items()}, "inner": inner}

    def load_state_dict(self, state: dict) -> None:
        self._momenta = {k: to_host(v) for k, v in state["momenta"].items()}
        self._spares = {}
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(state["inner"])

    def __repr__(self) -> str:
        return f"Momentum({self.inner!r}, mu={self.mu})"
