"""Garbage-collector policy for a process that holds millions of long-lived
objects (the job state).

CPython's cyclic collector rescans every tracked object on a full collection; with
a million live jobs that is a pause of about a second, and even the objects of the
last few seconds make pauses of tens of milliseconds (measured: full collections
every ~1.3 s growing from 27 to 58 ms while a benchmark enqueued). sepp's state is
acyclic once an object leaves it (a Ready job's entry cycle is broken when it stops
being Ready), so long-lived objects need no cyclic collection:

- `gc.freeze()` after recovery and then every `FREEZE_INTERVAL_S`: objects that
  survived that long move to the permanent generation and are never scanned again
  (they are still freed by reference counting as usual);
- young generations are collected as usual (short-lived cycles: exceptions,
  asyncio internals); full collections are made rare.

The trade: a cycle that survives two generations and then becomes garbage is not
reclaimed. None of sepp's structures create such cycles.

Freezing has one trap, and the refreeze closes it while the heap is small: an object
frozen while alive that later becomes part of garbage *cycle* is never reclaimed.
Connections are such objects (a connection and its timer handle, its TLS handshake
task and the exception that ended it, a traceback's frames). Measured (issue 13):
171 connections that each sent a 16 MiB frame before hello kept 15 MiB resident after
they closed, 666 half-finished TLS handshakes kept 16k objects. So every refreeze
first looks at the heap's size (`sys.getallocatedblocks()`, every pymalloc block,
tracked or not: an upper bound on what a collection scans, read in ~1 ms; on
jemalloc or the system malloc, which have no such count, the tracked objects): up to
`SWEEP_BLOCKS_MAX` blocks it unfreezes and runs a full collection (about 70 ns a
tracked object here: 200k objects 12 ms, an idle server's ~27k about 2 ms), which
also empties CPython's free lists (an idle server held ~5 MiB in them after 10k
parked reserves were reset). Above it -- a heap of hundreds of thousands of live
jobs, where a full collection would pause every client -- only the objects since
the last freeze are collected (when they are few enough), and the connection code
breaks its own cycles when it closes (server.py) so that little is left to this.

Freed memory goes back to the system: at every refreeze the C heap's free pages are
released (glibc `malloc_trim(0)`, where it exists; on jemalloc, the server's default
allocator, a purge of every arena -- jemalloc itself is told never to purge on its
own, see allocator.py). Objects larger than 512 bytes
(a queue's ready-level deque block, payloads) come from malloc, and glibc keeps the
free pages between live chunks resident: after 100k distinct queues were churned
through and forgotten the process stayed at 90 MiB, 62 MiB above idle, with 8 MiB of
it in use; one trim (4 ms) brought it to 37 MiB (issue 13). With nothing to release
a trim takes ~10 us.

Both pause whoever is waiting on the loop, so a refreeze goes the whole way (collect,
then give pages back) only when few would wait: see RefreezeSchedule. Measured on a
slow VM on jemalloc (2026-12-03, tools.attack snapshot-large and bench_client's
producer): a sweep of 35k-53k tracked objects took 19-40 ms, of 208k 89 ms, and one
purge after 1 GB of large jobs 105 ms -- every 5 s, under load, the tail of every
client's latency. The server runs the release on a thread (ctypes lets go of the
GIL), so only the collection is paid on the loop.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable

FREEZE_INTERVAL_S = 5.0
THRESHOLDS = (10_000, 50, 1000)
# Up to this many pymalloc blocks the refreeze runs a full collection first (see
# above): at most ~300k blocks hold at most ~300k tracked objects, ~20 ms.
SWEEP_BLOCKS_MAX = 300_000
# Above SWEEP_BLOCKS_MAX, the objects created since the last freeze are collected
# before they are frozen when there are at most this many of them (~10 ms).
YOUNG_COLLECT_MAX = 150_000
# A refreeze is full when the interval before it saw at most this much activity
# (requests answered plus events logged: 20 a second), or when the last full one is
# FULL_REFREEZE_MAX_S old (a busy server still sweeps and gives memory back).
QUIET_ACTIVITY_MAX = 100
FULL_REFREEZE_MAX_S = 60.0


def configure() -> None:
    """Apply the policy (call once the recovered state is loaded)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


SWEPT = "swept"
YOUNG_COLLECTED = "young_collected"
FROZEN_ONLY = "frozen_only"
# Not a full refreeze (RefreezeSchedule): frozen, nothing collected or released.
DEFERRED = "deferred"


class RefreezeSchedule:
    """Which refreezes are full. A full one pauses the loop (the collection; the
    release too unless it runs on a thread), and every request that arrives meanwhile
    waits, so it is made only when few would: after an interval of at most
    QUIET_ACTIVITY_MAX requests and events, or once FULL_REFREEZE_MAX_S have passed
    since the last full one. Between them a refreeze only freezes (microseconds).

    A server back to quiet after a burst is swept and trimmed at the next refreeze
    (RSS after, issue 13); a busy one pays the pause once a minute, not every 5 s."""

    __slots__ = ("activity", "last_full")

    def __init__(self, now: float, activity: int) -> None:
        self.activity = activity
        self.last_full = now

    def full(self, now: float, activity: int) -> bool:
        """Whether the refreeze at `now` is full; `activity` is a running count of
        what the server did (requests answered, events logged)."""
        quiet = activity - self.activity <= QUIET_ACTIVITY_MAX
        self.activity = activity
        if quiet or now - self.last_full >= FULL_REFREEZE_MAX_S:
            self.last_full = now
            return True
        return False


def refreeze(
    sweep_blocks_max: int = SWEEP_BLOCKS_MAX,
    young_collect_max: int = YOUNG_COLLECT_MAX,
    *,
    full: bool = True,
    release: Callable[[], object] | None = None,
) -> str:
    """Move the survivors of the last interval out of the collector's reach, and
    give the heap's free pages back to the system (`release`, default
    release_free_memory). A small heap is first swept whole (frozen objects
    included); a large one has its young objects collected when they are few. Not
    `full`: only the freeze. Returns what it did (SWEPT, YOUNG_COLLECTED,
    FROZEN_ONLY, DEFERRED)."""
    if not full:
        gc.freeze()
        return DEFERRED
    if heap_size() <= sweep_blocks_max:
        gc.unfreeze()
        gc.collect()
        done = SWEPT
    elif len(gc.get_objects()) <= young_collect_max:
        # Only the unfrozen objects are scanned: cycles that formed and died
        # since the last freeze are freed instead of frozen.
        gc.collect()
        done = YOUNG_COLLECTED
    else:
        done = FROZEN_ONLY
    gc.freeze()
    if release is None:
        release_free_memory()
    else:
        release()
    return done


def heap_size() -> int:
    """An upper bound on what a full collection scans: pymalloc's count of allocated
    blocks, or -- on jemalloc or the system malloc (PYTHONMALLOC=malloc), where that
    count is 0 -- the collector's tracked objects, frozen ones included."""
    blocks = sys.getallocatedblocks()
    if blocks:
        return blocks
    return gc.get_freeze_count() + len(gc.get_objects())


# jemalloc's "all arenas" index for `arena.<i>.purge` (MALLCTL_ARENAS_ALL).
_JEMALLOC_ALL_ARENAS = 4096


def _find_release() -> Callable[[], object] | None:
    """The call that returns the C heap's free pages: jemalloc's purge of every
    arena when jemalloc is this process's malloc (server.allocator, allocator.py),
    else glibc's `malloc_trim(0)`; None where there is neither (musl, not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    mallctl = getattr(libc, "mallctl", None)  # only jemalloc defines it
    if mallctl is not None:
        name = f"arena.{_JEMALLOC_ALL_ARENAS}.purge".encode()
        mallctl.argtypes = [
            ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
        ]  # fmt: skip
        mallctl.restype = ctypes.c_int
        return lambda: mallctl(name, None, None, None, 0)
    trim = getattr(libc, "malloc_trim", None)  # glibc; musl has none
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


_RELEASE = _find_release()


def can_release_free_memory() -> bool:
    return _RELEASE is not None


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (jemalloc: purge every arena's
    unused pages; glibc: `malloc_trim(0)`); whether the C library can (False where it
    has no such call)."""
    if _RELEASE is None:
        return False
    _RELEASE()
    return True
