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
"""

from __future__ import annotations

import gc

FREEZE_INTERVAL_S = 5.0
THRESHOLDS = (10_000, 50, 1000)


def configure() -> None:
    """Apply the policy (call once the recovered state is loaded)."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


def refreeze() -> None:
    """Move the survivors of the last interval out of the collector's reach."""
    gc.freeze()
