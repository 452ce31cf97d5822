"""``KeyBudget``: how many keys, and how many bytes of them, members may make a server hold.

A member holding the job secret could otherwise exhaust a server's memory with INIT_KEYs
for ever new keys. The scheduler tells each server what the job declared for it (every
tensor is declared by all workers alike before it is used: one member alone cannot), and a
new key is refused, with an ERROR naming the cap, once the server would hold more than
twice that plus a margin (``GRADPRESS_SERVER_MAX_KEYS`` / ``GRADPRESS_SERVER_MAX_KEY_BYTES``
fix the caps instead). The margin covers an INIT_KEY that arrives just before the
scheduler's word of its declaration, and released keys declared again under new names (a
planner's trials). The job goes on: only the INIT_KEY is refused.
"""
from __future__ import annotations

from ..config import Settings

MARGIN_KEYS = 4096
MARGIN_BYTES = 256 << 20


class KeyBudget:
    def __init__(self, settings: Settings):
        self.max_keys, self.max_bytes = settings.server_max_keys, settings.server_max_key_bytes
        self._declared: dict[int, tuple[int, int]] = {}   # tensor id -> (keys, bytes) declared for this server
        self._held: dict[int, int] = {}                    # key -> bytes
        self.held_bytes = 0

    def declared(self, message: dict, rank: int) -> None:
        """The scheduler's DECLARED of a tensor: what of it this server (``rank``) holds."""
        mine = [b for s, b in zip(message["servers"], message.get("part_bytes", [])) if s == rank]
        self._declared[message["tensor_id"]] = (len(mine), sum(mine))

    def caps(self) -> tuple[int, int]:
        keys = sum(k for k, _ in self._declared.values())
        nbytes = sum(b for _, b in self._declared.values())
        return (self.max_keys if self.max_keys > 0 else 2 * keys + MARGIN_KEYS,
                self.max_bytes if self.max_bytes > 0 else 2 * nbytes + MARGIN_BYTES)

    def refusal(self, key: int, nbytes: int) -> str:
        """Why a new ``key`` of ``nbytes`` is refused ('' if it is not); counts it if not."""
        max_keys, max_bytes = self.caps()
        derived = "twice what the job declared for this server, plus a margin"
        if len(self._held) + 1 > max_keys:
            why = "GRADPRESS_SERVER_MAX_KEYS" if self.max_keys > 0 else derived
            return (f"INIT_KEY of key {key}: this server holds {len(self._held)} keys for the job; its cap "
                    f"is {max_keys} ({why})")
        if self.held_bytes + nbytes > max_bytes:
            why = "GRADPRESS_SERVER_MAX_KEY_BYTES" if self.max_bytes > 0 else derived
            return (f"INIT_KEY of key {key}: {nbytes} more bytes would make this server hold "
                    f"{self.held_bytes + nbytes} for the job, over its cap of {max_bytes} ({why})")
        self._held[key] = nbytes
        self.held_bytes += nbytes
        return ""

    def release(self, key: int) -> None:
        self.held_bytes -= self._held.pop(key, 0)
