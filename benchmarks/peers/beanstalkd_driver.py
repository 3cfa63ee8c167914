"""Load driver for beanstalkd with its native Python client, greenstalk.

greenstalk is blocking, so every producer / worker is a thread with its own
connection and one command in flight (closed loop). Enqueue = `put`; drain =
`reserve` (timeout 0) + `delete` per job, the clock stopping at the last delete;
latency = put -> reserve -> delete on one connection.

    python -m benchmarks.peers.beanstalkd_driver --port 11300 --connections 50 --jobs 200000
"""

from __future__ import annotations

import itertools
import threading
import time
from importlib.metadata import version

import greenstalk

from benchmarks.peers.driverlib import (
    PAYLOAD,
    PhaseClock,
    emit,
    parser,
    percentiles,
    rate,
    run_in_threads,
)

TUBE = "bench"


def connect(host: str, port: int, tube: str = TUBE) -> greenstalk.Client:
    return greenstalk.Client((host, port), encoding=None, use=tube, watch=tube)


def enqueue_phase(clients: list[greenstalk.Client], jobs: int) -> dict[str, float]:
    tickets = itertools.count()  # next() on a count is atomic under the GIL

    def producer(c: greenstalk.Client) -> None:
        while next(tickets) < jobs:
            c.put(PAYLOAD)

    started = time.perf_counter()
    run_in_threads(producer, clients)
    return rate(jobs, time.perf_counter() - started)


def drain_phase(clients: list[greenstalk.Client], jobs: int) -> dict[str, float]:
    lock = threading.Lock()
    done = [0]
    last_ack = [0.0]

    def worker(c: greenstalk.Client) -> None:
        while done[0] < jobs:
            try:
                job = c.reserve(timeout=0)
            except greenstalk.TimedOutError:
                return
            c.delete(job)
            now = time.perf_counter()
            with lock:
                done[0] += 1
                last_ack[0] = now

    started = time.perf_counter()
    run_in_threads(worker, clients)
    return rate(done[0], last_ack[0] - started)


def latency_phase(c: greenstalk.Client, rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        c.put(PAYLOAD)
        job = c.reserve(timeout=1)
        c.delete(job)
        samples.append(time.perf_counter() - t0)
    return percentiles(samples, rounds)


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    clients = [connect(args.host, args.port) for _ in range(args.connections)]
    clock = PhaseClock(args.server_pid)
    if "enqueue" in args.phases:
        clock.run("enqueue", lambda: enqueue_phase(clients, args.jobs))
    if "drain" in args.phases:
        clock.run("drain", lambda: drain_phase(clients, args.jobs))
    if "latency" in args.phases:
        lat = connect(args.host, args.port, TUBE + "-latency")
        clock.run("latency", lambda: latency_phase(lat, args.rounds))
        lat.close()
    for c in clients:
        c.close()
    emit(clock.result, client=f"greenstalk {version('greenstalk')}", driver="threads")


if __name__ == "__main__":
    main()
