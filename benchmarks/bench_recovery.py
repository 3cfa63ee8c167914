"""Recovery, snapshot and memory figures of the storage engine.

    python -m benchmarks.bench_recovery                       # 100k and 1M live jobs
    python -m benchmarks.bench_recovery --jobs 100000 --runs 3

For each size it builds a data directory with that many live 256-byte jobs (in a
child process, buffer mode, no snapshot) and then, each in a fresh process so the
figures do not leak into each other:

- replay: cold start from the log alone -> events/s and seconds;
- snapshot: take one snapshot of the state (fork mode) -> write time, while 64
  submitters keep committing durable (sync_data) enqueues: the longest gap between
  two consecutive commit completions during the snapshot vs. before it (the stall),
  with the server's garbage-collector policy (sepp/server/gcpolicy.py);
- cold start from the snapshot -> seconds;
- resident memory (VmRSS) with all jobs live, after recovery.

A separate "mixed" log (enqueue, reserve, ack, nack, extend: one event per
record, like the server's 50/50 workload) gives a second replay figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine_line, median, print_table, rss_bytes
from sepp.core import Ack, CoreConfig, Enqueue, Extend, Nack, NewJob, Reserve
from sepp.server import gcpolicy
from sepp.server.ids import JobIds
from sepp.storage import Engine, StorageOptions

PAYLOAD = b"x" * 256


def _new_job(ids: JobIds) -> NewJob:
    return NewJob(
        job_id=ids.next(),
        queue="bench",
        job_type="work",
        payload_data=PAYLOAD,
        payload_encoding="application/octet-stream",
    )


def build(data_dir: str, jobs: int, mixed: bool) -> dict[str, float]:
    """Write a log: `jobs` live jobs (each its own enqueue record); with `mixed`,
    also reserve/ack/nack/extend traffic around them."""
    gc.disable()
    engine = Engine.open(
        data_dir, CoreConfig(), StorageOptions(persist_mode="buffer", snapshot_every_bytes=0)
    )
    ids = JobIds()
    now = 1_000_000
    for i in range(jobs):
        engine.execute(Enqueue(jobs=(_new_job(ids),)), now)
        if mixed and i % 2 == 0:
            # Traffic that leaves nothing behind: enqueue, reserve, extend, nack,
            # reserve, ack -- six records for one transient job.
            engine.execute(Enqueue(jobs=(_new_job(ids),)), now)
            decision, _ = engine.execute(Reserve(queues=("bench",), lease_ms=60_000), now)
            job = decision.reply.jobs[0]  # type: ignore[union-attr]
            engine.execute(Extend(job_id=job.job_id, attempt=job.attempt, lease_ms=60_000), now)
            engine.execute(Nack(job_id=job.job_id, attempt=job.attempt), now)
            decision, _ = engine.execute(Reserve(queues=("bench",), lease_ms=60_000), now)
            job = decision.reply.jobs[0]  # type: ignore[union-attr]
            engine.execute(Ack(job_id=job.job_id, attempt=job.attempt), now)
        if i % 1000 == 0:
            engine.flush()
            now += 1
    engine.close()
    return {"records": engine.appended_seq}


def cold_start(data_dir: str) -> dict[str, float]:
    started = time.perf_counter()
    engine = Engine.open(data_dir, CoreConfig(), StorageOptions(snapshot_every_bytes=0))
    elapsed = time.perf_counter() - started
    report = engine.recovery_report
    gc.collect()
    result = {
        "seconds": elapsed,
        "events": report.events_replayed,
        "records": report.records_replayed,
        "events_per_s": report.events_replayed / report.replay_s if report.replay_s else 0.0,
        "snapshot_load_s": report.snapshot_load_s,
        "rss": rss_bytes(),
        "live_jobs": len(engine.state.jobs),
    }
    engine.close()
    return result


async def _snapshot_under_load(engine: Engine, submitters: int) -> dict[str, float]:
    from sepp.server.pipeline import CommitPipeline

    pipeline = CommitPipeline(engine, backlog_max=1 << 30)
    pipeline.start()
    ids = JobIds()
    completions: list[float] = []
    stop = asyncio.Event()

    async def submitter() -> None:
        while not stop.is_set():
            await pipeline.submit(Enqueue(jobs=(_new_job(ids),)))
            completions.append(time.perf_counter())

    async def refreezer() -> None:
        # The server's GC policy (sepp/server/gcpolicy.py): freeze survivors often.
        while not stop.is_set():
            await asyncio.sleep(gcpolicy.FREEZE_INTERVAL_S)
            gcpolicy.refreeze()

    tasks = [asyncio.create_task(submitter()) for _ in range(submitters)]
    tasks.append(asyncio.create_task(refreezer()))
    await asyncio.sleep(1.0)  # a baseline second of commits
    snap_started = time.perf_counter()
    engine.start_snapshot()
    fork_done = time.perf_counter()
    while engine.snapshot_running():
        await asyncio.sleep(0.005)
    snap_ended = time.perf_counter()
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*tasks)
    await pipeline.stop()

    def longest_gap(start: float, end: float) -> float:
        times = [t for t in completions if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(times)), default=float("nan"))

    return {
        "snapshot_s": snap_ended - snap_started,
        "fork_ms": (fork_done - snap_started) * 1000,
        "stall_ms": longest_gap(snap_started - 0.001, snap_ended) * 1000,
        "baseline_gap_ms": longest_gap(snap_started - 0.9, snap_started) * 1000,
        "commits_during": sum(1 for t in completions if snap_started <= t <= snap_ended),
    }


def snapshot(data_dir: str) -> dict[str, float]:
    engine = Engine.open(
        data_dir,
        CoreConfig(),
        StorageOptions(persist_mode="sync_data", snapshot_every_bytes=0, snapshot_mode="fork"),
    )
    gcpolicy.configure()
    result = asyncio.run(_snapshot_under_load(engine, 64))
    engine.close()
    return result


def _child(action: str, data_dir: str, jobs: int, mixed: bool) -> dict[str, float]:
    code = (
        "import json, sys; from benchmarks.bench_recovery import *; "
        f"print(json.dumps({action}(sys.argv[1]{', ' + str(jobs) + ', ' + str(mixed) if action == 'build' else ''})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, data_dir],
        check=True,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", nargs="+", type=int, default=[100_000, 1_000_000])
    parser.add_argument("--mixed-jobs", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(machine_line())
    rows = []
    base = tempfile.mkdtemp(prefix="sepp-bench-recovery-")
    try:
        if args.mixed_jobs:
            d = os.path.join(base, "mixed")
            built = _child("build", d, args.mixed_jobs, True)
            runs = [_child("cold_start", d, 0, False) for _ in range(args.runs)]
            rows.append(
                (
                    f"mixed log ({int(built['records']):,} records)",
                    "replay from log",
                    median([r["seconds"] for r in runs]),
                    median([r["events_per_s"] for r in runs]),
                    "",
                    median([r["rss"] for r in runs]) / 2**20,
                )
            )
            print(rows[-1], flush=True)
        for jobs in args.jobs:
            d = os.path.join(base, f"live-{jobs}")
            _child("build", d, jobs, False)
            log_runs = [_child("cold_start", d, 0, False) for _ in range(args.runs)]
            rows.append(
                (
                    f"{jobs:,} live jobs",
                    "cold start from log",
                    median([r["seconds"] for r in log_runs]),
                    median([r["events_per_s"] for r in log_runs]),
                    "",
                    median([r["rss"] for r in log_runs]) / 2**20,
                )
            )
            print(rows[-1], flush=True)
            snap = _child("snapshot", d, 0, False)
            rows.append(
                (
                    f"{jobs:,} live jobs",
                    f"snapshot (fork {snap['fork_ms']:.0f} ms)",
                    snap["snapshot_s"],
                    "",
                    f"stall {snap['stall_ms']:.1f} ms (baseline gap {snap['baseline_gap_ms']:.1f} ms)",
                    "",
                )
            )
            print(rows[-1], flush=True)
            snap_runs = [_child("cold_start", d, 0, False) for _ in range(args.runs)]
            rows.append(
                (
                    f"{jobs:,} live jobs",
                    "cold start from snapshot",
                    median([r["seconds"] for r in snap_runs]),
                    "",
                    f"snapshot load {median([r['snapshot_load_s'] for r in snap_runs]):.2f} s",
                    median([r["rss"] for r in snap_runs]) / 2**20,
                )
            )
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print_table(["data", "measure", "median s", "events/s", "notes", "RSS MiB"], rows)


if __name__ == "__main__":
    main()
