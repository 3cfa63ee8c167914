"""Builders for the tests of `sepp-log`: real data directories written by the
storage engine (on the real file system, in tmp_path), and byte surgery on them.

- `LiveLog` drives an `Engine` and keeps what the live system held at every
  sequence number (`canonical[seq]`): point-in-time replay is checked against it.
- `scripted_log` writes a small, fixed history (no randomness) whose every record is
  known, so the reports of damage can be asserted exactly.
- `random_log` writes a seeded mixed workload (every command kind, from
  tests/storage/helpers.py) over several segments, with snapshots.
- `Surgery`: the offsets of records in segment files, and edits on them.

Nothing here reads a clock or sleeps; randomness comes from the `rng` fixture.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    Record,
    decode_envelope,
    decode_segment_header,
    encode_envelope,
    encode_record,
    parse_segment_file_name,
    scan_records,
)
from sepp.core import (
    Ack,
    Command,
    CoreConfig,
    Decision,
    Enqueue,
    Extend,
    Nack,
    NewJob,
    QueuePolicy,
    Reserve,
    Sweep,
)
from sepp.core.commands import RETRY_DEAD_LETTER, DeadLetterJobs, DrainDeadLetters
from sepp.storage import Engine, StorageOptions
from tests.storage.helpers import Workload, numbered_id

T0 = 1_700_000_000_000

# Short windows, so a short history holds expiries, promotions and dead letters.
CONFIG = CoreConfig(
    defaults=QueuePolicy(
        default_max_attempts=2,
        retry_delay_ms=200,
        dedup_window_ms=3_000,
        max_schedule_horizon_ms=60_000,
    ),
    dead_letter_retention_ms=4_000,
)


def options(**overrides: Any) -> StorageOptions:
    """Fast options for tests: no fsync per flush, snapshots only when asked,
    written inline, small segments so a short log spans several, and every segment
    kept (a long log retention) unless a test asks for retention."""
    values: dict[str, Any] = {
        "persist_mode": "buffer",
        "segment_bytes_max": 4096,
        "snapshot_every_bytes": 0,
        "snapshot_mode": "inline",
        "snapshots_kept": 10,
        "log_retention_ms": 10**13,
    }
    values.update(overrides)
    return StorageOptions(**values)


@dataclass
class LiveLog:
    """An engine writing a data directory, and the live state at every seq."""

    data_dir: Path
    engine: Engine
    canonical: dict[int, dict[str, Any]] = field(default_factory=dict)
    times: dict[int, int] = field(default_factory=dict)
    # Take a snapshot right after these seqs are logged.
    snapshot_at: frozenset[int] = frozenset()

    @classmethod
    def open(
        cls, data_dir: Path, *, snapshot_at: tuple[int, ...] = (), **option_overrides: Any
    ) -> LiveLog:
        engine = Engine.open(str(data_dir), CONFIG, options(**option_overrides))
        live = cls(data_dir, engine, snapshot_at=frozenset(snapshot_at))
        live.canonical[engine.appended_seq] = engine.state.canonical()
        return live

    def _logged(self, seq: int, time_ms: int) -> None:
        self.engine.flush()
        self.canonical[seq] = self.engine.state.canonical()
        self.times[seq] = time_ms
        if seq in self.snapshot_at:
            self.engine.snapshot_now()

    def run(self, command: Command, now: int) -> Decision:
        """Execute and flush one command; it must be accepted and logged."""
        decision, seq = self.engine.execute(command, now)
        if type(decision) is not Decision or not decision.events:
            raise AssertionError(f"{command!r} was not logged: {decision!r}")
        self._logged(seq, decision.time_ms)
        return decision

    def try_run(self, command: Command, now: int) -> None:
        """Execute one command, logged or not."""
        decision, seq = self.engine.execute(command, now)
        if type(decision) is Decision and decision.events:
            self._logged(seq, decision.time_ms)

    @property
    def last_seq(self) -> int:
        return self.engine.appended_seq

    def close(self) -> None:
        self.engine.close()


def job(n: int, queue: str = "emails", **fields: Any) -> NewJob:
    return NewJob(
        job_id=numbered_id(n),
        queue=queue,
        job_type="send",
        payload_data=bytes(range(n % 7, n % 7 + 250)),
        payload_encoding="raw",
        **fields,
    )


def scripted_log(
    data_dir: Path, *, snapshot_at: tuple[int, ...] = (), **option_overrides: Any
) -> LiveLog:
    """A fixed history of 40 records, one second apart from T0 (seq s at T0 + s*1000):

    seq 1..24   enqueue job n (n = 0..23) into "emails" (even n) or "reports" (odd)
    seq 25      reserve 1 job of "emails" (job 0), lease 30 s, worker "w1"
    seq 26      ack job 0
    seq 27      reserve 1 from "emails" (job 2), worker "w2"
    seq 28      nack job 2, reason "smtp down" (retry after 200 ms: Scheduled)
    seq 29      sweep (promotes job 2)
    seq 30      reserve 1 from "emails" (job 2, attempt 2), worker "w1"
    seq 31      extend job 2's lease to 60 s
    seq 32      nack job 2 "smtp down again": attempts exhausted, dead letter
    seq 33      reserve 2 from "reports" (jobs 1 and 3), worker "w3"
    seq 34      ack job 1
    seq 35      enqueue job 24 into "emails" with idempotency key "welcome-24"
    seq 36      operator dead-letters job 4
    seq 37      drain 1 dead letter of "emails" (job 2)
    seq 38      reserve 1 from "emails" (job 6), lease 1 s, worker "w2"
    seq 39      sweep, 5 s later (job 6's lease expired: Ready for attempt 2)
    seq 40      nack job 3 with a dead-letter directive, reason "bad input"

    With the default options (4096-byte segments) the segments hold seqs 1..12,
    13..24 and 25..40."""
    live = LiveLog.open(data_dir, snapshot_at=snapshot_at, **option_overrides)
    for n in range(24):
        live.run(Enqueue(jobs=(job(n, "emails" if n % 2 == 0 else "reports"),)), _at(n + 1))
    live.run(Reserve(queues=("emails",), lease_ms=30_000, worker_id="w1"), _at(25))
    live.run(Ack(job_id=numbered_id(0), attempt=1, worker_id="w1"), _at(26))
    live.run(Reserve(queues=("emails",), lease_ms=30_000, worker_id="w2"), _at(27))
    live.run(Nack(job_id=numbered_id(2), attempt=1, reason="smtp down", worker_id="w2"), _at(28))
    live.run(Sweep(), _at(29))
    live.run(Reserve(queues=("emails",), lease_ms=30_000, worker_id="w1"), _at(30))
    live.run(Extend(job_id=numbered_id(2), attempt=2, lease_ms=60_000, worker_id="w1"), _at(31))
    live.run(
        Nack(job_id=numbered_id(2), attempt=2, reason="smtp down again", worker_id="w1"), _at(32)
    )
    live.run(Reserve(queues=("reports",), lease_ms=30_000, max_jobs=2, worker_id="w3"), _at(33))
    live.run(Ack(job_id=numbered_id(1), attempt=1, worker_id="w3"), _at(34))
    live.run(Enqueue(jobs=(job(24, idempotency_key="welcome-24"),)), _at(35))
    live.run(DeadLetterJobs(job_ids=(numbered_id(4),), reason="operator"), _at(36))
    live.run(DrainDeadLetters(queue="emails", max_records=1), _at(37))
    live.run(Reserve(queues=("emails",), lease_ms=1_000, worker_id="w2"), _at(38))
    live.run(Sweep(), _at(39) + 5_000)
    live.run(
        Nack(
            job_id=numbered_id(3),
            attempt=1,
            retry=RETRY_DEAD_LETTER,
            reason="bad input",
            worker_id="w3",
        ),
        _at(40) + 5_000,
    )
    return live


def _at(seq: int) -> int:
    return T0 + seq * 1000


def random_log(
    data_dir: Path,
    rng: random.Random,
    *,
    commands: int = 400,
    snapshot_every: int = 0,
    **option_overrides: Any,
) -> LiveLog:
    """A seeded mixed workload; a snapshot after every `snapshot_every` commands.
    Retention is on (segments below the oldest kept snapshot are deleted), so with
    snapshots the log no longer starts at seq 1."""
    option_overrides.setdefault("log_retention_ms", 0)
    option_overrides.setdefault("snapshots_kept", 3)
    live = LiveLog.open(data_dir, **option_overrides)
    workload = Workload(rng)
    now = T0
    for i in range(commands):
        now = workload.advance(now)
        live.try_run(workload.command(live.engine.state, now), now)
        if snapshot_every and (i + 1) % snapshot_every == 0:
            live.engine.snapshot_now()
    return live


# ---------------------------------------------------------------- surgery


def segment_paths(data_dir: Path) -> list[Path]:
    wal = data_dir / "wal"
    return sorted(p for p in wal.iterdir() if parse_segment_file_name(p.name) is not None)


def snapshot_paths(data_dir: Path) -> list[Path]:
    snaps = data_dir / "snapshots"
    return sorted(p for p in snaps.iterdir() if p.suffix == ".snap")


def records_of(path: Path) -> list[Record]:
    """The valid records of a segment file (bodies copied)."""
    data = path.read_bytes()
    first_seq = decode_segment_header(data).first_seq
    return [
        Record(item.offset, item.seq, item.kind, memoryview(bytes(item.body)))
        for item in scan_records(data, start_offset=FILE_HEADER_BYTES, expected_seq=first_seq)
        if type(item) is Record
    ]


def locate(data_dir: Path, seq: int) -> tuple[Path, Record]:
    """The segment file holding record `seq`, and the record."""
    for path in segment_paths(data_dir):
        for record in records_of(path):
            if record.seq == seq:
                return path, record
    raise KeyError(seq)


def record_size(record: Record) -> int:
    return RECORD_HEADER_BYTES + len(record.body)


def rel(path: Path, data_dir: Path) -> str:
    return os.path.relpath(path, data_dir)


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def splice(path: Path, start: int, end: int, replacement: bytes = b"") -> None:
    data = path.read_bytes()
    path.write_bytes(data[:start] + replacement + data[end:])


def all_records(data_dir: Path) -> Iterator[tuple[Path, Record]]:
    for path in segment_paths(data_dir):
        for record in records_of(path):
            yield path, record


def replace_record(data_dir: Path, seq: int, body: bytes) -> tuple[Path, int]:
    """Re-encode record `seq` with a new body, checksums and all (a record no crash
    produces: a writer bug, or damage behind good checksums). Returns its file and
    offset."""
    path, record = locate(data_dir, seq)
    splice(path, record.offset, record.offset + record_size(record), encode_record(seq, 1, body))
    return path, record.offset


def reencode(data_dir: Path, seq: int, **changes: Any) -> tuple[Path, int]:
    """Re-encode record `seq` with envelope fields changed: `time_ms`, `events`."""
    _path, record = locate(data_dir, seq)
    envelope = decode_envelope(record.body)
    time_ms = changes.get("time_ms", envelope.time_ms)
    events = changes.get("events", envelope.events)
    return replace_record(data_dir, seq, encode_envelope(time_ms, envelope.command_kind, events))


def tree(data_dir: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under `data_dir`: (size, mtime_ns, content) -- to prove a command
    changed nothing."""
    out = {}
    for path in sorted(data_dir.rglob("*")):
        if path.is_file():
            stat = path.stat()
            out[str(path.relative_to(data_dir))] = (
                stat.st_size,
                stat.st_mtime_ns,
                path.read_bytes(),
            )
    return out
