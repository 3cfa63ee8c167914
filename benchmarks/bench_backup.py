"""Online backup under load (issue 15 target): "Backup of a 1 GB data directory
while the 50/50 load runs: throughput drop <= 10 %".

One `sepp serve` (pinned to the server core of `common.bench_cores`, admin listener on, snapshots off so the data
directory is its log) is filled with ~1 GB of log (64 KiB jobs, batched, kept in a
queue of their own). Then, for each round, the 50/50 load -- 50 producer and 50
worker connections at once, closed loop, 256-byte payloads, one job per request,
reserve (long poll) + ack -- runs alternating, per backup variant: once with
`sepp backup DEST` started after a warm-up (by default at its default pace, and
with `--max-rate 0`, as fast as it goes), the load stopping a second after the
backup, then once alone, as long. (The data directory grows with every run: the
load writes log.) The load generator
(pinned to core 1) counts completed operations in 100 ms buckets; throughput is
compared over the same window, the backup's duration, in both runs:

    jobs/s = (enqueues + acks) / 2 per second, in the window
    drop % = 1 - with / without

`sepp backup` is left unpinned: a backup on a 2-core machine competes for a core,
as it would in production. Each backup writes into a fresh directory on the same
disk (fsynced). Medians of the rounds.

    python -m benchmarks.bench_backup                  # ~1 GB, 3 rounds (~5 min)
    python -m benchmarks.bench_backup --gib 0.25 --rounds 1   # quick
    python -m benchmarks.bench_backup --variants "" "--max-rate 50"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ServeProcess,
    driver_core,
    fsync_rate,
    machine_line,
    median,
    print_table,
    server_core,
    taskset,
)
from benchmarks.loadgen import Conn, _job, connect

ROOT = Path(__file__).resolve().parent.parent
BUCKET_S = 0.1
# A load run with a backup ends this long after the backup (at most RUN_S_MAX).
TAIL_S = 1.0
RUN_S_MAX = 600.0
BALLAST_PAYLOAD_BYTES = 64 * 1024
BALLAST_JOBS_PER_REQUEST = 8  # 512 KiB per request, below max_message_bytes


class Server(ServeProcess):
    """`sepp serve` with an admin listener; snapshots off (the data directory is
    the log; no snapshot lands inside a measured window)."""

    def __init__(self, mode: str, data_dir: str) -> None:
        env = dict(os.environ)
        env.update(
            {
                "SEPP_STORAGE__SNAPSHOT_EVERY_BYTES": "0",
                "SEPP_LOGGING__LEVEL": "warning",
                "SEPP_ADMIN__LISTEN_ADDR": "127.0.0.1:0",
            }
        )
        super().__init__(
            data_dir,
            mode,
            env,
            core=server_core(),
            wait_for_admin=True,
            remove_data_dir=False,
            stop_timeout_s=120.0,
        )
        assert self.admin is not None
        self.admin_addr: str = self.admin


def dir_bytes(path: str) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(folder, name))
    return total


# -- the child processes -------------------------------------------------------------------


async def _fill(port: int, target_bytes: int, connections: int) -> None:
    conns = [await connect("127.0.0.1", port) for _ in range(connections)]
    payload = os.urandom(BALLAST_PAYLOAD_BYTES)
    per_request = BALLAST_PAYLOAD_BYTES * BALLAST_JOBS_PER_REQUEST
    remaining = [target_bytes // per_request + 1]
    job = {
        "queue": "ballast",
        "job_type": "ballast",
        "payload": {"data": payload, "encoding": "application/octet-stream"},
    }

    async def producer(conn: Conn) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await conn.call("enqueue", {"jobs": [job] * BALLAST_JOBS_PER_REQUEST})

    await asyncio.gather(*(producer(c) for c in conns))
    for conn in conns:
        assert conn.transport is not None
        conn.transport.close()


async def _load(port: int, seconds: float, connections: int, on_stdin: bool) -> dict[str, Any]:
    """The 50/50 mix: `connections` producers and as many workers at once, for
    `seconds`, or (`on_stdin`) until a line comes on stdin (at most `seconds`)."""
    producers = [await connect("127.0.0.1", port) for _ in range(connections)]
    workers = [await connect("127.0.0.1", port) for _ in range(connections)]
    started = time.time()
    end = [started + seconds]
    if on_stdin:

        def stop_on_line() -> None:
            sys.stdin.readline()
            end[0] = min(end[0], time.time())

        threading.Thread(target=stop_on_line, daemon=True).start()
    buckets = int(seconds / BUCKET_S) + 20  # calls answered after the end
    enqueued = [0] * buckets
    acked = [0] * buckets

    async def produce(conn: Conn) -> None:
        while time.time() < end[0]:
            await conn.call("enqueue", {"jobs": [_job("mix")]})
            enqueued[int((time.time() - started) / BUCKET_S)] += 1

    async def work(conn: Conn) -> None:
        while time.time() < end[0]:
            body = await conn.call(
                "reserve", {"queues": ["mix"], "lease_ms": 60_000, "wait_ms": 200}
            )
            for job in body["jobs"]:
                await conn.call("ack", {"job_id": job["id"], "attempt": job["attempt"]})
                acked[int((time.time() - started) / BUCKET_S)] += 1

    await asyncio.gather(*(produce(c) for c in producers), *(work(c) for c in workers))
    for conn in producers + workers:
        assert conn.transport is not None
        conn.transport.close()
    return {
        "started": started,
        "ended": end[0],
        "bucket_s": BUCKET_S,
        "enqueued": enqueued,
        "acked": acked,
    }


def _child(args: argparse.Namespace) -> None:
    from sepp.server.loops import resolve_event_loop, run_on

    loop = resolve_event_loop("auto")
    if args.child == "fill":
        run_on(loop, lambda: _fill(args.port, int(args.gib * 2**30), 8))
        print(json.dumps({"ok": True}), flush=True)
    else:
        result = run_on(
            loop, lambda: _load(args.port, args.seconds, args.connections, args.until_stdin)
        )
        print(json.dumps(result), flush=True)


def _spawn_child(kind: str, port: int, **options: Any) -> subprocess.Popen[str]:
    cmd = [*taskset(driver_core()), sys.executable, "-m", "benchmarks.bench_backup", "--child", kind,
           "--port", str(port)]  # fmt: skip
    for key, value in options.items():
        if value is True:
            cmd.append("--" + key.replace("_", "-"))
        else:
            cmd += ["--" + key.replace("_", "-"), str(value)]
    stdin = subprocess.PIPE if options.get("until_stdin") else None
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _child_result(proc: subprocess.Popen[str], stdin: str | None = None) -> dict[str, Any]:
    out, _ = proc.communicate(stdin)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def window_rate(load: dict[str, Any], start: float, end: float) -> float:
    """(enqueues + acks) / 2 per second between `start` and `end` (wall times)."""
    first = int((start - load["started"]) / load["bucket_s"])
    last = int((end - load["started"]) / load["bucket_s"])
    ops = sum(load["enqueued"][first : last + 1]) + sum(load["acked"][first : last + 1])
    seconds = float((last + 1 - first) * load["bucket_s"])
    return float(ops) / 2 / seconds


# -- the rounds ------------------------------------------------------------------------------


def backup_run(server: Server, args: argparse.Namespace, options: str, dest: str) -> dict[str, Any]:
    """One load run with `sepp backup OPTIONS` started after the warm-up (the load
    stops TAIL_S after the backup ends), then a run without, as long; the drop is
    taken over the backup's window in both."""
    load = _spawn_child(
        "load", server.port, seconds=RUN_S_MAX, connections=args.connections, until_stdin=True
    )
    time.sleep(args.warmup)
    began = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "sepp.server.cli", "backup", dest, "--admin-addr", server.admin_addr,
         "--json", *options.split()],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    ended = time.time()
    time.sleep(TAIL_S)
    loaded = _child_result(load, "stop\n")
    if done.returncode != 0:
        raise RuntimeError(f"backup failed: {done.stderr}")
    result = json.loads(done.stdout)
    shutil.rmtree(dest, ignore_errors=True)
    plain = _child_result(
        _spawn_child("load", server.port, seconds=loaded["ended"] - loaded["started"],
                     connections=args.connections)
    )  # fmt: skip
    # The same window, relative to each load's start, in both runs.
    offset_start, offset_end = began - loaded["started"], ended - loaded["started"]
    without = window_rate(plain, plain["started"] + offset_start, plain["started"] + offset_end)
    with_backup = window_rate(loaded, began, ended)
    seconds = ended - began
    return {
        "without": without,
        "with": with_backup,
        "drop": 100.0 * (1 - with_backup / without),
        "backup_mb_s": result["bytes"] / 1e6 / seconds,
        "backup_bytes": result["bytes"],
        "backup_s": seconds,
    }


def _row(label: str, options: str, runs: list[dict[str, Any]]) -> list[object]:
    def pick(key: str) -> float:
        return median([r[key] for r in runs])

    return [label, options or "(default pace)", pick("without"),
            pick("with"),
            f"{pick('drop'):.1f}", f"{pick('backup_bytes') / 2**30:.2f}",
            f"{pick('backup_s'):.1f}", pick("backup_mb_s")]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="log to build first (GiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--until-stdin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=float, default=2.0, help="load before the backup starts")
    parser.add_argument("--connections", type=int, default=50, help="producers (and workers)")
    parser.add_argument("--mode", default="sync_data", help="the server's persist mode")
    parser.add_argument(
        "--dest-dir", help="where the backups go (default: beside the data directory, same disk)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["", "--max-rate 0"],
        help='`sepp backup` options of each backup run of a round ("" = none)',
    )
    parser.add_argument("--child", choices=["fill", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    print(machine_line())
    probe = fsync_rate()
    print(f"disk: 4 KiB append + fdatasync median {probe['median_us']:.0f} us "
          f"({probe['syncs_per_s']:.0f}/s)")  # fmt: skip
    work_dir = tempfile.mkdtemp(prefix="sepp-bench-backup-")
    server = Server(args.mode, os.path.join(work_dir, "data"))
    try:
        t0 = time.time()
        _child_result(_spawn_child("fill", server.port, gib=args.gib))
        size = dir_bytes(server.data_dir)
        print(f"data directory: {size / 2**30:.2f} GiB of log built in {time.time() - t0:.1f}s "
              f"(64 KiB jobs); persist mode {args.mode}")  # fmt: skip
        print(f"load: {args.connections} producers + {args.connections} workers; backup after "
              f"{args.warmup:.0f}s; each round, per backup variant: a run with the backup "
              f"(ending {TAIL_S:.0f}s after it), then one without, as long")  # fmt: skip
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
        rows = []
        for n in range(args.rounds):
            for k, options in enumerate(args.variants):
                dest = os.path.join(args.dest_dir or work_dir, f"backup-{os.getpid()}-{n}-{k}")
                r = backup_run(server, args, options, dest)
                runs[options].append(r)
                rows.append(_row(f"round {n + 1}", options, [r]))
        for options in args.variants:
            rows.append(_row("median", options, runs[options]))
        print()
        print_table(
            ["", "sepp backup", "jobs/s without", "jobs/s with backup", "drop %", "backup GiB",
             "backup s", "backup MB/s"],
            rows,
        )  # fmt: skip
        print()
        for options in args.variants:
            drop = median([r["drop"] for r in runs[options]])
            verdict = "met" if drop <= 10 else "NOT met"
            print(f"target drop <= 10 %, sepp backup {options or '(default pace)'}: {verdict} "
                  f"({drop:.1f} %)")  # fmt: skip
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
