"""The `Worker` as a user runs it: one process, one `SeppClient`, a no-op handler,
against a real `sepp serve` in another process (pinned to the server core of
`common.bench_cores`; this process to the driver core). Prints jobs/s (first reserve to last ack) and the client process's
CPU µs per job, per `max_jobs` setting, the median of `--runs`.

    python -m benchmarks.bench_worker                       # max_jobs unset and 1, 50 in flight
    python -m benchmarks.bench_worker --jobs 50000 --runs 5 --max-in-flight 50
    python -m benchmarks.bench_worker --profile /tmp/worker.prof --runs 1 --max-jobs 0

`--max-jobs 0` stands for "unset". The jobs are enqueued in batches of 256 before
the worker starts, so only the worker's own cost is measured. `--profile FILE`
writes cProfile stats of the worker phase (the figures are then not comparable).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import time
from datetime import timedelta

from benchmarks.bench_e2e import Server
from benchmarks.common import driver_core, machine_line, median, print_table
from sepp.client import EnqueueRequest, JobCtx, Payload, SeppClient, Worker, WorkerMetrics

PAYLOAD = Payload(b"x" * 256, "application/octet-stream")
ENQUEUE_BATCH = 256


class _Count(WorkerMetrics):
    def __init__(self, target: int, done: asyncio.Event) -> None:
        super().__init__()
        self.processed = 0
        self._target = target
        self._done = done

    def record_processed(self) -> None:
        self.processed += 1
        if self.processed == self._target:
            self._done.set()


async def _noop(payload: Payload | None, ctx: JobCtx) -> None:
    return None


async def one_run(
    port: int, jobs: int, max_jobs: int | None, max_in_flight: int, profile: str | None
) -> tuple[float, float]:
    """(jobs/s, client CPU µs per job) of one worker phase."""
    client = await SeppClient.connect(f"127.0.0.1:{port}")
    queue = f"w{time.monotonic_ns()}"
    for start in range(0, jobs, ENQUEUE_BATCH):
        count = min(ENQUEUE_BATCH, jobs - start)
        await client.enqueue_batch([EnqueueRequest(queue, "t", payload=PAYLOAD)] * count)
    done = asyncio.Event()
    metrics = _Count(jobs, done)
    worker = Worker(
        client,
        [queue],
        timedelta(seconds=30),
        max_jobs=max_jobs,
        max_in_flight=max_in_flight,
        metrics=metrics,
    )
    worker.handle("t", _noop)
    profiler = cProfile.Profile() if profile else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    task = asyncio.ensure_future(worker.run())
    await done.wait()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)  # type: ignore[arg-type]
    worker.stop()
    await task
    await client.close()
    return jobs / wall, cpu / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=50)
    parser.add_argument("--max-jobs", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--persist-mode", default="sync_all")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {int(driver_core())})
    print(machine_line())
    print(
        f"worker: no-op handler, max_in_flight={args.max_in_flight}, {args.jobs} jobs, "
        f"server --persist-mode {args.persist_mode}, pinned: {pin}"
    )
    rows = []
    for max_jobs in args.max_jobs:
        rates: list[float] = []
        cpus: list[float] = []
        for _ in range(args.runs):
            server = Server(args.persist_mode, pin)
            try:
                rate, cpu = asyncio.run(
                    one_run(
                        server.port, args.jobs, max_jobs or None, args.max_in_flight, args.profile
                    )
                )
            finally:
                server.stop()
            rates.append(rate)
            cpus.append(cpu)
        rows.append(
            [
                max_jobs if max_jobs else "unset",
                f"{median(rates):,.0f}",
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                f"{median(cpus):.1f}",
            ]
        )
    print_table(["max_jobs", "jobs/s (median)", "min-max", "client CPU µs/job"], rows)


if __name__ == "__main__":
    main()
