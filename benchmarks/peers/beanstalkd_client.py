"""User-level client benchmark of beanstalkd (compare.py's "clients" section):
greenstalk as its users write it, from threads of ONE process.

greenstalk is blocking and a `Client` is one connection for one thread, so each
of N threads has its own. producer: every thread calls ``client.put(payload)`` in a
loop; worker: every thread loops ``client.reserve(timeout=1)`` then a no-op handler
then ``client.delete(job)``, the clock stopping at the last delete. The worker
works what the producer phase left (topped up, not timed, when fewer are ready).
Prints one JSON line in bench_client's format.

    python -m benchmarks.peers.beanstalkd_client --port 11300 --jobs 50000 --concurrency 50
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from importlib.metadata import version
from typing import Any

import greenstalk

from benchmarks.bench_client import Mark, result
from benchmarks.peers.driverlib import PAYLOAD, run_in_threads

TUBE = "bench-clients"


def connect(host: str, port: int) -> greenstalk.Client[bytes]:
    return greenstalk.Client((host, port), encoding=None, use=TUBE, watch=TUBE)


def produce(jobs: int, clients: list[greenstalk.Client[bytes]]) -> None:
    tickets = itertools.count()  # next() on a count is atomic under the GIL

    def producer(client: greenstalk.Client[bytes]) -> None:
        while next(tickets) < jobs:
            client.put(PAYLOAD)

    run_in_threads(producer, clients)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--server-pid", type=int, default=0)
    p.add_argument("--phases", nargs="+", default=["producer", "worker"])
    args = p.parse_args()
    jobs = args.jobs
    out: dict[str, Any] = {}
    # Each thread's connection is opened up front, as an application opens it at startup.
    clients = [connect(args.host, args.port) for _ in range(args.concurrency)]
    if "producer" in args.phases:
        start = Mark(args.server_pid)
        produce(jobs, clients)
        out["producer"] = result(jobs, start, Mark(args.server_pid))
    if "worker" in args.phases:
        with connect(args.host, args.port) as admin:
            ready = int(admin.stats_tube(TUBE)["current-jobs-ready"])
        if jobs > ready:
            produce(jobs - ready, clients)
        lock = threading.Lock()
        deleted = [0]
        done: list[Mark] = []

        def worker(client: greenstalk.Client[bytes]) -> None:
            while deleted[0] < jobs:
                try:
                    job = client.reserve(timeout=1)
                except greenstalk.TimedOutError:
                    continue
                client.delete(job)
                with lock:
                    deleted[0] += 1
                    if deleted[0] == jobs:
                        done.append(Mark(args.server_pid))

        start = Mark(args.server_pid)
        run_in_threads(worker, clients)
        out["worker"] = result(jobs, start, done[0])
    for client in clients:
        client.close()
    out["client"] = f"greenstalk {version('greenstalk')} (threads)"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
