"""A lean load generator for sepp: closed-loop connections speaking the wire
protocol directly (sepp.protocol framing and msgpack), one request in flight per
connection, as benchmark-method.md prescribes.

Run as a child process by bench_e2e.py (pinned to its own core), it prints one
JSON line with the phase results and its own CPU time, so the report can show that
the generator was not the bottleneck. It runs on uvloop when installed (`--loop`,
default auto, like the server): on the standard loop it used ~35 us of CPU per
enqueue, nearly as much as the server, and with the server faster it became a
co-bottleneck (benchmarks/README.md, finding 15).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from typing import Any

import msgpack

from sepp.protocol.framing import LENGTH_PREFIX, FrameReader
from sepp.server.loops import EVENT_LOOPS, loop_kind, resolve_event_loop, run_on

PAYLOAD = b"x" * 256
_pack = msgpack.Packer(use_bin_type=True).pack


class Conn(asyncio.Protocol):
    """One connection: pipelined requests matched to responses by id."""

    def __init__(self) -> None:
        self.reader = FrameReader(64 * 1024 * 1024)
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 1
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_event_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        for frame in self.reader.feed(data):
            rid, status, body = msgpack.unpackb(frame)  # raw=False is the default
            future = self.pending.pop(rid, None)
            if future is not None and not future.done():
                if status == "ok":
                    future.set_result(body)
                else:
                    future.set_exception(RuntimeError(f"{status}: {body.get('message')}"))

    def connection_lost(self, exc: Exception | None) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ConnectionError("connection lost"))
        if not self.lost.done():
            self.lost.set_result(None)

    def call(self, op: str, body: dict[str, Any]) -> asyncio.Future[Any]:
        rid = self.next_id
        self.next_id += 1
        frame = _pack([rid, op, body])
        future: asyncio.Future[Any] = asyncio.get_event_loop().create_future()
        self.pending[rid] = future
        assert self.transport is not None
        self.transport.write(LENGTH_PREFIX.pack(len(frame)) + frame)
        return future


async def connect(host: str, port: int) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(Conn, host, port)
    await conn.call("hello", {"protocol": 1, "client": "sepp-loadgen"})
    return conn


def _job(queue: str) -> dict[str, Any]:
    return {
        "queue": queue,
        "job_type": "bench",
        "payload": {"data": PAYLOAD, "encoding": "application/octet-stream"},
    }


async def enqueue_phase(conns: list[Conn], queue: str, jobs: int, batch: int) -> dict[str, float]:
    remaining = jobs
    lock_free = [remaining]

    async def producer(conn: Conn) -> None:
        while lock_free[0] > 0:
            n = min(batch, lock_free[0])
            lock_free[0] -= n
            await conn.call("enqueue", {"jobs": [_job(queue) for _ in range(n)]})

    started = time.perf_counter()
    await asyncio.gather(*(producer(c) for c in conns))
    elapsed = time.perf_counter() - started
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed}


async def drain_phase(conns: list[Conn], queue: str, jobs: int) -> dict[str, float]:
    done = [0]
    last_ack = [0.0]

    async def worker(conn: Conn) -> None:
        while done[0] < jobs:
            body = await conn.call("reserve", {"queues": [queue], "lease_ms": 60_000, "wait_ms": 0})
            reserved = body["jobs"]
            if not reserved:
                return
            job = reserved[0]
            await conn.call("ack", {"job_id": job["id"], "attempt": job["attempt"]})
            done[0] += 1
            last_ack[0] = time.perf_counter()

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = last_ack[0] - started
    return {
        "jobs": done[0],
        "seconds": elapsed,
        "jobs_per_s": done[0] / elapsed if elapsed > 0 else 0.0,
    }


async def latency_phase(conn: Conn, queue: str, rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await conn.call("enqueue", {"jobs": [_job(queue)]})
        body = await conn.call("reserve", {"queues": [queue], "lease_ms": 60_000, "wait_ms": 1000})
        job = body["jobs"][0]
        await conn.call("ack", {"job_id": job["id"], "attempt": job["attempt"]})
        samples.append(time.perf_counter() - t0)
    samples.sort()

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, int(len(samples) * p))] * 1000

    return {"rounds": rounds, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "p999_ms": pct(0.999)}


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu(pid: int | None) -> float:
    """CPU seconds of another process (the server), from /proc; 0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    conns = [await connect(args.host, args.port) for _ in range(args.connections)]
    # The loop this really runs on, not the one asked for.
    result: dict[str, Any] = {"loop": loop_kind(asyncio.get_running_loop())}
    queue = args.queue

    async def phase(name: str, work: Any) -> None:
        # Each phase records the CPU share (of one core) the generator and the
        # server used during it, to show which side limited the rate.
        own0, server0, wall0 = _own_cpu(), _proc_cpu(args.server_pid), time.perf_counter()
        result[name] = await work
        wall = time.perf_counter() - wall0
        result[name]["client_cpu"] = (_own_cpu() - own0) / wall
        result[name]["server_cpu"] = (_proc_cpu(args.server_pid) - server0) / wall

    if "enqueue" in args.phases:
        await phase("enqueue", enqueue_phase(conns, queue, args.jobs, args.batch))
    if "drain" in args.phases:
        await phase("drain", drain_phase(conns, queue, args.jobs))
    if "latency" in args.phases:
        await phase("latency", latency_phase(conns[0], queue + "-latency", args.rounds))
    for conn in conns:
        assert conn.transport is not None
        conn.transport.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--queue", default="bench")
    parser.add_argument("--phases", nargs="+", default=["enqueue", "drain", "latency"])
    parser.add_argument(
        "--server-pid", type=int, default=0, help="to report the server's CPU per phase"
    )
    parser.add_argument(
        "--loop",
        choices=EVENT_LOOPS,
        default="auto",
        help="the generator's own event loop (auto: uvloop when installed, as the server)",
    )
    args = parser.parse_args()
    loop_name = resolve_event_loop(args.loop)
    result = run_on(loop_name, lambda: run(args))
    result["pid"] = os.getpid()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
