"""Which memory allocator `sepp serve` runs on ([server] allocator, issue 13).

CPython's own small-object allocator (pymalloc) carves 1 MiB arenas and hands one
back to the operating system only once every object in it is gone. After a burst
(100,000 queue names created and forgotten, a flood of idempotency keys expiring)
the few objects allocated during it that live on unchanged -- counters, timers,
interned strings -- keep arenas alive: RSS stays 15-25 % above a fresh server's
idle size with the state back to empty (`python -m tools.attack --full --only
queue-churn --only idempotency-keys`: 42 / 40 MiB after, 34 idle). The C library's
malloc returns freed memory, so RSS comes back to idle (35 / 35 MiB, 35 idle).

That costs the request path: in `bench_e2e --modes sync_data` (50/50, 50,000 jobs,
three interleaved rounds each) malloc gave 24,537 / 14,976 enqueue / drain jobs/s
and 37 / 60 µs of server CPU per job against pymalloc's 25,857 / 16,007 and 34 / 55
(-5 % / -6 %). Eight MiB held after a burst is not worth 6 % of every request, so
pymalloc stays the default and `allocator = "system"` is there for deployments
whose bursts are large next to their steady state.

Measured again on 2026-12-03 (a new machine image; `--full --seed 7`, queue-churn /
idempotency-keys, RSS idle -> after in MiB): pymalloc 34 -> 42 (queue-churn; the
pinned arenas hold a few dozen objects each: counters rebound on every request,
the histograms' bucket counts, two dicts the state re-created while it forgot
queues, a timer's deadline), glibc malloc 35 -> 36 and 34 -> 35, and mimalloc 2.0.9
(Debian libmimalloc2.0, LD_PRELOAD, PYTHONMALLOC=malloc) 39 -> 41 and 40 -> 48: as
fast as pymalloc (bench_e2e 50/50 sync_data, two interleaved rounds, 21.0k vs 21.1k
enqueue/s) but a larger idle size and no better after the key flood, so it is not
offered. glibc malloc cost -2.7 % enqueue / -6.3 % drain (three interleaved rounds:
20,455 / 13,031 against 21,020 / 13,911 jobs/s; 44 / 68 against 42 / 63 µs/job).
Through the client library it costs more: `bench_client --phases producer worker
worker_mj1 --jobs 60000`, two interleaved rounds with `SEPP_SERVER__ALLOCATOR`
system / python: producer 37.2k / 37.1k against 41.8k / 42.2k jobs/s (-11 %), Worker
26.2k / 25.4k against 29.9k / 30.5k (-14 %), `max_jobs=1` unchanged (~18k).

Tried on 2026-12-03 and dropped: after a burst, at the refreeze that sweeps the
heap, replace the int and float values sepp's long-lived objects hold (counters,
offsets, histogram counts) with equal fresh copies, so that they move into the
pools pymalloc allocates from now and the arenas they pinned empty out. The pass
found 58-63 such values in ~6 ms, but the arenas stayed pinned by what is left or
made anew -- instance dicts the pass itself materialized, weak references, the
log writer's offsets rebound since, an empty list nobody tracks -- and
queue-churn ended at 44-45 MiB against 41-44 without it (idle 34-35).

The allocator is chosen when the interpreter starts (PYTHONMALLOC), so with
"system" the server re-executes itself once, the same command line with
PYTHONMALLOC=malloc, before it opens anything: same process id, same arguments, a
quarter of a second more at startup. A PYTHONMALLOC the user set is never
overridden, and an in-process server (tests, embedding) is never re-executed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

ALLOCATORS = ("system", "python")
SYSTEM_MALLOC = "malloc"


def reexec_command(allocator: str, environ: Mapping[str, str]) -> list[str] | None:
    """The command line to re-execute the server with for `allocator`, or None
    when the running interpreter already has the right one (or the user chose
    one with PYTHONMALLOC)."""
    if allocator != "system" or "PYTHONMALLOC" in environ:
        return None
    return [sys.executable, *sys.orig_argv[1:]]


def use_allocator(allocator: str) -> None:
    """Re-execute this process on the C library's malloc when `allocator` asks
    for it and it is not in use yet; returns only when nothing is to be done."""
    command = reexec_command(allocator, os.environ)
    if command is None:
        return
    os.environ["PYTHONMALLOC"] = SYSTEM_MALLOC
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


def allocator_in_use(environ: Mapping[str, str]) -> str:
    """What this interpreter allocates small objects with, for the startup log."""
    chosen = environ.get("PYTHONMALLOC", "")
    if chosen.startswith("malloc"):
        return "system malloc"
    if chosen in ("", "pymalloc", "pymalloc_debug", "debug"):
        return "pymalloc"
    return chosen
