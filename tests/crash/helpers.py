"""Small shared pieces of the crash tests: a tagged job, a client that records what
the server acknowledged, and draining a queue to see what survived.

Every job carries a unique tag as its payload, so a job whose enqueue was in
doubt (no answer) can still be recognised if it shows up later.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sepp.client import (
    EnqueueAck,
    EnqueueRequest,
    Payload,
    ReserveOptions,
    SeppClient,
    SeppError,
)
from tools import crash

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def tagged(queue: str, tag: str, size: int = 0) -> EnqueueRequest:
    data = tag.encode() + b"." * size
    return EnqueueRequest(queue=queue, job_type="t", payload=Payload(data, "text/plain"))


def tag_of(data: bytes) -> str:
    return data.decode().rstrip(".")


@dataclass
class Ledger:
    """Tags acknowledged (tag -> job id) and tags whose enqueue is in doubt."""

    acknowledged: dict[str, str] = field(default_factory=dict)
    in_doubt: set[str] = field(default_factory=set)
    errors: list[SeppError] = field(default_factory=list)

    async def enqueue(self, client: SeppClient, queue: str, tags: list[str], size: int = 0) -> bool:
        """Enqueue a batch; False (error kept) when the call failed."""
        try:
            results = await client.enqueue_batch([tagged(queue, t, size) for t in tags])
        except SeppError as exc:
            self.errors.append(exc)
            self.in_doubt.update(tags)
            return False
        for tag, result in zip(tags, results, strict=True):
            assert isinstance(result, EnqueueAck), result
            self.acknowledged[tag] = result.job_id
        return True


async def drain(client: SeppClient, queues: list[str]) -> dict[str, tuple[str, int]]:
    """Reserve and ack everything ready: tag -> (job id, attempt)."""
    seen: dict[str, tuple[str, int]] = {}
    options = ReserveOptions(
        queues=queues, lease_duration=timedelta(seconds=30), wait_timeout=timedelta(0), max_jobs=256
    )
    while jobs := await client.reserve(options):
        for job in jobs:
            assert job.payload is not None
            tag = tag_of(job.payload.data)
            assert tag not in seen, f"{tag} delivered twice"
            seen[tag] = (job.ctx.id, job.ctx.attempt)
            await client.ack(job.ctx)
    return seen


def harness_rec(tag: str, queue: str = "cq0", **state: object) -> crash.JobRec:
    """What the crash harness's ledger knows of job `tag` (id-<tag>, its enqueue
    acknowledged), with `state` set on it."""
    rec = crash.JobRec(tag, queue, 0, False, None, 3, None, job_id=f"id-{tag}", enq="ok")
    for name, value in state.items():
        setattr(rec, name, value)
    return rec


def harness_ledger(*recs: crash.JobRec) -> crash.Ledger:
    """The crash harness's ledger knowing `recs`, each by its id."""
    ledger = crash.Ledger(crash.Report(seed=0))
    for rec in recs:
        ledger.add(rec)
        ledger.by_id[rec.job_id or ""] = rec
    return ledger


def assert_survived(ledger: Ledger, seen: dict[str, tuple[str, int]]) -> None:
    """Every acknowledged job is there with its id; nothing else but in-doubt ones."""
    for tag, job_id in ledger.acknowledged.items():
        assert tag in seen, f"acknowledged job {tag} ({job_id}) lost"
        assert seen[tag][0] == job_id
    unknown = set(seen) - set(ledger.acknowledged) - ledger.in_doubt
    assert not unknown, f"jobs nobody enqueued: {sorted(unknown)[:5]}"


def serve_once(data_dir: Path, env: dict[str, str] | None = None, timeout: float = 30.0) -> str:
    """Start `sepp serve` expecting it to refuse: returns its stderr (exit code 1)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    environment.update(env or {})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sepp.server.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
            # No admin listener: its default port may be taken on a shared
            # machine, and that refusal would hide the one under test.
            "--admin-listen",
            "off",
        ],
        capture_output=True,
        timeout=timeout,
        env=environment,
        cwd=str(data_dir.parent),
        check=False,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()
    return proc.stderr.decode()


def run(coro: object) -> object:
    """Run a coroutine on a fresh loop with a hard timeout."""
    return asyncio.run(asyncio.wait_for(coro, 120))  # type: ignore[arg-type]
