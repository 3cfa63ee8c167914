"""Group-commit throughput of the storage engine, in process.

N submitters each keep one 256-byte enqueue in flight through the same commit
pipeline the server uses (as callback chains, the way the server's connections
drive it; `--style tasks` uses one asyncio task per submitter instead) (decide + apply + encode on the event loop, one
write + one fdatasync per group in the flushing thread, replies released in log
order once durable). Reported: commands/s (median of --runs), records per sync.

    python -m benchmarks.bench_wal                 # sync_data and buffer, 1/8/64/256
    python -m benchmarks.bench_wal --modes sync_data --submitters 256 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time

from benchmarks.common import fsync_rate, machine_line, median, print_table
from sepp.core import CoreConfig, Enqueue, NewJob
from sepp.server.ids import JobIds
from sepp.server.pipeline import CommitPipeline
from sepp.storage import Engine, StorageOptions

PAYLOAD = b"x" * 256


async def _run_once(
    mode: str, submitters: int, commands: int, style: str = "callbacks"
) -> dict[str, float]:
    data_dir = tempfile.mkdtemp(prefix="sepp-bench-wal-")
    try:
        engine = Engine.open(
            data_dir,
            CoreConfig(),
            StorageOptions(persist_mode=mode, snapshot_every_bytes=0),
        )
        pipeline = CommitPipeline(engine, backlog_max=1 << 30)
        pipeline.start()
        ids = JobIds()
        per_task = commands // submitters
        next_id = ids.next

        def command() -> Enqueue:
            job = NewJob(
                job_id=next_id(),
                queue="bench",
                job_type="work",
                payload_data=PAYLOAD,
                payload_encoding="application/octet-stream",
            )
            return Enqueue(jobs=(job,))

        started = time.perf_counter()
        if style == "tasks":
            # One asyncio task per submitter, awaiting a future per command.
            async def submitter() -> None:
                submit = pipeline.submit
                for _ in range(per_task):
                    await submit(command())

            await asyncio.gather(*(submitter() for _ in range(submitters)))
        else:
            # Closed-loop callback chains, the way the server drives the pipeline:
            # each submitter sends its next command from its previous durability
            # callback (one command in flight per submitter).
            finished = asyncio.Event()
            left = [submitters]

            def chain(remaining: int) -> None:
                def step(error: BaseException | None) -> None:
                    nonlocal remaining
                    if error is not None:
                        raise error
                    if remaining == 0:
                        left[0] -= 1
                        if left[0] == 0:
                            finished.set()
                        return
                    remaining -= 1
                    _decision, barrier = pipeline.execute(command())
                    pipeline.after_durable(barrier, step)

                step(None)

            for _ in range(submitters):
                chain(per_task)
            await finished.wait()
        elapsed = time.perf_counter() - started
        await pipeline.stop()
        flushes = engine.stats["flushes"]
        engine.close()
        done = per_task * submitters
        return {"rate": done / elapsed, "per_sync": done / max(flushes, 1)}
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", nargs="+", default=["sync_data", "buffer"])
    parser.add_argument("--submitters", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="approximate length of one run")
    parser.add_argument(
        "--style",
        choices=["callbacks", "tasks"],
        default="callbacks",
        help="submitters as callback chains (as the server runs) or as asyncio tasks",
    )
    args = parser.parse_args()

    print(machine_line())
    print(f"submitters: {args.style}")
    probe = fsync_rate()
    print(
        f"disk: 4 KiB append + fdatasync median {probe['median_us']:.0f} us, "
        f"{probe['syncs_per_s']:,.0f} syncs/s"
    )
    rows = []
    for mode in args.modes:
        for n in args.submitters:
            # Size each run to roughly --seconds from a short calibration run.
            calib = asyncio.run(_run_once(mode, n, max(n * 20, 2000), args.style))
            commands = max(n * 20, int(calib["rate"] * args.seconds))
            results = [
                asyncio.run(_run_once(mode, n, commands, args.style)) for _ in range(args.runs)
            ]
            rates = [r["rate"] for r in results]
            rows.append(
                (
                    mode,
                    n,
                    median(rates),
                    min(rates),
                    max(rates),
                    median([r["per_sync"] for r in results]),
                    commands,
                )
            )
            print(f"  {mode} x{n}: {median(rates):,.0f} commands/s", flush=True)
    print()
    print_table(
        [
            "persist mode",
            "submitters",
            "median cmd/s",
            "min",
            "max",
            "records/sync",
            "commands/run",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
