"""The client side of bench_grpc's `official` phase: the official `sepp-py` client
(which imports as `sepp` too) in its own virtual environment, so this file is run
by path with that environment's Python, never as part of the `benchmarks`
package, and imports nothing of this repository.

    .venv-official/bin/python benchmarks/grpc_official_child.py \
        --addr 127.0.0.1:PORT --server-pid PID --jobs 20000 --concurrency 50

N tasks (--concurrency) each await `client.enqueue(EnqueueRequest(...))`, one job
at a time (256-byte payload, built per call as user code builds it), on one
`SeppClient` (one channel). Prints one JSON line: jobs/s, the client's CPU
(`time.process_time`, all threads) and the server's (/proc/PID/stat) per job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

PAYLOAD = b"x" * 256
ENCODING = "application/octet-stream"


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(addr: str, jobs: int, concurrency: int, server_pid: int) -> dict[str, float]:
    from sepp import EnqueueRequest, Payload, SeppClient

    client = await SeppClient.connect(addr)
    try:
        # Warm the channel and the server's paths (not timed).
        for _ in range(100):
            await client.enqueue(
                EnqueueRequest("bench-warm", "bench", payload=Payload(PAYLOAD, ENCODING))
            )
        remaining = [jobs]

        async def caller() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await client.enqueue(
                    EnqueueRequest("bench-grpc", "bench", payload=Payload(PAYLOAD, ENCODING))
                )

        wall0, cpu0, server0 = time.perf_counter(), time.process_time(), proc_cpu(server_pid)
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        wall1, cpu1, server1 = time.perf_counter(), time.process_time(), proc_cpu(server_pid)
    finally:
        await client.close()
    seconds = wall1 - wall0
    return {
        "jobs": jobs,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds,
        "client_us_per_job": (cpu1 - cpu0) / jobs * 1e6,
        "server_us_per_job": (server1 - server0) / jobs * 1e6,
        "client_cpu": (cpu1 - cpu0) / seconds,
        # One single-job EnqueueBatch per enqueue: per RPC = per job.
        "server_us_per_rpc": (server1 - server0) / jobs * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", required=True)
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--pin", type=int, default=-1, help="pin to this core (-1: no)")
    args = parser.parse_args()
    if args.pin >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.pin})
    print(json.dumps(asyncio.run(run(args.addr, args.jobs, args.concurrency, args.server_pid))))


if __name__ == "__main__":
    main()
