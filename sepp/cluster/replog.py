"""The interfaces cluster mode is built on, and their in-memory implementations.

Owns: `ReplicatedLog` (a conditional-append log of opaque messages: the cluster's
log, one message per group commit), `Lease` (who may try to write), `BlobStore`
(snapshots), their errors, and `MemoryLog` / `MemoryLease` / `MemoryBlobStore`,
deterministic implementations for tests and the simulation (time is passed in).

Promises (every implementation):
- `append_if(expected_seq, data)` appends only if the log's last sequence is
  `expected_seq`, and returns the new message's sequence (`expected_seq + 1`).
  A log whose last sequence differs raises `AppendRefused` (carrying the actual
  last sequence if known); nothing was appended. An append whose outcome cannot
  be known (a timeout, a lost connection) raises `AppendOutcomeUnknown`: the
  caller must read the tail (`last`, `read`) before it believes either way.
- Sequences start at 1 and have no gaps below `last()`; messages below
  `first()` may have been purged (`purge_below`).
- `read(seq, limit)` returns the messages from `seq` on (at most `limit`, fewer
  at the tail, none past it); `read_from(seq)` yields them forever as the log
  grows (a follower's tail), in order, never skipping one, each with the time
  the log stored it where the log knows it (`Entry.stored_ms`; for JetStream
  the stream leader's clock, set before it acknowledges the append).
- `Lease.acquire` succeeds for one holder at a time: it creates the record when
  none is held (or the last one lapsed) and fails when another holder's record
  is live. `renew` succeeds only for the holder whose record is current
  (compare-and-set on its revision). A lease is advisory: safety comes from
  `append_if`, never from holding the lease.

Must not import: asyncio sockets, nats (backends live in their own modules).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol


class ReplicatedLogError(RuntimeError):
    """A replicated-log or lease operation failed."""


class AppendRefused(ReplicatedLogError):
    """`append_if` found a different last sequence: another writer appended (or
    the caller's view is stale). Nothing was appended."""

    def __init__(self, expected_seq: int, last_seq: int | None) -> None:
        super().__init__(f"append expected last sequence {expected_seq}, log is at {last_seq}")
        self.expected_seq = expected_seq
        self.last_seq = last_seq


class AppendOutcomeUnknown(ReplicatedLogError):
    """The append may or may not have happened; read the tail before answering."""


class Purged(ReplicatedLogError):
    """The messages asked for were purged (below `first()`)."""

    def __init__(self, seq: int, first_seq: int) -> None:
        super().__init__(f"sequence {seq} was purged; the log starts at {first_seq}")
        self.seq = seq
        self.first_seq = first_seq


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the log. `stored_ms`: when the log stored it (ms since the
    epoch, the log's clock: JetStream's stream leader); 0 when not known."""

    seq: int
    data: bytes
    stored_ms: float = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the leader's lease says: who holds it, where clients reach it, and
    the epoch it leads."""

    node_id: str
    address: str
    epoch: int


@dataclass(frozen=True, slots=True)
class HeldLease:
    """A lease as read: its record and the revision a renewal must compare with."""

    record: LeaseRecord
    revision: int


class ReplicatedLog(Protocol):
    async def append_if(self, expected_seq: int, data: bytes) -> int: ...

    async def last(self) -> int: ...

    async def first(self) -> int: ...

    async def read(self, seq: int, limit: int) -> list[Entry]: ...

    def read_from(self, seq: int) -> AsyncIterator[Entry]: ...

    async def purge_below(self, seq: int) -> None: ...


class Lease(Protocol):
    async def current(self) -> HeldLease | None: ...

    async def acquire(self, record: LeaseRecord) -> HeldLease | None: ...

    async def renew(self, held: HeldLease) -> HeldLease | None: ...

    async def release(self, held: HeldLease) -> None: ...


class BlobStore(Protocol):
    async def put(self, name: str, data: bytes) -> None: ...

    async def get(self, name: str) -> bytes | None: ...

    async def names(self) -> list[str]: ...

    async def delete(self, name: str) -> None: ...


# -- in-memory implementations ------------------------------------------------


class MemoryLog:
    """A `ReplicatedLog` in one process's memory. `fail_next` injects faults for
    tests: "refuse" (as if another writer appended), "unknown_lost" (the
    outcome is unknown and nothing was appended) or "unknown_applied" (unknown,
    but appended). With `clock_ms`, each message's `stored_ms` is that clock's
    reading when it was appended (else 0: not known)."""

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms
        self._messages: list[bytes] = []
        self._stored_ms: list[int] = []
        self._first = 1
        self._grown = asyncio.Condition()
        self.fail_next: list[str] = []

    def _last(self) -> int:
        return self._first + len(self._messages) - 1

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        fault = self.fail_next.pop(0) if self.fail_next else None
        last = self._last()
        if fault == "refuse" or expected_seq != last:
            raise AppendRefused(expected_seq, last)
        if fault == "unknown_lost":
            raise AppendOutcomeUnknown("injected: append lost")
        self._messages.append(bytes(data))
        self._stored_ms.append(0 if self._clock_ms is None else self._clock_ms())
        async with self._grown:
            self._grown.notify_all()
        if fault == "unknown_applied":
            raise AppendOutcomeUnknown("injected: append applied, answer lost")
        return last + 1

    async def last(self) -> int:
        return self._last()

    async def first(self) -> int:
        return self._first

    async def read(self, seq: int, limit: int) -> list[Entry]:
        if seq < self._first:
            raise Purged(seq, self._first)
        start = seq - self._first
        end = start + max(limit, 0)
        chunk = zip(self._messages[start:end], self._stored_ms[start:end], strict=True)
        return [Entry(seq + i, data, stored) for i, (data, stored) in enumerate(chunk)]

    async def read_from(self, seq: int) -> AsyncIterator[Entry]:
        while True:
            for entry in await self.read(seq, 1024):
                yield entry
                seq = entry.seq + 1
            async with self._grown:
                while self._last() < seq:
                    await self._grown.wait()

    async def purge_below(self, seq: int) -> None:
        drop = min(max(seq - self._first, 0), len(self._messages))
        del self._messages[:drop]
        del self._stored_ms[:drop]
        self._first += drop


class MemoryLease:
    """A `Lease` with a time-to-live on an injected clock (milliseconds)."""

    def __init__(self, ttl_ms: int, clock_ms: Callable[[], int]) -> None:
        self.ttl_ms = ttl_ms
        self._clock_ms = clock_ms
        self._held: HeldLease | None = None
        self._expires_ms = 0
        self._revision = 0

    def _live(self) -> HeldLease | None:
        if self._held is not None and self._clock_ms() >= self._expires_ms:
            self._held = None
        return self._held

    def _grant(self, record: LeaseRecord) -> HeldLease:
        self._revision += 1
        self._held = HeldLease(record, self._revision)
        self._expires_ms = self._clock_ms() + self.ttl_ms
        return self._held

    async def current(self) -> HeldLease | None:
        return self._live()

    async def acquire(self, record: LeaseRecord) -> HeldLease | None:
        if self._live() is not None:
            return None
        return self._grant(record)

    async def renew(self, held: HeldLease) -> HeldLease | None:
        live = self._live()
        if live is None or live.revision != held.revision:
            return None
        return self._grant(held.record)

    async def release(self, held: HeldLease) -> None:
        live = self._live()
        if live is not None and live.revision == held.revision:
            self._held = None


class MemoryBlobStore:
    """A `BlobStore` in memory."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    async def put(self, name: str, data: bytes) -> None:
        self._blobs[name] = bytes(data)

    async def get(self, name: str) -> bytes | None:
        return self._blobs.get(name)

    async def names(self) -> list[str]:
        return sorted(self._blobs)

    async def delete(self, name: str) -> None:
        self._blobs.pop(name, None)
