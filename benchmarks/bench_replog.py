"""The JetStream replicated log alone (issue 19): fenced appends on a local
three-server cluster (tools/cluster.py: R3, file storage, `sync_interval: always`).

    python -m benchmarks.bench_replog [--latency-appends 1000] [--seconds 5]

Prints the machine and a 4 KiB fsync probe, then one table:
- fenced 1 KiB `append_if` latency with one in flight (p50 / p99 / max ms);
- 16 KiB `append_if` throughput (appends/s, MB/s) with 1, 4 and 16 in flight,
  each append expecting its predecessor's sequence (how a leader pipelines
  group commits).
The cluster is started in a temporary directory and stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from benchmarks.common import fsync_rate, machine_line, print_table
from sepp.cluster import jetstream
from tools import cluster as local_cluster


def _percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


async def _latency(log: jetstream.JetStreamLog, count: int) -> list[float]:
    payload = os.urandom(1024)
    last = await log.last()
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        last = await log.append_if(last, payload)
        samples.append((time.perf_counter() - start) * 1000)
    return sorted(samples)


async def _throughput(log: jetstream.JetStreamLog, in_flight: int, seconds: float) -> float:
    """Appends/s with `in_flight` fenced appends outstanding, each expecting the
    sequence its predecessor will get."""
    payload = os.urandom(16 * 1024)
    next_expected = await log.last()
    window: asyncio.Queue[asyncio.Task[int]] = asyncio.Queue()
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    for _ in range(in_flight):
        window.put_nowait(asyncio.ensure_future(log.append_if(next_expected, payload)))
        next_expected += 1
    while True:
        task = await window.get()
        await task
        done += 1
        if time.perf_counter() >= deadline:
            break
        window.put_nowait(asyncio.ensure_future(log.append_if(next_expected, payload)))
        next_expected += 1
    elapsed = time.perf_counter() - start
    while not window.empty():
        await window.get_nowait()
    return done / elapsed


async def _run(cluster: local_cluster.JetStreamCluster, args: argparse.Namespace) -> None:
    nc = await jetstream.connect(cluster.urls())
    try:
        res = await jetstream.ensure_cluster_resources(
            nc, jetstream.ClusterNames("bench"), monitor_urls=cluster.monitor_urls()
        )
        await _latency(res.log, 50)  # warm-up
        lat = await _latency(res.log, args.latency_appends)
        rows: list[list[object]] = [
            [
                "1 KiB fenced append, 1 in flight",
                f"{_percentile(lat, 0.5):.2f} / {_percentile(lat, 0.99):.2f} / {lat[-1]:.2f}",
                f"{1000 / (sum(lat) / len(lat)):.0f}",
                "",
            ]
        ]
        for in_flight in args.in_flight:
            rate = await _throughput(res.log, in_flight, args.seconds)
            rows.append(
                [
                    f"16 KiB fenced appends, {in_flight} in flight",
                    "",
                    f"{rate:.0f}",
                    f"{rate * 16 / 1024:.1f}",
                ]
            )
        print_table(["case", "p50 / p99 / max ms", "appends/s", "MiB/s"], rows)
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency-appends", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-replog-") as tmp:
        probe = fsync_rate(tmp)
        print(f"fsync probe (4 KiB append + fdatasync): {probe}")
        cluster = local_cluster.start_cluster(tmp)
        try:
            asyncio.run(_run(cluster, args))
        finally:
            local_cluster.stop_cluster(cluster)


if __name__ == "__main__":
    main()
