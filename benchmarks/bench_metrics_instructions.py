"""What the metrics cost the job path, counted in instructions (issue 15 target:
job throughput with metrics on and one /events stream open within 3 % of metrics
off).

    python -m benchmarks.bench_metrics_instructions                # 4,000 and 12,000 jobs
    python -m benchmarks.bench_metrics_instructions --jobs 3000 9000 --repeat 2

Why instructions: on this shared 2-core machine the wall-clock comparison
(benchmarks/bench_metrics_overhead.py) moves by -6 % to +9 % from one round to the
next, more than the 3 % it must resolve. The instructions the server executes do
not depend on what else the machine runs, so they resolve a difference of a
fraction of a percent. They are a proxy for time (cache misses and syscalls
weigh differently), which is why the wall-clock benchmark stays beside this one.

How: the server (`sepp serve`, persist mode sync_data, snapshots off) runs under
valgrind's cachegrind with the cache simulation off (it only counts
instructions, Ir) and the lean load generator enqueues N jobs over 50
connections, then reserves and acks each. "on" is the admin listener on, with one
/admin/api/v1/events stream open and /metrics scraped every second for the whole
run (as in bench_metrics_overhead); "off" is no admin listener and no metrics
listener, so the request counters are not kept at all.

A run's total also holds the server's start-up, recovery and shutdown, the same
for both variants; the figure is therefore the *marginal* cost of a job: the
difference of the totals of two runs with different job counts, divided by the
difference of the job counts. Cachegrind slows the server about 30-50 times, so
the per-second work of the "on" variant (one /metrics scrape and one /events
snapshot a second) falls on 30-50 times fewer jobs than at full speed: the
figure over-states what metrics cost a full-speed server, never under-states it.
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
    metrics_on: bool, jobs: int, connections: int, out_dir: str, server_env: dict[str, str]
) -> dict[str, Any]:
    """One server under cachegrind, one load-generator run: the server's total
    instruction count and the load generator's result."""
    out_file = os.path.join(out_dir, f"cg-{'on' if metrics_on else 'off'}-{jobs}-{time.time_ns()}")
    env = dict(os.environ)
    env["SEPP_STORAGE__SNAPSHOT_EVERY_BYTES"] = "0"
    env["SEPP_LOGGING__LEVEL"] = "warning"
    env["SEPP_METRICS__LISTEN_ADDR"] = "off"
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
    )
    observer = Observer(server.admin) if server.admin is not None else None
    started = time.perf_counter()
    try:
        result = loadgen(
            server.port,
            False,
            connections=connections,
            jobs=jobs,
            phases=list(PHASES),
            server_pid=server.proc.pid,
        )
    finally:
        if observer is not None:
            observer.stop()
        server.stop()
    result["seconds"] = time.perf_counter() - started
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, nargs=2, default=[4_000, 12_000])
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=2, help="runs per variant and job count")
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
    if small == large:
        sys.exit("--jobs needs two different job counts")
    print(machine_line())
    print(
        f"command: python -m benchmarks.bench_metrics_instructions --jobs {small} {large} "
        f"--connections {args.connections} --repeat {args.repeat}"
        + "".join(f" --server-env {item}" for item in args.server_env)
    )
    out_dir = tempfile.mkdtemp(prefix="sepp-bench-ir-out-")
    runs: dict[tuple[bool, int], list[dict[str, Any]]] = {}
    try:
        for rep in range(args.repeat):
            # Alternate the order so a drift of the machine meets both variants.
            order = (True, False) if rep % 2 == 0 else (False, True)
            for metrics_on in order:
                for jobs in (small, large):
                    result = counted_run(metrics_on, jobs, args.connections, out_dir, server_env)
                    runs.setdefault((metrics_on, jobs), []).append(result)
                    seen = result.get("observer")
                    print(
                        f"  run {rep + 1} metrics {'on ' if metrics_on else 'off'} {jobs:>7,} jobs: "
                        f"{result['ir']:,} instructions in {result['seconds']:.0f} s"
                        + (
                            f" (events {seen['events']}, scrapes {seen['scrapes']})" if seen else ""
                        ),
                        flush=True,
                    )
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    per_job: dict[bool, float] = {}
    rows = []
    for metrics_on in (False, True):
        low = median([r["ir"] for r in runs[(metrics_on, small)]])
        high = median([r["ir"] for r in runs[(metrics_on, large)]])
        per_job[metrics_on] = (high - low) / (large - small)
        rows.append(
            [
                "on" if metrics_on else "off",
                f"{low:,.0f}",
                f"{high:,.0f}",
                f"{per_job[metrics_on]:,.0f}",
            ]
        )
    off, on = per_job[False], per_job[True]
    rows.append(["difference on - off", "", "", f"{(on - off) / off * 100:+.2f}%"])
    print(
        f"\nserver instructions (median of {args.repeat}), marginal per job = "
        f"(total at {large:,} - total at {small:,}) / {large - small:,}; a job = enqueue + reserve + ack"
    )
    print("on = admin listener on, one /events stream open, /metrics scraped every second")
    print_table(
        [
            "metrics",
            f"instructions, {small:,} jobs",
            f"instructions, {large:,} jobs",
            "instructions per job",
        ],
        rows,
    )
    spread = [
        (max(r["ir"] for r in rs) - min(r["ir"] for r in rs)) / median([r["ir"] for r in rs]) * 100
        for rs in runs.values()
    ]
    print(f"spread between repeats of one configuration: at most {max(spread):.2f}% of its total")


if __name__ == "__main__":
    main()
