"""Rounds that wait on workers: those a worker's leaving ends, and those held up by a worker.

Only a server knows which workers pushed a round and which did not; a worker waiting for
its reply knows only that it is late. So once a round has waited half of
GRADPRESS_OP_TIMEOUT_S, its server names the workers it still waits for: once in its log,
and in a STALLED to each worker in the round, whose deadline error then names them too (a
training thread hung, a loop with fewer steps, a rank that evaluates alone) where it could
only name the server. Nothing fails early: the workers' own deadlines still end the job,
and a late push still completes its round.
"""
from __future__ import annotations

import logging

from ..net.protocol import Op
from .sink import Reply

log = logging.getLogger(__name__)
NAMES_SHOWN = 8  # workers named in one message; the rest are counted


def in_round(state) -> list[tuple[bytes, int]]:
    """Each worker in a key's rounds in flight, with its round: those that pushed the round
    being summed or wait to pull it, then those that pushed the next one early."""
    return [(to, state.round) for to in [*state.pushed, *state.waiting]] + [(to, state.round + 1) for to in state.early]


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown if len(names) <= NAMES_SHOWN else f"{shown} and {len(names) - NAMES_SHOWN} more"


class RoundWaits:
    """One engine's view of its keys' open rounds (its thread's alone, as the keys are)."""

    def __init__(self, sender_name: str, num_workers: int, after_s: float):
        self.sender_name = sender_name
        self.num_workers = num_workers
        self.after_s = after_s
        self.ranks: dict[bytes, int] = {}  # each worker's identity, by the rank its INIT_KEY named
        self._open: dict[int, tuple[int, float, bool]] = {}  # key -> (round, first seen open, STALLED sent)

    def met(self, identity: bytes, name: str) -> None:
        """A worker's INIT_KEY, sent as ``name`` ("worker 3")."""
        role, _, rank = name.partition(" ")
        if role == "worker" and rank.isascii() and rank.isdigit() and len(rank) < 10:  # (a peer sent it)
            self.ranks[identity] = int(rank)

    def forget(self, key: int) -> None:
        """``key`` was released: a key of that number made later starts its own wait."""
        self._open.pop(key, None)

    def left(self, keys: dict, why: str) -> list[Reply]:
        """A worker finished while others go on (synchronous jobs): the rounds still open
        never complete. Those in them hear why now."""
        replies = []
        for key, state in keys.items():
            replies += [Reply(to, Op.ERROR, {"message": f"{state.describe()}, round {rnd}: {why}", "key": key,
                                             "round": rnd}, []) for to, rnd in sorted(set(in_round(state)))]
        if replies:
            log.warning("%s: %d round(s) failed: %s", self.sender_name, len(replies), why)
        return replies

    def check(self, keys: dict, now: float) -> list[Reply]:
        """STALLED, once a round, to the workers of every round that has been open for
        ``after_s`` (timed from the first check that found it open), and one log line for
        each set of workers waited for."""
        replies: list[Reply] = []
        logged: dict[str, list] = {}
        still_open = {}
        for key, state in keys.items():
            if not (state.pushed or state.waiting) or getattr(state, "broken", ""):
                continue
            rnd, since, said = self._open.get(key, (state.round, now, False))
            if rnd != state.round:
                since, said = now, False
            if not said and now - since >= self.after_s:
                said = True
                message = self.waiting_for(state, now - since)
                replies += [Reply(to, Op.STALLED, {"key": key, "round": r, "message": message}, [])
                            for to, r in sorted(set(in_round(state)))]
                logged.setdefault(message, []).append(state)
            still_open[key] = (state.round, since, said)
        self._open = still_open
        for message, states in logged.items():
            more = f", and {len(states) - 1} more key(s)" if len(states) > 1 else ""
            log.warning("%s, round %d%s: %s", states[0].describe(), states[0].round, more, message)
        return replies

    def waiting_for(self, state, age_s: float) -> str:
        """``"server 0 waits for the push of worker 1 (at 8 s it had worker 0's)"``; where one
        worker pushes a machine's sum (GRADPRESS_LOCAL_REDUCE), the machines missing are named
        with their workers' ranks (DMLC_WORKER_ID x BYTEPS_LOCAL_SIZE + local rank)."""
        ranks = sorted(self.ranks[i] for i in state.pushed if i in self.ranks)
        group = max(self.num_workers // state.num_workers, 1)  # workers one push stands for
        pushed = {r // group for r in ranks}
        missing = [f"worker {m}" if group == 1 else f"machine {m} (workers {m * group}-{m * group + group - 1})"
                   for m in range(state.num_workers) if m not in pushed]
        had = f"{_listed([f'worker {r}' for r in ranks])}'s" if ranks else "no push yet"
        return f"{self.sender_name} waits for the push of {_listed(missing)} (at {age_s:.0f} s it had {had})"
