"""Comparative benchmark: sepp against the brokers people use today, on this machine.

Runs sepp (a real `sepp serve`, via benchmarks/bench_e2e.py and loadgen.py) and every
available peer (benchmarks/peers/: beanstalkd, BullMQ on Redis, NATS JetStream) with
the method of benchmark-method.md: 256-byte payloads, N producers then N workers
with one request in flight each (closed loop), drain = reserve + ack per job with the
clock stopping at the last ack, then enqueue -> reserve -> ack latency on a single
connection. Broker pinned to one core, its load driver to the other (core 0 and 1, or
swapped when `common.bench_cores` finds syncs stalling on core 0); both sides' CPU share
of one core is recorded per phase ('!' marks >= 90 %: that side limited the rate).
Every broker is a child process with a fresh data dir and a free 127.0.0.1 port, and
is stopped by PID when its run ends (also on Ctrl-C and errors).

    python -m benchmarks.compare --install            # install the peers first (apt, pip, npm)
    python -m benchmarks.compare                      # durable, 200,000 jobs, median of 3 runs
    python -m benchmarks.compare --quick              # 50,000 jobs, 1 run
    python -m benchmarks.compare --buffered --sweep   # + buffered table, + concurrency sweep
    python -m benchmarks.compare --brokers sepp nats --runs 1 --jobs 20000
    python -m benchmarks.compare --sepp-builds pure   # sepp's pure-Python build only
    python -m benchmarks.compare --clients --quick    # only the clients section, 10,000 jobs

The "clients" section (in every run unless --no-clients) measures what users run:
each broker through its own client library from ONE client process pinned to core
1, durable — sepp's SeppClient / Worker (benchmarks/bench_client.py's producer,
worker, max_jobs=1 worker and round trip phases, server in sync_all), BullMQ's
Queue.add / Worker(concurrency) from one Node process, nats-py's js.publish / pull
consumer, greenstalk from threads — with jobs/s, client CPU per job, sepp/peer
ratios and issue 14's verdicts.

sepp runs in both builds when the compiled build exists (`python -m tools.compile`;
"sepp compiled" and "sepp pure" rows, the compiled one the reference for the
ratios and the verdicts of both printed), else in the pure build.

Writes <out>/compare-<stamp>.{txt,csv,png} (+ -runs.csv with every single run);
<out> defaults to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Any

from benchmarks import bench_client, bench_e2e
from benchmarks.common import (
    bench_cores,
    check_builds,
    fsync_rate,
    machine_line,
    median,
    server_loop,
    server_sync,
)
from benchmarks.peers.brokers import PEERS, Broker, DriverError, stop_all, taskset
from log_format._compiled import BUILDS, build_name

ROOT = Path(__file__).resolve().parent.parent
INSTALL = Path(__file__).resolve().parent / "peers" / "install.sh"
METHOD_JOBS = 200_000
SWEEP = [(1, 5_000), (8, 40_000), (64, 200_000), (256, 200_000)]
BROKER_ORDER = ["sepp", "beanstalkd", "bullmq", "nats"]
SATURATED = 0.90
BUSY_OTHERS = 0.15  # cores used by other processes during a run that make it suspect

# Targets for sepp durable (sync_data) against the durable peers (the numbers).
TARGET_ENQ_BEST, TARGET_ENQ_PEROP = 1.4, 3.0
TARGET_DRAIN_BEST, TARGET_DRAIN_PEROP = 1.25, 2.5


@dataclass
class Row:
    section: str  # durable | buffered | sweep
    broker: str  # display name
    key: str  # sepp | beanstalkd | bullmq | nats
    mode: str  # durable | buffered
    setting: str  # e.g. "sync_data", "binlog -f 0"
    connections: int
    jobs: int
    per_op_fsync: bool = False
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    build: str = ""  # sepp's rows: "pure" or "compiled"

    @property
    def label(self) -> str:
        return f"{self.broker} ({self.setting})"

    def med(self, phase: str, key: str) -> float | None:
        values = [r[phase][key] for r in self.runs if phase in r and key in r[phase]]
        return median(values) if values else None

    def cpu_us(self, phase: str) -> float | None:
        """The broker's CPU time per job in the phase (µs), median over runs."""
        values = [
            r[phase]["server_cpu"] / r[phase]["jobs_per_s"] * 1e6
            for r in self.runs
            if phase in r and r[phase].get("server_cpu") and r[phase].get("jobs_per_s")
        ]
        return median(values) if values else None

    def spread(self, phase: str) -> tuple[float, float] | None:
        values = [r[phase]["jobs_per_s"] for r in self.runs if phase in r]
        return (min(values), max(values)) if values else None


# --- running --------------------------------------------------------------------


def run_sepp(
    persist_mode: str,
    build: str,
    connections: int,
    jobs: int,
    pin: bool,
    latency: bool,
    rounds: int,
) -> dict[str, Any]:
    # bench_e2e.one_run starts `sepp serve` pinned to the server core (snapshots off)
    # and loadgen to the driver core (common.bench_cores), exactly as
    # `python -m benchmarks.bench_e2e` does.
    del rounds  # one_run uses loadgen's 2,000 latency rounds
    result = bench_e2e.one_run(persist_mode, connections, jobs, pin, latency=latency, build=build)
    result["client"] = "benchmarks/loadgen.py (raw protocol, asyncio)"
    return result


def run_peer(
    cls: type[Broker], mode: str, connections: int, jobs: int, pin: bool, latency: bool, rounds: int
) -> dict[str, Any]:
    broker = cls(mode, pin)
    broker.start()
    try:
        phases = ["enqueue", "drain"] + (["latency"] if latency else [])
        return broker.drive(connections, jobs, phases, rounds=rounds)
    finally:
        broker.stop()


def _system_busy() -> float:
    """CPU seconds all cores spent busy (not idle, not iowait) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _our_cpu() -> float:
    """CPU seconds of this process and every child it waited for (brokers, drivers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def others_cpu(seconds: float = 1.0) -> float:
    """Cores used by processes other than this benchmark over `seconds` (now)."""
    busy0, ours0 = _system_busy(), _our_cpu()
    time.sleep(seconds)
    return max(0.0, (_system_busy() - busy0 - (_our_cpu() - ours0)) / seconds)


def wait_quiet(limit: float, log: Callable[[str], None]) -> None:
    """Wait (up to `limit` seconds) until other processes leave the machine quiet."""
    if limit <= 0:
        return
    t0 = time.monotonic()
    busy = others_cpu()
    while busy >= BUSY_OTHERS and time.monotonic() - t0 < limit:
        busy = others_cpu(2.0)
    waited = time.monotonic() - t0
    if busy >= BUSY_OTHERS:
        log(f"  (machine still busy after {waited:.0f} s: others use {busy * 100:.0f}% of a core)")
    elif waited > 5:
        log(f"  (waited {waited:.0f} s for other processes to quiet down)")


def measure(
    row: Row, runner: Callable[[], dict[str, Any]], log: Callable[[str], None], quiet: float = 0.0
) -> None:
    wait_quiet(quiet, log)
    load = os.getloadavg()[0]
    busy0, ours0 = _system_busy(), _our_cpu()
    t0 = time.perf_counter()
    try:
        result = runner()
    except (DriverError, RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as exc:
        msg = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
        row.errors.append(msg)
        log(f"  {row.label:<45} c={row.connections:<4} ERROR: {msg}")
        return
    result["load_avg_before"] = load
    result["wall_s"] = time.perf_counter() - t0
    # CPU that processes other than this benchmark used meanwhile, in cores: on a
    # 2-core machine anything much above 0 means the figures are not clean.
    result["other_cpu"] = max(
        0.0, (_system_busy() - busy0 - (_our_cpu() - ours0)) / result["wall_s"]
    )
    row.runs.append(result)
    enq = result.get("enqueue", {})
    drn = result.get("drain", {})
    lat = result.get("latency", {})
    short = (
        f"enq {enq.get('jobs_per_s', 0):>9,.0f}/s ({enq.get('server_cpu', 0) * 100:.0f}%/{enq.get('client_cpu', 0) * 100:.0f}%)"
        f"  drain {drn.get('jobs_per_s', 0):>8,.0f}/s ({drn.get('server_cpu', 0) * 100:.0f}%/{drn.get('client_cpu', 0) * 100:.0f}%)"
    )
    if drn and drn.get("jobs", row.jobs) != row.jobs:
        short += f"  [drained {drn['jobs']:,} of {row.jobs:,}]"
    if lat:
        short += f"  p50/p99/p999 {lat['p50_ms']:.2f}/{lat['p99_ms']:.2f}/{lat['p999_ms']:.2f} ms"
    log(
        f"  {row.label:<45} c={row.connections:<4} {short}  [{result['wall_s']:.0f} s, "
        f"others' CPU {result['other_cpu'] * 100:.0f}%]"
    )


def make_rows(
    section: str,
    mode: str,
    keys: list[str],
    sepp_modes: list[str],
    connections: int,
    jobs: int,
    builds: list[str],
) -> list[Row]:
    rows = []
    for key in keys:
        if key == "sepp":
            for build in builds:
                for persist in sepp_modes:
                    rows.append(
                        Row(
                            section,
                            f"sepp {build}",
                            "sepp",
                            mode,
                            persist,
                            connections,
                            jobs,
                            build=build,
                        )
                    )
        else:
            cls = PEERS[key]
            setting = cls(mode).setting()
            rows.append(
                Row(section, cls.name, key, mode, setting, connections, jobs, cls.per_op_fsync)
            )
    return rows


def runner_for(row: Row, pin: bool, latency: bool, rounds: int) -> Callable[[], dict[str, Any]]:
    if row.key == "sepp":
        return lambda: run_sepp(
            row.setting, row.build, row.connections, row.jobs, pin, latency, rounds
        )
    cls = PEERS[row.key]
    return lambda: run_peer(cls, row.mode, row.connections, row.jobs, pin, latency, rounds)


# --- reporting --------------------------------------------------------------------


def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_cpu(row: Row, side: str) -> str:
    parts = []
    for phase in ("enqueue", "drain"):
        v = row.med(phase, side)
        parts.append("-" if v is None else f"{v * 100:.0f}%" + ("!" if v >= SATURATED else ""))
    return " / ".join(parts)


def fmt_cpu_us(row: Row) -> str:
    parts = []
    for phase in ("enqueue", "drain"):
        v = row.cpu_us(phase)
        parts.append("-" if v is None else f"{v:.0f}")
    return " / ".join(parts)


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def md_table(headers: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"]
    out.append(
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if i in right else ("-" * (w + 2)) for i, w in enumerate(widths)
        )
        + "|"
    )
    for r in rows:
        out.append(
            "| "
            + " | ".join(
                c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
            + " |"
        )
    return "\n".join(out)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def headline_table(rows: list[Row], ref: Row | None, ref_name: str) -> str:
    headers = [
        "broker", "mode", "enqueue jobs/s", "drain jobs/s", "p50 ms", "p99 ms", "p999 ms",
        "broker CPU enq/drain", "broker µs/job enq/drain", "driver CPU enq/drain",
        f"{ref_name}/peer enq", f"{ref_name}/peer drain", "runs",
    ]  # fmt: skip
    body = []
    ref_enq = ref.med("enqueue", "jobs_per_s") if ref else None
    ref_drn = ref.med("drain", "jobs_per_s") if ref else None
    for row in rows:
        if not row.runs:
            body.append(
                [
                    row.broker,
                    row.setting,
                    "error",
                    "error",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "0",
                ]
            )
            continue
        enq, drn = row.med("enqueue", "jobs_per_s"), row.med("drain", "jobs_per_s")

        def with_spread(v: float | None, phase: str, row: Row = row) -> str:
            s = row.spread(phase)
            if v is None or s is None or len(row.runs) < 2:
                return fmt_rate(v)
            return f"{v:,.0f} ({s[0]:,.0f}-{s[1]:,.0f})"

        body.append(
            [
                row.broker,
                row.setting,
                with_spread(enq, "enqueue"),
                with_spread(drn, "drain"),
                fmt_ms(row.med("latency", "p50_ms")),
                fmt_ms(row.med("latency", "p99_ms")),
                fmt_ms(row.med("latency", "p999_ms")),
                fmt_cpu(row, "server_cpu"),
                fmt_cpu_us(row),
                fmt_cpu(row, "client_cpu"),
                "—" if row is ref else fmt_ratio(ratio(ref_enq, enq)),
                "—" if row is ref else fmt_ratio(ratio(ref_drn, drn)),
                str(len(row.runs)) + (f" ({len(row.errors)} failed)" if row.errors else ""),
            ]
        )
    return md_table(headers, body, right=set(range(2, 13)))


def sweep_table(rows: list[Row]) -> str:
    brokers: list[str] = []
    for r in rows:
        if r.label not in brokers:
            brokers.append(r.label)
    conns = sorted({r.connections for r in rows})
    headers = ["connections", "jobs"] + [b + " enq / drain" for b in brokers]
    body = []
    for c in conns:
        line = [str(c), ""]
        for b in brokers:
            match = [r for r in rows if r.connections == c and r.label == b]
            if not match or not match[0].runs:
                line.append("error" if match else "-")
                continue
            r = match[0]
            line[1] = f"{r.jobs:,}"
            cpu = ""
            for phase in ("enqueue", "drain"):
                v = r.med(phase, "client_cpu")
                if v is not None and v >= SATURATED:
                    cpu = " ⚠"
            line.append(
                f"{fmt_rate(r.med('enqueue', 'jobs_per_s'))} / {fmt_rate(r.med('drain', 'jobs_per_s'))}{cpu}"
            )
        body.append(line)
    return md_table(headers, body, right=set(range(0, len(headers))))


def verdicts(rows: list[Row], build: str) -> list[str]:
    ref = next(
        (
            r
            for r in rows
            if r.key == "sepp" and r.setting == "sync_data" and r.build == build and r.runs
        ),
        None,
    )
    peers = [r for r in rows if r.key != "sepp" and r.runs]
    if ref is None or not peers:
        return [f"verdict: needs sepp {build} sync_data and at least one durable peer"]
    out = []
    for phase, best_t, perop_t in (
        ("enqueue", TARGET_ENQ_BEST, TARGET_ENQ_PEROP),
        ("drain", TARGET_DRAIN_BEST, TARGET_DRAIN_PEROP),
    ):
        mine = ref.med(phase, "jobs_per_s") or 0.0
        best = max(peers, key=lambda r: r.med(phase, "jobs_per_s") or 0.0)
        b = best.med(phase, "jobs_per_s") or 0.0
        rr = mine / b if b else float("inf")
        out.append(
            f"{phase.capitalize()} >= {best_t}x the best peer: sepp {build} {mine:,.0f}/s vs {best.broker} {b:,.0f}/s"
            f" = {rr:.2f}x -> {'MET' if rr >= best_t else 'NOT MET'}"
        )
        perop = [r for r in peers if r.per_op_fsync]
        if perop:
            parts, ok = [], True
            for r in perop:
                v = r.med(phase, "jobs_per_s") or 0.0
                x = mine / v if v else float("inf")
                ok &= x >= perop_t
                parts.append(f"{r.broker} {v:,.0f}/s = {x:.2f}x")
            out.append(
                f"{phase.capitalize()} >= {perop_t}x every per-operation-fsync broker: "
                + "; ".join(parts)
                + f" -> {'MET' if ok else 'NOT MET'}"
            )
    return out


def bound_notes(rows: list[Row]) -> list[str]:
    notes = []
    for r in rows:
        if not r.runs:
            continue
        for phase in ("enqueue", "drain"):
            c, s = r.med(phase, "client_cpu"), r.med(phase, "server_cpu")
            where = f"{r.section} {r.label} c={r.connections} {phase}"
            if c is not None and c >= SATURATED:
                notes.append(
                    f"⚠ driver-bound: {where}: the driver used {c * 100:.0f}% of its core, so this is what one "
                    f"driver process can push, not the broker's ceiling"
                )
            if s is not None and s >= SATURATED:
                notes.append(
                    f"broker-bound (CPU): {where}: the broker used {s * 100:.0f}% of its core"
                )
    return notes


def load_notes(rows: list[Row]) -> list[str]:
    busy = [
        f"{r.section} {r.broker} ({r.setting}) c={r.connections}: {run['other_cpu'] * 100:.0f}%"
        for r in rows
        for run in r.runs
        if run.get("other_cpu", 0.0) >= BUSY_OTHERS
    ]
    if not busy:
        return []
    return [
        f"note: during {len(busy)} run(s) other processes on this machine used >= "
        f"{BUSY_OTHERS * 100:.0f}% of a core (they competed for CPU and disk, so those figures "
        "are low): " + "; ".join(busy)
    ]


def errors_of(rows: list[Row]) -> list[str]:
    return [f"error: {r.section} {r.label} c={r.connections}: {e}" for r in rows for e in r.errors]


CSV_FIELDS = [
    "section", "broker", "mode", "setting", "connections", "jobs", "runs", "failed_runs",
    "enqueue_jobs_s", "enqueue_min", "enqueue_max", "drain_jobs_s", "drain_min", "drain_max",
    "p50_ms", "p99_ms", "p999_ms", "broker_cpu_enqueue", "broker_cpu_drain",
    "broker_cpu_us_per_job_enqueue", "broker_cpu_us_per_job_drain", "driver_cpu_enqueue", "driver_cpu_drain", "ratio_sepp_enqueue", "ratio_sepp_drain", "ratio_reference",
]  # fmt: skip


def csv_rows(
    rows: list[Row], ref_of: Callable[[Row], tuple[Row | None, str]]
) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        ref, ref_name = ref_of(r)
        enq, drn = r.med("enqueue", "jobs_per_s"), r.med("drain", "jobs_per_s")
        se, sd = r.spread("enqueue"), r.spread("drain")
        out.append(
            {
                "section": r.section,
                "broker": r.broker,
                "mode": r.mode,
                "setting": r.setting,
                "connections": r.connections,
                "jobs": r.jobs,
                "runs": len(r.runs),
                "failed_runs": len(r.errors),
                "enqueue_jobs_s": enq,
                "enqueue_min": se[0] if se else None,
                "enqueue_max": se[1] if se else None,
                "drain_jobs_s": drn,
                "drain_min": sd[0] if sd else None,
                "drain_max": sd[1] if sd else None,
                "p50_ms": r.med("latency", "p50_ms"),
                "p99_ms": r.med("latency", "p99_ms"),
                "p999_ms": r.med("latency", "p999_ms"),
                "broker_cpu_enqueue": r.med("enqueue", "server_cpu"),
                "broker_cpu_drain": r.med("drain", "server_cpu"),
                "broker_cpu_us_per_job_enqueue": r.cpu_us("enqueue"),
                "broker_cpu_us_per_job_drain": r.cpu_us("drain"),
                "driver_cpu_enqueue": r.med("enqueue", "client_cpu"),
                "driver_cpu_drain": r.med("drain", "client_cpu"),
                "ratio_sepp_enqueue": ratio(ref.med("enqueue", "jobs_per_s"), enq) if ref else None,
                "ratio_sepp_drain": ratio(ref.med("drain", "jobs_per_s"), drn) if ref else None,
                "ratio_reference": ref_name if ref else "",
            }
        )
    return out


def write_png(path: Path, sections: list[tuple[str, list[Row]]], sweep: list[Row]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no PNG (run benchmarks/peers/install.sh)"
    panels = [(t, [r for r in rs if r.runs]) for t, rs in sections if any(r.runs for r in rs)]
    n = len(panels) + (1 if any(r.runs for r in sweep) else 0)
    if n == 0:
        return "nothing to plot"
    fig, axes = plt.subplots(n, 1, figsize=(11, 4.2 * n), squeeze=False)
    for ax, (title, rs) in zip(axes[:, 0], panels):
        labels = [f"{r.broker}\n{r.setting}" for r in rs]
        xs = range(len(rs))
        enq = [r.med("enqueue", "jobs_per_s") or 0 for r in rs]
        drn = [r.med("drain", "jobs_per_s") or 0 for r in rs]
        w = 0.38
        b1 = ax.bar([x - w / 2 for x in xs], enq, w, label="enqueue jobs/s", color="#3b75af")
        b2 = ax.bar([x + w / 2 for x in xs], drn, w, label="drain jobs/s", color="#ef8636")
        ax.bar_label(b1, labels=[f"{v:,.0f}" for v in enq], fontsize=8)
        ax.bar_label(b2, labels=[f"{v:,.0f}" for v in drn], fontsize=8)
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("jobs/s")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if n > len(panels):
        ax = axes[-1, 0]
        for label in dict.fromkeys(r.label for r in sweep):
            rs = sorted(
                (r for r in sweep if r.label == label and r.runs), key=lambda r: r.connections
            )
            if not rs:
                continue
            cs = [r.connections for r in rs]
            line = ax.plot(
                cs,
                [r.med("enqueue", "jobs_per_s") for r in rs],
                marker="o",
                label=f"{label} enqueue",
            )
            ax.plot(
                cs,
                [r.med("drain", "jobs_per_s") for r in rs],
                marker="s",
                linestyle="--",
                color=line[0].get_color(),
                label=f"{label} drain",
            )
        ax.set_xscale("log", base=2)
        ticks = sorted({r.connections for r in sweep})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_yscale("log")
        ax.set_xlabel("connections (producers = workers)")
        ax.set_ylabel("jobs/s")
        ax.set_title("durable throughput by concurrency", fontsize=10)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --- the clients section: each broker through its own client library ------------------

CLIENTS_JOBS = 50_000
CLIENTS_SEPP_PHASES = ["producer", "worker", "worker_mj1", "roundtrip"]
CLIENTS_PEER_PHASES = ["producer", "worker"]
CLIENTS_ORDER = ["sepp", "bullmq", "nats", "beanstalkd"]
# What each broker's client process calls, as its users write it.
CLIENT_APIS = {
    "sepp": "SeppClient.enqueue, N tasks / Worker(max_in_flight=N), no-op",
    "bullmq": "Queue.add, N concurrent / Worker(concurrency=N), no-op",
    "nats": "js.publish, N tasks / pull fetch(N) + ack each",
    "beanstalkd": "greenstalk put / reserve + delete, N threads",
}
CLIENT_PHASE_NAMES = {
    "producer": "producer",
    "worker": "worker",
    "worker_mj1": "worker max_jobs=1",
    "roundtrip": "round trip",
}
# A client run that stalls (a worker waiting for jobs that never come) fails after this.
CLIENTS_TIMEOUT = 900.0
TARGET_CLIENT_PRODUCER, TARGET_CLIENT_WORKER, TARGET_CLIENT_WORKER_MJ1 = 2.0, 2.0, 1.0


@dataclass
class ClientRow:
    key: str  # sepp | bullmq | nats | beanstalkd
    broker: str
    setting: str
    jobs: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def phases(self) -> list[str]:
        return CLIENTS_SEPP_PHASES if self.key == "sepp" else CLIENTS_PEER_PHASES

    def summary(self, phase: str) -> dict[str, Any]:
        return bench_client.summarize(phase, self.runs)

    def rate(self, phase: str) -> float | None:
        return self.summary(phase).get("jobs_per_s")


def make_client_rows(keys: list[str], sepp_mode: str, build: str, jobs: int) -> list[ClientRow]:
    rows = []
    for key in CLIENTS_ORDER:
        if key not in keys:
            continue
        if key == "sepp":
            rows.append(ClientRow("sepp", f"sepp {build}", sepp_mode, jobs))
        else:
            cls = PEERS[key]
            rows.append(ClientRow(key, cls.name, cls("durable").setting(), jobs))
    return rows


def client_runner(
    row: ClientRow, build: str, concurrency: int, rounds: int, pin: bool
) -> Callable[[], dict[str, Any]]:
    if row.key == "sepp":
        return lambda: bench_client.run_once(
            row.setting,
            row.phases,
            row.jobs,
            concurrency=concurrency,
            rounds=rounds,
            pin=pin,
            loop="asyncio",
            build=build,
            timeout=CLIENTS_TIMEOUT,
        )
    cls = PEERS[row.key]

    def run() -> dict[str, Any]:
        broker = cls("durable", pin)
        broker.start()
        try:
            return broker.drive_clients(row.jobs, concurrency, row.phases, CLIENTS_TIMEOUT)
        finally:
            broker.stop()

    return run


def measure_client(
    row: ClientRow, runner: Callable[[], dict[str, Any]], log: Callable[[str], None], quiet: float
) -> None:
    wait_quiet(quiet, log)
    busy0, ours0 = _system_busy(), _our_cpu()
    t0 = time.perf_counter()
    try:
        result = runner()
    except (DriverError, RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as exc:
        msg = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
        row.errors.append(msg)
        log(f"  {row.broker:<16} clients ERROR: {msg}")
        return
    wall = time.perf_counter() - t0
    result["other_cpu"] = max(0.0, (_system_busy() - busy0 - (_our_cpu() - ours0)) / wall)
    row.runs.append(result)
    parts = [
        f"{CLIENT_PHASE_NAMES[p]} {result[p]['jobs_per_s']:,.0f}/s "
        f"({result[p]['client_us_per_job']:.0f} µs)"
        for p in row.phases
        if p in result
    ]
    log(
        f"  {row.broker:<16} " + "  ".join(parts) + f"  [{wall:.0f} s, others' CPU "
        f"{result['other_cpu'] * 100:.0f}%]"
    )


def clients_table(rows: list[ClientRow]) -> str:
    headers = [
        "broker", "client API", "phase", "jobs/s", "client µs/job", "broker µs/job",
        "client CPU", "p50 / p99 / p999 ms", "sepp/peer", "sepp max_jobs=1/peer", "runs",
    ]  # fmt: skip
    sepp = next((r for r in rows if r.key == "sepp" and r.runs), None)
    body = []
    for row in rows:
        if not row.runs:
            body.append([row.broker, CLIENT_APIS[row.key], "error"] + ["-"] * 7 + ["0"])
            continue
        for phase in row.phases:
            s = row.summary(phase)
            if not s:
                continue
            spread = f" ({s['min']:,.0f}-{s['max']:,.0f})" if s["runs"] > 1 else ""
            cpu = s["client_cpu"] * 100
            lat = (
                f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f} / {s['p999_ms']:.2f}"
                if "p50_ms" in s
                else "-"
            )
            same = mj1 = "-"
            if row.key == "sepp":
                same = "—"
            elif sepp is not None:
                same = fmt_ratio(ratio(sepp.rate(phase), s["jobs_per_s"]))
                if phase == "worker":
                    mj1 = fmt_ratio(ratio(sepp.rate("worker_mj1"), s["jobs_per_s"]))
            body.append(
                [
                    row.broker if phase == row.phases[0] else "",
                    CLIENT_APIS[row.key] if phase == row.phases[0] else "",
                    CLIENT_PHASE_NAMES[phase],
                    f"{s['jobs_per_s']:,.0f}{spread}",
                    f"{s['client_us_per_job']:.1f}",
                    f"{s['server_us_per_job']:.1f}",
                    f"{cpu:.0f}%" + ("!" if cpu >= SATURATED * 100 else ""),
                    lat,
                    same,
                    mj1,
                    str(len(row.runs)) + (f" ({len(row.errors)} failed)" if row.errors else ""),
                ]
            )
    return md_table(headers, body, right=set(range(3, 11)))


def clients_verdicts(rows: list[ClientRow]) -> list[str]:
    sepp = next((r for r in rows if r.key == "sepp" and r.runs), None)
    bull = next((r for r in rows if r.key == "bullmq" and r.runs), None)
    if sepp is None:
        return ["clients verdict: needs sepp's client run"]
    out = []
    if bull is None:
        out.append("clients verdict: needs BullMQ's client run for the ratio targets")
    else:
        for what, mine, theirs, target in (
            ("Producer >= 2x BullMQ Queue.add", "producer", "producer", TARGET_CLIENT_PRODUCER),
            ("Worker >= 2x BullMQ Worker", "worker", "worker", TARGET_CLIENT_WORKER),
            (
                "max_jobs=1 worker >= BullMQ Worker rate",
                "worker_mj1",
                "worker",
                TARGET_CLIENT_WORKER_MJ1,
            ),
        ):
            a, b = sepp.rate(mine), bull.rate(theirs)
            x = ratio(a, b)
            out.append(
                f"{what}: sepp {fmt_rate(a)}/s vs BullMQ {fmt_rate(b)}/s = {fmt_ratio(x)}"
                f" -> {'MET' if x is not None and x >= target else 'NOT MET'}"
            )
    summary = {p: sepp.summary(p) for p in sepp.phases}
    out += [f"{line[0].upper()}{line[1:]}" for line in bench_client.verdicts(summary)]
    return out


CLIENTS_CSV_FIELDS = [
    "broker", "setting", "phase", "jobs", "runs", "jobs_s", "min", "max", "client_us_per_job",
    "broker_us_per_job", "client_cpu", "p50_ms", "p99_ms", "p999_ms",
]  # fmt: skip


def clients_csv_rows(rows: list[ClientRow]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        for phase in row.phases:
            s = row.summary(phase)
            if not s:
                continue
            out.append(
                {
                    "broker": row.broker,
                    "setting": row.setting,
                    "phase": phase,
                    "jobs": s["jobs"],
                    "runs": s["runs"],
                    "jobs_s": s["jobs_per_s"],
                    "min": s["min"],
                    "max": s["max"],
                    "client_us_per_job": s["client_us_per_job"],
                    "broker_us_per_job": s["server_us_per_job"],
                    "client_cpu": s["client_cpu"],
                    "p50_ms": s.get("p50_ms"),
                    "p99_ms": s.get("p99_ms"),
                    "p999_ms": s.get("p999_ms"),
                }
            )
    return out


# --- main ---------------------------------------------------------------------------


def versions(keys: list[str]) -> list[str]:
    out = []
    if "sepp" in keys:
        out.append(
            f"sepp {pkg_version('sepp')} (python {platform.python_version()}, event loop {server_loop()}, durable syncs by {server_sync('sync_data')}, builds in this checkout: {build_name(ignore_env=True)}), msgpack {pkg_version('msgpack')}"
        )
    for key in keys:
        if key != "sepp":
            out.append(PEERS[key].versions())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--install", action="store_true", help="run benchmarks/peers/install.sh first"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"jobs per run (default {METHOD_JOBS:,}; the sweep scales with it)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs per durable row; the median is reported (default 3)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="50,000 jobs, 1 run (unless --jobs/--runs say otherwise)",
    )
    parser.add_argument(
        "--connections", type=int, default=50, help="producers = workers in the headline run"
    )
    parser.add_argument(
        "--rounds", type=int, default=2000, help="latency round trips (sepp: loadgen's 2,000)"
    )
    parser.add_argument("--brokers", nargs="+", default=BROKER_ORDER, choices=BROKER_ORDER)
    parser.add_argument(
        "--sepp-modes",
        nargs="+",
        default=["sync_data", "sync_all"],
        help="sepp's durable persist modes",
    )
    parser.add_argument(
        "--sepp-builds",
        nargs="+",
        choices=BUILDS,
        default=None,
        help="sepp's builds in the durable table, the first one the reference for the ratios "
        "(default: compiled then pure when `python -m tools.compile` was run, else pure)",
    )
    parser.add_argument("--no-durable", action="store_true", help="skip the durable headline table")
    parser.add_argument(
        "--buffered",
        action="store_true",
        help="also the buffered table (sepp buffer vs each peer's ordinary setting)",
    )
    parser.add_argument("--buffered-runs", type=int, default=1)
    parser.add_argument(
        "--sweep", action="store_true", help="also the durable concurrency sweep 1/8/64/256"
    )
    parser.add_argument("--sweep-runs", type=int, default=1)
    parser.add_argument(
        "--no-clients",
        action="store_true",
        help="skip the clients section (each broker through its own client library)",
    )
    parser.add_argument(
        "--clients",
        action="store_true",
        help="the clients section only (no durable / buffered / sweep table)",
    )
    parser.add_argument(
        "--clients-jobs",
        type=int,
        default=None,
        help=f"jobs per producer / worker phase of the clients section (default {CLIENTS_JOBS:,}; "
        "--quick 10,000); sepp's max_jobs=1 worker runs a quarter",
    )
    parser.add_argument(
        "--clients-mode",
        default="sync_all",
        help="sepp's persist mode in the clients section (default sync_all, the issue's target)",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin broker / driver to cores 0 / 1"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run wait up to this long until other processes use < 15%% of a core",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    builds = args.sepp_builds or (
        ["compiled", "pure"] if build_name(ignore_env=True) == "compiled" else ["pure"]
    )
    problem = check_builds(builds)
    if problem:
        parser.error(problem)
    jobs = args.jobs or (50_000 if args.quick else METHOD_JOBS)
    clients_jobs = args.clients_jobs or (10_000 if args.quick else CLIENTS_JOBS)
    if args.clients:
        if args.no_clients:
            parser.error("--clients and --no-clients contradict each other")
        args.no_durable, args.buffered, args.sweep = True, False, False
    runs = args.runs or (1 if args.quick else 3)
    pin = not args.no_pin

    if args.install:
        subprocess.run(
            ["bash", str(INSTALL)], check=True, env={**os.environ, "PYTHON": sys.executable}
        )

    # Stop whatever we started on SIGTERM / SIGHUP as on Ctrl-C.
    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    report_lines: list[str] = []

    def log(line: str = "") -> None:
        print(line, flush=True)
        report_lines.append(line)

    keys = []
    for key in args.brokers:
        if key != "sepp":
            why = PEERS[key].missing()
            if why:
                log(f"skipping {PEERS[key].name}: {why}")
                continue
        keys.append(key)

    log(f"# sepp vs peers — {dt.datetime.now().isoformat(timespec='seconds')}")
    log(f"command: python -m benchmarks.compare {shlex.join(sys.argv[1:])}")
    log(machine_line())
    probe = fsync_rate()
    log(
        f"disk (start): 4 KiB append + fdatasync median {probe['median_us']:.0f} us, p99 {probe['p99_us']:.0f} us, {probe['syncs_per_s']:,.0f} syncs/s"
    )
    if pin and taskset("0"):
        server, driver = bench_cores()
        log(f"pinning: broker on core {server}, load driver on core {driver}")
    else:
        log("pinning: no")
    for v in versions(keys):
        log(f"version: {v}")
    if not args.clients:
        log(
            f"method: 256-byte payloads, {args.connections} producers then {args.connections} workers, one request in flight each; {jobs:,} jobs; latency {args.rounds:,} round trips on one connection"
        )
    log("")

    durable = (
        []
        if args.no_durable
        else make_rows("durable", "durable", keys, args.sepp_modes, args.connections, jobs, builds)
    )
    # The buffered table and the sweep run the reference build only.
    buffered = (
        make_rows("buffered", "buffered", keys, ["buffer"], args.connections, jobs, builds[:1])
        if args.buffered
        else []
    )
    scale = jobs / METHOD_JOBS
    sweep: list[Row] = []
    if args.sweep:
        for conns, n in SWEEP:
            sweep += make_rows(
                "sweep",
                "durable",
                keys,
                ["sync_data"],
                conns,
                max(conns * 20, round(n * scale)),
                builds[:1],
            )

    clients = (
        []
        if args.no_clients
        else make_client_rows(keys, args.clients_mode, builds[0], clients_jobs)
    )

    try:
        if durable:
            log(
                f"## durable, {args.connections}/{args.connections}, {jobs:,} jobs, {runs} run(s) (CPU = broker%/driver%)"
            )
            for i in range(runs):
                log(f"run {i + 1}/{runs}")
                for row in durable:
                    measure(row, runner_for(row, pin, True, args.rounds), log, args.wait_quiet)
        if buffered:
            log(
                f"## buffered, {args.connections}/{args.connections}, {jobs:,} jobs, {args.buffered_runs} run(s)"
            )
            for i in range(args.buffered_runs):
                log(f"run {i + 1}/{args.buffered_runs}")
                for row in buffered:
                    measure(row, runner_for(row, pin, True, args.rounds), log, args.wait_quiet)
        if sweep:
            log(f"## durable concurrency sweep, {args.sweep_runs} run(s)")
            for _ in range(args.sweep_runs):
                for row in sweep:
                    measure(row, runner_for(row, pin, False, args.rounds), log, args.wait_quiet)
        if clients:
            log(
                f"## clients: each broker through its own client library, one client process, "
                f"{args.connections} concurrent callers, {clients_jobs:,} jobs, {runs} run(s) "
                f"(µs = client CPU per job)"
            )
            for i in range(runs):
                log(f"run {i + 1}/{runs}")
                for crow in clients:
                    runner = client_runner(crow, builds[0], args.connections, args.rounds, pin)
                    measure_client(crow, runner, log, args.wait_quiet)
    except KeyboardInterrupt:
        log("interrupted: reporting what was measured")
    finally:
        stop_all()

    end_probe = fsync_rate()
    log("")
    log(
        f"disk (end): 4 KiB append + fdatasync median {end_probe['median_us']:.0f} us, {end_probe['syncs_per_s']:,.0f} syncs/s"
    )

    def ref_of(row: Row) -> tuple[Row | None, str]:
        pool = {"durable": durable, "buffered": buffered, "sweep": sweep}[row.section]
        want = "buffer" if row.section == "buffered" else "sync_data"
        ref = next(
            (
                r
                for r in pool
                if r.key == "sepp"
                and r.setting == want
                and r.build == builds[0]
                and r.connections == row.connections
                and r.runs
            ),
            None,
        )
        return ref, f"sepp {builds[0]} {want}"

    all_rows = durable + buffered + sweep
    if durable:
        ref, name = ref_of(durable[0])
        log("")
        log(
            f"### Durable — {args.connections} producers / {args.connections} workers, {jobs:,} jobs, median of {runs} run(s) (min-max)"
        )
        log(headline_table(durable, ref, name))
        log("")
        for build in builds:
            for v in verdicts(durable, build):
                log(v)
    if buffered:
        ref, name = ref_of(buffered[0])
        log("")
        log(
            f"### Buffered — {args.connections}/{args.connections}, {jobs:,} jobs, median of {args.buffered_runs} run(s); ratio = sepp buffer / peer"
        )
        log(headline_table(buffered, ref, name))
    if sweep:
        log("")
        log(
            f"### Durable throughput by concurrency (enqueue / drain jobs/s; {args.sweep_runs} run(s); ⚠ = driver ≥ 90% of its core)"
        )
        log(sweep_table(sweep))
    if clients:
        log("")
        log(
            f"### Clients — each broker through its own client library, one client process "
            f"({f'pinned to core {bench_cores()[1]}' if pin and taskset('0') else 'unpinned'}), "
            f"{args.connections} concurrent callers, durable, {clients_jobs:,} "
            f"jobs, median of {runs} run(s) (min-max)"
        )
        log(clients_table(clients))
        log("")
        log(
            "client / broker µs/job = CPU time of the client process / of the broker per job "
            "(per round trip for sepp's round trip); client CPU = its share of one core."
        )
        for v in clients_verdicts(clients):
            log(v)
        busy = [
            f"{crow.broker}: {run['other_cpu'] * 100:.0f}%"
            for crow in clients
            for run in crow.runs
            if run.get("other_cpu", 0.0) >= BUSY_OTHERS
        ]
        if busy:
            log(
                f"note: during {len(busy)} clients run(s) other processes used >= "
                f"{BUSY_OTHERS * 100:.0f}% of a core (those figures are low): " + "; ".join(busy)
            )
        for crow in clients:
            for e in crow.errors:
                log(f"error: clients {crow.broker}: {e}")
    log("")
    log(
        "CPU = share of one core during the enqueue / drain phase (broker and driver pinned to the cores of the pinning line); '!' = >= 90% busy."
    )
    for note in bound_notes(all_rows) + load_notes(all_rows) + errors_of(all_rows):
        log(note)

    base = args.out / f"compare-{stamp}"
    with open(f"{base}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(csv_rows(all_rows, ref_of))
    with open(f"{base}-runs.csv", "w", newline="") as f:
        fields = [
            "section",
            "broker",
            "setting",
            "connections",
            "jobs",
            "run",
            "phase",
            "jobs_per_s",
            "seconds",
            "p50_ms",
            "p99_ms",
            "p999_ms",
            "server_cpu",
            "client_cpu",
            "other_cpu",
            "load_avg_before",
        ]
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in all_rows:
            for n, run in enumerate(r.runs, 1):
                for phase in ("enqueue", "drain", "latency"):
                    if phase in run:
                        w.writerow(
                            {
                                "section": r.section,
                                "broker": r.broker,
                                "setting": r.setting,
                                "connections": r.connections,
                                "jobs": r.jobs,
                                "run": n,
                                "phase": phase,
                                "load_avg_before": run.get("load_avg_before"),
                                "other_cpu": run.get("other_cpu"),
                                **run[phase],
                            }
                        )
    if clients:
        with open(f"{base}-clients.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CLIENTS_CSV_FIELDS)
            w.writeheader()
            w.writerows(clients_csv_rows(clients))
    sections = []
    if durable:
        sections.append(
            (
                f"durable, {args.connections}/{args.connections}, {jobs:,} jobs (median of {runs})",
                durable,
            )
        )
    if buffered:
        sections.append(
            (f"buffered, {args.connections}/{args.connections}, {jobs:,} jobs", buffered)
        )
    problem = write_png(Path(f"{base}.png"), sections, sweep)
    log(
        f"wrote {base}.csv, {base}-runs.csv, {base}.txt"
        + (f", {base}-clients.csv" if clients else "")
        + ("" if problem else f", {base}.png")
        + (f" ({problem})" if problem else "")
    )
    Path(f"{base}.txt").write_text("\n".join(report_lines) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        stop_all()
