"""Shared pieces of the benchmark scripts: machine description, fsync rate,
medians and table printing, pinning to a core and a `sepp serve` child process.

Benchmarks are never part of the test run; each script prints a table with the
machine it ran on and the command that reproduces it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from log_format._compiled import build_name, stale_sources
from sepp.server.loops import resolve_event_loop
from sepp.server.pipeline import resolve_sync_method


@contextlib.contextmanager
def _probe_file(directory: str | None, prefix: str) -> Iterator[int]:
    """A temporary file's descriptor in `directory` (default: the temp dir), closed
    and removed afterwards."""
    fd, path = tempfile.mkstemp(dir=directory or tempfile.gettempdir(), prefix=prefix)
    try:
        yield fd
    finally:
        os.close(fd)
        os.remove(path)


def _timed_sync(fd: int) -> tuple[float, float]:
    """fdatasync `fd`: (when it started, how long it took), in seconds."""
    t0 = time.perf_counter()
    os.fdatasync(fd)
    return t0, time.perf_counter() - t0


def fsync_rate(directory: str | None = None, appends: int = 500) -> dict[str, float]:
    """Append a 4 KiB block and fdatasync it, `appends` times: median latency (us)
    and syncs per second (1 / mean), the disk figure every durable number depends on."""
    block = os.urandom(4096)
    times = []
    with _probe_file(directory, "fsync-probe-") as fd:
        for _ in range(appends):
            os.write(fd, block)
            times.append(_timed_sync(fd)[1])
    return {
        "median_us": statistics.median(times) * 1e6,
        "p99_us": sorted(times)[int(len(times) * 0.99) - 1] * 1e6,
        "syncs_per_s": len(times) / sum(times),
    }


def slow_spacing(
    starts: Sequence[float], durations: Sequence[float], slow_s: float
) -> dict[str, Any]:
    """Of operations started at `starts` (seconds) that took `durations`, the ones
    taking at least `slow_s`: how many, and the median gap between the starts of
    consecutive slow ones (ms; None below two). A gap that sits at one value says
    the slowness comes on a clock, not with the load."""
    slow = [t for t, d in zip(starts, durations, strict=True) if d >= slow_s]
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(slow)]
    return {"slow": len(slow), "gap_ms": statistics.median(gaps) if gaps else None}


def sync_stalls(
    directory: str | None = None, seconds: float = 2.0, stall_ms: float = 5.0
) -> dict[str, Any]:
    """Overwrite 256 bytes of a preallocated file and fdatasync it, back to back for
    `seconds` (a durable log's pattern, no sepp code): how many syncs ran, how many
    took at least `stall_ms`, the longest, and the median gap between stalls. On the
    Firecracker images here the stalls came every 100 ms (benchmarks/README.md,
    "Round trips and the disk's 100 ms stalls"); a short probe like `fsync_rate`
    rarely catches one."""
    span = 4 << 20
    record = b"x" * 256
    starts: list[float] = []
    durations: list[float] = []
    with _probe_file(directory, "stall-probe-") as fd:
        os.write(fd, bytes(span))
        os.fsync(fd)
        offset = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            os.pwrite(fd, record, offset)
            offset = (offset + len(record)) % span
            started, took = _timed_sync(fd)
            starts.append(started)
            durations.append(took)
    return {
        "syncs": len(durations),
        "max_ms": max(durations, default=0.0) * 1000,
        **slow_spacing(starts, durations, stall_ms / 1000),
    }


def machine_line() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return (
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()} ({sys.implementation.name}), "
        f"load avg {load[0]:.2f}, sepp build {build_name()}, server loop {server_loop()}, "
        f"durable syncs by {server_sync('sync_data')}, load generator loop {server_loop('auto')}"
    )


def check_builds(builds: Sequence[str | None]) -> str | None:
    """Why these builds cannot be benchmarked (the compiled build was not built, or
    a source changed after it was), or None."""
    if "compiled" not in builds:
        return None
    name = build_name(ignore_env=True)
    if name != "compiled":
        return f"the compiled build is not in this checkout ({name}): run `python -m tools.compile` first"
    stale = stale_sources()
    if stale:
        return f"the compiled build is older than {stale[0]}: run `python -m tools.compile` again"
    return None


def server_loop(setting: str | None = None) -> str:
    """The event loop `sepp serve` runs on with this setting (default: the
    environment's SEPP_SERVER__EVENT_LOOP, else auto), with uvloop's version."""
    if setting is None:
        setting = os.environ.get("SEPP_SERVER__EVENT_LOOP", "auto")
    name = resolve_event_loop(setting)
    return f"uvloop {importlib.metadata.version('uvloop')}" if name == "uvloop" else name


def server_sync(persist_mode: str, setting: str | None = None) -> str:
    """Who syncs `sepp serve`'s group commits in `persist_mode` with this setting
    (default: the environment's SEPP_STORAGE__SYNC_METHOD, else auto): "aio" or
    "thread"."""
    if setting is None:
        setting = os.environ.get("SEPP_STORAGE__SYNC_METHOD", "auto")
    return resolve_sync_method(setting, persist_mode, real_fs=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_json(
    cmd: Sequence[str],
    what: str,
    timeout: float,
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    error: type[Exception] = RuntimeError,
) -> dict[str, Any]:
    """Run a benchmark driver (`cmd`) that prints its result as one JSON line last;
    that result. Raises `error` naming `what` if it times out, fails or prints none."""
    try:
        out = subprocess.run(
            list(cmd), capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what} timed out after {timeout:.0f} s") from exc
    if out.returncode != 0 or not out.stdout.strip():
        raise error(f"{what} failed ({out.returncode}): {out.stderr.strip()[-1500:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if n else c.ljust(w) for c, w in zip(row, widths)))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


ROOT = Path(__file__).resolve().parent.parent


CORES_ENV = "SEPP_BENCH_CORES"
_CORES_PROBE_S = 1.0


def bench_cores() -> tuple[str, str]:
    """(the server's core, the driver's core) for pinned benchmarks.

    `SEPP_BENCH_CORES="S,D"` sets them. Otherwise a sync loop (`sync_stalls`) runs
    pinned to core 0 and to core 1 for a second each, and the server goes to the
    core where fewer syncs stalled (core 0 on a tie). On the Firecracker images
    here, syncs issued from core 0 stalled 11-18 ms every 100 ms while core 1 was
    clean, which alone put a durable round trip's p99 at 6-7 ms instead of 2-2.5
    (benchmarks/README.md, "Round trips and the disk's 100 ms stalls"). Every
    broker and driver of a run gets the same two cores. The choice is written to
    the environment, so child processes and later calls reuse it."""
    chosen = os.environ.get(CORES_ENV)
    if chosen:
        server, _, driver = chosen.partition(",")
        return server.strip(), driver.strip()
    server, driver = "0", "1"
    if (os.cpu_count() or 1) >= 2 and hasattr(os, "sched_setaffinity"):
        stalls = {core: _pinned_stalls(core) for core in (0, 1)}
        if stalls[1] < stalls[0]:
            server, driver = "1", "0"
        print(
            f"cores: a sync loop stalled (>= 5 ms) {stalls[0]} times pinned to core 0 and "
            f"{stalls[1]} times on core 1 in {_CORES_PROBE_S:g} s each: servers on core "
            f"{server}, drivers on core {driver} ({CORES_ENV} overrides)",
            flush=True,
        )
    os.environ[CORES_ENV] = f"{server},{driver}"
    return server, driver


def _pinned_stalls(core: int) -> int:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        return int(sync_stalls(seconds=_CORES_PROBE_S)["slow"])
    finally:
        os.sched_setaffinity(0, before)


def server_core() -> str:
    return bench_cores()[0]


def driver_core() -> str:
    return bench_cores()[1]


def taskset(core: str | None) -> list[str]:
    """The command prefix that pins a child to `core` (none if `core` is None, taskset is
    missing or the machine has one core)."""
    if core is None or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return []
    return ["taskset", "-c", core]


def terminate(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM a child of this process (by its PID) and reap it; SIGKILL once
    `grace_s` has passed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServeProcess:
    """`sepp serve --listen 127.0.0.1:0` in a child process; its ports read from the lines
    it prints first (`sepp listening on`, `sepp admin on`, `sepp grpc on`). `prefix` is a
    command to run it under (valgrind, for one); `module` the module (and its
    arguments) that runs the CLI."""

    def __init__(
        self,
        data_dir: str,
        persist_mode: str,
        env: dict[str, str],
        *,
        core: str | None = None,
        args: Sequence[str] = (),
        wait_for_admin: bool = False,
        wait_for_grpc: bool = False,
        remove_data_dir: bool = True,
        stop_timeout_s: float = 60.0,
        prefix: Sequence[str] = (),
        module: Sequence[str] = ("sepp.server.cli",),
    ) -> None:
        self.data_dir = data_dir
        self.remove_data_dir = remove_data_dir
        self.stop_timeout_s = stop_timeout_s
        cmd = [
            *taskset(core), *prefix,
            sys.executable, "-m", *module, "serve",
            "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--persist-mode", persist_mode,
            *args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT
        )
        assert self.proc.stdout is not None
        self.port = 0
        self.admin: str | None = None
        self.grpc_port = 0
        while (
            not self.port
            or (wait_for_admin and self.admin is None)
            or (wait_for_grpc and not self.grpc_port)
        ):
            line = self.proc.stdout.readline().decode()
            if line.startswith("sepp listening on "):
                self.port = int(line.strip().rpartition(":")[2])
            elif line.startswith("sepp admin on "):
                self.admin = line.strip().removeprefix("sepp admin on ")
            elif line.startswith("sepp grpc on "):
                self.grpc_port = int(line.strip().rpartition(":")[2])
            elif not line:
                self.stop()
                raise RuntimeError("the server did not start")

    def stop(self) -> None:
        terminate(self.proc, self.stop_timeout_s)
        if self.remove_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
