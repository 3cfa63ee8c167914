"""Speed and memory of `sepp-log` (tools/): verify and replay events/s, and dump's
peak memory on a log of several gigabytes.

    python -m benchmarks.bench_tools                        # 5 GB dump log, 3 runs
    python -m benchmarks.bench_tools --size 0.5 --runs 3    # a quick run
    python -m benchmarks.bench_tools --size 0               # verify and replay only
    python -m benchmarks.bench_tools --work-dir /var/tmp/sepp-bench-tools   # keep the logs

Logs, written once by the real storage engine (buffer mode, 64 MiB segments), in
child processes; with --work-dir they are kept and reused by later runs:

- mixed: one event per record -- the shape of a server's log when clients send one
  job per request (the reference benchmark's rule): enqueue, reserve, extend, nack,
  reserve, ack traffic around --jobs live jobs (benchmarks/bench_recovery.py's log);
- batched: enqueues of 16 jobs and reserves of 16, acked one by one (about two
  events a record): the per-event cost when records carry several;
- big: --size GB of 16 KiB-payload jobs, each enqueued, reserved and acked (so the
  state stays small and the log replays); the dump memory log. The same log at a
  tenth of the size is measured too: a constant-memory dump has the same peak at
  both sizes.

Every measure runs in a fresh child process (no heap or page-cache effects carried
between them, except the OS cache of the log files: every run reads warm files, the
case of an operator re-running a command), median of --runs:

- verify and replay events/s (`tools.verify.verify`, `tools.replay.replay_to`);
- the parts of the fast path, to say what dominates: `ValidEnvelopes` alone
  (checksums + envelope decoding), `check_run` (+ verify's catalogue and time
  checks), `replay_run` (+ apply) with and without those checks; the rest of
  verify is its invariants check and snapshot comparisons;
- `sepp-log dump` (human output to /dev/null): seconds, events/s and peak resident
  memory (VmHWM from the child's /proc/self/status), next to the interpreter's own
  peak with the tools imported.

Builds (--builds): verify, replay and the parts run once per build, the builds
interleaved run by run: "pure" (SEPP_PURE=1, the sources) and "compiled" (the mypyc
build of `python -m tools.compile`; README "Compiled build"). Both by default when
the compiled build exists; each child reports the build it ran and a mismatch stops
the benchmark. dump runs on the checkout's build.

Target (issue): verify and replay >= 300,000 events/s; dump in constant memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks.common import machine_line, median, print_table
from log_format._compiled import build_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_EVENTS_PER_S = 300_000


# ---------------------------------------------------------------- building


def build_mixed(data_dir: str, jobs: int) -> dict[str, Any]:
    from benchmarks.bench_recovery import build

    return build(data_dir, jobs, True)


def build_batched(data_dir: str, jobs: int) -> dict[str, Any]:
    import gc

    from sepp.core import Ack, CoreConfig, Enqueue, NewJob, Reserve
    from sepp.server.ids import JobIds
    from sepp.storage import Engine, StorageOptions

    gc.disable()
    engine = Engine.open(
        data_dir, CoreConfig(), StorageOptions(persist_mode="buffer", snapshot_every_bytes=0)
    )
    ids = JobIds()
    payload = b"x" * 256
    now = 1_000_000
    for i in range(0, jobs, 16):
        batch = tuple(
            NewJob(
                job_id=ids.next(),
                queue="bench",
                job_type="work",
                payload_data=payload,
                payload_encoding="application/octet-stream",
            )
            for _ in range(16)
        )
        engine.execute(Enqueue(jobs=batch), now)
        decision, _ = engine.execute(Reserve(queues=("bench",), lease_ms=60_000, max_jobs=16), now)
        for job in decision.reply.jobs:  # type: ignore[union-attr]
            engine.execute(Ack(job_id=job.job_id, attempt=job.attempt), now)
        if i % 1024 == 0:
            engine.flush()
            now += 1
    engine.close()
    return {"records": engine.appended_seq}


def build_big(data_dir: str, gigabytes: float) -> dict[str, Any]:
    import gc

    from sepp.core import Ack, CoreConfig, Enqueue, NewJob, Reserve
    from sepp.server.ids import JobIds
    from sepp.storage import Engine, StorageOptions

    gc.disable()
    engine = Engine.open(
        data_dir, CoreConfig(), StorageOptions(persist_mode="buffer", snapshot_every_bytes=0)
    )
    ids = JobIds()
    payload = os.urandom(16 * 1024)
    target = int(gigabytes * 2**30)
    now = 1_700_000_000_000
    while engine.stats["bytes"] < target:
        for _ in range(200):
            engine.execute(
                Enqueue(
                    jobs=(
                        NewJob(
                            job_id=ids.next(),
                            queue="bench",
                            job_type="work",
                            payload_data=payload,
                            payload_encoding="raw",
                        ),
                    )
                ),
                now,
            )
            decision, _ = engine.execute(
                Reserve(queues=("bench",), lease_ms=60_000, worker_id="w"), now
            )
            job = decision.reply.jobs[0]  # type: ignore[union-attr]
            engine.execute(Ack(job_id=job.job_id, attempt=job.attempt, worker_id="w"), now)
        engine.flush()
        now += 50
    engine.close()
    return {"records": engine.appended_seq, "bytes": engine.stats["bytes"]}


# ---------------------------------------------------------------- measuring (children)


def measure_verify(data_dir: str) -> dict[str, Any]:
    import time

    from tools.datadir import open_data_dir
    from tools.verify import verify

    started = time.perf_counter()
    report = verify(open_data_dir(data_dir))
    elapsed = time.perf_counter() - started
    if not report.ok:
        raise SystemExit(f"verify found problems: {report.problems[:3]}")
    return {"seconds": elapsed, "events": report.events, "records": report.records}


def measure_replay(data_dir: str) -> dict[str, Any]:
    import time

    from tools.datadir import open_data_dir
    from tools.replay import replay_to

    started = time.perf_counter()
    result = replay_to(open_data_dir(data_dir))
    elapsed = time.perf_counter() - started
    if result.state is None:
        raise SystemExit(f"replay failed: {result.problems[:3]}")
    return {"seconds": elapsed, "events": result.events, "records": result.records}


def measure_parts(data_dir: str) -> dict[str, Any]:
    """The fast path in pieces, each over the whole log (segments mapped, as verify
    and replay read them): `ValidEnvelopes` alone (checksums + envelope decoding),
    `check_run` (+ verify's catalogue and time checks), `replay_run` (+ apply) and
    `replay_run` with verify's checks."""
    import gc
    import mmap
    import time

    from log_format import FILE_HEADER_BYTES, ValidEnvelopes
    from sepp.core import State
    from sepp.storage.replay import RunChecks, check_run, replay_run
    from tools.datadir import open_data_dir
    from tools.verify import catalogue_checks

    gc.disable()
    directory = open_data_dir(data_dir)
    maps = []
    for segment in directory.segments:
        with open(segment.path, "rb") as f:
            maps.append((mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), segment.first_seq))
    checks = catalogue_checks()

    def envelopes() -> int:
        count = 0
        for buf, seq in maps:
            for envelope in ValidEnvelopes(buf, start_offset=FILE_HEADER_BYTES, expected_seq=seq):
                count += len(envelope[3])
        return count

    def checked() -> int:
        run_checks = RunChecks(checks)
        return sum(
            check_run(
                buf, start_offset=FILE_HEADER_BYTES, expected_seq=seq, checks=run_checks
            ).events
            for buf, seq in maps
        )

    def replayed(with_checks: bool) -> int:
        state = State()
        run_checks = RunChecks(checks) if with_checks else None
        return sum(
            replay_run(
                state, buf, start_offset=FILE_HEADER_BYTES, expected_seq=seq, checks=run_checks
            ).events
            for buf, seq in maps
        )

    out: dict[str, Any] = {}
    for key, part in (
        ("envelopes_s", envelopes),
        ("check_run_s", checked),
        ("replay_run_s", lambda: replayed(False)),
        ("replay_run_checks_s", lambda: replayed(True)),
    ):
        started = time.perf_counter()
        out["events"] = part()
        out[key] = time.perf_counter() - started
        gc.collect()
    return out


_DUMP_CHILD = """
import os, sys, time
from tools.sepp_log import main
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
started = time.perf_counter()
code = main(sys.argv[1:]) if sys.argv[1:] else 0
elapsed = time.perf_counter() - started
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
os.write(2, ("RESULT %d %.6f %d\\n" % (code, elapsed, hwm)).encode())
"""


def dump_peak(args: list[str]) -> dict[str, Any]:
    """Run `sepp-log ARGS` (stdout to /dev/null) in a child: seconds and VmHWM."""
    out = subprocess.run(
        [sys.executable, "-c", _DUMP_CHILD, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in out.stderr.splitlines() if x.startswith("RESULT "))
    _tag, code, seconds, hwm_kb = line.split()
    if int(code) != 0:
        raise SystemExit(f"sepp-log {' '.join(args)} exited {code}: {out.stderr[-2000:]}")
    return {"seconds": float(seconds), "hwm_bytes": int(hwm_kb) * 1024}


def _child(function: str, *args: Any, build: str | None = None) -> dict[str, Any]:
    """Run `function(*args)` in a fresh interpreter. `build`: "pure" runs the
    sources (SEPP_PURE=1), "compiled" requires the compiled build; the child says
    which build it ran, and a mismatch is an error, never a silent mislabel."""
    code = (
        "import json, sys; from benchmarks.bench_tools import *; "
        f"result = {function}(*json.loads(sys.argv[1])); "
        "from log_format._compiled import running_build; "
        "result['build'] = running_build(); "
        "print(json.dumps(result))"
    )
    env = dict(os.environ)
    env.pop("SEPP_PURE", None)
    if build == "pure":
        env["SEPP_PURE"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if build is not None and result["build"] != build:
        raise SystemExit(f"asked for the {build} build, the child ran {result['build']}")
    return result


# ---------------------------------------------------------------- main


def _log(work: str, name: str, builder: str, *args: Any) -> tuple[str, dict[str, Any]]:
    """A log built once: reused when `work` already holds one built with the same
    arguments."""
    path = os.path.join(work, name)
    marker = os.path.join(work, f"{name}.json")
    wanted = {"builder": builder, "args": list(args)}
    if os.path.exists(marker):
        with open(marker) as f:
            saved = json.load(f)
        if saved.get("params") == wanted and os.path.isdir(path):
            print(f"reusing {path}", flush=True)
            return path, saved["built"]
    shutil.rmtree(path, ignore_errors=True)
    print(f"building {path} ({builder}{tuple(args)}) ...", flush=True)
    built = _child(builder, path, *args)
    with open(marker, "w") as f:
        json.dump({"params": wanted, "built": built}, f)
    return path, built


def _size_of(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _dirs, names in os.walk(path)
        for name in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size", type=float, default=5.0, help="GB of log for dump (default 5; 0: skip dump)"
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the mixed log")
    parser.add_argument("--batched-jobs", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work-dir", help="keep the generated logs here and reuse them")
    parser.add_argument(
        "--builds",
        help="comma-separated: pure, compiled (default: both when the compiled build "
        "exists -- python -m tools.compile -- else pure)",
    )
    args = parser.parse_args()
    default = "pure,compiled" if build_name() == "compiled" else "pure"
    builds = (args.builds or default).split(",")
    if set(builds) - {"pure", "compiled"}:
        parser.error(f"--builds: unknown build in {args.builds!r}")
    print(machine_line())
    print(f"builds: {', '.join(builds)} (checkout: {build_name()})")
    work = args.work_dir or tempfile.mkdtemp(prefix="sepp-bench-tools-")
    os.makedirs(work, exist_ok=True)
    rows: list[tuple[Any, ...]] = []
    try:
        for name, builder, size_arg in (
            ("mixed", "build_mixed", args.jobs),
            ("batched", "build_batched", args.batched_jobs),
        ):
            path, _built = _log(work, name, builder, size_arg)
            log_bytes = _size_of(path)
            # Builds interleaved run by run, so drift on a shared machine hits both.
            for command in ("verify", "replay"):
                by_build: dict[str, list[dict[str, Any]]] = {b: [] for b in builds}
                for _ in range(args.runs):
                    for b in builds:
                        by_build[b].append(_child(f"measure_{command}", path, build=b))
                for b, runs in by_build.items():
                    rate = median([r["events"] / r["seconds"] for r in runs])
                    rows.append(
                        (
                            f"{name} ({runs[0]['records']:,} records, "
                            f"{runs[0]['events']:,} events, {log_bytes / 2**20:.0f} MiB)",
                            b,
                            command,
                            median([r["seconds"] for r in runs]),
                            rate,
                            "",
                            "yes" if rate >= TARGET_EVENTS_PER_S else "NO",
                        )
                    )
                    print(rows[-1], flush=True)
            parts: dict[str, list[dict[str, Any]]] = {b: [] for b in builds}
            for _ in range(args.runs):
                for b in builds:
                    parts[b].append(_child("measure_parts", path, build=b))
            for b, measured in parts.items():
                events = measured[0]["events"]
                for key, label in (
                    ("envelopes_s", "  part: ValidEnvelopes (checksums + decode)"),
                    ("check_run_s", "  part: check_run (+ catalogue, times)"),
                    ("replay_run_s", "  part: replay_run (+ apply)"),
                    ("replay_run_checks_s", "  part: replay_run with verify's checks"),
                ):
                    seconds = median([p[key] for p in measured])
                    rows.append((name, b, label, seconds, events / seconds, "", ""))
                    print(rows[-1], flush=True)

        baseline = dump_peak([])
        for gigabytes in (args.size / 10, args.size) if args.size > 0 else ():
            path, built = _log(work, f"big-{gigabytes:g}GB", "build_big", gigabytes)
            runs = [dump_peak(["dump", path]) for _ in range(args.runs)]
            seconds = median([r["seconds"] for r in runs])
            records = int(built["records"])
            rows.append(
                (
                    f"big ({_size_of(path) / 2**30:.2f} GiB, {records:,} records)",
                    build_name(),
                    "dump (human, to /dev/null)",
                    seconds,
                    records / seconds,
                    f"{median([r['hwm_bytes'] for r in runs]) / 2**20:.1f}",
                    "",
                )
            )
            print(rows[-1], flush=True)
        rows.append(
            (
                "(none)",
                build_name(),
                "python + tools imported",
                "",
                "",
                f"{baseline['hwm_bytes'] / 2**20:.1f}",
                "",
            )
        )
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"target: verify and replay >= {TARGET_EVENTS_PER_S:,} events/s; dump in constant memory")
    print_table(
        ["log", "build", "measure", "median s", "events/s", "peak RSS MiB", "target met"], rows
    )


if __name__ == "__main__":
    main()
