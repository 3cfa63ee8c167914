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

Freed memory goes back to the system: at every refreeze the C heap's free pages are
released (glibc `malloc_trim(0)`, where it exists). Objects larger than 512 bytes
(a queue's ready-level deque block, payloads) come from malloc, and glibc keeps the
free pages between live chunks resident: after 100k distinct queues were churned
through and forgotten the process stayed at 90 MiB, 62 MiB above idle, with 8 MiB of
it in use; one trim (4 ms) brought it to 37 MiB (issue 13). With nothing to release
a trim takes ~10 us.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable

FREEZE_INTERVAL_S = 5.0
THRESHOLDS = (10_000, 50, 1000)


def configure() -> None:
    """Apply the policy (call once the recovered state is loaded)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


def refreeze() -> None:
    """Move the survivors of the last interval out of the collector's reach, and
    give the heap's free pages back to the system."""
    gc.freeze()
    release_free_memory()


def _find_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc; musl has none
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim_call: Callable[[int], int] = trim
    return trim_call


_MALLOC_TRIM = _find_malloc_trim()


def can_release_free_memory() -> bool:
    return _MALLOC_TRIM is not None


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc `malloc_trim(0)`);
    whether the C library can (False where it has no such call)."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
