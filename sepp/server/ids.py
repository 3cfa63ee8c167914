"""Job ids: random version-4 UUIDs in canonical lowercase form, made fast.

`uuid.uuid4()` costs ~2 us (an os.urandom call and a UUID object per id); at
60,000 enqueues/s that is an eighth of the budget. `JobIds` draws random bytes
from the OS in blocks and formats them directly. Same distribution of ids: 122
random bits from os.urandom, version and variant bits set as RFC 4122 says.
"""

from __future__ import annotations

import os

_BLOCK = 16 * 512


class JobIds:
    def __init__(self) -> None:
        self._hex = ""
        self._pos = 0

    def _refill(self) -> None:
        self._hex = os.urandom(_BLOCK).hex()
        self._pos = 0

    def next(self) -> str:
        pos = self._pos
        if pos >= len(self._hex):
            self._refill()
            pos = 0
        h = self._hex[pos : pos + 32]
        self._pos = pos + 32
        # Version nibble 4; variant bits 10xx in the first nibble of group four.
        variant = "89ab"[int(h[16], 16) & 3]
        return f"{h[0:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"

    def take(self, count: int) -> list[str]:
        """`count` fresh ids (a batch enqueue)."""
        next_id = self.next
        return [next_id() for _ in range(count)]
