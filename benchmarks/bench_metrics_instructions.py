"""What the metrics cost the job path, counted in instructions (issue 15 target:
job throughput with metrics on and one /events stream open within 3 % of metrics
off).

    python -m benchmarks.bench_metrics_instructions
    python -m benchmarks.bench_metrics_instructions --jobs 3000 9000 --hold 4 16 --rate 10000

Why instructions: on this shared 2-core machine the wall-clock comparison
(benchmarks/bench_metrics_overhead.py) moves by -6 % to +9 % from one round to the
next, more than the 3 % it must resolve. The instructions the server executes do
not depend on what else the machine runs. They are a proxy for time (cache misses
and syscalls weigh differently), which is why the wall-clock benchmark stays
beside this one.

How: the server (`sepp serve`, persist mode sync_data, snapshots off) runs under
valgrind's cachegrind with the cache simulation off (it counts instructions, Ir,
nothing else). "on" is the admin listener on, one /admin/api/v1/events stream
open and /metrics scraped every second for the server's whole life (as in
bench_metrics_overhead); "off" is no admin listener and no metrics listener, so
the request counters are not kept at all.

The metrics cost two things: some instructions per request (counting, timing
one request in 8) and some per second (one /events snapshot and one /metrics
render a second, and the periodic GC refreeze sweeping the admin listener's
objects too). Cachegrind slows the server 20-40 times, so a run under it spends
20-40 times more per-second work per job than a server at full speed, and run
lengths differ by tens of seconds on a shared machine: a plain ratio of totals
would mostly measure that. So each round runs every variant six times:

- four on a server whose GC refreeze is stretched past the run
  (benchmarks/serve_stretched.py: under load its sweep costs what the heap of
  jobs in flight costs, so it would tie the per-job figure to the run's length)
  and with no observer (the request counters still run when the admin listener
  is on; the observer's allocations would drive the collector's full scans of a
  heap the stretched refreeze no longer freezes): idle for two lengths of time,
  and the lean load generator's enqueue-then-drain of two job counts (50
  connections; a job is enqueue + reserve + ack), fitted to
      instructions = start-up and shutdown + per_job x jobs + per_second x seconds
  (seconds: from the server listening to the stop signal; least squares);
- two on the ordinary server with the observer (for "on"), idle for the two
  lengths: their slope is what a second of an idle server costs, refreeze, the
  /events snapshot and the /metrics render included.

The verdict is the cost per job of a server at a given full-speed rate (--rate,
jobs/s, the wall-clock benchmark's figure for this machine): per_job + (a second
of the ordinary idle server) / rate, on beside off. `--control` runs metrics off
as both variants, to show what the method itself moves.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_e2e import loadgen
from benchmarks.bench_metrics_overhead import PHASES, Observer
from benchmarks.common import ServeProcess, machine_line, median, print_table

SUMMARY = re.compile(rb"^summary:\s+(\d+)", re.MULTILINE)


def counted_run(
    metrics_on: bool,
    jobs: int,
    hold_s: float,
    connections: int,
    out_dir: str,
    server_env: dict[str, str],
    stretched: bool,
    observed: bool,
) -> dict[str, Any]:
    """One server under cachegrind: `jobs` through the load generator (if any),
    then `hold_s` idle. Returns its instruction count and how long it served.
    `stretched`: the server's periodic GC refreeze does not run (serve_stretched)."""
    out_file = os.path.join(out_dir, f"cg-{time.time_ns()}")
    env = dict(os.environ)
    env["SEPP_STORAGE__SNAPSHOT_EVERY_BYTES"] = "0"
    env["SEPP_LOGGING__LEVEL"] = "warning"
    env["SEPP_METRICS__LISTEN_ADDR"] = "off"
    # pymalloc, as before jemalloc became the default: on jemalloc the server would
    # re-execute itself (allocator.py) out of valgrind's reach, and the counts compare
    # with the figures recorded on pymalloc.
    env["SEPP_SERVER__ALLOCATOR"] = "python"
    env.update(server_env)
    prefix = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--branch-sim=no",
        f"--cachegrind-out-file={out_file}",
        "--quiet",
    ]
    server = ServeProcess(
        tempfile.mkdtemp(prefix="sepp-bench-ir-"),
        "sync_data",
        env,
        args=["--admin-listen", "127.0.0.1:0" if metrics_on else "off"],
        wait_for_admin=metrics_on,
        stop_timeout_s=600.0,
        prefix=prefix,
        module=("benchmarks.serve_stretched", "86400") if stretched else ("sepp.server.cli",),
    )
    serving_since = time.perf_counter()
    observer = Observer(server.admin) if server.admin is not None and observed else None
    result: dict[str, Any] = {"jobs": jobs, "stretched": stretched}
    try:
        if jobs:
            result.update(
                loadgen(
                    server.port,
                    False,
                    connections=connections,
                    jobs=jobs,
                    phases=list(PHASES),
                    server_pid=server.proc.pid,
                )
            )
        if hold_s:
            time.sleep(hold_s)  # the idle part of the run: its length is measured
    finally:
        result["seconds"] = time.perf_counter() - serving_since
        if observer is not None:
            observer.stop()
        server.stop()
    if server.proc.returncode != 0:
        raise RuntimeError(f"the server exited with {server.proc.returncode}")
    if observer is not None:
        if observer.error:
            raise RuntimeError(f"observer: {observer.error}")
        result["observer"] = {"events": observer.events, "scrapes": observer.scrapes}
    data = Path(out_file).read_bytes()
    found = SUMMARY.search(data)
    if found is None:
        raise RuntimeError(f"no instruction count in {out_file}")
    result["ir"] = int(found.group(1))
    os.remove(out_file)
    return result


def fit(runs: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Least squares of ir = fixed + per_job * jobs + per_second * seconds over
    `runs`: (fixed, per_job, per_second)."""
    rows = [(1.0, float(r["jobs"]), float(r["seconds"]), float(r["ir"])) for r in runs]
    # Normal equations A^T A x = A^T y, solved by Gaussian elimination (3 x 3).
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    v = [sum(r[i] * r[3] for r in rows) for i in range(3)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda k: abs(m[k][col]))
        m[col], m[pivot] = m[pivot], m[col]
        v[col], v[pivot] = v[pivot], v[col]
        for k in range(3):
            if k != col:
                factor = m[k][col] / m[col][col]
                m[k] = [a - factor * b for a, b in zip(m[k], m[col])]
                v[k] -= factor * v[col]
    fixed, per_job, per_second = (v[i] / m[i][i] for i in range(3))
    return fixed, per_job, per_second


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs=2, default=[4_000, 12_000])
    parser.add_argument(
        "--hold", type=float, nargs=2, default=[5.0, 25.0], help="the idle runs' lengths (s)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        nargs="+",
        default=[5_000.0, 10_000.0],
        help="full-speed job rates (jobs/s) to state the verdict at",
    )
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the six runs per variant")
    parser.add_argument(
        "--control",
        action="store_true",
        help="run metrics off as both variants: the difference shows the method's noise",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the server in both variants (repeatable)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    server_env = dict(item.split("=", 1) for item in args.server_env)
    small, large = sorted(args.jobs)
    short, long = sorted(args.hold)
    if small == large or short == long:
        sys.exit("--jobs and --hold each need two different values")
    print(machine_line())
    print(
        f"command: python -m benchmarks.bench_metrics_instructions --jobs {small} {large} "
        f"--hold {short:g} {long:g} --rate {' '.join(f'{r:g}' for r in args.rate)} "
        f"--connections {args.connections} --repeat {args.repeat}"
        + "".join(f" --server-env {item}" for item in args.server_env)
        + (" --control (both variants metrics off)" if args.control else "")
    )
    out_dir = tempfile.mkdtemp(prefix="sepp-bench-ir-out-")
    # (jobs, idle seconds, refreeze stretched): the stretched runs give the cost
    # per job and per second without the refreeze; the ordinary idle runs price
    # a second of an idle server with it (and with the observer, when on).
    plan = [
        (0, short, True),
        (0, long, True),
        (small, 0.0, True),
        (large, 0.0, True),
        (0, short, False),
        (0, long, False),
    ]
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    try:
        for rep in range(args.repeat):
            # Alternate the order so a drift of the machine meets both variants.
            for metrics_on in (False, True) if rep % 2 == 0 else (True, False):
                for jobs, hold_s, stretched in plan:
                    result = counted_run(
                        metrics_on and not args.control,
                        jobs,
                        hold_s,
                        args.connections,
                        out_dir,
                        server_env,
                        stretched,
                        observed=not stretched,
                    )
                    runs[metrics_on].append(result)
                    seen = result.get("observer")
                    print(
                        f"  round {rep + 1} metrics {'on ' if metrics_on else 'off'} "
                        f"{'refreeze stretched, unobserved' if stretched else 'ordinary, observed'} "
                        f"{jobs:>7,} jobs, {result['seconds']:5.1f} s serving: "
                        f"{result['ir']:,} instructions"
                        + (
                            f" (events {seen['events']}, scrapes {seen['scrapes']})" if seen else ""
                        ),
                        flush=True,
                    )
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    fits: dict[bool, tuple[float, float, float]] = {}
    idle_per_second: dict[bool, float] = {}
    for metrics_on, variant_runs in runs.items():
        stretched_runs = [r for r in variant_runs if r["stretched"]]
        fits[metrics_on] = fixed, per_job, per_second = fit(stretched_runs)
        worst = max(
            abs(fixed + per_job * r["jobs"] + per_second * r["seconds"] - r["ir"]) / r["ir"]
            for r in stretched_runs
        )
        print(
            f"metrics {'on' if metrics_on else 'off'}: the fit's largest residual is "
            f"{worst * 100:.2f}% of a run's total"
        )
        # A second of the ordinary idle server: the slope between its two lengths.
        ordinary = [r for r in variant_runs if not r["stretched"]]
        shorts = [r for r in ordinary if r["seconds"] < (short + long) / 2]
        longs = [r for r in ordinary if r["seconds"] >= (short + long) / 2]
        idle_per_second[metrics_on] = (
            median([r["ir"] for r in longs]) - median([r["ir"] for r in shorts])
        ) / (median([r["seconds"] for r in longs]) - median([r["seconds"] for r in shorts]))
    rows = []
    for metrics_on in (False, True):
        fixed, per_job, per_second = fits[metrics_on]
        rows.append(
            [
                "on" if metrics_on else "off",
                f"{fixed:,.0f}",
                f"{per_job:,.0f}",
                f"{per_second:,.0f}",
                f"{idle_per_second[metrics_on]:,.0f}",
            ]
            + [f"{per_job + idle_per_second[metrics_on] / rate:,.0f}" for rate in args.rate]
        )
    diff_row = ["difference on - off", "", "", "", ""]
    for rate in args.rate:
        on = fits[True][1] + idle_per_second[True] / rate
        off = fits[False][1] + idle_per_second[False] / rate
        diff_row.append(f"{(on - off) / off * 100:+.2f}%")
    rows.append(diff_row)
    print(
        "\nserver instructions, fitted: total = start-up and shutdown + per job x jobs + "
        "per second x seconds serving (a job = enqueue + reserve + ack)"
    )
    print(
        "on = admin listener on (request counters kept); the ordinary idle runs with one "
        "/events stream open and /metrics scraped every second"
    )
    print_table(
        [
            "metrics",
            "start-up + shutdown",
            "per job",
            "per second (stretched, unobserved)",
            "per second idle (ordinary, observed)",
        ]
        + [f"per job at {rate:,.0f} jobs/s" for rate in args.rate],
        rows,
    )
    per_request = (fits[True][1] - fits[False][1]) / fits[False][1] * 100
    print(f"per-job instructions alone (request counting and timing): {per_request:+.2f}%")


if __name__ == "__main__":
    main()
