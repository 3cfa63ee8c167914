"""Large jobs through a real server: what a 1 MiB job costs to enqueue (issue 13).

    python -m benchmarks.bench_large                     # 3 runs, both shapes
    python -m benchmarks.bench_large --runs 5 --requests 200

A fresh `sepp serve` per run (durable, `sync_data` unless `--mode`; snapshots off;
pinned to the server core), and this process as its one client (`SeppClient`, pinned
to the driver core; `common.bench_cores`), sending requests one after another, each awaited before the next, in three
shapes:

- `enqueue 1 x 1 MiB`: `enqueue_batch` of one job of a 1 MiB random payload;
- `enqueue 8 x 1 MiB`: eight such jobs per request (8 MiB: the shape of
  `tools.attack`'s snapshot-large and drain-payloads floods);
- `reserve 8 x 1 MiB`: `reserve(max_jobs=8)` of the jobs the enqueues left, each
  answer's eight jobs then acked (the acks are not in the latency, but are in the
  server's CPU).

Per shape: request latency p50 / p90 (ms), payload MiB/s, and per request the
server's CPU (ms, all threads) and minor page faults (each a first touch of memory
the process did not hold: on these virtual machines the dominant cost of taking in
large payloads). Medians over runs; every run's figures are printed as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta

from benchmarks.common import (
    ServeProcess,
    driver_core,
    machine_line,
    median,
    print_table,
    server_core,
)

MiB = 1024 * 1024
# (name, jobs per request, op): the enqueue shapes run first and leave their jobs
# (warm-up ones included) for the reserve shape.
SHAPES = (
    ("enqueue 1 x 1 MiB", 1, "enqueue"),
    ("enqueue 8 x 1 MiB", 8, "enqueue"),
    ("reserve 8 x 1 MiB", 8, "reserve"),
)
QUEUE = "large"
WARMUP_REQUESTS = 3
LEASE = timedelta(minutes=10)


def _proc_stat(pid: int) -> tuple[int, float]:
    """(minor faults, CPU seconds of all threads) of process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _shape(
    addr: str, pid: int, jobs: int, requests: int, seed: int, op: str = "enqueue"
) -> dict[str, float]:
    """`requests` timed requests of `jobs` 1 MiB jobs each (after the warm-up
    ones): enqueues, or reserves (each followed by the acks of what it got,
    untimed but in the server's CPU)."""
    from sepp.client import EnqueueRequest, Payload, ReserveOptions, SeppClient

    data = random.Random(seed).randbytes(MiB)

    async def request(client: SeppClient) -> float:
        if op == "enqueue":
            payload = Payload(data, "application/octet-stream")
            batch = [EnqueueRequest(QUEUE, "blob", payload=payload) for _ in range(jobs)]
            t = time.perf_counter()
            await client.enqueue_batch(batch)
            return time.perf_counter() - t
        t = time.perf_counter()
        got = await client.reserve(ReserveOptions([QUEUE], LEASE, max_jobs=jobs))
        took = time.perf_counter() - t
        if not got or len(got) != jobs:
            raise RuntimeError(f"a reserve of {jobs} jobs got {len(got or [])}")
        await asyncio.gather(*(client.ack(job.ctx) for job in got))
        return took

    async with await SeppClient.connect(addr) as client:
        for _ in range(WARMUP_REQUESTS):
            await request(client)
        faults0, cpu0 = _proc_stat(pid)
        started = time.perf_counter()
        latencies = sorted([await request(client) * 1000 for _ in range(requests)])
        seconds = time.perf_counter() - started
        faults1, cpu1 = _proc_stat(pid)
    return {
        "p50_ms": statistics.median(latencies),
        "p90_ms": latencies[int(len(latencies) * 0.9)],
        "mib_per_s": requests * jobs / seconds,
        "server_cpu_ms": (cpu1 - cpu0) / requests * 1000,
        "faults": (faults1 - faults0) / requests,
    }


def run_once(mode: str, requests: int, seed: int) -> dict[str, dict[str, float]]:
    """One fresh server; every shape against it, in order. The reserve shape
    takes as many jobs as the 8-job enqueue shape put there."""
    env = dict(os.environ)
    env.setdefault("SEPP_STORAGE__SNAPSHOT_EVERY_BYTES", "0")
    env.setdefault("SEPP_LOGGING__LEVEL", "warning")
    server = ServeProcess(
        tempfile.mkdtemp(prefix="sepp-bench-large-"), mode, env, core=server_core()
    )
    try:
        addr = f"127.0.0.1:{server.port}"
        return {
            name: asyncio.run(
                _shape(addr, server.proc.pid, jobs, max(1, requests // jobs), seed, op)
            )
            for name, jobs, op in SHAPES
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--requests", type=int, default=160, help="1 MiB jobs per shape and run (160)"
    )
    parser.add_argument("--mode", default="sync_data", help="persist mode (sync_data)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {int(driver_core())})
    print(machine_line())
    print(
        f"sepp serve --persist-mode {args.mode} (snapshots off, core {server_core()}); one SeppClient "
        f"(core {driver_core()}); {args.requests} jobs of 1 MiB per shape, {args.runs} run(s), seed {seed}"
    )
    runs = []
    for i in range(args.runs):
        out = run_once(args.mode, args.requests, seed + i)
        runs.append(out)
        brief = "; ".join(
            f"{name}: p50 {r['p50_ms']:.1f} ms, {r['mib_per_s']:.0f} MiB/s"
            for name, r in out.items()
        )
        print(f"run {i + 1}/{args.runs}: {brief}", flush=True)
    rows = []
    for name, _jobs, _op in SHAPES:
        values = [r[name] for r in runs]

        def med(key: str, values: list[dict[str, float]] = values) -> float:
            return median([v[key] for v in values])

        rows.append(
            [
                name,
                f"{med('p50_ms'):.1f} / {med('p90_ms'):.1f}",
                f"{med('mib_per_s'):.0f}",
                f"{med('server_cpu_ms'):.1f}",
                f"{med('faults'):,.0f}",
            ]
        )
    print()
    print_table(
        [
            "per request",
            "latency p50 / p90 ms",
            "MiB/s",
            "server CPU ms/request",
            "server minor faults/request",
        ],
        rows,
    )
    print(f"(medians of {args.runs} run(s))")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
