"""What the metrics cost the job path (issue 15 target: job throughput with metrics
on and one /events stream open within 3 % of metrics off; server CPU per job side
by side in one run).

    python -m benchmarks.bench_metrics_overhead                  # 5 rounds of 60,000 jobs
    python -m benchmarks.bench_metrics_overhead --rounds 3 --jobs 40000

Each round runs a real `sepp serve` (persist mode sync_data, snapshots off, pinned
to the server core of `common.bench_cores`) twice, in alternating order (on/off, then off/on, ...), and drives it
with the lean load generator (benchmarks/loadgen.py, raw protocol, pinned to the
driver core, 50 connections: enqueue the jobs, then reserve + ack each):

- on: `--admin-listen 127.0.0.1:0`, so the native front counts every request
  (sepp_requests_total, sepp_request_duration_seconds), one /admin/api/v1/events
  stream is open for the whole run (one snapshot a second) and /metrics is
  scraped every second -- what a dashboard plus a Prometheus do;
- off: the admin listener "off" (and no [metrics] listener): the request
  counters are then not kept at all (RequestMetrics is None: nobody could read
  them), so "off" is the hot path without any of it. The event counters of
  Engine.observer run in both (they are not switchable: they are the server's
  own counters, read by `sepp stats` too).

Prints the machine line, a table of medians per variant -- jobs/s and server CPU
µs per job (from /proc/PID/stat over each phase), enqueue and drain -- and the
difference on - off in %, with the events and scrapes the observer saw (so a run
where the stream was not open shows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.bench_e2e import loadgen
from benchmarks.common import ServeProcess, machine_line, median, print_table, server_core
from benchmarks.compare import _our_cpu, _system_busy, wait_quiet

PHASES = ("enqueue", "drain")


class Server(ServeProcess):
    """`sepp serve` with the admin listener on (port 0) or off."""

    def __init__(self, metrics_on: bool, pin: bool) -> None:
        env = dict(os.environ)
        env["SEPP_STORAGE__SNAPSHOT_EVERY_BYTES"] = "0"  # steady state: no snapshot
        env["SEPP_LOGGING__LEVEL"] = "warning"
        env["SEPP_METRICS__LISTEN_ADDR"] = "off"
        super().__init__(
            tempfile.mkdtemp(prefix="sepp-bench-metrics-"),
            "sync_data",
            env,
            core=server_core() if pin else None,
            args=["--admin-listen", "127.0.0.1:0" if metrics_on else "off"],
            wait_for_admin=metrics_on,
        )


class Observer:
    """A dashboard and a scraper, in a thread of this process: one /events stream
    open, /metrics scraped every second."""

    def __init__(self, admin: str) -> None:
        self.admin = admin
        self.events = 0
        self.scrapes = 0
        self.requests_total = 0.0
        self.error: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the event stream did not open: {self.error}")

    async def _main(self) -> None:
        try:
            async with aiohttp.ClientSession() as session:
                stream = asyncio.create_task(self._stream(session))
                while not self._stop.is_set():
                    async with session.get(self.admin + "/metrics") as response:
                        text = await response.text()
                    self.scrapes += 1
                    self.requests_total = sum(
                        float(line.rpartition(" ")[2])
                        for line in text.splitlines()
                        if line.startswith("sepp_requests_total{")
                    )
                    await asyncio.sleep(1.0)  # a scraper's interval
                stream.cancel()
        except (aiohttp.ClientError, OSError) as exc:
            self.error = str(exc)
            self._ready.set()

    async def _stream(self, session: aiohttp.ClientSession) -> None:
        async with session.get(self.admin + "/admin/api/v1/events") as response:
            if response.status != 200:
                self.error = f"/events answered {response.status}"
                self._ready.set()
                return
            async for line in response.content:
                if line.startswith(b"event: "):
                    self.events += 1
                    self._ready.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def one_run(metrics_on: bool, pin: bool, jobs: int, connections: int) -> dict[str, Any]:
    busy0, ours0, wall0 = _system_busy(), _our_cpu(), time.perf_counter()
    server = Server(metrics_on, pin)
    observer = Observer(server.admin) if server.admin is not None else None
    try:
        result = loadgen(
            server.port,
            pin,
            connections=connections,
            jobs=jobs,
            phases=list(PHASES),
            server_pid=server.proc.pid,
        )
    finally:
        if observer is not None:
            observer.stop()
        server.stop()
    if observer is not None:
        if observer.error:
            raise RuntimeError(f"observer: {observer.error}")
        result["observer"] = {
            "events": observer.events,
            "scrapes": observer.scrapes,
            "requests_total": observer.requests_total,
        }
    # Cores that other processes used meanwhile: the machine is shared.
    result["others_cpu"] = max(
        0.0, (_system_busy() - busy0 - (_our_cpu() - ours0)) / (time.perf_counter() - wall0)
    )
    for phase in PHASES:
        r = result[phase]
        r["cpu_us_per_job"] = r["server_cpu"] / r["jobs_per_s"] * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every run here")
    parser.add_argument(
        "--quiet",
        type=float,
        default=10.0,
        help="wait up to this many seconds before each run for other processes to quiet down",
    )
    args = parser.parse_args()
    pin = not args.no_pin
    print(machine_line())
    print(
        f"command: python -m benchmarks.bench_metrics_overhead --rounds {args.rounds} "
        f"--jobs {args.jobs} --connections {args.connections}" + (" --no-pin" if not pin else "")
    )
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    started = time.monotonic()
    for round_no in range(args.rounds):
        order = (True, False) if round_no % 2 == 0 else (False, True)
        for metrics_on in order:
            wait_quiet(args.quiet, print)
            result = one_run(metrics_on, pin, args.jobs, args.connections)
            runs[metrics_on].append(result)
            seen = result.get("observer")
            print(
                f"  round {round_no + 1} metrics {'on ' if metrics_on else 'off'}: "
                + "  ".join(
                    f"{p} {result[p]['jobs_per_s']:,.0f} jobs/s "
                    f"{result[p]['cpu_us_per_job']:.1f} us/job"
                    for p in PHASES
                )
                + (
                    f"  (events {seen['events']}, scrapes {seen['scrapes']}, "
                    f"sepp_requests_total {seen['requests_total']:,.0f})"
                    if seen
                    else ""
                )
                + f"  [others' CPU {result['others_cpu'] * 100:.0f}%]",
                flush=True,
            )
    rows = []
    medians: dict[bool, dict[str, tuple[float, float]]] = {}
    for metrics_on in (False, True):
        medians[metrics_on] = {
            p: (
                median([r[p]["jobs_per_s"] for r in runs[metrics_on]]),
                median([r[p]["cpu_us_per_job"] for r in runs[metrics_on]]),
            )
            for p in PHASES
        }
        label = "on" if metrics_on else "off"
        rows.append(
            [label]
            + [f"{medians[metrics_on][p][0]:,.0f}" for p in PHASES]
            + [f"{medians[metrics_on][p][1]:.1f}" for p in PHASES]
        )

    def diff(index: int, phase: str) -> str:
        on, off = medians[True][phase][index], medians[False][phase][index]
        return f"{(on - off) / off * 100:+.1f}%"

    rows.append(
        ["difference on - off"] + [diff(0, p) for p in PHASES] + [diff(1, p) for p in PHASES]
    )
    print(
        f"\nmedians of {args.rounds} rounds, {args.jobs:,} jobs, {args.connections} connections "
        f"({time.monotonic() - started:.0f} s):"
    )
    print("on = admin listener on, one /events stream open, /metrics scraped every second")
    print_table(
        [
            "metrics",
            "enqueue jobs/s",
            "drain jobs/s",
            "enqueue server CPU us/job",
            "drain server CPU us/job",
        ],
        rows,
    )
    # Rounds ran on and off back to back: the difference within each round, and
    # its median, is the figure least moved by what else the machine did.
    for phase in PHASES:
        paired = [
            (on[phase]["cpu_us_per_job"] - off[phase]["cpu_us_per_job"])
            / off[phase]["cpu_us_per_job"]
            * 100
            for on, off in zip(runs[True], runs[False])
        ]
        print(
            f"{phase}: server CPU per job on - off within each round "
            + " ".join(f"{d:+.1f}%" for d in paired)
            + f", median {median(paired):+.1f}%"
        )
    print(
        "others' CPU during the runs (cores): "
        + " ".join(f"{r['others_cpu']:.2f}" for r in runs[True] + runs[False])
    )
    if args.json:
        args.json.write_text(json.dumps({"on": runs[True], "off": runs[False]}, indent=1))


if __name__ == "__main__":
    main()
