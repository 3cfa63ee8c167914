"""The user-level benchmark: sepp measured through its own client library, as users
run it (issue 14).

A real `sepp serve` (durable, `sync_all` unless `--mode`; snapshots off; pinned to
the server core, as bench_e2e starts it) and ONE client process pinned to the other
(its own `os.sched_setaffinity`; the cores from `common.bench_cores`; `--no-pin`
leaves both free). The client process uses only the public API (`SeppClient`, `Worker`, `SyncSeppClient`), so the benchmark keeps
measuring whatever the client's internals become. Phases, in this order, each on
its own queue, 256-byte payloads:

| phase           | what the client process does                                              |
|-----------------|---------------------------------------------------------------------------|
| producer        | ONE `SeppClient`, N tasks (`--concurrency`, 50) each awaiting              |
|                 | `client.enqueue(EnqueueRequest(...))` one job at a time                    |
| producer_clients| N `SeppClient`s (N connections), one task each, the same calls             |
| worker          | one `Worker`, no-op `async` handler, `max_in_flight=50`, `max_jobs` unset  |
| worker_mj1      | the same with `max_jobs=1`                                                 |
| worker_mif8     | `max_in_flight=8` (`max_jobs` unset)                                       |
| worker_mif1     | `max_in_flight=1`                                                          |
| sync_producer   | ONE `SyncSeppClient`, N threads each calling `client.enqueue(...)`         |
| sync_loop       | ONE `SyncSeppClient`, one thread calling `client.enqueue(...)` in a loop   |
| sync_worker     | ONE `SyncSeppClient`, N threads each `reserve(max_jobs=1)` + `ack`         |
| roundtrip       | ONE `SeppClient`: enqueue -> reserve -> ack, one after another (p50/p99/p999) |

Worker phases get their jobs enqueued first in batches (not timed); their clock
stops at the last ack (`WorkerMetrics.record_processed`). Per phase: jobs/s, the
client process's CPU time per job (`time.process_time`, all its threads) and the
server's (`/proc/PID/stat`). Medians of `--runs` runs (a fresh server each), min-max
shown; the verdicts of issue 14 that need only sepp's figures are printed last.

    python -m benchmarks.bench_client                  # every phase, 100,000 jobs, 3 runs
    python -m benchmarks.bench_client --quick          # 10,000 jobs, 1 run, 300 round trips
    python -m benchmarks.bench_client --phases producer worker worker_mj1 --runs 5
    python -m benchmarks.bench_client --mode sync_data --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict, Unpack

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 256
ENCODING = "application/octet-stream"
JOB_TYPE = "bench"
LEASE = timedelta(seconds=60)
PRELOAD_BATCH = 256  # the server's default max_enqueue_batch

# name -> (description, share of --jobs it runs; the slow settings run fewer jobs)
PHASES: dict[str, tuple[str, float]] = {
    "producer": ("producer: N concurrent enqueue, one SeppClient", 1.0),
    "producer_clients": ("producer: N SeppClients, one enqueue in flight each", 0.5),
    "worker": ("Worker no-op, max_in_flight 50, max_jobs unset", 1.0),
    "worker_mj1": ("Worker no-op, max_in_flight 50, max_jobs=1", 0.25),
    "worker_mif8": ("Worker no-op, max_in_flight 8", 0.25),
    "worker_mif1": ("Worker no-op, max_in_flight 1", 0.05),
    "sync_producer": ("SyncSeppClient: N threads enqueue", 0.5),
    "sync_loop": ("SyncSeppClient: one thread, enqueue in a loop", 0.05),
    "sync_worker": ("SyncSeppClient: N threads reserve(1) + ack", 0.25),
    "roundtrip": ("round trip enqueue -> reserve -> ack, one client", 0.0),
}
WORKER_SETTINGS: dict[str, dict[str, int | None]] = {
    "worker": {"max_in_flight": 50, "max_jobs": None},
    "worker_mj1": {"max_in_flight": 50, "max_jobs": 1},
    "worker_mif8": {"max_in_flight": 8, "max_jobs": None},
    "worker_mif1": {"max_in_flight": 1, "max_jobs": None},
}
MIN_JOBS = 200

# Issue 14's targets that need only sepp's own figures.
TARGET_PRODUCER_CPU_US = 15.0
TARGET_WORKER_CPU_US = 25.0
TARGET_ROUNDTRIP_P99_MS = 3.0


def phase_jobs(phase: str, jobs: int) -> int:
    return max(MIN_JOBS, round(jobs * PHASES[phase][1]))


def proc_cpu(pid: int) -> float:
    """CPU seconds (all threads) of another process, from /proc; 0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Mark:
    """The wall clock and both sides' CPU at one moment."""

    __slots__ = ("cpu", "server", "wall")

    def __init__(self, server_pid: int) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        self.server = proc_cpu(server_pid)


def result(jobs: int, start: Mark, end: Mark) -> dict[str, float]:
    seconds = end.wall - start.wall
    return {
        "jobs": jobs,
        "seconds": seconds,
        "jobs_per_s": jobs / seconds if seconds > 0 else 0.0,
        "client_cpu_s": end.cpu - start.cpu,
        "server_cpu_s": end.server - start.server,
        "client_us_per_job": (end.cpu - start.cpu) / jobs * 1e6,
        "server_us_per_job": (end.server - start.server) / jobs * 1e6,
        "client_cpu": (end.cpu - start.cpu) / seconds if seconds > 0 else 0.0,
    }


# --- the client process ------------------------------------------------------------


_client_api: Any = None


def _request(queue: str) -> Any:
    # Built per call, as user code builds it, from classes imported once, as a
    # module's top-level import does (an import statement per call cost ~0.75 us, a
    # cost of this benchmark, not of the client). Imported when first used, in the
    # client process, after its build was chosen.
    global _client_api
    if _client_api is None:
        import sepp.client

        _client_api = sepp.client
    api = _client_api
    return api.EnqueueRequest(queue, JOB_TYPE, payload=api.Payload(PAYLOAD, ENCODING))


async def _preload(client: Any, queue: str, jobs: int) -> None:
    from sepp.client import EnqueueAck

    left = jobs
    while left:
        n = min(PRELOAD_BATCH, left)
        answers = await client.enqueue_batch([_request(queue) for _ in range(n)])
        if not all(isinstance(a, EnqueueAck) for a in answers):
            raise RuntimeError(f"preload of {queue} refused: {answers[0]!r}")
        left -= n


async def producer_phase(addr: str, jobs: int, concurrency: int, server_pid: int) -> dict[str, Any]:
    from sepp.client import SeppClient

    queue = "bench-producer"
    async with await SeppClient.connect(addr) as client:
        remaining = [jobs]

        async def caller() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await client.enqueue(_request(queue))

        start = Mark(server_pid)
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return result(jobs, start, Mark(server_pid))


async def producer_clients_phase(
    addr: str, jobs: int, concurrency: int, server_pid: int
) -> dict[str, Any]:
    from sepp.client import SeppClient

    queue = "bench-producer-clients"
    clients = [await SeppClient.connect(addr) for _ in range(concurrency)]
    try:
        remaining = [jobs]

        async def caller(client: SeppClient) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await client.enqueue(_request(queue))

        start = Mark(server_pid)
        await asyncio.gather(*(caller(c) for c in clients))
        return result(jobs, start, Mark(server_pid))
    finally:
        for client in clients:
            await client.close()


async def worker_phase(
    addr: str, jobs: int, setting: dict[str, int | None], server_pid: int, queue: str
) -> dict[str, Any]:
    from sepp.client import SeppClient, Worker
    from sepp.client.worker import WorkerMetrics

    async with await SeppClient.connect(addr) as client:
        await _preload(client, queue, jobs)
        done: list[Mark] = []

        class Count(WorkerMetrics):
            processed = 0

            def record_processed(self) -> None:
                super().record_processed()
                self.processed += 1
                if self.processed == jobs:
                    done.append(Mark(server_pid))
                    worker.stop()

        async def noop(payload: object, ctx: object) -> None:
            return None

        max_jobs = setting["max_jobs"]
        worker = Worker(
            client,
            [queue],
            LEASE,
            max_in_flight=setting["max_in_flight"] or 1,
            max_jobs=max_jobs,
            metrics=Count(),
        )
        worker.handle(JOB_TYPE, noop)
        start = Mark(server_pid)
        # A worker that stalls must not hang the benchmark.
        await asyncio.wait_for(worker.run(), timeout=max(120.0, jobs / 50))
        if not done:
            raise RuntimeError(f"worker stopped before acking {jobs} jobs")
        return result(jobs, start, done[0])


async def roundtrip_phase(addr: str, rounds: int, server_pid: int) -> dict[str, Any]:
    from benchmarks.common import slow_spacing
    from sepp.client import ReserveOptions, SeppClient

    queue = "bench-roundtrip"
    opts = ReserveOptions([queue], LEASE, wait_timeout=timedelta(seconds=5), max_jobs=1)
    samples = []
    starts = []
    async with await SeppClient.connect(addr) as client:
        start = Mark(server_pid)
        for _ in range(rounds):
            t0 = time.perf_counter()
            starts.append(t0)
            await client.enqueue(_request(queue))
            got = await client.reserve(opts)
            if not got:
                raise RuntimeError("round trip: the reserve came back empty")
            await client.ack(got[0].ctx)
            samples.append(time.perf_counter() - t0)
        out = result(rounds, start, Mark(server_pid))
    out.update(percentiles(samples))
    # Whether the slow ones come on a clock (README: the disk's 100 ms stalls).
    spacing = slow_spacing(starts, samples, TARGET_ROUNDTRIP_P99_MS / 1000)
    out["slow"], out["slow_gap_ms"] = spacing["slow"], spacing["gap_ms"]
    return out


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000

    return {"p50_ms": pct(0.50), "p99_ms": pct(0.99), "p999_ms": pct(0.999)}


def _threads(target: Callable[[], None], n: int) -> None:
    errors: list[BaseException] = []

    def wrapped() -> None:
        try:
            target()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def sync_producer_phase(addr: str, jobs: int, concurrency: int, server_pid: int) -> dict[str, Any]:
    from sepp.client import SyncSeppClient

    queue = "bench-sync-producer"
    tickets = itertools.count()  # next() on a count is atomic under the GIL
    with SyncSeppClient.connect(addr) as client:

        def producer() -> None:
            while next(tickets) < jobs:
                client.enqueue(_request(queue))

        start = Mark(server_pid)
        _threads(producer, concurrency)
        return result(jobs, start, Mark(server_pid))


def sync_loop_phase(addr: str, jobs: int, server_pid: int) -> dict[str, Any]:
    from sepp.client import SyncSeppClient

    queue = "bench-sync-loop"
    with SyncSeppClient.connect(addr) as client:
        start = Mark(server_pid)
        for _ in range(jobs):
            client.enqueue(_request(queue))
        return result(jobs, start, Mark(server_pid))


def sync_worker_phase(addr: str, jobs: int, concurrency: int, server_pid: int) -> dict[str, Any]:
    from sepp.client import ReserveOptions, SyncSeppClient

    queue = "bench-sync-worker"
    with SyncSeppClient.connect(addr) as client:
        left = jobs
        while left:
            n = min(PRELOAD_BATCH, left)
            client.enqueue_batch([_request(queue) for _ in range(n)])
            left -= n
        opts = ReserveOptions([queue], LEASE, wait_timeout=timedelta(seconds=1), max_jobs=1)
        lock = threading.Lock()
        acked = [0]
        done: list[Mark] = []

        def worker() -> None:
            while acked[0] < jobs:
                got = client.reserve(opts)
                for job in got or ():
                    client.ack(job.ctx)
                    with lock:
                        acked[0] += 1
                        if acked[0] == jobs:
                            done.append(Mark(server_pid))

        start = Mark(server_pid)
        _threads(worker, concurrency)
        return result(jobs, start, done[0])


def child_main(args: argparse.Namespace) -> None:
    if args.pin:
        from benchmarks.common import driver_core

        pin_to(int(driver_core()))
    addr = args.addr or f"127.0.0.1:{args.port}"
    loop_name = args.loop
    if loop_name == "uvloop":
        import uvloop

        run_async: Callable[[Any], Any] = uvloop.run
    else:
        run_async = asyncio.run
    out: dict[str, Any] = {}
    for phase in args.phases:
        n = phase_jobs(phase, args.jobs)
        if phase == "producer":
            out[phase] = run_async(producer_phase(addr, n, args.concurrency, args.server_pid))
        elif phase == "producer_clients":
            out[phase] = run_async(
                producer_clients_phase(addr, n, args.concurrency, args.server_pid)
            )
        elif phase in WORKER_SETTINGS:
            out[phase] = run_async(
                worker_phase(addr, n, WORKER_SETTINGS[phase], args.server_pid, f"bench-{phase}")
            )
        elif phase == "sync_producer":
            out[phase] = sync_producer_phase(addr, n, args.concurrency, args.server_pid)
        elif phase == "sync_loop":
            out[phase] = sync_loop_phase(addr, n, args.server_pid)
        elif phase == "sync_worker":
            out[phase] = sync_worker_phase(addr, n, args.concurrency, args.server_pid)
        elif phase == "roundtrip":
            out[phase] = run_async(roundtrip_phase(addr, args.rounds, args.server_pid))
    out["loop"] = loop_name
    out["pinned"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    print(json.dumps(out), flush=True)


def pin_to(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {core})


# --- the orchestrator ----------------------------------------------------------------


class ChildOptions(TypedDict, total=False):
    """`run_child`'s settings, passed on by `run_once`."""

    concurrency: int
    rounds: int
    pin: bool
    loop: str
    build: str | None
    timeout: float


def run_once(
    mode: str, phases: Sequence[str], jobs: int, **options: Unpack[ChildOptions]
) -> dict[str, Any]:
    """One fresh `sepp serve` (pinned to the server core unless `pin` is False) and one client
    process (`run_child`) running `phases`; the client's JSON result, one entry per
    phase."""
    from benchmarks.bench_e2e import Server
    from log_format._compiled import build_env

    build = options.get("build")
    server = Server(mode, options.get("pin", True), build_env(build) if build is not None else {})
    try:
        return run_child(f"127.0.0.1:{server.port}", server.proc.pid, phases, jobs, **options)
    finally:
        server.stop()


def run_child(
    addr: str,
    server_pid: int,
    phases: Sequence[str],
    jobs: int,
    concurrency: int = 50,
    rounds: int = 2000,
    pin: bool = True,
    loop: str = "asyncio",
    build: str | None = None,
    timeout: float = 3600,
) -> dict[str, Any]:
    """The client process (pinned to the driver core if `pin`) running `phases` against the
    server(s) at `addr`, already running (`server_pid`: whose CPU is counted); its
    JSON result, one entry per phase."""
    from benchmarks.common import run_json
    from log_format._compiled import build_env

    cmd = [
        sys.executable, "-m", "benchmarks.bench_client", "--child", "--addr", addr,
        "--server-pid", str(server_pid), "--jobs", str(jobs), "--concurrency", str(concurrency),
        "--rounds", str(rounds), "--loop", loop, "--phases", *phases,
    ]  # fmt: skip
    if not pin:
        cmd.append("--no-pin")
    env = {**os.environ, **(build_env(build) if build is not None else {})}
    return run_json(cmd, "bench_client child", timeout, cwd=ROOT, env=env)


def summarize(phase: str, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of one phase, with the spread of jobs/s."""
    from benchmarks.common import median

    values = [r[phase] for r in runs if phase in r]
    if not values:
        return {}
    rates = [v["jobs_per_s"] for v in values]
    out: dict[str, Any] = {
        "runs": len(values),
        "jobs": values[0]["jobs"],
        "jobs_per_s": median(rates),
        "min": min(rates),
        "max": max(rates),
        "client_us_per_job": median([v["client_us_per_job"] for v in values]),
        "server_us_per_job": median([v["server_us_per_job"] for v in values]),
        "client_cpu": median([v["client_cpu"] for v in values]),
    }
    for key in ("p50_ms", "p99_ms", "p999_ms"):
        if key in values[0]:
            out[key] = median([v[key] for v in values])
    if "slow" in values[0]:
        out["slow"] = median([v["slow"] for v in values])
        gaps = [v["slow_gap_ms"] for v in values if v.get("slow_gap_ms") is not None]
        out["slow_gap_ms"] = median(gaps) if gaps else None
    return out


def verdicts(summary: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 14's targets that need only sepp's figures."""
    lines = []
    checks = (
        ("producer", "client_us_per_job", TARGET_PRODUCER_CPU_US, "client CPU per enqueue", "µs"),
        ("worker", "client_us_per_job", TARGET_WORKER_CPU_US, "client CPU per job worked", "µs"),
        ("roundtrip", "p99_ms", TARGET_ROUNDTRIP_P99_MS, "round trip p99", "ms"),
    )
    for phase, key, limit, what, unit in checks:
        got = summary.get(phase, {}).get(key)
        if got is None:
            lines.append(f"{what} <= {limit:g} {unit}: not measured (phase {phase} not run)")
            continue
        line = f"{what} <= {limit:g} {unit}: {got:.2f} {unit} -> {'MET' if got <= limit else 'NOT MET'}"
        slow = summary[phase].get("slow")
        if phase == "roundtrip" and slow is not None:
            gap = summary[phase].get("slow_gap_ms")
            apart = "" if gap is None else f", median {gap:.0f} ms apart"
            line += f" ({slow:.0f} round trips took >= {limit:g} ms{apart})"
        lines.append(line)
    return lines


def table_rows(summary: dict[str, dict[str, Any]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for phase, s in summary.items():
        if not s:
            continue
        spread = f"{s['min']:,.0f}-{s['max']:,.0f}" if s["runs"] > 1 else ""
        lat = f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f} / {s['p999_ms']:.2f}" if "p50_ms" in s else ""
        rows.append(
            [
                phase,
                PHASES[phase][0],
                s["jobs"],
                s["jobs_per_s"],
                spread,
                f"{s['client_us_per_job']:.1f}",
                f"{s['server_us_per_job']:.1f}",
                f"{s['client_cpu'] * 100:.0f}%" + ("!" if s["client_cpu"] >= 0.9 else ""),
                lat,
            ]
        )
    return rows


HEADERS = [
    "phase",
    "what",
    "jobs",
    "jobs/s",
    "min-max",
    "client µs/job",
    "server µs/job",
    "client CPU",
    "p50 / p99 / p999 ms",
]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), default=list(PHASES))
    parser.add_argument(
        "--jobs", type=int, default=None, help="jobs of the producer / worker phase (100,000)"
    )
    parser.add_argument("--runs", type=int, default=None, help="runs; medians reported (3)")
    parser.add_argument("--rounds", type=int, default=None, help="round trips (2,000)")
    parser.add_argument("--concurrency", type=int, default=50, help="callers / threads (50)")
    parser.add_argument("--mode", default="sync_all", help="the server's persist mode (sync_all)")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the client process's event loop (asyncio, what asyncio.run gives users)",
    )
    parser.add_argument("--build", choices=["pure", "compiled"], default=None)
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, 1 run, 300 rounds")
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    # The client process's own arguments (run_once starts it).
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    # Or the addresses to connect to, as users give them ("h1:p1,h2:p2,h3:p3"
    # for a cluster: the client finds the leader; bench_cluster --clients).
    parser.add_argument("--addr", default="", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.jobs is None:
        args.jobs = 10_000 if args.quick else 100_000
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.rounds is None:
        args.rounds = 300 if args.quick else 2000
    if args.loop == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            parser.error("uvloop is not installed")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return
    from benchmarks.common import bench_cores, check_builds, fsync_rate, machine_line, print_table
    from log_format._compiled import build_name

    problem = check_builds([args.build])
    if problem:
        sys.exit(problem)
    print(machine_line())
    probe = fsync_rate()
    print(
        f"disk: 4 KiB append + fdatasync median {probe['median_us']:.0f} us, "
        f"{probe['syncs_per_s']:,.0f} syncs/s"
    )
    if args.pin and (os.cpu_count() or 1) >= 2:
        server, driver = bench_cores()
        print(f"pinning: server on core {server}, client process on core {driver}")
    else:
        print("pinning: no")
    print(
        f"server: sepp serve --persist-mode {args.mode} (snapshots off), build "
        f"{args.build or build_name()}; client: one process, event loop {args.loop}, "
        f"concurrency {args.concurrency}, {args.jobs:,} jobs (slower settings fewer), "
        f"{args.rounds:,} round trips, {args.runs} run(s)"
    )
    runs = []
    for i in range(args.runs):
        one = run_once(
            args.mode,
            args.phases,
            args.jobs,
            concurrency=args.concurrency,
            rounds=args.rounds,
            pin=args.pin,
            loop=args.loop,
            build=args.build,
        )
        runs.append(one)
        parts = [
            f"{p} {one[p]['jobs_per_s']:,.0f}/s {one[p]['client_us_per_job']:.0f} µs"
            for p in args.phases
            if p in one
        ]
        print(f"run {i + 1}/{args.runs}: " + "; ".join(parts), flush=True)
    summary = {p: summarize(p, runs) for p in args.phases}
    print()
    print_table(HEADERS, table_rows(summary))
    print(
        f"(medians of {args.runs} run(s); µs/job = CPU time of that process per job (per round"
        " trip for roundtrip); client CPU = share of one core; '!' = >= 90%)"
    )
    end = fsync_rate()
    print(f"disk (end): {end['syncs_per_s']:,.0f} syncs/s")
    print()
    for line in verdicts(summary):
        print(line)


if __name__ == "__main__":
    main()
