"""The web console's targets (issue 16):

- the dashboard with 100 queues: first render <= 300 ms server time, page weight
  <= 150 KB (the HTML plus its one script and one style sheet: the page loads
  nothing else);
- ten dashboards open (ten /events streams) vs none: job throughput within 5 %
  (side by side, medians of alternating rounds);
- a new job visible on an open dashboard <= 2 s after its ack: shown by the
  browser test (tests/server/test_console_browser.py, the five-jobs test), not here.

    python -m benchmarks.bench_console                         # 3 rounds of 40,000 jobs
    python -m benchmarks.bench_console --rounds 1 --jobs 20000  # short

Render: a real `sepp serve` (admin listener on loopback, no keys: the local
admin) with 100 queues of 10 jobs each; `GET /` timed on loopback from the
client (request sent to last byte read, so it bounds the server's time from
above), the first request and the median of 20.

Throughput: `sepp serve` (persist mode sync_data, snapshots off, pinned to core
0) driven by the lean load generator (benchmarks/loadgen.py, pinned to core 1,
50 connections: enqueue the jobs, then reserve + ack each); the admin listener
is on in both variants, and in "10 open" ten /admin/api/v1/events streams are
read for the whole run (in a thread of this process) -- what ten open dashboards
cost the server.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import aiohttp

from benchmarks.bench_e2e import loadgen
from benchmarks.common import ServeProcess, machine_line, median, print_table, server_core
from benchmarks.compare import wait_quiet

PHASES = ("enqueue", "drain")
QUEUES = 100
JOBS_PER_QUEUE = 10
RENDERS = 20
STREAMS = 10
RENDER_TARGET_MS = 300
WEIGHT_TARGET_BYTES = 150 * 1024
THROUGHPUT_TARGET_PCT = 5.0


class Server(ServeProcess):
    def __init__(self, pin: bool) -> None:
        env = dict(os.environ)
        env["SEPP_STORAGE__SNAPSHOT_EVERY_BYTES"] = "0"
        env["SEPP_LOGGING__LEVEL"] = "warning"
        env["SEPP_METRICS__LISTEN_ADDR"] = "off"
        super().__init__(
            tempfile.mkdtemp(prefix="sepp-bench-console-"),
            "sync_data",
            env,
            core=server_core() if pin else None,
            args=["--admin-listen", "127.0.0.1:0"],
            wait_for_admin=True,
        )


async def _render(admin: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        for q in range(QUEUES):
            jobs = [{"job_type": "t", "payload": {"json": {"n": i}}} for i in range(JOBS_PER_QUEUE)]
            url = f"{admin}/admin/api/v1/queues/queue-{q:03d}/jobs"
            async with session.post(url, json={"jobs": jobs}) as response:
                assert response.status == 200, await response.text()
        times = []
        html = b""
        for _ in range(RENDERS):
            t0 = time.perf_counter()
            async with session.get(admin + "/") as response:
                html = await response.read()
            times.append((time.perf_counter() - t0) * 1000)
        assert html.count(b'data-queue="queue-') == QUEUES, "not every queue has a card"
        weight = len(html)
        for asset in ("/static/console.js", "/static/console.css"):
            async with session.get(admin + asset) as response:
                weight += len(await response.read())
    return {"first_ms": times[0], "median_ms": statistics.median(times), "weight": weight}


class Dashboards:
    """`count` open /events streams, read in a thread of this process."""

    def __init__(self, admin: str, count: int) -> None:
        self.admin = admin
        self.count = count
        self.events = 0
        self.error: str | None = None
        self._opened = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._task: Any = None
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._main(), self._loop)
        if not self._ready.wait(30):
            raise RuntimeError(f"the streams did not open: {self.error}")

    async def _main(self) -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._stream(session) for _ in range(self.count)))

    async def _stream(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.admin + "/admin/api/v1/events") as response:
                if response.status != 200:
                    self.error = f"/events answered {response.status}"
                    self._ready.set()
                    return
                self._opened += 1
                if self._opened == self.count:
                    self._ready.set()
                async for line in response.content:
                    if line.startswith(b"event: stats"):
                        self.events += 1
        except (aiohttp.ClientError, OSError) as exc:
            self.error = str(exc)
            self._ready.set()

    def stop(self) -> None:
        self._task.cancel()  # cancels the task in its loop, which closes the session
        concurrent.futures.wait([self._task], timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def one_run(streams: int, pin: bool, jobs: int, connections: int) -> dict[str, Any]:
    server = Server(pin)
    assert server.admin is not None
    dashboards = Dashboards(server.admin, streams) if streams else None
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
        if dashboards is not None:
            dashboards.stop()
        server.stop()
    if dashboards is not None:
        if dashboards.error:
            raise RuntimeError(f"dashboards: {dashboards.error}")
        result["events"] = dashboards.events
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--quiet", type=float, default=10.0)
    args = parser.parse_args()
    pin = not args.no_pin
    print(machine_line())
    print(
        f"command: python -m benchmarks.bench_console --rounds {args.rounds} --jobs {args.jobs} "
        f"--connections {args.connections}" + (" --no-pin" if not pin else "")
    )
    server = Server(pin=False)
    try:
        assert server.admin is not None
        render = asyncio.run(_render(server.admin))
    finally:
        server.stop()
    print(f"\ndashboard with {QUEUES} queues ({RENDERS} renders of GET /, loopback):")
    print_table(
        ["figure", "measured", "target", "met"],
        [
            ["first render ms", f"{render['first_ms']:.1f}", f"<= {RENDER_TARGET_MS}",
             "yes" if render["first_ms"] <= RENDER_TARGET_MS else "no"],
            ["median render ms", f"{render['median_ms']:.1f}", f"<= {RENDER_TARGET_MS}",
             "yes" if render["median_ms"] <= RENDER_TARGET_MS else "no"],
            ["page weight KB (html + js + css)", f"{render['weight'] / 1024:.1f}",
             f"<= {WEIGHT_TARGET_BYTES // 1024}",
             "yes" if render["weight"] <= WEIGHT_TARGET_BYTES else "no"],
        ],
    )  # fmt: skip
    runs: dict[int, list[dict[str, Any]]] = {0: [], STREAMS: []}
    for round_no in range(args.rounds):
        order = (0, STREAMS) if round_no % 2 == 0 else (STREAMS, 0)
        for streams in order:
            wait_quiet(args.quiet, print)
            result = one_run(streams, pin, args.jobs, args.connections)
            runs[streams].append(result)
            print(
                f"  round {round_no + 1} dashboards {streams:>2}: "
                + "  ".join(f"{p} {result[p]['jobs_per_s']:,.0f} jobs/s" for p in PHASES)
                + (f"  (stats events read {result['events']})" if streams else ""),
                flush=True,
            )
    medians = {
        streams: {p: median([r[p]["jobs_per_s"] for r in runs[streams]]) for p in PHASES}
        for streams in runs
    }
    rows: list[list[object]] = [
        [f"{streams} open"] + [f"{medians[streams][p]:,.0f}" for p in PHASES] for streams in runs
    ]
    diffs = {p: (medians[STREAMS][p] - medians[0][p]) / medians[0][p] * 100 for p in PHASES}
    rows.append(["difference"] + [f"{diffs[p]:+.1f}%" for p in PHASES])
    rows.append(
        ["within 5 %"] + ["yes" if diffs[p] >= -THROUGHPUT_TARGET_PCT else "no" for p in PHASES]
    )
    print(
        f"\njob throughput, medians of {args.rounds} rounds, {args.jobs:,} jobs, "
        f"{args.connections} connections; dashboards = open /events streams:"
    )
    print_table(["dashboards", "enqueue jobs/s", "drain jobs/s"], rows)


if __name__ == "__main__":
    main()
