"""Fits of what the planner measures: linear costs, the link's alpha-beta model, and what
one message costs (``profile.py`` holds the results; ``pipeline/planning`` measures)."""
from __future__ import annotations

from .profile import LinearCost, Link, check


def fit_linear(samples: list[tuple[float, float]]) -> LinearCost:
    """Least-squares ``y = a + b x`` over (x, y) samples, clamped to a, b >= 0."""
    check(len(samples) >= 2, "a linear fit needs at least two samples")
    n = len(samples)
    mx = sum(x for x, _ in samples) / n
    my = sum(y for _, y in samples) / n
    sxx = sum((x - mx) ** 2 for x, _ in samples)
    b = sum((x - mx) * (y - my) for x, y in samples) / sxx if sxx > 0 else 0.0
    b = max(b, 0.0)
    return LinearCost(max(my - b * mx, 0.0), b)


def fit_link(round_trips: list[tuple[int, float]], workers: int, server_add: LinearCost,
             message_s: float = 0.0) -> Link:
    """The link that explains measured uncompressed push/pull round trips of one partition.

    Every worker pushes the same partition to one server at once: its link carries
    ``workers * b`` bytes in (the pushes) and out (the replies), and it sums ``workers``
    pushes, so ``t(b) = message_s + 2 alpha + 2 workers b / rate + workers * add(b)``.
    """
    check(len(round_trips) >= 2 and all(b > 0 and t > 0 for b, t in round_trips),
          f"push/pull round trips {round_trips}: need two or more positive sizes and times")
    fit = fit_linear([(float(b), t) for b, t in round_trips])
    per_byte = fit.per_byte_s - workers * server_add.per_byte_s
    if per_byte <= 0:
        # sizes too small for this link to tell apart (a fast link, noisy times): bound the
        # rate from below by giving the largest probe's whole time to its bytes
        b, t = max(round_trips)
        return Link(alpha_s=max(min(t for _, t in round_trips) - message_s, 0.0) / 2,
                    bytes_per_s=2 * workers * b / t)
    return Link(alpha_s=max(fit.fixed_s - message_s, 0.0) / 2, bytes_per_s=2 * workers / per_byte)


def probe_batches(credit: int) -> tuple[int, ...]:
    """How many tiny push_pulls the message probe puts in flight at once: one, half the
    credit and the credit. None goes past the credit: those pushes wait for the servers'
    acknowledgements, which the timeline models apart (a batch of 32 at credit 8 made the
    fitted cost 0.31-0.46 ms a message, within the credit it was 0.21-0.29:
    docs/history/performance-2026.md)."""
    return tuple(sorted({1, max(2, credit // 2), max(2, credit)}))


def fit_message(batches: list[tuple[int, float]]) -> float:
    """Seconds per message from (k, seconds) of k tiny push/pulls in flight at once (every
    worker at once). On a host whose CPUs the job's processes share, this is the host's
    work per message over its cores, not one thread's: charged to the worker's
    communication thread and to the servers (``simulate.py``), it came to 0.42-0.58 ms per
    worker and partition where the jobs' processes spent 0.5-0.6 ms in all (their CPU
    clocks over the same probe read 0.27: a message costs more beside backward)."""
    return fit_linear([(float(k), t) for k, t in batches]).per_byte_s
