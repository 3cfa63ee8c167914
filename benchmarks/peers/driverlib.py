"""Shared pieces of the Python peer drivers: arguments, per-phase CPU accounting
(driver and broker, as benchmarks/loadgen.py does) and percentiles."""

from __future__ import annotations

import argparse
import json
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

PAYLOAD = b"x" * 256


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, default=50)
    p.add_argument("--jobs", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--phases", nargs="+", default=["enqueue", "drain", "latency"])
    p.add_argument("--server-pid", type=int, default=0, help="to report the broker's CPU per phase")
    return p


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (all threads) of another process, from /proc; 0 if unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PhaseClock:
    """Wraps a phase to record the driver's and the broker's CPU share of one core."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.result: dict[str, Any] = {}

    def start(self) -> tuple[float, float, float]:
        return own_cpu(), proc_cpu(self.server_pid), time.perf_counter()

    def stop(self, name: str, mark: tuple[float, float, float], body: dict[str, Any]) -> None:
        own0, server0, wall0 = mark
        wall = time.perf_counter() - wall0
        body["client_cpu"] = (own_cpu() - own0) / wall
        body["server_cpu"] = (proc_cpu(self.server_pid) - server0) / wall
        self.result[name] = body

    def run(self, name: str, work: Callable[[], dict[str, Any]]) -> None:
        mark = self.start()
        self.stop(name, mark, work())


def percentiles(samples: list[float], rounds: int) -> dict[str, float]:
    samples = sorted(samples)

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, int(len(samples) * p))] * 1000

    return {"rounds": rounds, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "p999_ms": pct(0.999)}


def rate(jobs: int, seconds: float) -> dict[str, float]:
    return {"jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds if seconds > 0 else 0.0}


def emit(result: dict[str, Any], **extra: Any) -> None:
    result["pid"] = os.getpid()
    result.update(extra)
    print(json.dumps(result), flush=True)


def run_in_threads(target: Callable[[Any], None], items: list[Any]) -> None:
    """`target(item)` for every item, each in a thread of its own, all at once;
    re-raises the first error any of them met."""
    errors: list[BaseException] = []

    def wrapped(item: Any) -> None:
        try:
            target(item)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(item,), daemon=True) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
