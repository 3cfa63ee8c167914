"""What the core's state costs in memory per queue, per idempotency key and per job
type, while jobs are held and after they are gone (issue 13, found 4: 100k distinct
queue names once took the server from 31 to 973 MiB, and it stayed there).

    python -m benchmarks.bench_memory                 # 100,000 items per scenario
    python -m benchmarks.bench_memory --count 20000   # quicker

Each scenario runs the live path (`decide`, then `apply_record`) on a fresh `State`
in its own child process, twice: once under `tracemalloc` (bytes the Python heap
holds: exact and repeatable) and once without it (resident memory from
/proc/self/statm, what an operator sees; tracemalloc's own bookkeeping would distort
it). Each measures three moments: idle (the empty state), full (`--count` jobs
enqueued) and churned (every job reserved and acked; `gc.collect()` before each
reading), then once more after `gcpolicy.release_free_memory()` (trimmed: what the
server's periodic `gcpolicy.refreeze` gives back). Scenarios, `--count` jobs each:

- baseline: one queue, one job type, no idempotency key;
- queues: a distinct queue per job;
- keys: one queue, an idempotency key per job (the default 24 h window, so every
  key outlives its job's ack);
- types: one queue, a distinct job type per job.

The table gives bytes per item: (reading - idle) / count; the "per ..." rows below it
subtract the baseline, so they are the cost of the queue, the key or the job type
alone. The core is measured without the server: the server keeps no per-queue or
per-job-type structure beyond the parked long-polls of a queue (freed with the last
of them).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc
import uuid
from typing import Any

from benchmarks.common import machine_line
from sepp.core import Ack, CoreConfig, Decision, Enqueue, NewJob, Reserve, State, apply_record
from sepp.core import decide as decide_fn
from sepp.core.results import ReserveResult
from sepp.server import gcpolicy

SCENARIOS = ("baseline", "queues", "keys", "types")
NOW = 1_700_000_000_000
BATCH = 256


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _job(scenario: str, i: int) -> NewJob:
    return NewJob(
        job_id=str(uuid.UUID(int=(i + 1) << 64 | 0xBEEF)),
        queue=f"queue-{i:08d}" if scenario == "queues" else "q",
        job_type=f"type-{i:08d}" if scenario == "types" else "work",
        payload_data=b"x" * 16,
        payload_encoding="application/octet-stream",
        idempotency_key=f"key-{i:08d}-{uuid.UUID(int=i)}" if scenario == "keys" else None,
    )


def _run(state: State, command: Any, now: int) -> Any:
    result = decide_fn(state, command, now)
    assert isinstance(result, Decision), result
    apply_record(state, result.time_ms, result.events)
    return result.reply


def _fill(state: State, scenario: str, count: int) -> None:
    for start in range(0, count, BATCH):
        jobs = tuple(_job(scenario, i) for i in range(start, min(count, start + BATCH)))
        _run(state, Enqueue(jobs=jobs), NOW)


def _churn(state: State, scenario: str, count: int) -> None:
    if scenario == "queues":
        for i in range(count):
            reply = _run(state, Reserve(queues=(f"queue-{i:08d}",), lease_ms=60_000), NOW)
            assert isinstance(reply, ReserveResult)
            for view in reply.jobs:
                _run(state, Ack(job_id=view.job_id, attempt=view.attempt), NOW)
        return
    while True:
        reply = _run(state, Reserve(queues=("q",), lease_ms=60_000, max_jobs=BATCH), NOW)
        assert isinstance(reply, ReserveResult)
        if not reply.jobs:
            return
        for view in reply.jobs:
            _run(state, Ack(job_id=view.job_id, attempt=view.attempt), NOW)


def child(scenario: str, count: int, traced: bool) -> dict[str, int]:
    def reading() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()

    if traced:
        tracemalloc.start()
    state = State(CoreConfig())
    idle = reading()
    _fill(state, scenario, count)
    full = reading()
    _churn(state, scenario, count)
    assert not state.jobs
    churned = reading()
    # What the server's periodic gcpolicy.refreeze does: free heap pages go back.
    gcpolicy.release_free_memory()
    trimmed = reading()
    return {
        "idle": idle,
        "full": full,
        "churned": churned,
        "trimmed": trimmed,
        "queues_left": len(state.queues),
    }


def _measure(scenario: str, count: int, traced: bool) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_memory", "--child", scenario]
        + ["--count", str(count)]
        + (["--traced"] if traced else []),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.count, args.traced)))
        return
    count = args.count
    print(machine_line())
    print(f"{count:,} jobs per scenario; bytes per job = (reading - idle) / {count:,}")
    heap = {s: _measure(s, count, traced=True) for s in SCENARIOS}
    rss = {s: _measure(s, count, traced=False) for s in SCENARIOS}

    def per(r: dict[str, int], moment: str) -> float:
        return (r[moment] - r["idle"]) / count

    print()
    print(
        f"{'scenario':<10} {'heap full':>10} {'heap churned':>13} "
        f"{'RSS idle MiB':>13} {'RSS full MiB':>13} {'RSS churned MiB':>16} "
        f"{'RSS trimmed MiB':>16} {'queues left':>12}"
    )
    for s in SCENARIOS:
        h, r = heap[s], rss[s]
        print(
            f"{s:<10} {per(h, 'full'):>10.0f} {per(h, 'churned'):>13.0f} "
            f"{r['idle'] / 2**20:>13.1f} {r['full'] / 2**20:>13.1f} "
            f"{r['churned'] / 2**20:>16.1f} {r['trimmed'] / 2**20:>16.1f} {h['queues_left']:>12}"
        )
    print()
    base_full, base_churned = per(heap["baseline"], "full"), per(heap["baseline"], "churned")
    rows = (
        ("per queue holding a job", per(heap["queues"], "full") - base_full),
        ("per queue once emptied", per(heap["queues"], "churned") - base_churned),
        ("per idempotency key (job live)", per(heap["keys"], "full") - base_full),
        ("per idempotency key (job acked)", per(heap["keys"], "churned") - base_churned),
        ("per distinct job type (live)", per(heap["types"], "full") - base_full),
        ("per distinct job type (churned)", per(heap["types"], "churned") - base_churned),
    )
    for label, value in rows:
        print(f"{label:<34} {value:>8.0f} B")


if __name__ == "__main__":
    main()
