"""The gRPC front (issue 18): the official Python client against a real
`sepp serve --grpc-listen`, beside the native protocol on the same server.

Per run: a fresh `sepp serve --persist-mode sync_all --grpc-listen 127.0.0.1:0`
(snapshots off) pinned to the server core, then, one after the other, each pinned to
the driver core (`common.bench_cores`):

| phase      | the client process                                                          |
|------------|-----------------------------------------------------------------------------|
| official   | sepp-py 0.1.0 (the official client, in .venv-official): ONE `SeppClient`,   |
|            | 50 tasks each awaiting `client.enqueue(...)`: one EnqueueBatch RPC per job  |
| native_raw | benchmarks/loadgen.py: 50 connections, one single-job `enqueue` request in   |
|            | flight each (the native protocol, one request per job, like the RPCs above) |
| native     | our `SeppClient` (bench_client's producer phase): 50 concurrent `enqueue`;   |
|            | it coalesces the calls of one loop turn into one request                    |

256-byte payloads, durable (`sync_all`). Per phase: jobs/s (median of --runs, min -
max), the server's CPU µs per request and per job (/proc/PID/stat, 10 ms ticks) and
the client's CPU µs per job. The target of issue 18: official >= 4,000 jobs/s.

    python -m benchmarks.bench_grpc                 # 20,000 jobs per phase, 3 runs
    python -m benchmarks.bench_grpc --jobs 5000 --runs 1 --phases official

Needs the official client's environment (.venv-official, or --official-venv):
`pytest tests/grpc/test_official_suite.py` builds it (tests/grpc/conftest.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import bench_client
from benchmarks.common import (
    ServeProcess,
    driver_core,
    fsync_rate,
    machine_line,
    median,
    print_table,
    run_json,
    server_core,
    taskset,
)

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("official", "native_raw", "native")
TARGET_OFFICIAL_JOBS_PER_S = 4_000
# How long one client process may run.
CHILD_TIMEOUT_S = 1800.0


class GrpcServer(ServeProcess):
    """`sepp serve` with the gRPC front; ports read from its first lines."""

    def __init__(self, pin: bool) -> None:
        env = dict(os.environ)
        env.setdefault("SEPP_STORAGE__SNAPSHOT_EVERY_BYTES", "0")
        env.setdefault("SEPP_LOGGING__LEVEL", "warning")
        env["SEPP_ADMIN__LISTEN_ADDR"] = "off"
        super().__init__(
            tempfile.mkdtemp(prefix="sepp-bench-grpc-"),
            "sync_all",
            env,
            core=server_core() if pin else None,
            args=["--grpc-listen", "127.0.0.1:0"],
            wait_for_grpc=True,
        )


def _json_tail(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    return run_json(cmd, " ".join(cmd[:4]), CHILD_TIMEOUT_S, cwd=cwd, env=env)


def official_phase(server: GrpcServer, venv: Path, jobs: int, pin: bool) -> dict[str, Any]:
    child = ROOT / "benchmarks" / "grpc_official_child.py"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Run by path from a directory without a `sepp` package: `import sepp` must
    # find the official client, not this repository.
    return _json_tail(
        [
            str(venv / "bin" / "python"), str(child),
            "--addr", f"127.0.0.1:{server.grpc_port}", "--server-pid", str(server.proc.pid),
            "--jobs", str(jobs), "--pin", driver_core() if pin else "-1",
        ],
        cwd=Path(tempfile.gettempdir()),
        env=env,
    )  # fmt: skip


def native_raw_phase(server: GrpcServer, jobs: int, pin: bool) -> dict[str, Any]:
    result = _json_tail(
        [
            *taskset(driver_core() if pin else None), sys.executable, "-m", "benchmarks.loadgen",
            "--port", str(server.port), "--connections", "50", "--jobs", str(jobs),
            "--phases", "enqueue", "--server-pid", str(server.proc.pid), "--queue", "bench-raw",
        ],
        cwd=ROOT,
    )["enqueue"]  # fmt: skip
    server_s = result["server_cpu"] * result["seconds"]
    client_s = result["client_cpu"] * result["seconds"]
    return {
        "jobs": jobs,
        "jobs_per_s": result["jobs_per_s"],
        "server_us_per_job": server_s / jobs * 1e6,
        "server_us_per_rpc": server_s / jobs * 1e6,  # one request per job
        "client_us_per_job": client_s / jobs * 1e6,
    }


def native_phase(server: GrpcServer, jobs: int, pin: bool) -> dict[str, Any]:
    address = f"127.0.0.1:{server.port}"
    result = bench_client.run_child(
        address, server.proc.pid, ["producer"], jobs, pin=pin, timeout=CHILD_TIMEOUT_S
    )["producer"]
    # Requests are coalesced: per request is not per job here (not measured).
    result["server_us_per_rpc"] = float("nan")
    return dict(result)


def run_once(phases: Sequence[str], jobs: int, venv: Path, pin: bool) -> dict[str, Any]:
    server = GrpcServer(pin)
    try:
        out: dict[str, Any] = {}
        for phase in phases:
            if phase == "official":
                out[phase] = official_phase(server, venv, jobs, pin)
            elif phase == "native_raw":
                out[phase] = native_raw_phase(server, jobs, pin)
            else:
                out[phase] = native_phase(server, jobs, pin)
        return out
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_grpc")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument(
        "--official-venv", type=Path, default=Path(
            os.environ.get("SEPP_OFFICIAL_VENV") or ROOT / ".venv-official"
        ),
    )  # fmt: skip
    parser.add_argument("--no-pin", dest="pin", action="store_false")
    args = parser.parse_args(argv)
    if "official" in args.phases and not (args.official_venv / "bin" / "python").exists():
        raise SystemExit(
            f"no official client environment at {args.official_venv}: "
            "run `pytest tests/grpc/test_official_suite.py` once (it builds it)"
        )
    print(machine_line())
    probe = fsync_rate()
    print(f"fsync probe: {probe['syncs_per_s']:,.0f} syncs/s (4 KiB append + fdatasync)")
    print(f"{args.jobs:,} jobs per phase, {args.runs} run(s), sync_all, 256-byte payloads")
    runs = []
    for n in range(args.runs):
        runs.append(run_once(args.phases, args.jobs, args.official_venv, args.pin))
        print(f"run {n + 1}: " + ", ".join(
            f"{p} {runs[-1][p]['jobs_per_s']:,.0f} jobs/s" for p in args.phases
        ))  # fmt: skip
    rows = []
    for phase in args.phases:
        values = [r[phase] for r in runs]
        rates = [v["jobs_per_s"] for v in values]
        rows.append(
            [
                phase,
                median(rates),
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                median([v["server_us_per_rpc"] for v in values]),
                median([v["server_us_per_job"] for v in values]),
                median([v["client_us_per_job"] for v in values]),
            ]
        )
    print()
    print_table(
        ["phase", "jobs/s", "min-max", "server µs/request", "server µs/job", "client µs/job"],
        rows,
    )
    if "official" in args.phases:
        got = median([r["official"]["jobs_per_s"] for r in runs])
        verdict = "MET" if got >= TARGET_OFFICIAL_JOBS_PER_S else "NOT MET"
        print(
            f"\nofficial client, 50 concurrent single-job enqueues >= "
            f"{TARGET_OFFICIAL_JOBS_PER_S:,} jobs/s: {got:,.0f} -> {verdict}"
        )


if __name__ == "__main__":
    main()
