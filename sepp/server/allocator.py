"""Which memory allocator `sepp serve` runs on ([server] allocator, issue 13).

The default, "auto", is jemalloc when the system has it (Debian/Ubuntu:
`apt install libjemalloc2`) and pymalloc otherwise. The history of that choice
follows, oldest first; the figures that decided it are at the end.

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
(-5 % / -6 %). Eight MiB held after a burst was not worth 6 % of every request, so
pymalloc stayed the default then, with `allocator = "system"` for deployments
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

Measured on 2026-12-03 again, jemalloc 5.3.0 (Debian libjemalloc2, LD_PRELOAD,
PYTHONMALLOC=malloc, MALLOC_CONF as first tried, see below): it returns what a burst
freed, for a few per cent of speed. `--full --seed 2026120313`, RSS idle -> after in
MiB: queue-churn 36 -> 38, idempotency-keys 37 -> 40, parked-reset 37 -> 38
(pymalloc: 34 -> 41, 34 -> 40, 34 -> 37). Speed, interleaved rounds on a shared
machine: through the client (`bench_client --phases producer worker --jobs 60000`,
three rounds) producer 32.3k against pymalloc's 32.6k jobs/s and Worker 22.2k
against 22.6k (-1 % / -2 %; glibc malloc in the same rounds 30.9k / 20.3k, -5 % /
-10 %); under the lean load generator (`bench_e2e --modes sync_all --jobs 40000`,
three rounds) enqueue 16.0k against 16.9k jobs/s and 55-60 against 52-56 µs of
server CPU per job (-5 %), drain even. With the settings adopted (below), six
rounds of the same bench_client: producer 31.6k against 33.5k (medians, -6 %),
Worker 20.5k against 22.0k (-7 %); round by round the gap was 0-10 %. So "auto"
picks jemalloc: memory that comes back after a burst, for about 5 % of throughput;
`allocator = "python"` takes that back and keeps ~7 MiB after a burst.

Its settings, JEMALLOC_CONF. First tried: a background thread purging pages freed
about a second ago (dirty_decay_ms 1000). That made snapshots of large jobs slow
for everyone: with 1,000 live jobs of 1 MiB arriving in 8 MiB requests
(`tools.attack --only snapshot-large`) every freed request buffer was handed back
and faulted in again, 590k page faults in the server against pymalloc's 294k
(the same with decay 30 s), and the well-behaved client's p99 went from 29-44 ms
(pymalloc, 10 runs) to 35-79 ms (jemalloc, 15 runs, 4 over the 50 ms target). So
jemalloc is told never to purge by itself (dirty_decay_ms -1) and the server purges
every arena at its full refreezes (gcpolicy.release_free_memory, on a thread; a
refreeze is full after a quiet 5 s interval, or once a minute while busy:
gcpolicy.RefreezeSchedule): freed pages are reused while the server is busy and
returned at most ~5 s after a burst --
342k page faults, p99 35-50 ms (5 runs), RSS after queue-churn / idempotency-keys /
parked-reset 38 / 38 / 38 MiB, idle 37. muzzy_decay_ms 0: what is purged is
released (MADV_DONTNEED), not merely marked free, so RSS shows it; two arenas for
a process whose work is one thread. A MALLOC_CONF the user set is kept (and then
jemalloc's own decay applies as configured; the refreeze purges all the same).

The allocator is chosen when the interpreter starts (PYTHONMALLOC, LD_PRELOAD), so
with "auto" (jemalloc found), "jemalloc" or "system" the server re-executes itself
once, the same command line with PYTHONMALLOC=malloc (and jemalloc preloaded),
before it opens anything: same process id, same arguments, a quarter of a second
more at startup. A PYTHONMALLOC the user set is never overridden, and an
in-process server (tests, embedding) is never re-executed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping

ALLOCATORS = ("auto", "jemalloc", "system", "python")
SYSTEM_MALLOC = "malloc"
JEMALLOC_CONF = "narenas:2,dirty_decay_ms:-1,muzzy_decay_ms:0"
JEMALLOC_MISSING = (
    'server.allocator = "jemalloc" but libjemalloc is not installed'
    " (Debian/Ubuntu: apt install libjemalloc2)"
)


class AllocatorUnavailable(Exception):
    """The configured allocator cannot be loaded on this system."""


def find_jemalloc() -> str | None:
    """The shared library name of jemalloc, for LD_PRELOAD, or None (also on systems
    other than Linux, whose loaders preload another way)."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.util.find_library("jemalloc")


def reexec_environment(
    allocator: str, environ: Mapping[str, str], find: Callable[[], str | None] | None = None
) -> dict[str, str] | None:
    """The environment variables to re-execute the server with for `allocator`, or
    None when the running interpreter already has the right one (or the user chose
    one with PYTHONMALLOC). Raises AllocatorUnavailable for "jemalloc" without it."""
    if allocator == "python" or "PYTHONMALLOC" in environ:
        return None
    if allocator == "system":
        return {"PYTHONMALLOC": SYSTEM_MALLOC}
    library = (find or find_jemalloc)()
    if library is None:
        if allocator == "jemalloc":
            raise AllocatorUnavailable(JEMALLOC_MISSING)
        return None  # auto: pymalloc
    preload = environ.get("LD_PRELOAD", "")
    return {
        "PYTHONMALLOC": SYSTEM_MALLOC,
        "LD_PRELOAD": f"{library} {preload}".strip(),
        "MALLOC_CONF": environ.get("MALLOC_CONF", JEMALLOC_CONF),
    }


def use_allocator(allocator: str) -> None:
    """Re-execute this process on the allocator `allocator` asks for when it is not
    in use yet; returns only when nothing is to be done. Raises
    AllocatorUnavailable (before anything changed) for a missing jemalloc."""
    changes = reexec_environment(allocator, os.environ)
    if changes is None:
        return
    os.environ.update(changes)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def jemalloc_version() -> str | None:
    """jemalloc's version when it is this process's malloc (preloaded), else None."""
    try:
        mallctl = ctypes.CDLL(None).mallctl  # only jemalloc defines it
    except (AttributeError, OSError):
        return None
    value = ctypes.c_char_p()
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if mallctl(b"version", ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return "?"
    return (value.value or b"?").decode(errors="replace").partition("-")[0]


def allocator_in_use(
    environ: Mapping[str, str], jemalloc: Callable[[], str | None] = jemalloc_version
) -> str:
    """What this interpreter allocates small objects with, for the startup log."""
    chosen = environ.get("PYTHONMALLOC", "")
    if chosen.startswith("malloc"):
        version = jemalloc()
        return f"jemalloc {version}" if version else "system malloc"
    if chosen in ("", "pymalloc", "pymalloc_debug", "debug"):
        return "pymalloc"
    return chosen
