"""`python -m benchmarks.bench_admin [--jobs N] [--runs R]`: the server time of the
admin reads of issue 15 on a large queue.

Builds a state of N ready jobs in one queue (default 1,000,000) by applying
enqueue events, as recovery would, then times what the server does to answer:

- a page of 100 jobs (`sepp.core.reads.list_jobs` through the per-queue, per-state
  index, the answer body of the native front and its msgpack encoding), for every
  page of the queue, walked with the opaque cursor from the first to the last;
- a job by id (`get_job`, its answer body and encoding), for 1,000 ids spread over
  the queue;
- the same page walk while the queue changes underneath: every tenth job acked
  (removed from the index) before the walk, so cursors skip holes.

Prints medians, p99 and max in ms per answer, with the targets (a page of 100 in
at most 5 ms of server time, a job by id in at most 1 ms). Socket time is left
out: it is the same for any answer of this size.
"""

from __future__ import annotations

import argparse
import gc
import time
import uuid

import msgpack

from benchmarks.common import machine_line, median, print_table
from sepp.core import CoreConfig, State, apply_record
from sepp.core.events import JobAcked, JobEnqueued, JobReserved
from sepp.core.reads import get_job, list_jobs
from sepp.server.admin_shapes import job_info_body, page_body

PAGE_JOBS = 100
BY_ID_SAMPLES = 1_000
PAGE_TARGET_MS = 5.0
BY_ID_TARGET_MS = 1.0


def build_state(jobs: int) -> tuple[State, list[str]]:
    state = State(CoreConfig())
    ids = [str(uuid.UUID(int=i + 1, version=4)) for i in range(jobs)]
    for i, job_id in enumerate(ids):
        apply_record(
            state,
            1_000 + i,
            [
                JobEnqueued(
                    job_id=job_id,
                    queue="q",
                    job_type="t",
                    payload_data=b'{"n": %d}' % i,
                    payload_encoding="application/json",
                    priority=i % 10,
                    max_attempts=3,
                    enqueued_at=1_000 + i,
                    scheduled_at=None,
                    run_at=None,
                    idempotency_key=None,
                    dedup_expires_at=None,
                    traceparent=None,
                    tracestate=None,
                    custom=None,
                )
            ],
        )
    return state, ids


def ack_every(state: State, ids: list[str], step: int) -> None:
    """Lease and ack every `step`-th job: holes in the ready index."""
    now = 2_000_000_000
    for job_id in ids[::step]:
        apply_record(
            state,
            now,
            [JobReserved(job_id=job_id, attempt=1, lease_expires_at=now + 60_000, worker_id="w")],
        )
        apply_record(state, now, [JobAcked(job_id=job_id, attempt=1, worker_id="w")])


def walk_pages(state: State) -> list[float]:
    """Seconds per page answer, for every page of the queue."""
    times: list[float] = []
    cursor: str | None = None
    clock = time.perf_counter
    while True:
        started = clock()
        page = list_jobs(state, "q", "ready", cursor=cursor, limit=PAGE_JOBS)
        assert not isinstance(page, Exception), page
        msgpack.packb(page_body(page))
        times.append(clock() - started)
        cursor = page.next_cursor
        if cursor is None:
            return times


def by_id(state: State, ids: list[str]) -> list[float]:
    times: list[float] = []
    clock = time.perf_counter
    stride = max(1, len(ids) // BY_ID_SAMPLES)
    for job_id in ids[::stride][:BY_ID_SAMPLES]:
        started = clock()
        info = get_job(state, job_id)
        if info is not None:
            msgpack.packb(job_info_body(info))
        times.append(clock() - started)
    return times


def summary(name: str, seconds: list[float], target_ms: float) -> list[object]:
    ordered = sorted(seconds)
    p99 = ordered[max(0, int(len(ordered) * 0.99) - 1)]
    worst = ordered[-1] * 1e3
    return [
        name,
        len(ordered),
        f"{median(ordered) * 1e3:.3f}",
        f"{p99 * 1e3:.3f}",
        f"{worst:.3f}",
        f"<= {target_ms:g}",
        "met" if p99 * 1e3 <= target_ms else "NOT MET",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_admin")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="ready jobs in the queue")
    parser.add_argument("--runs", type=int, default=3, help="walks of the whole queue")
    args = parser.parse_args(argv)
    print(machine_line())
    started = time.perf_counter()
    state, ids = build_state(args.jobs)
    print(f"built {args.jobs:,} ready jobs in {time.perf_counter() - started:.1f} s")
    # As the server does (sepp.server.gcpolicy): the long-lived state is frozen out
    # of the collector's reach, so a collection does not walk a million jobs.
    gc.freeze()
    pages: list[float] = []
    jobs: list[float] = []
    for _ in range(args.runs):
        pages += walk_pages(state)
        jobs += by_id(state, ids)
    ack_every(state, ids, 10)
    holes: list[float] = []
    for _ in range(args.runs):
        holes += walk_pages(state)
    rows = [
        summary(f"page of {PAGE_JOBS} ({args.jobs:,} ready)", pages, PAGE_TARGET_MS),
        summary(f"page of {PAGE_JOBS}, every 10th acked", holes, PAGE_TARGET_MS),
        summary("job by id", jobs, BY_ID_TARGET_MS),
    ]
    print_table(["answer", "samples", "median ms", "p99 ms", "max ms", "target", "p99"], rows)
    print(f"command: python -m benchmarks.bench_admin --jobs {args.jobs} --runs {args.runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
