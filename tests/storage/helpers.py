"""Shared builders for the storage tests.

- `Oracle`: what the engine must hold after a crash. Every logged decision is
  recorded with its sequence number; a record is *released* once the engine says it
  is durable (its reply could have been sent). `ref` is a plain `State` rebuilt by
  applying exactly the released records, in log order; after recovery the engine
  must equal `ref` plus some prefix of the unreleased tail (`recovered(k)`).
- `Workload`: a seeded generator of commands of every kind (enqueues with and
  without keys, schedules and payloads, reserves, acks, nacks of every kind,
  extends, sweeps, drains, operator actions), some of them refused or logging
  nothing, driven by a manual clock.
- Small readers over the fake file system: segment and snapshot paths, the records
  of a segment file.

Nothing here reads a clock or sleeps; every random choice comes from the `rng`
fixture (tests/conftest.py), so a failure replays with `SEPP_SEED=...`.
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass
from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    Record,
    decode_segment_header,
    parse_segment_file_name,
    parse_snapshot_file_name,
    scan_records,
)
from sepp.core import (
    RETRY_DEAD_LETTER,
    RETRY_DEFAULT,
    RETRY_DELAY,
    Ack,
    Command,
    CoreConfig,
    DeadLetterJobs,
    Decision,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Nack,
    NewJob,
    QueuePolicy,
    Release,
    RequeueDeadLetters,
    Reserve,
    State,
    Sweep,
    apply_record,
)
from sepp.core.commands import (
    AdminDeadLetterJobs,
    AdminRequeueDeadLetters,
    CancelJobs,
    ChangeLeader,
    DeleteDeadLetters,
    DeleteQueue,
    DeleteSchedule,
    PauseQueue,
    PauseSchedule,
    PurgeQueue,
    PutQueue,
    PutSchedule,
    ResumeQueue,
    ResumeSchedule,
)
from sepp.core.events import Event
from sepp.core.results import CommandError
from sepp.core.state import IN_FLIGHT, READY, SCHEDULED
from sepp.storage import Engine, StorageOptions
from sepp.storage.faultfs import FaultyFileSystem

DATA_DIR = "/data"
WAL_DIR = "/data/wal"
SNAP_DIR = "/data/snapshots"
# An arbitrary wall-clock start (ms); tests that care about time say so explicitly.
T0 = 1_700_000_000_000

QUEUES = ("a", "b", "c")
KEYS = ("k1", "k2", "k3", "k4", "k5")

# Small windows so that sweeps have work: leases expire, scheduled jobs come due,
# dedup keys and dead letters expire within a few simulated seconds. A depth cap
# keeps the state (and so each cycle of a long simulation) small.
CONFIG = CoreConfig(
    defaults=QueuePolicy(
        default_max_attempts=2,
        retry_delay_ms=200,
        retry_backoff="exponential",
        dedup_window_ms=3_000,
        max_queue_depth=40,
        max_schedule_horizon_ms=60_000,
    ),
    dead_letter_retention_ms=4_000,
)


def inline_options(**overrides: Any) -> StorageOptions:
    """Storage options for the fake file system: snapshots written inline."""
    overrides.setdefault("snapshot_mode", "inline")
    return StorageOptions(**overrides)


def open_engine(
    fs: FaultyFileSystem, options: StorageOptions | None = None, **kwargs: Any
) -> Engine:
    return Engine.open(DATA_DIR, CONFIG, options or inline_options(), fs=fs, **kwargs)


def numbered_id(n: int) -> str:
    """A canonical UUID string for job number `n` (ascending with n)."""
    return str(uuid.UUID(int=(n + 1) << 64 | 0x5E99))


def random_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def simple_job(
    n: int, *, queue: str | None = None, payload_bytes: int = 64, **fields: Any
) -> NewJob:
    """Job number `n`; by default 32 jobs per queue, below CONFIG's depth cap."""
    payload = bytes((n + i) % 251 for i in range(payload_bytes)) if payload_bytes else None
    return NewJob(
        job_id=numbered_id(n),
        queue=queue if queue is not None else f"q{n // 32}",
        job_type="work",
        payload_data=payload,
        payload_encoding="raw" if payload else None,
        **fields,
    )


def enqueue_one(n: int, **fields: Any) -> Enqueue:
    return Enqueue(jobs=(simple_job(n, **fields),))


# ---------------------------------------------------------------- the oracle


@dataclass
class Logged:
    seq: int
    time_ms: int
    events: tuple[Event, ...]


class Oracle:
    """The released decisions, replayed into a plain State (`ref`)."""

    def __init__(self, config: CoreConfig = CONFIG) -> None:
        self.ref = State(config)
        self.released_seq = 0
        self.unreleased: list[Logged] = []

    @property
    def appended_seq(self) -> int:
        return self.unreleased[-1].seq if self.unreleased else self.released_seq

    def executed(self, decision: Decision | CommandError, barrier: int) -> None:
        """Record what `Engine.execute` returned."""
        if type(decision) is Decision and decision.events:
            if barrier != self.appended_seq + 1:
                raise AssertionError(f"barrier {barrier} after seq {self.appended_seq}")
            self.unreleased.append(Logged(barrier, decision.time_ms, decision.events))
        elif barrier != self.appended_seq:
            # A command that logged nothing waits for the last record it may have read.
            raise AssertionError(f"barrier {barrier} of a no-op, last seq {self.appended_seq}")

    def release(self, durable_seq: int) -> None:
        """Replies up to `durable_seq` are released: they must survive any crash."""
        if durable_seq < self.released_seq:
            raise AssertionError(f"durable seq went back: {durable_seq} < {self.released_seq}")
        self._commit_through(durable_seq)
        self.released_seq = max(self.released_seq, durable_seq)

    def _commit_through(self, seq: int) -> None:
        while self.unreleased and self.unreleased[0].seq <= seq:
            logged = self.unreleased.pop(0)
            apply_record(self.ref, logged.time_ms, logged.events)

    def recovered(self, last_seq: int) -> None:
        """The engine came back with records 1..last_seq. It must hold every
        released record and nothing but a prefix of the unreleased ones."""
        if not self.released_seq <= last_seq <= self.appended_seq:
            raise AssertionError(
                f"recovered up to seq {last_seq}; released {self.released_seq}, "
                f"appended {self.appended_seq}"
            )
        self._commit_through(last_seq)
        self.released_seq = last_seq
        self.unreleased.clear()


class History:
    """Every logged decision, kept whole, for 'state at seq S' checks."""

    def __init__(self, config: CoreConfig = CONFIG) -> None:
        self.config = config
        self.records: list[Logged] = []

    def executed(self, decision: Decision | CommandError, barrier: int) -> None:
        if type(decision) is Decision and decision.events:
            expected = self.records[-1].seq + 1 if self.records else 1
            if barrier != expected:
                raise AssertionError(f"barrier {barrier}, expected {expected}")
            self.records.append(Logged(barrier, decision.time_ms, decision.events))

    def state_at(self, seq: int) -> State:
        state = State(self.config)
        for logged in self.records:
            if logged.seq > seq:
                break
            apply_record(state, logged.time_ms, logged.events)
        return state


# ---------------------------------------------------------------- the workload


class Workload:
    """Seeded random commands against the engine's current state."""

    def __init__(self, rng: random.Random, *, payload_bytes_max: int = 160) -> None:
        self.rng = rng
        self.payload_bytes_max = payload_bytes_max

    def advance(self, now: int) -> int:
        return now + self.rng.choice((0, 0, 1, 7, 50, 120, 400, 900, 2_500))

    def new_job(self, now: int) -> NewJob:
        rng = self.rng
        size = rng.randrange(self.payload_bytes_max + 1)
        payload = rng.randbytes(size) if size else None
        scheduled_at = None
        if rng.random() < 0.2:
            scheduled_at = now + rng.choice((-1_000, 1, 300, 2_000, 7_000))
        custom = None
        if rng.random() < 0.2:
            custom = {"n": rng.randrange(1000), "ok": rng.random() < 0.5, "s": "x" * 3}
        job_type = "work" if rng.random() < 0.98 else ""  # "" is refused
        return NewJob(
            job_id=random_id(rng),
            queue=rng.choice(QUEUES),
            job_type=job_type,
            payload_data=payload,
            payload_encoding="raw" if payload else None,
            idempotency_key=rng.choice(KEYS) if rng.random() < 0.3 else None,
            priority=rng.choice((None, 0, 3, 9)),
            max_attempts=rng.choice((None, 1, 2, 3)),
            scheduled_at=scheduled_at,
            traceparent="00-trace-01" if rng.random() < 0.1 else None,
            custom=custom,
        )

    def command(self, state: State, now: int) -> Command:
        rng = self.rng
        r = rng.random()
        if r < 0.28:
            jobs = tuple(self.new_job(now) for _ in range(rng.choice((1, 1, 2, 3))))
            return Enqueue(jobs=jobs, atomic=rng.random() < 0.2)
        if r < 0.48:
            queues = tuple(rng.sample(QUEUES, rng.randrange(1, len(QUEUES) + 1)))
            return Reserve(
                queues=queues,
                lease_ms=rng.choice((100, 600, 2_000)),
                max_jobs=rng.choice((1, 1, 2, 3)),
                worker_id=rng.choice((None, "w1", "w2")),
            )
        in_flight = [j for j in state.jobs.values() if j.status == IN_FLIGHT]
        if r < 0.78 and in_flight:
            job = rng.choice(in_flight)
            attempt = job.attempt if rng.random() < 0.95 else job.attempt + 1  # fenced off
            kind = rng.random()
            if kind < 0.4:
                return Ack(job_id=job.job_id, attempt=attempt, worker_id=job.worker_id)
            if kind < 0.5:
                return Release(job_id=job.job_id, attempt=attempt, worker_id=job.worker_id)
            if kind < 0.85:
                retry = rng.choice((RETRY_DEFAULT, RETRY_DELAY, RETRY_DEAD_LETTER))
                return Nack(
                    job_id=job.job_id,
                    attempt=attempt,
                    retry=retry,
                    delay_ms=rng.choice((0, 150, 1_000)) if retry == RETRY_DELAY else None,
                    reason=rng.choice((None, "boom")),
                )
            return Extend(job_id=job.job_id, attempt=attempt, lease_ms=rng.choice((200, 1_500)))
        if r < 0.88:
            return Sweep()
        if r < 0.94:
            return DrainDeadLetters(
                queue=rng.choice((None, *QUEUES)), max_records=rng.choice((1, 2, 5))
            )
        if r < 0.955:
            waiting = [j.job_id for j in state.jobs.values() if j.status in (READY, SCHEDULED)]
            picked = rng.sample(waiting, min(len(waiting), 2)) if waiting else [random_id(rng)]
            return DeadLetterJobs(job_ids=tuple(picked), reason="operator")
        if r < 0.97:
            dead = list(state.dead)
            picked = rng.sample(dead, min(len(dead), 2)) if dead else [random_id(rng)]
            return RequeueDeadLetters(job_ids=tuple(picked))
        return self.admin_command(state)

    def admin_command(self, state: State) -> Command:
        """An operator's command of issue 15 (logged with an AdminAction header)."""
        rng = self.rng
        who = {"actor": rng.choice(("ann", "local")), "role": rng.choice(("operator", "admin"))}
        kind = rng.choice(
            (
                "cancel",
                "dead_letter",
                "requeue",
                "delete",
                "pause",
                "resume",
                "resume",
                "purge",
                "put_queue",
                "delete_queue",
                "put_schedule",
                "put_schedule",
                "pause_schedule",
                "resume_schedule",
                "delete_schedule",
                "leader_change",
            )
        )
        if kind == "leader_change":
            return ChangeLeader(epoch=rng.randrange(1, 5), node_id="n1", address="h:1")
        if kind == "put_schedule":
            return PutSchedule(
                name=rng.choice(("s1", "s2")),
                queue=rng.choice(QUEUES),
                job_type="tick",
                every_ms=rng.choice((1_000, 1_500)),
                catch_up=rng.choice(("none", "one", "all")),
                **who,
            )
        if kind in ("pause_schedule", "resume_schedule", "delete_schedule"):
            cls3 = {
                "pause_schedule": PauseSchedule,
                "resume_schedule": ResumeSchedule,
                "delete_schedule": DeleteSchedule,
            }[kind]
            return cls3(name=rng.choice(("s1", "s2")), **who)
        if kind == "put_queue":
            overrides = rng.choice(({}, {"default_priority": 5}, {"retry_delay_ms": 50}))
            return PutQueue(queue=rng.choice(QUEUES), overrides=overrides, **who)
        if kind == "delete_queue":
            return DeleteQueue(queue=rng.choice(QUEUES), **who)
        if kind in ("cancel", "dead_letter"):
            waiting = [j.job_id for j in state.jobs.values() if j.status in (READY, SCHEDULED)]
            picked = rng.sample(waiting, min(len(waiting), 2)) if waiting else [random_id(rng)]
            cls = CancelJobs if kind == "cancel" else AdminDeadLetterJobs
            return cls(job_ids=tuple(picked), reason=rng.choice((None, "op")), **who)
        if kind in ("requeue", "delete"):
            cls2 = AdminRequeueDeadLetters if kind == "requeue" else DeleteDeadLetters
            if rng.random() < 0.5:
                dead = list(state.dead)
                picked = rng.sample(dead, min(len(dead), 2)) if dead else [random_id(rng)]
                return cls2(job_ids=tuple(picked), **who)
            return cls2(queue=rng.choice(QUEUES), max_jobs=rng.choice((1, 3)), **who)
        if kind == "pause":
            return PauseQueue(queue=rng.choice(QUEUES), **who)
        if kind == "resume":
            return ResumeQueue(queue=rng.choice(QUEUES), **who)
        return PurgeQueue(queue=rng.choice(QUEUES), max_jobs=rng.choice((1, 2)), **who)


# ---------------------------------------------------------------- files


def segment_paths(fs: FaultyFileSystem, wal_dir: str = WAL_DIR) -> list[str]:
    names = [n for n in fs.listdir(wal_dir) if parse_segment_file_name(n) is not None]
    return [os.path.join(wal_dir, n) for n in sorted(names)]


def snapshot_paths(fs: FaultyFileSystem, snap_dir: str = SNAP_DIR) -> list[str]:
    names = [n for n in fs.listdir(snap_dir) if parse_snapshot_file_name(n) is not None]
    return [os.path.join(snap_dir, n) for n in sorted(names)]


def segment_records(data: bytes) -> tuple[int, list[Record], object]:
    """(first_seq, valid records, terminal scan item) of a segment file's bytes."""
    first_seq = decode_segment_header(data).first_seq
    items = list(scan_records(data, start_offset=FILE_HEADER_BYTES, expected_seq=first_seq))
    return first_seq, [i for i in items if type(i) is Record], items[-1]


def durable_log_seq(fs: FaultyFileSystem) -> int:
    """The last sequence number a crash right now would keep (durable bytes only,
    contiguous from the first durable segment)."""
    last = 0
    files = fs.durable_files()
    for path in sorted(p for p in files if p.startswith(WAL_DIR + "/")):
        if parse_segment_file_name(os.path.basename(path)) is None:
            continue
        data = files[path]
        if len(data) < FILE_HEADER_BYTES:
            continue
        _first, records, _end = segment_records(data)
        if records:
            last = records[-1].seq
    return last
