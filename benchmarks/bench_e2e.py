"""End-to-end benchmark of a real `sepp serve` process, after benchmark-method.md.

256-byte payloads; N producer connections with one request in flight each enqueue
the jobs, then N worker connections reserve + ack them one at a time (the clock
stops at the last ack), then one connection measures enqueue -> reserve -> ack
round trips (p50/p99/p999). The server runs pinned to the server core and the load
generator (benchmarks/loadgen.py) to the driver core (`common.bench_cores`: 0 and 1,
or swapped where syncs stall on core 0); the generator's CPU share is
reported, so a run where it was the bottleneck shows (>= 90% is flagged).

    python -m benchmarks.bench_e2e                      # headline 50/50, every persist mode
    python -m benchmarks.bench_e2e --sweep              # + concurrency 1/8/64/256 (sync_data)
    python -m benchmarks.bench_e2e --batch 256          # + batch enqueue of 256 per request
    python -m benchmarks.bench_e2e --modes sync_data --runs 3 --jobs 50000
    python -m benchmarks.bench_e2e --modes sync_data --builds pure compiled   # side by side
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ServeProcess,
    check_builds,
    driver_core,
    fsync_rate,
    machine_line,
    median,
    print_table,
    server_core,
    server_loop,
    server_sync,
    taskset,
)
from log_format._compiled import BUILDS, build_env, build_name
from sepp.server.loops import EVENT_LOOPS
from sepp.server.pipeline import SYNC_METHODS

ROOT = Path(__file__).resolve().parent.parent
SWEEP = [(1, 5_000), (8, 40_000), (64, 200_000), (256, 200_000)]


class Server(ServeProcess):
    def __init__(self, mode: str, pin: bool, extra_env: dict[str, str] | None = None) -> None:
        env = dict(os.environ)
        env.update(extra_env or {})
        # Benchmarks measure the steady state: no snapshot in the middle of a phase.
        env.setdefault("SEPP_STORAGE__SNAPSHOT_EVERY_BYTES", "0")
        env.setdefault("SEPP_LOGGING__LEVEL", "warning")
        data_dir = tempfile.mkdtemp(prefix="sepp-bench-e2e-")
        super().__init__(data_dir, mode, env, core=server_core() if pin else None)


def loadgen(port: int, pin: bool, **options: Any) -> dict[str, Any]:
    cmd = [
        *taskset(driver_core() if pin else None),
        sys.executable,
        "-m",
        "benchmarks.loadgen",
        "--port",
        str(port),
    ]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):
            cmd += [flag, *map(str, value)]
        else:
            cmd += [flag, str(value)]
    # The same driver whichever build the server runs: the load generator imports
    # sepp.protocol, so it always runs the pure build.
    env = {**os.environ, **build_env("pure")}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def one_run(
    mode: str,
    connections: int,
    jobs: int,
    pin: bool,
    batch: int = 1,
    latency: bool = True,
    loop: str | None = None,
    sync_method: str | None = None,
    build: str | None = None,
) -> dict[str, Any]:
    """One server, one load-generator run. `loop`: the server's event loop
    (server.event_loop), `sync_method` its storage.sync_method, `build` "pure" or
    "compiled" (the compiled build must exist: `python -m tools.compile`); None =
    whatever the environment says (default auto, and the checkout's build)."""
    env = build_env(build) if build is not None else {}
    if loop is not None:
        env["SEPP_SERVER__EVENT_LOOP"] = loop
    if sync_method is not None:
        env["SEPP_STORAGE__SYNC_METHOD"] = sync_method
    server = Server(mode, pin, env)
    try:
        phases = (
            ["enqueue"] if batch > 1 else ["enqueue", "drain"] + (["latency"] if latency else [])
        )
        result = loadgen(
            server.port,
            pin,
            connections=connections,
            jobs=jobs,
            batch=batch,
            phases=phases,
            rounds=2000,
            server_pid=server.proc.pid,
        )
        return result
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", nargs="+", default=["sync_data", "sync_all", "buffer"])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="concurrency 1/8/64/256 in sync_data")
    parser.add_argument(
        "--batch", type=int, default=0, help="also measure batch enqueue of this size"
    )
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument(
        "--loops",
        nargs="+",
        choices=EVENT_LOOPS,
        default=[None],
        help="the server's event loop(s); several are measured side by side, runs interleaved",
    )
    parser.add_argument(
        "--sync-methods",
        nargs="+",
        choices=SYNC_METHODS,
        default=[None],
        help="the server's storage.sync_method(s); several are measured side by side, runs interleaved",
    )
    parser.add_argument(
        "--builds",
        nargs="+",
        choices=BUILDS,
        default=[None],
        help="the server's build(s) (compiled needs `python -m tools.compile` first); several are measured side by side, runs interleaved",
    )
    args = parser.parse_args()
    problem = check_builds(args.builds)
    if problem:
        parser.error(problem)
    variants = [
        (loop, sync, build)
        for build in args.builds
        for loop in args.loops
        for sync in args.sync_methods
    ]
    pin = not args.no_pin

    print(machine_line())
    probe = fsync_rate()
    print(
        f"disk: 4 KiB append + fdatasync median {probe['median_us']:.0f} us, {probe['syncs_per_s']:,.0f} syncs/s"
    )
    if pin and taskset("0"):
        print(f"pinning: server on core {server_core()}, load generator on core {driver_core()}")
    else:
        print("pinning: no")
    rows = []

    def add_row(
        label: str,
        mode: str,
        conns: int,
        variant: tuple[str | None, str | None, str | None],
        results: list[dict[str, Any]],
    ) -> None:
        def med(phase: str, key: str) -> float:
            return median([r[phase][key] for r in results if phase in r])

        def cpu(side: str) -> str:
            # enqueue / drain phase shares of one core; '!' marks a saturated side
            parts = []
            for phase in ("enqueue", "drain"):
                if phase in results[0]:
                    share = median([r[phase][side] for r in results]) * 100
                    parts.append(f"{share:.0f}%" + ("!" if share >= 90 else ""))
            return " / ".join(parts)

        def cpu_us() -> str:
            # the server's CPU time per job in the enqueue / drain phase
            parts = []
            for phase in ("enqueue", "drain"):
                if phase in results[0]:
                    per_job = [r[phase]["server_cpu"] / r[phase]["jobs_per_s"] for r in results]
                    parts.append(f"{median(per_job) * 1e6:.0f}")
            return " / ".join(parts)

        rows.append(
            (
                label,
                mode,
                f"{variant[2] or build_name()} / {server_loop(variant[0])} / {server_sync(mode, variant[1])}",
                conns,
                med("enqueue", "jobs_per_s"),
                med("drain", "jobs_per_s") if "drain" in results[0] else "",
                med("latency", "p50_ms") if "latency" in results[0] else "",
                med("latency", "p99_ms") if "latency" in results[0] else "",
                med("latency", "p999_ms") if "latency" in results[0] else "",
                cpu("server_cpu"),
                cpu_us(),
                cpu("client_cpu"),
            )
        )
        print("  ", rows[-1], flush=True)

    def measure(
        label: str, mode: str, conns: int, jobs: int, batch: int = 1, latency: bool = True
    ) -> None:
        # With several variants, run index by run index so drift spreads over all.
        results: dict[tuple[str | None, str | None, str | None], list[dict[str, Any]]] = {
            variant: [] for variant in variants
        }
        for _ in range(args.runs):
            for loop, sync, build in variants:
                run = one_run(
                    mode,
                    conns,
                    jobs,
                    pin,
                    batch=batch,
                    latency=latency,
                    loop=loop,
                    sync_method=sync,
                    build=build,
                )
                results[(loop, sync, build)].append(run)
        for variant in variants:
            add_row(label, mode, conns, variant, results[variant])

    for mode in args.modes:
        measure(f"{args.connections}/{args.connections}", mode, args.connections, args.jobs)
    if args.sweep:
        for conns, jobs in SWEEP:
            measure("sweep", "sync_data", conns, jobs, latency=False)
    if args.batch:
        for mode in args.modes:
            measure(f"batch {args.batch}", mode, args.connections, args.jobs, batch=args.batch)
    print()
    print_table(
        [
            "run",
            "persist mode",
            "build / loop / sync",
            "conns",
            "enqueue jobs/s",
            "drain jobs/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "server CPU",
            "server µs/job",
            "client CPU",
        ],
        rows,
    )
    print(
        "(medians of",
        args.runs,
        "runs; CPU = share of one core during the enqueue / drain phase; '!' = that side was >= 90% busy;",
        "server µs/job = the server's CPU time per job in those phases)",
    )


if __name__ == "__main__":
    main()
