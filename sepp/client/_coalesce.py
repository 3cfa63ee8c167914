"""Coalescing: single calls of one kind issued in the same event-loop moment
travel to the server as one request.

Owns: `Call` (one caller's part of a coalesced request: its wire item, its
future, whether it may be repeated, a size hint) and `Coalescer` (collects the
calls of one kind and hands them to the client to send together).

Promises:

* no added latency when there is nothing to coalesce: the calls collected are
  sent at the next turn of the event loop (``loop.call_soon``), never after a
  timer, unless the client asked for a linger (then at most that long, and at
  once when a batch is full);
* without a linger, a batch leaves as soon as it holds its eager size
  (`ENQUEUE_EAGER_CALLS` for enqueues, `EAGER_CALLS` for acks, nacks and
  extends) and the next one starts: the server (on another core) decides and writes the
  first part while the callers of the rest are still being resumed here, and
  the parts' answers come back at different moments, so client work and server
  work (and its fsync) overlap instead of taking turns. Measured (50 concurrent
  enqueue callers, durable server on another core, bench_client, 3 runs):
  36.1k -> 45.3k jobs/s at 25, 41.6k at 32, 38.6k at 8 (more frames cost more
  than they overlap); client CPU 9.8 -> 11.9 us per enqueue. Once the server's
  request path got cheaper, enqueues gained from a smaller cut and settles did
  not (pure build, 50 callers, runs interleaved): enqueues at 13 beat 25 in 10
  of 11 pairs (100,000 jobs: median 37.4k vs 31.9k jobs/s), a Worker's acks at
  13 lost to 25 in 3 of 3 (21k vs 26k jobs/s: each settle answer is the
  Worker's cue to reserve again, and smaller settles make more of them);
* enqueues without a linger are held while the server has work from this
  connection: while `ENQUEUE_FRAMES_AHEAD` enqueue requests are in flight on it
  (`busy`), new enqueues wait for one of those answers (or a full batch) rather
  than leaving at the next turn, so each request carries more jobs. They would
  have waited at the server anyway (it handles a connection's requests in
  order), and nothing is held when nothing is in flight. Measured (50
  concurrent enqueue callers, durable server on another core, six interleaved
  pairs, medians): 12.5 -> 16.7 jobs a request, client CPU per enqueue 17.6 ->
  16.0 us, 33.1k -> 34.5k jobs/s. With the hold, enqueues leave at 25 again
  (two requests of 25 in flight, then held): against 13, seven interleaved
  pairs, 16.7 -> 25 jobs a request, client CPU per enqueue lower in 7 of 7
  (median 19.3 -> 15.0 us), jobs/s higher in 6 of 7 (median 31.6k -> 33.4k);
* a call whose caller stopped waiting before its batch left is left out;
* order: the calls of one batch keep the order they were made in.

What a batch is sent as, how it is cut (the server's batch limit, the frame
limit) and how each caller gets its own outcome is the client's part
(`SeppClient._send_coalesced`): this module only collects.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "EAGER_CALLS",
    "ENQUEUE_EAGER_CALLS",
    "ENQUEUE_FRAMES_AHEAD",
    "Call",
    "Coalescer",
    "Outcome",
]

# Without a linger: a batch this long leaves at once (see the module docstring);
# settles (acks, nacks, extends) at EAGER_CALLS, enqueues at ENQUEUE_EAGER_CALLS.
EAGER_CALLS = 25
ENQUEUE_EAGER_CALLS = 25
# Without a linger, enqueues wait while this many enqueue requests are in flight
# on the connection (see the module docstring).
ENQUEUE_FRAMES_AHEAD = 2


class Outcome(Protocol):
    """Where one call's outcome goes: an `asyncio.Future` (an async caller awaits
    it) or anything settled the same way (the sync client's waiter)."""

    def done(self) -> bool: ...

    def set_result(self, result: dict[str, Any], /) -> None: ...

    def set_exception(self, error: BaseException, /) -> None: ...


class Call:
    """One caller's single call inside a coalesced request: `op` is the single
    operation it stands for (``enqueue``, ``ack``, ``nack``, ``extend``), `wire`
    its job map or lease body, `retry_safe` whether it may be sent again after
    a transient failure, `size` a lower estimate of its encoded bytes."""

    __slots__ = ("future", "op", "retry_safe", "size", "wire")

    def __init__(
        self,
        op: str,
        wire: dict[str, Any],
        retry_safe: bool,
        size: int,
        future: Outcome,
    ) -> None:
        self.op = op
        self.wire = wire
        self.retry_safe = retry_safe
        self.size = size
        self.future = future


class Coalescer:
    """Collects the calls of one kind until the loop's next turn (or the linger),
    then passes them, in order, to `send`. With `busy` (no linger), calls are
    held while it answers True, until the owner calls `flush` again or a batch
    is full."""

    __slots__ = (
        "_busy",
        "_calls",
        "_eager",
        "_full",
        "_handle",
        "_leave_at",
        "held",
        "_linger_s",
        "_loop",
        "_send",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[list[Call]], None],
        *,
        linger_s: float = 0.0,
        full: int = 256,
        eager: int = EAGER_CALLS,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        if eager < 1:
            raise ValueError(f"eager must be at least 1, got {eager}")
        self._loop = loop
        self._send = send
        self._linger_s = linger_s
        self._eager = eager
        self._busy = busy if linger_s <= 0 else None
        # The calls collected are held (`busy`): only a full batch leaves now.
        self.held = False
        self._calls: list[Call] = []
        self._handle: asyncio.Handle | None = None
        self.full = full

    @property
    def full(self) -> int:
        """With a linger: this many calls waiting are sent at once (the client
        keeps it at the server's batch limit); without one, a batch leaves at
        the smaller of it and the eager size."""
        return self._full

    @full.setter
    def full(self, value: int) -> None:
        self._full = value
        self._leave_at = value if self._linger_s > 0 else min(value, self._eager)

    def submit(self, call: Call) -> None:
        calls = self._calls
        calls.append(call)
        if self._handle is None:
            if self._linger_s > 0:
                self._handle = self._loop.call_later(self._linger_s, self.flush)
            else:
                self._handle = self._loop.call_soon(self.flush)
        elif len(calls) >= (self._full if self.held else self._leave_at):
            self.flush()

    def flush(self, force: bool = False) -> None:
        """Send the calls collected, unless `busy` holds them (`force`: send
        them all the same)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        busy = self._busy
        if busy is not None and not force and len(self._calls) < self._full and busy():
            # Held: the owner flushes when it is no longer busy, and the loop's
            # next turn after another call looks again.
            self.held = True
            return
        self.held = False
        calls, self._calls = self._calls, []
        live = [call for call in calls if not call.future.done()]
        if live:
            try:
                self._send(live)
            except Exception as exc:  # a bug: no caller may be left waiting
                for call in live:
                    if not call.future.done():
                        call.future.set_exception(exc)

    def __len__(self) -> int:
        return len(self._calls)
