"""`python -m tools.sim --seeds N [--seed S] [--jobs J]`: the deterministic
crash/restart simulation of sepp against the reference model.

Owns: the seeded, in-process simulation. One seed = one run: a random core
configuration and storage options (persist mode, tiny segments, frequent
snapshots, retention), a random workload of every command kind (including
refused and fenced ones, and every admin mutation of issue 15: dead-letter and
cancel by id, requeue and delete of dead letters by id and by queue / cause,
pause, resume, purge, put and delete of a runtime queue) on a manual clock, driven through the real storage
`Engine` on the fault-injecting file system (`sepp.storage.faultfs`), and a
handful of crash/restart cycles. Every command also runs on the reference model
(`tools.refmodel.Model`), so each cycle is checked against an independent,
obviously-correct implementation of the semantics, not against the core itself.

Faults, one per cycle, chosen by the seed:

- **power loss** at a random moment: between batches, right before the n-th
  file operation (mid-write, between write and sync, mid-rotation, mid-snapshot,
  mid-retention) or at the n-th hit of a named storage hook point; the file
  system then drops everything not synced, or keeps a torn prefix of the
  unsynced bytes (`FaultyFileSystem.crash(tear=...)`), or -- as page-cache
  writeback does -- any subset of the unsynced 4 KiB pages, each whole or torn,
  so that a hole can come before records that survived (`crash(pages=...)`;
  recovery must cut such a hole, never an acknowledged record); and a
  **writeback** power loss: a large batch dies between its write and its sync,
  and its pages reach the disk out of order;
- **process kill** at the same kinds of moments: the process dies, the file
  system keeps every byte written (the page cache survives a SIGKILL);
- **a crash during recovery** itself (then recovery again);
- **EIO / ENOSPC on a write or a sync**, and **a full disk**: the engine must
  fail for good (no later command accepted, no write or sync ever retried), then
  restart once the fault is gone;
- **a flipped bit in a sealed segment** (recovery must refuse, naming the file,
  the record's offset and sequence number; once repaired it must start -- unless
  the segment lies wholly below the newest snapshot: then it is damaged history,
  and recovery must start with every job and report exactly that damage) and **in
  a snapshot** (recovery must fall back to an older snapshot or the log and
  rebuild the same state, or refuse when nothing else covers it).

Checks (a failure of any is a *violation*):

1. every command's answer equals the model's (`refmodel.answer_difference`);
2. after every batch the observable state equals the model's (jobs with status,
   attempt, deadlines; per-queue counts; dead letters; dedup records; the next
   deadline), and `check_invariants` holds;
3. after every restart the engine recovered records 1..k with
   released <= k <= appended, where *released* is what a reply may have been
   sent for (written, for a process kill; synced, for a power loss), and its
   state equals the model rebuilt from exactly the first k logged commands —
   including the clock — so nothing acknowledged is lost and nothing
   unacknowledged appears except a prefix of the in-doubt tail;
4. the engine then keeps working: the next cycle runs on it;
5. issue 17, apart from the model: every sweep fires what its schedules' catch-up
   policies allow and each tick at most once in the log's history, across crashes
   (`ScheduleAudit`; restarts come after a random downtime, so schedules come back
   behind); no command takes a queue's jobs in flight past its max_in_flight
   (`check_max_in_flight`, counted in the state after every command); no window
   of a rate-limited queue holds more deliveries than its limit (`RateAudit`).

Every run prints the seed; a failing seed prints `SEPP_SEED=<seed> python -m
tools.sim --seeds 1`, which replays exactly that run (nothing here reads a
clock, sleeps or depends on thread timing: snapshots are taken synchronously).

Must not import: sepp.server, sepp.client (it drives `sepp.storage` directly).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import gc
import logging
import multiprocessing
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    Record,
    decode_segment_header,
    parse_segment_file_name,
    parse_snapshot_file_name,
    scan_records,
)
from log_format._compiled import build_name
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
    Sweep,
    check_invariants,
)
from sepp.core.commands import (
    AdminDeadLetterJobs,
    AdminRequeueDeadLetters,
    CancelJobs,
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
from sepp.core.events import CAUSE_NAMES, JobEnqueued, JobReserved, ScheduleAdvanced
from sepp.core.invariants import InvariantViolation
from sepp.core.results import CommandError
from sepp.core.schedules import SCHEDULE_ON_TIME_MS, next_cron_tick
from sepp.core.state import IN_FLIGHT as CORE_IN_FLIGHT
from sepp.core.state import State
from sepp.storage import HOOK_POINTS, Engine, RecoveryError, StorageFailed, StorageOptions
from sepp.storage.faultfs import MUTATING_OPS, Crasher, FaultyFileSystem, SimulatedCrash

from .refmodel import (
    ADMIN_CHUNK_MAX,
    IN_FLIGHT,
    READY,
    SCHEDULED,
    Model,
    answer_difference,
    observe_core,
)
from .refmodel import normalise as normalise_answer

__all__ = ["SeedResult", "Violation", "main", "run_seed", "run_seeds"]

DATA_DIR = "/sim"
WAL_DIR = "/sim/wal"
SNAP_DIR = "/sim/snapshots"
T0 = 1_700_000_000_000

DISK_OPS = MUTATING_OPS - {"truncate"}

QUEUES = ("a", "b", "c")
KEYS = ("k1", "k2", "k3", "k4", "k5")

# Core configurations a seed draws from: small windows so that sweeps have work
# (leases expire, schedules come due, dedup keys and dead letters age out within
# simulated seconds), depth caps so that the state stays small.
CORE_CONFIGS: dict[str, CoreConfig] = {
    "retained": CoreConfig(
        defaults=QueuePolicy(
            default_max_attempts=2,
            retry_delay_ms=200,
            retry_backoff="exponential",
            dedup_window_ms=3_000,
            max_queue_depth=40,
            max_schedule_horizon_ms=60_000,
        ),
        dead_letter_retention_ms=4_000,
    ).with_queue("b", rate_limit_jobs=3, rate_limit_per_ms=1_000),  # issue 17
    "dropped": CoreConfig(
        defaults=QueuePolicy(dedup_window_ms=5_000, max_queue_depth=30, max_lease_duration_ms=1_500)
    ).with_queue("c", max_in_flight=2),  # issue 17: never a third of c's jobs leased
    "declared": CoreConfig(
        strict_queues=True,
        dead_letter_retention_ms=1_500,
        sweep_limit=2,
        defaults=QueuePolicy(
            retry_delay_ms=50, max_queue_depth=20, default_max_attempts=3, dedup_window_ms=1_000
        ),
    )
    .with_queue("a", max_lease_duration_ms=700, default_priority=4, max_attempts_ceiling=2)
    .with_queue("b", retry_delay_ms=0, retry_backoff="exponential"),
}


# How long the process stays down before a restart (simulated ms): schedules
# then have ticks to catch up on (several every_ms ticks, a cron minute or two).
RESTART_DOWNTIME_MS = (0, 0, 0, 1_500, 7_000, 130_000)

# The faults a cycle draws from (each counted as `fault_<name>`), and how often.
FAULTS = (
    "between",
    "op",
    "point",
    "error",
    "full",
    "flip_segment",
    "flip_snapshot",
    "writeback",
)
FAULT_WEIGHTS = (20, 35, 20, 10, 5, 6, 4, 10)


class Violation(AssertionError):
    """A broken promise found by the simulation."""


# ---------------------------------------------------------------- the process


def _kill(engine: Engine) -> None:
    """The process is gone: wake a snapshot thread that waits for durability (it
    then meets the dead file system and ends) and wait for it."""
    if engine.snapshot_running():
        engine._fail(SimulatedCrash("process died"))
    engine.wait_snapshot()
    engine.release_lock()  # the kernel drops a dead process's locks


# ---------------------------------------------------------------- the model side


@dataclass
class _Pending:
    seq: int
    run: Callable[[Model], tuple[Any, ...]]


class ModelLog:
    """The reference model as the log sees it: `base` holds exactly the commands
    up to `base_seq` (the newest seq no crash may lose), `pending` the logged
    commands after it, `live` everything answered so far."""

    def __init__(self, config: CoreConfig) -> None:
        self.base = Model(config)
        self.base_seq = 0
        self.pending: list[_Pending] = []
        self.live = self._clone(self.base)

    @staticmethod
    def _clone(model: Model) -> Model:
        return copy.deepcopy(model, {id(model.config): model.config})

    @property
    def appended_seq(self) -> int:
        return self.pending[-1].seq if self.pending else self.base_seq

    def logged(self, seq: int, run: Callable[[Model], tuple[Any, ...]]) -> None:
        if seq != self.appended_seq + 1:
            raise Violation(f"record seq {seq} logged after seq {self.appended_seq}")
        self.pending.append(_Pending(seq, run))

    def advance_base(self, seq: int) -> None:
        """Records up to `seq` are durable against every crash: fold them in."""
        while self.pending and self.pending[0].seq <= seq:
            self.pending.pop(0).run(self.base)
            self.base_seq += 1

    def recovered(self, seq: int) -> None:
        """The engine came back with records 1..seq: the model follows."""
        self.advance_base(seq)
        if self.base_seq != seq:
            raise Violation(f"recovered seq {seq}, model base at {self.base_seq}")
        self.pending.clear()
        self.live = self._clone(self.base)


# ---------------------------------------------------------------- issue 17's promises


class ScheduleAudit:
    """Issue 17's schedule promises, checked on every sweep the engine decides,
    from the schedules as the sweep found them and the events it logged -- apart
    from the model (which only says the core and it agree):

    - a fired tick is due (at or before the sweep's time, at or after the
      schedule's next tick) and is exactly one JobEnqueued of the same record,
      with the key `schedule:<name>:<tick>`;
    - per catch-up policy: `all` fires every due tick (oldest first, at most the
      sweep limit less the ticks fired before it in the sweep) and accounts for each one it passes (fired + skipped), `one`
      the newest due tick only, `none` the newest only if at most
      SCHEDULE_ON_TIME_MS late; after them the next tick is the first one
      after those handled (after the sweep's time, but for `all` at its limit);
    - no paused or not-yet-due schedule fires, and no due one is left unhandled
      (unless the sweep's limit ran out);
    - a tick fires at most once in the log's history of the schedule (one
      definition: its name and creation time), across crashes: a crash takes
      back exactly the ticks of the records it lost (`recovered`)."""

    def __init__(self) -> None:
        # (name, created_at) -> (seq, tick) of each tick fired, in log order.
        self.fired: dict[tuple[str, int], list[tuple[int, int]]] = {}

    @staticmethod
    def before(state: State) -> dict[str, tuple[Any, int, bool, Any]]:
        """The schedules as a command finds them: spec, next tick, paused, cron."""
        return {n: (s.spec, s.next_ms, s.paused, s.cron) for n, s in state.schedules.items()}

    @staticmethod
    def _after(spec: Any, cron: Any, tick: int) -> int | None:
        if spec.every_ms is not None:
            return int(tick + spec.every_ms)
        return next_cron_tick(cron, tuple(spec.zone), tick)

    def decided(
        self,
        before: dict[str, tuple[Any, int, bool, Any]],
        decision: Decision,
        seq: int,
        now: int,
        limit: int,
        stats: Counter[str],
        *,
        sweep: bool,
    ) -> None:
        """`decision` was logged at `seq` at time `now` (`sweep`: a Sweep's)."""
        enqueued: dict[str, list[int]] = {}
        for ev in decision.events:
            if type(ev) is JobEnqueued and ev.custom and "schedule_tick_ms" in ev.custom:
                name, tick = ev.custom["schedule"], ev.custom["schedule_tick_ms"]
                if ev.idempotency_key != f"schedule:{name}:{tick}":
                    raise Violation(f"tick {tick} of {name} enqueued with key {ev.idempotency_key}")
                enqueued.setdefault(name, []).append(tick)
        handled: set[str] = set()
        fired_total = 0
        for ev in decision.events:
            if type(ev) is not ScheduleAdvanced:
                continue
            name, fired = ev.name, list(ev.fired)
            where = (
                f"schedule {name} at {now}: fired {fired}, skipped {ev.skipped}, next {ev.next_ms}"
            )
            if not sweep or name not in before or name in handled:
                raise Violation(f"{where}: not a sweep, not a schedule, or handled twice")
            handled.add(name)
            spec, first, paused, cron = before[name]
            if paused or first > now:
                raise Violation(f"{where}: it was {'paused' if paused else f'not due ({first})'}")
            if fired != enqueued.pop(name, []):
                raise Violation(f"{where}: the record enqueued ticks {enqueued.get(name)}")
            due = [first]
            while len(due) < 5_000:
                nxt = self._after(spec, cron, due[-1])
                if nxt is None or nxt > now:
                    break
                due.append(nxt)
            policy = spec.catch_up
            if policy == "all":
                considered = [t for t in due if t < ev.next_ms]
                ok = (
                    bool(considered)
                    and set(fired) <= set(considered)
                    and len(fired) + ev.skipped == len(considered)
                    and ev.next_ms == self._after(spec, cron, considered[-1])
                    and (ev.next_ms > now or len(considered) >= limit - fired_total)
                )
            else:
                ok = (
                    set(fired) <= {due[-1]}
                    and len(fired) + ev.skipped == len(due)
                    and ev.next_ms == self._after(spec, cron, due[-1])
                    and (policy == "one" or not fired or now - due[-1] <= SCHEDULE_ON_TIME_MS)
                )
            if not ok:
                raise Violation(f"{where}: not what catch_up = {policy} allows (due {due[:20]})")
            history = self.fired.setdefault((name, spec.created_at), [])
            last = history[-1][1] if history else None
            if fired and last is not None and fired[0] <= last:
                raise Violation(f"{where}: tick {fired[0]} fired again (last fired {last})")
            if fired != sorted(set(fired)):
                raise Violation(f"{where}: ticks out of order or twice")
            history.extend((seq, tick) for tick in fired)
            fired_total += len(fired)
            kind = "cron" if spec.cron is not None else "every"
            stats[f"schedule_ticks_fired_{kind}_{policy}"] += len(fired)
            stats[f"schedule_ticks_skipped_{kind}_{policy}"] += ev.skipped
        if enqueued:
            raise Violation(f"ticks enqueued with no ScheduleAdvanced: {enqueued}")
        if sweep and fired_total < limit:
            for name, (_spec, first, paused, _cron) in before.items():
                if not paused and first <= now and name not in handled:
                    raise Violation(
                        f"schedule {name} due at {first} left alone by the sweep at {now}"
                    )

    def recovered(self, seq: int) -> None:
        """The engine came back with records 1..seq: later ticks never fired."""
        for history in self.fired.values():
            while history and history[-1][0] > seq:
                history.pop()


def check_max_in_flight(
    model: Model, before: dict[str, int], after: dict[str, int], what: str, stats: Counter[str]
) -> None:
    """No command takes a capped queue's in-flight jobs (counted in the state, not
    by its counters) above its max_in_flight (the model's policy): a cap lowered
    below the jobs already leased leaves them, but leases no more."""
    for queue, count in after.items():
        cap = model.policy(queue).max_in_flight
        if cap is None or count <= before.get(queue, 0):
            continue
        stats["max_in_flight_leases"] += count - before.get(queue, 0)
        stats["max_in_flight_reached"] += count == cap
        if count > cap:
            raise Violation(
                f"{what}: {count} jobs of queue {queue} in flight, max_in_flight {cap} "
                f"(before it: {before.get(queue, 0)})"
            )


# Deliveries older than this (simulated ms) are past every rate window the
# simulation sets (RateAudit forgets them).
RATE_WINDOW_MS_MAX = 10_000


class RateAudit:
    """Issue 17's rate limits, apart from the model: since a queue's rate limit
    {jobs N, per_ms M} took its present value, no window (t - M, t] holds more
    than N of its deliveries (lease grants, redeliveries included: the
    JobReserved events of the log). A crash takes back the deliveries and the
    limit changes of the records it lost (`recovered`)."""

    def __init__(self) -> None:
        self.deliveries: dict[str, list[tuple[int, int]]] = {}  # queue -> (seq, time)
        self.changes: dict[str, list[int]] = {}  # queue -> seqs that changed its limit

    @staticmethod
    def limits(model: Model) -> dict[str, tuple[int | None, int | None]]:
        policies = {queue: model.policy(queue) for queue in QUEUES}
        return {q: (p.rate_limit_jobs, p.rate_limit_per_ms) for q, p in policies.items()}

    def decided(
        self,
        before: dict[str, tuple[int | None, int | None]],
        after: dict[str, tuple[int | None, int | None]],
        decision: Decision,
        seq: int,
        state: State,
        stats: Counter[str],
    ) -> None:
        """`decision` (logged at `seq`; `before` / `after`: the limits around it)."""
        now = decision.time_ms
        for queue, limit in after.items():
            if before[queue] != limit:
                self.changes.setdefault(queue, []).append(seq)
        delivered: Counter[str] = Counter()
        for ev in decision.events:
            if type(ev) is JobReserved:
                queue = state.jobs[ev.job_id].queue
                self.deliveries.setdefault(queue, []).append((seq, now))
                delivered[queue] += 1
        for queue in delivered:
            self.deliveries[queue] = [
                (s, t) for s, t in self.deliveries[queue] if t > now - RATE_WINDOW_MS_MAX
            ]
            jobs, per_ms = after.get(queue, (None, None))
            if jobs is None or per_ms is None:
                continue
            changes = self.changes.get(queue)
            changed = changes[-1] if changes else 0
            window = sum(1 for s, t in self.deliveries[queue] if s > changed and t > now - per_ms)
            stats["rate_limited_deliveries"] += delivered[queue]
            stats["rate_limit_reached"] += window == jobs
            if window > jobs:
                raise Violation(
                    f"queue {queue}: {window} deliveries in the {per_ms} ms up to {now}, "
                    f"rate limit {jobs}"
                )

    def recovered(self, seq: int) -> None:
        """The engine came back with records 1..seq: later ones never happened."""
        for deliveries in self.deliveries.values():
            while deliveries and deliveries[-1][0] > seq:
                deliveries.pop()
        for changes in self.changes.values():
            while changes and changes[-1] > seq:
                changes.pop()


def in_flight_counts(state: State) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for job in state.jobs.values():
        if job.status == CORE_IN_FLIGHT:
            counts[job.queue] += 1
    return counts


# ---------------------------------------------------------------- the workload


class Workload:
    """Seeded commands against the model's view of the state. Each command comes
    with the same call on the model."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # The enqueued_at of each job's first delivery seen here: after an
        # operator requeue it is the token of a lease from before the requeue.
        self.first_tokens: dict[str, int] = {}

    def token(self, job_id: str, current: int) -> int | None:
        """The fencing token an ack, nack or extend carries: none (an old
        client), the delivery's, or a stale one — mostly the one from before a
        requeue of the job, when there was one."""
        first = self.first_tokens.setdefault(job_id, current)
        r = self.rng.random()
        if r < 0.25:
            return None
        if first != current and r < 0.55:
            return first
        if r < 0.3:
            return current - 1
        return current

    def job_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def advance(self, now: int) -> int:
        return now + self.rng.choice((0, 0, 1, 7, 50, 120, 400, 900, 2_500))

    def new_job(self, now: int) -> NewJob:
        rng = self.rng
        size = rng.randrange(120)
        payload = rng.randbytes(size) if size else None
        scheduled_at = None
        if rng.random() < 0.2:
            scheduled_at = now + rng.choice((-1_000, 1, 300, 2_000, 7_000, 10**9))
        custom: dict[str, str | int | float | bool] | None = None
        if rng.random() < 0.2:
            custom = {"n": rng.randrange(1000), "ok": rng.random() < 0.5, "s": "x" * 3}
        return NewJob(
            job_id=self.job_id(),
            queue=rng.choice(QUEUES) if rng.random() < 0.97 else "",
            job_type="work" if rng.random() < 0.98 else "",
            payload_data=payload,
            payload_encoding="raw" if payload else None,
            idempotency_key=rng.choice(KEYS) if rng.random() < 0.3 else None,
            priority=rng.choice((None, 0, 3, 9)),
            max_attempts=rng.choice((None, 1, 2, 3)),
            scheduled_at=scheduled_at,
            traceparent="00-trace-01" if rng.random() < 0.1 else None,
            custom=custom,
        )

    def command(self, model: Model, now: int) -> tuple[Command, Callable[[Model], Any]]:
        rng = self.rng
        r = rng.random()
        if r < 0.28:
            jobs = tuple(self.new_job(now) for _ in range(rng.choice((1, 1, 2, 3))))
            atomic = rng.random() < 0.25
            return Enqueue(jobs=jobs, atomic=atomic), lambda m: m.enqueue(jobs, atomic, now)
        if r < 0.48:
            queues = tuple(rng.sample(QUEUES, rng.randrange(1, len(QUEUES) + 1)))
            lease_ms = rng.choice((100, 600, 2_000))
            max_jobs = rng.choice((1, 1, 2, 3))
            worker = rng.choice((None, "w1", "w2"))
            order = "fair" if rng.random() < 0.3 else "strict"  # issue 17's fair reserve
            return (
                Reserve(
                    queues=queues,
                    lease_ms=lease_ms,
                    max_jobs=max_jobs,
                    worker_id=worker,
                    order=order,
                ),
                lambda m: m.reserve(queues, lease_ms, max_jobs, worker, now, order),
            )
        in_flight = sorted(j.job_id for j in model.jobs.values() if j.status == IN_FLIGHT)
        if r < 0.78 and in_flight:
            job_id = rng.choice(in_flight)
            current = model.jobs[job_id].attempt
            attempt = current if rng.random() < 0.93 else rng.choice((current - 1, current + 1))
            attempt = max(attempt, 1)
            token = self.token(job_id, model.jobs[job_id].enqueued_at)
            kind = rng.random()
            if kind < 0.45:
                return (
                    Ack(job_id=job_id, attempt=attempt, enqueued_at=token),
                    lambda m: m.ack(job_id, attempt, now, token),
                )
            if kind < 0.85:
                retry = rng.choice((RETRY_DEFAULT, RETRY_DELAY, RETRY_DEAD_LETTER))
                delay = rng.choice((0, 150, 1_000)) if retry == RETRY_DELAY else None
                reason = rng.choice((None, "boom"))
                return (
                    Nack(
                        job_id=job_id,
                        attempt=attempt,
                        retry=retry,
                        delay_ms=delay,
                        reason=reason,
                        enqueued_at=token,
                    ),
                    lambda m: m.nack(job_id, attempt, retry, delay, reason, now, token),
                )
            if kind < 0.93:
                # An attempt handed back unused (an abandoned reserve's job).
                return (
                    Release(job_id=job_id, attempt=attempt),
                    lambda m: m.release(job_id, attempt, now),
                )
            lease_ms = rng.choice((200, 1_500))
            return (
                Extend(job_id=job_id, attempt=attempt, lease_ms=lease_ms, enqueued_at=token),
                lambda m: m.extend(job_id, attempt, lease_ms, now, token),
            )
        if r < 0.88:
            return Sweep(), lambda m: m.sweep(now)
        if r < 0.94:
            queue = rng.choice((None, *QUEUES))
            most = rng.choice((1, 2, 5))
            return (
                DrainDeadLetters(queue=queue, max_records=most),
                lambda m: m.drain(queue, most, now),
            )
        if r < 0.97:
            waiting = sorted(
                j.job_id for j in model.jobs.values() if j.status in (READY, SCHEDULED)
            )
            picked = tuple(
                rng.sample(waiting, min(len(waiting), 2)) if waiting else [self.job_id()]
            )
            return (
                DeadLetterJobs(job_ids=picked, reason="operator"),
                lambda m: m.dead_letter_jobs(picked, "operator", now),
            )
        dead = [d.job.job_id for d in model.dead]
        chosen = tuple(rng.sample(dead, min(len(dead), 2)) if dead else [self.job_id()])
        if rng.random() < 0.5:
            return RequeueDeadLetters(job_ids=chosen), lambda m: m.requeue(chosen, now)
        return self.admin(model, now)

    def admin(self, model: Model, now: int) -> tuple[Command, Any]:
        """An operator's command of issue 15 (logged with an AdminAction header)."""
        rng = self.rng
        actor, role = "ann", rng.choice(("operator", "admin"))
        kind = rng.choice(
            (
                "cancel",
                "dead_letter",
                "delete",
                "requeue",
                "by_filter",
                "pause",
                "resume",
                "resume",
                "purge",
                "put_queue",
                "delete_queue",
                "schedule",
                "schedule",
            )
        )
        if kind == "schedule":
            return self.schedule(now)
        if kind in ("cancel", "dead_letter"):
            waiting = sorted(
                j.job_id for j in model.jobs.values() if j.status in (READY, SCHEDULED)
            )
            ids = (*rng.sample(waiting, min(len(waiting), 2)), self.job_id())
            if kind == "cancel":
                return CancelJobs(job_ids=ids, actor=actor, role=role), lambda m: m.live_jobs_admin(
                    ids, False, None, now
                )
            return AdminDeadLetterJobs(
                job_ids=ids, reason="op", actor=actor, role=role
            ), lambda m: m.live_jobs_admin(ids, True, "op", now)
        if kind in ("delete", "requeue"):
            dead = [d.job.job_id for d in model.dead]
            ids = (*rng.sample(dead, min(len(dead), 2)), self.job_id())
            if kind == "delete":
                return DeleteDeadLetters(
                    job_ids=ids, actor=actor, role=role
                ), lambda m: m.delete_dead_letters(ids, now)
            return AdminRequeueDeadLetters(
                job_ids=ids, reason="again", actor=actor, role=role
            ), lambda m: m.dead_letters_admin(ids, None, None, ADMIN_CHUNK_MAX, True, now)
        if kind == "by_filter":
            return self.dead_letters_by_filter(actor, role, now)
        if kind == "delete_queue" and not model.overrides and rng.random() < 0.8:
            kind = "put_queue"  # define one first, mostly
        queue = rng.choice(QUEUES)
        if kind == "purge":
            most = rng.choice((1, 2, 1000))
            return PurgeQueue(
                queue=queue, max_jobs=most, reason="flush", actor=actor, role=role
            ), lambda m: m.purge(queue, most, now)
        if kind == "put_queue":
            overrides = rng.choice(QUEUE_OVERRIDES)
            return PutQueue(
                queue=queue, overrides=overrides, actor="root", role="admin"
            ), lambda m: m.put_queue(queue, dict(overrides), now)
        if kind == "delete_queue":
            if model.overrides and rng.random() < 0.8:
                queue = rng.choice(sorted(model.overrides))
            return DeleteQueue(queue=queue, actor="root", role="admin"), lambda m: m.delete_queue(
                queue, now
            )
        if kind == "pause":
            return PauseQueue(queue=queue, actor=actor, role=role), lambda m: m.pause(
                queue, True, now
            )
        return ResumeQueue(queue=queue, actor=actor, role=role), lambda m: m.pause(
            queue, False, now
        )

    def schedule(self, now: int) -> tuple[Command, Any]:
        """A schedule command of issue 17: fixed intervals, or crons of the model's
        vocabulary (`refmodel.cron_period_ms`), now and then one that does not parse."""
        rng = self.rng
        name = rng.choice(("s1", "s2"))
        actor, role = "ann", rng.choice(("operator", "admin"))
        roll = rng.random()
        if roll < 0.5:
            queue = rng.choice(QUEUES)
            every: int | None = rng.choice((1_000, 2_500))
            cron: str | None = None
            if rng.random() < 0.5:
                every, cron = None, rng.choice(SIM_CRONS)
            catch_up = rng.choice(("none", "one", "all"))
            command = PutSchedule(
                actor=actor, role=role, name=name, queue=queue, job_type="tick",
                every_ms=every, cron=cron, catch_up=catch_up,
            )  # fmt: skip
            return command, lambda m: m.put_schedule(
                name, queue, "tick", every, catch_up, now, cron=cron
            )
        if roll < 0.85:
            pause = roll < 0.65
            cls = PauseSchedule if pause else ResumeSchedule
            return cls(actor=actor, role=role, name=name), lambda m: m.pause_schedule(
                name, pause, now
            )
        return DeleteSchedule(actor=actor, role=role, name=name), lambda m: m.delete_schedule(
            name, now
        )

    def dead_letters_by_filter(self, actor: str, role: str, now: int) -> tuple[Command, Any]:
        """A requeue or delete of dead letters by queue and / or cause, in a chunk;
        now and then ids and a filter together (refused)."""
        rng = self.rng
        queue = rng.choice((None, *QUEUES))
        cause = rng.choice((None, *sorted(CAUSE_NAMES)))
        if queue is None and cause is None:
            queue = rng.choice(QUEUES)
        ids: tuple[str, ...] = (self.job_id(),) if rng.random() < 0.05 else ()
        most = rng.choice((1, 2, 1000))
        requeue = rng.random() < 0.5
        command = AdminRequeueDeadLetters if requeue else DeleteDeadLetters
        return command(
            job_ids=ids, queue=queue, cause=cause, max_jobs=most, actor=actor, role=role
        ), lambda m: m.dead_letters_admin(ids, queue, cause, most, requeue, now)


# The crons the simulation puts (issue 17): every one, two or three minutes (the
# simulated clock runs a minute or two per seed, longer across the downtime of a
# restart), and one that does not parse (refused by both).
SIM_CRONS = ("* * * * *", "*/1 * * * *", "*/2 * * * *", "*/3 * * * *", "61 * * * *")

# Runtime queue definitions the simulation puts (issue 15): valid ones (some
# change delivery: lease cap, default priority and attempts, retry delay, depth),
# the same again (changed=False), ones the configuration rules refuse against a
# file's queue (a default above its ceiling), and unknown / restart-only keys.
QUEUE_OVERRIDES: tuple[dict[str, int | str], ...] = (
    {},
    {"default_priority": 7},
    {"default_priority": 2, "default_max_attempts": 1},
    {"max_lease_duration_ms": 400, "retry_delay_ms": 0},
    {"retry_backoff": "exponential", "retry_delay_ms": 30},
    {"max_queue_depth": 3},
    {"default_max_attempts": 3},
    {"dedup_window_ms": 5},
    {"max_in_flight": 1},
    {"max_in_flight": 2, "max_lease_duration_ms": 900},
    {"rate_limit_jobs": 2, "rate_limit_per_ms": 1_500},
    {"rate_limit_jobs": 1, "rate_limit_per_ms": 300, "max_in_flight": 2},
    {"rate_limit_jobs": 4},  # refused: jobs and per_ms are set together
    {"weight": 3},
    {"no_such_setting": 1},
    {"default_priority": "high"},
)


# ---------------------------------------------------------------- one run


@dataclass
class SeedResult:
    seed: int
    cycles: int = 0
    operations: int = 0
    violation: str | None = None
    stats: Counter[str] = field(default_factory=Counter)


def _observed(state_view: dict[str, Any], *, with_clock: bool) -> dict[str, Any]:
    if with_clock:
        return state_view
    return {k: v for k, v in state_view.items() if k != "clock"}


def _first_difference(core: dict[str, Any], model: dict[str, Any]) -> str | None:
    for key in model:
        if core.get(key) != model[key]:
            return f"{key}: core {core.get(key)!r:.600} != model {model[key]!r:.600}"
    return None


def _segment_paths(fs: FaultyFileSystem) -> list[str]:
    names = [n for n in fs.listdir(WAL_DIR) if parse_segment_file_name(n) is not None]
    return [f"{WAL_DIR}/{n}" for n in sorted(names)]


def _snapshot_paths(fs: FaultyFileSystem) -> list[str]:
    names = [n for n in fs.listdir(SNAP_DIR) if parse_snapshot_file_name(n) is not None]
    return [f"{SNAP_DIR}/{n}" for n in sorted(names)]


class Sim:
    """One seeded run: a data directory on the fake file system, an engine, the
    model, and crash/restart cycles."""

    def __init__(self, seed: int, *, commands_max: int = 6) -> None:
        self.seed = seed
        self.rng = rng = random.Random(f"sepp-sim:{seed}")
        self.config_name = rng.choice(sorted(CORE_CONFIGS))
        self.config = CORE_CONFIGS[self.config_name]
        self.options = StorageOptions(
            persist_mode=rng.choice(("sync_all", "sync_data", "buffer")),
            segment_bytes_max=rng.choice((4096, 4096, 8192, 65536)),
            snapshot_every_bytes=0,
            snapshot_mode="inline",
            snapshots_kept=rng.choice((1, 2)),
            log_retention_ms=rng.choice((0, 0, 3_000)),
        )
        self.buffered = self.options.persist_mode == "buffer"
        self.snapshot_p = rng.choice((0.0, 0.05, 0.2))
        self.commands_max = commands_max
        self.fs = FaultyFileSystem()
        self.crasher = Crasher()
        self.fs.hook = self.crasher.fs_hook
        self.model = ModelLog(self.config)
        self.workload = Workload(rng)
        self.now = T0
        # Released to a client: written (durable against a process kill) and
        # synced (durable against a power loss). Equal except in buffer mode.
        self.written_seq = 0
        self.synced_seq = 0
        self.result = SeedResult(seed)
        self.stats = self.result.stats
        self.power_lost_in_recovery = False
        self.audit = ScheduleAudit()
        self.rates = RateAudit()
        self.engine = self._open()

    # -- the process ---------------------------------------------------------

    def _open(self) -> Engine:
        while True:
            try:
                return Engine.open(
                    DATA_DIR,
                    self.config,
                    self.options,
                    fs=self.fs,
                    hook=self.crasher.engine_hook,
                )
            except SimulatedCrash:
                # Died while recovering: recovery must be repeatable.
                self.stats["crashed_in_recovery"] += 1
                if self.rng.random() < 0.5:
                    self.fs.crash(self.rng, tear=True, pages=self.rng.random() < 0.5)
                    self.power_lost_in_recovery = True
                self.crasher.reset()

    def _synced(self, seq: int) -> None:
        self.synced_seq = max(self.synced_seq, seq)
        self.model.advance_base(self.synced_seq)

    def step(self, commands: int | None = None) -> None:
        """One batch: commands (each compared with the model; `commands` of them,
        else a random number), one flush, perhaps a sync or a snapshot, then the
        whole state compared with the model.
        Raises SimulatedCrash (the process died) or StorageFailed."""
        engine, rng, model = self.engine, self.rng, self.model
        if commands is None:
            commands = rng.randrange(1, self.commands_max + 1)
        for _ in range(commands):
            self.now = self.workload.advance(self.now)
            command, on_model = self.workload.command(model.live, self.now)
            state = engine.state
            schedules = ScheduleAudit.before(state) if state.schedules else {}
            capped = any(model.live.policy(q).max_in_flight is not None for q in QUEUES)
            leased = in_flight_counts(state) if capped else {}
            limits = RateAudit.limits(model.live)
            decision, barrier = engine.execute(command, self.now)
            expected = on_model(model.live)
            if type(decision) is Decision and decision.events:
                self.rates.decided(
                    limits, RateAudit.limits(model.live), decision, barrier, state, self.stats
                )
            if capped:
                check_max_in_flight(
                    model.live, leased, in_flight_counts(state), type(command).__name__, self.stats
                )
            if type(decision) is Decision and (schedules or type(command) is Sweep):
                self.audit.decided(
                    schedules,
                    decision,
                    barrier,
                    self.now,
                    self.config.sweep_limit,
                    self.stats,
                    sweep=type(command) is Sweep,
                )
            self.result.operations += 1
            difference = answer_difference(normalise_answer(decision), expected)
            if difference is not None:
                raise Violation(f"{type(command).__name__}: {difference}")
            if type(decision) is Decision and decision.events:
                model.logged(barrier, on_model)
            elif not isinstance(decision, Decision | CommandError):
                raise Violation(f"unexpected decision {decision!r}")
        self.written_seq = engine.flush()
        if not self.buffered:
            self._synced(self.written_seq)
        elif rng.random() < 0.4:
            engine.sync()  # buffer mode: only a sync makes written records durable
            self._synced(self.written_seq)
        if rng.random() < self.snapshot_p:
            before = engine.snapshot_seq
            published = engine.snapshot_now()
            self.stats["snapshots"] += 1
            if self.crasher.dead:
                raise SimulatedCrash("died in the snapshot thread")
            self.written_seq = engine.durable_seq
            if not self.buffered:
                self._synced(self.written_seq)
            elif published != before:
                self._synced(published)  # publication syncs the log under it first
        self.check_live()

    def check_live(self) -> None:
        state = self.engine.state
        try:
            check_invariants(state)
        except InvariantViolation as exc:
            raise Violation(f"invariant broken: {exc}") from exc
        difference = _first_difference(
            _observed(observe_core(state), with_clock=False),
            _observed(self.model.live.observe(), with_clock=False),
        )
        if difference is not None:
            raise Violation(f"live state differs from the model: {difference}")

    def run_until_crash(self, steps_max: int) -> bool:
        for _ in range(steps_max):
            try:
                self.step()
            except SimulatedCrash:
                return True
        return False

    def restart(self, *, power_loss: bool, tear: bool, pages: bool | None = None) -> None:
        """The process is gone; a new one recovers the data directory. A torn power
        loss keeps an in-order prefix of the unsynced writes, or (`pages`; None: a
        coin decides) their pages out of order."""
        self.crasher.dead = True
        _kill(self.engine)
        if power_loss:
            if pages is None:
                pages = tear and self.rng.random() < 0.5
            self.stats["power_loss_pages"] += pages
            self.fs.crash(self.rng, tear=tear, pages=pages)
            released = self.synced_seq
        else:
            released = self.written_seq
        self.crasher.reset()
        if self.rng.random() < 0.15:
            self.crasher.arm_ops(self.rng.randrange(1, 5))
        self.power_lost_in_recovery = False
        # The server is down a while: schedules come back behind (their catch-up),
        # leases and delays lapse meanwhile.
        self.now += self.rng.choice(RESTART_DOWNTIME_MS)
        self.engine = self._open()
        self.crasher.reset()
        if self.power_lost_in_recovery:
            # A power loss during the next start loses what the killed process
            # had written but not synced (buffer mode's documented window).
            released = min(released, self.synced_seq)
        self.check_recovered(released)

    def check_recovered(self, released: int) -> None:
        engine = self.engine
        seq = engine.appended_seq
        appended = self.model.appended_seq
        if not released <= seq <= appended:
            raise Violation(
                f"recovered up to seq {seq}; released {released}, appended {appended}"
                + (" (an acknowledged record was lost)" if seq < released else "")
            )
        if engine.durable_seq != seq:
            raise Violation(f"recovered durable seq {engine.durable_seq} != appended {seq}")
        self.stats["kept_in_doubt"] += seq > released
        self.stats["lost_in_doubt"] += seq < appended
        self.stats["truncated"] += engine.recovery_report.truncated is not None
        self.stats["cut_unsynced_hole"] += engine.recovery_report.unsynced_hole is not None
        self.model.recovered(seq)
        self.audit.recovered(seq)
        self.rates.recovered(seq)
        self.written_seq = self.synced_seq = seq
        try:
            check_invariants(engine.state)
        except InvariantViolation as exc:
            raise Violation(f"invariant broken after recovery: {exc}") from exc
        difference = _first_difference(observe_core(engine.state), self.model.live.observe())
        if difference is not None:
            raise Violation(f"recovered state differs from the model at seq {seq}: {difference}")
        tmp = [n for n in self.fs.listdir(SNAP_DIR) if n.endswith(".tmp")]
        if tmp:
            raise Violation(f"snapshot temp files left after recovery: {tmp}")
        self.result.cycles += 1

    # -- faults --------------------------------------------------------------

    def cycle(self) -> None:
        rng = self.rng
        fault = rng.choices(FAULTS, weights=FAULT_WEIGHTS)[0]
        self.stats[f"fault_{fault}"] += 1
        if fault == "between":
            for _ in range(rng.randrange(0, 8)):
                self.step()
            self.restart(power_loss=rng.random() < 0.6, tear=rng.random() < 0.5)
        elif fault == "op":
            self.crasher.arm_ops(rng.randrange(1, 80))
            if self.run_until_crash(300):
                op = (self.crasher.killed_at or "? ?").split(" ")[1]
                self.stats[f"died_before_{op}"] += 1
            self.restart(power_loss=rng.random() < 0.6, tear=rng.random() < 0.5)
        elif fault == "point":
            point = rng.choice(HOOK_POINTS)
            self.crasher.arm_point(point, rng.randrange(1, 4))
            if self.run_until_crash(60):
                self.stats[f"died_at_{point}"] += 1
            self.restart(power_loss=rng.random() < 0.6, tear=rng.random() < 0.5)
        elif fault == "writeback":
            for _ in range(rng.randrange(0, 4)):
                self.step()
            # A batch of several 4 KiB pages dies between its write and its sync;
            # its pages (and in buffer mode earlier unsynced ones) reach the disk
            # out of order: a hole can come before records that survived.
            self.crasher.arm_point("wal.after_write", 1)
            with contextlib.suppress(SimulatedCrash):
                self.step(commands=rng.randrange(8, 80))
            self.restart(power_loss=True, tear=True, pages=True)
        elif fault in ("error", "full"):
            self.disk_error(full=fault == "full")
        elif fault == "flip_segment":
            self.flip_segment()
        else:
            self.flip_snapshot()

    def disk_error(self, *, full: bool) -> None:
        rng = self.rng
        for _ in range(rng.randrange(0, 4)):
            self.step()
        if full:
            # Not counting the active segment's preallocated zeros (freed at
            # rotation; when they do not fit the log goes on without them).
            active = self.engine.segments[-1]
            zeros = self.fs.size(active.path) - active.size
            used = sum(len(d) for d in self.fs.durable_files().values()) - zeros
            self.fs.capacity_bytes = used + rng.randrange(500, 20_000)
            expected_errno = errno.ENOSPC
        else:
            sync_op = "fdatasync" if self.options.persist_mode == "sync_data" else "fsync"
            op = rng.choice(("write", sync_op))
            expected_errno = rng.choice((errno.EIO, errno.ENOSPC))
            self.fs.fail(op, expected_errno, path_contains="/wal/", times=1)
        self.fs.record_ops = True
        self.fs.ops.clear()
        failed = False
        for _ in range(400):
            try:
                self.step()
            except StorageFailed:
                if self.engine.failure is not None:
                    failed = True
                    break
                # A snapshot that did not fit: reported, the log goes on.
                self.stats["snapshot_failed"] += 1
        self.fs.record_ops = False
        if not failed:
            # In buffer mode a sync fault may never be reached in 400 batches.
            self.fs.clear_faults()
            self.fs.capacity_bytes = None
            self.restart(power_loss=rng.random() < 0.5, tear=True)
            return
        failure = self.engine.failure
        if not isinstance(failure, OSError) or failure.errno != expected_errno:
            raise Violation(f"engine failed with {failure!r}, expected errno {expected_errno}")
        mark = len(self.fs.ops)
        self.fs.record_ops = True
        for attempt in (
            lambda: self.engine.execute(Sweep(), self.now),
            self.engine.flush,
            self.engine.sync,
        ):
            try:
                attempt()
            except StorageFailed:
                continue
            raise Violation("a failed engine accepted more work")
        self.fs.record_ops = False
        later = [(op, path) for op, path in self.fs.ops[mark:] if op in DISK_OPS]
        if later:
            raise Violation(f"the failed engine touched the disk again: {later[:3]}")
        self.stats["failed_for_good"] += 1
        self.engine.close()
        self.fs.clear_faults()
        self.fs.capacity_bytes = None  # space is back
        self.restart(power_loss=rng.random() < 0.5, tear=True)

    def _quiesce(self) -> None:
        """A clean stop: everything written and synced, then a fresh open."""
        self.engine.close()
        self.written_seq = self.engine.durable_seq
        self._synced(self.written_seq)
        self.engine = self._open()
        self.check_recovered(self.synced_seq)

    def flip_segment(self) -> None:
        rng = self.rng
        for _ in range(rng.randrange(2, 12)):
            self.step()
        self.engine.close()
        self.written_seq = self.engine.durable_seq
        self._synced(self.written_seq)
        sealed = _segment_paths(self.fs)[:-1]
        if not sealed:
            self.engine = self._open()
            self.check_recovered(self.synced_seq)
            return
        path = rng.choice(sealed)
        data = self.fs.read(path)
        offset = rng.randrange(len(data))
        expected = _expected_refusal(data, offset)
        # Recovery rows 15, 17: damage wholly below the newest snapshot (by the
        # next segment's name) is history -- started past and reported.
        names = [parse_segment_file_name(p.rsplit("/", 1)[1]) or 0 for p in _segment_paths(self.fs)]
        snaps = [
            parse_snapshot_file_name(p.rsplit("/", 1)[1]) or 0 for p in _snapshot_paths(self.fs)
        ]
        following = names[_segment_paths(self.fs).index(path) + 1]
        history = bool(snaps) and following - 1 <= max(snaps)
        self.fs.flip_bit(path, offset, 0)
        try:
            started = Engine.open(DATA_DIR, self.config, self.options, fs=self.fs)
        except RecoveryError as exc:
            if history:
                raise Violation(
                    f"a flipped bit in history {path} at {offset} (below the snapshot at "
                    f"{max(snaps)}) refused to start: {exc}"
                ) from exc
            where = (exc.path, exc.offset, exc.seq)
            if where != (path, *expected) or "sepp-log verify" not in str(exc):
                raise Violation(
                    f"flipped bit at {path}:{offset}: refusal names {where}, expected "
                    f"{(path, *expected)}: {exc}"
                ) from exc
        else:
            damaged = [(h.path, h.offset, h.seq) for h in started.recovery_report.damaged_history]
            if not history or damaged != [(path, *expected)]:
                started.close()
                raise Violation(
                    f"a flipped bit in sealed segment {path} at {offset} was not noticed "
                    f"as expected (history: {history}, reported: {damaged})"
                )
            # Every job is there: the snapshot holds the state.
            self.engine = started
            self.check_recovered(self.synced_seq)
            started.close()
            self.stats["started_past_damaged_history"] += 1
            self.fs.flip_bit(path, offset, 0)  # the operator restores the file
            self.engine = self._open()
            self.check_recovered(self.synced_seq)
            return
        self.stats["refused_flipped_bit"] += 1
        self.fs.flip_bit(path, offset, 0)  # the operator restores the file
        self.engine = self._open()
        self.check_recovered(self.synced_seq)

    def flip_snapshot(self) -> None:
        rng = self.rng
        for _ in range(rng.randrange(2, 12)):
            self.step()
        self.engine.snapshot_now()
        self.engine.close()
        self.written_seq = self.engine.durable_seq
        self._synced(self.written_seq)
        snapshots = _snapshot_paths(self.fs)
        if not snapshots:  # nothing logged yet, or nothing new since a damaged one
            self.engine = self._open()
            self.check_recovered(self.synced_seq)
            return
        path = rng.choice(snapshots)
        data = self.fs.read(path)
        offset = rng.randrange(len(data))
        self.fs.flip_bit(path, offset, rng.randrange(8))
        try:
            self.engine = Engine.open(DATA_DIR, self.config, self.options, fs=self.fs)
        except RecoveryError as exc:
            # Acceptable only when nothing else covers the log's head.
            first_log = min(
                (parse_segment_file_name(p.rsplit("/", 1)[1]) or 0) for p in _segment_paths(self.fs)
            )
            others = [p for p in snapshots if p != path]
            if first_log <= 1 or any(
                (parse_snapshot_file_name(p.rsplit("/", 1)[1]) or 0) + 1 >= first_log
                for p in others
            ):
                raise Violation(f"damaged snapshot {path} refused although covered: {exc}") from exc
            if exc.path is None:
                raise Violation(f"refusal does not name the file: {exc}") from exc
            self.stats["refused_damaged_snapshot"] += 1
            self.fs.put(path, data)  # the operator restores the file
            self.engine = self._open()
            self.check_recovered(self.synced_seq)
            return
        skipped = [p for p, _reason in self.engine.recovery_report.skipped_snapshots]
        if skipped != [path] and path == snapshots[-1]:
            raise Violation(f"damaged newest snapshot {path} was used (skipped: {skipped})")
        self.stats["fell_back_from_snapshot"] += path in skipped
        self.check_recovered(self.synced_seq)

    def finish(self) -> None:
        """A clean shutdown and restart keeps everything; commands go on after it."""
        self._quiesce()
        for _ in range(3):
            self.step()
        self._quiesce()


def _expected_refusal(data: bytes, offset: int) -> tuple[int, int | None]:
    """(offset, seq) a refusal must name for bit 0 of `data[offset]` flipped in a
    sealed segment: the header (offset 0), or the record holding the byte."""
    if offset < FILE_HEADER_BYTES:
        return 0, None
    first_seq = decode_segment_header(data).first_seq
    records = [
        item
        for item in scan_records(data, start_offset=FILE_HEADER_BYTES, expected_seq=first_seq)
        if type(item) is Record
    ]
    record = max((r for r in records if r.offset <= offset), key=lambda r: r.offset)
    return record.offset, record.seq


def run_seed(seed: int, *, cycles: int | None = None) -> SeedResult:
    """One whole seeded run; never raises for a violation (it is in the result)."""
    with _simulated_process():
        return _run_seed(seed, cycles)


def _run_seed(seed: int, cycles: int | None) -> SeedResult:
    sim: Sim | None = None
    try:
        sim = Sim(seed)
        for _ in range(cycles if cycles is not None else sim.rng.randrange(2, 7)):
            sim.cycle()
        sim.finish()
        return sim.result
    except Violation as exc:
        result = sim.result if sim is not None else SeedResult(seed)
        result.violation = str(exc)
        return result
    except (SimulatedCrash, StorageFailed, RecoveryError, OSError, AssertionError) as exc:
        result = sim.result if sim is not None else SeedResult(seed)
        result.violation = f"unexpected {type(exc).__name__}: {exc}"
        return result


# ---------------------------------------------------------------- many runs


@dataclass
class Summary:
    seeds: int = 0
    cycles: int = 0
    operations: int = 0
    failures: list[SeedResult] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.cycles += result.cycles
        self.operations += result.operations
        self.stats.update(result.stats)
        if result.violation is not None:
            self.failures.append(result)


@contextlib.contextmanager
def _simulated_process() -> Iterator[None]:
    """While a seed runs: a SimulatedCrash that ends the engine's snapshot thread
    is the simulated process dying, not an error to report; and the storage's
    "failed permanently" / "not published" log lines are expected."""
    previous = threading.excepthook
    storage_log = logging.getLogger("sepp.storage")
    level = storage_log.level

    def hook(args: Any) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, SimulatedCrash):
            return
        previous(args)

    threading.excepthook = hook
    storage_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        threading.excepthook = previous
        storage_log.setLevel(level)


def _run_chunk(seeds: list[int]) -> Summary:
    summary = Summary()
    try:
        for index, seed in enumerate(seeds):
            summary.add(run_seed(seed))
            if index % 50 == 49:
                # Engine.open freezes the heap (gc.freeze); give old runs back.
                gc.unfreeze()
                gc.collect()
    finally:
        gc.unfreeze()
    return summary


def run_seeds(
    seeds: Iterable[int], *, jobs: int = 1, on_progress: Callable[[Summary], None] | None = None
) -> Summary:
    seeds = list(seeds)
    total = Summary()
    chunk = 200
    chunks = [seeds[i : i + chunk] for i in range(0, len(seeds), chunk)]
    if jobs <= 1:
        for part in chunks:
            _merge(total, _run_chunk(part))
            if on_progress is not None:
                on_progress(total)
        return total
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs) as pool:
        for summary in pool.imap(_run_chunk, chunks):
            _merge(total, summary)
            if on_progress is not None:
                on_progress(total)
    return total


def _merge(total: Summary, part: Summary) -> None:
    total.seeds += part.seeds
    total.cycles += part.cycles
    total.operations += part.operations
    total.failures.extend(part.failures)
    total.stats.update(part.stats)


def replay_command(seed: int) -> str:
    return f"SEPP_SEED={seed} python -m tools.sim --seeds 1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.sim",
        description="Seeded crash/restart simulation of sepp's storage against the reference model.",
    )
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to run")
    parser.add_argument(
        "--seed", type=int, help="first seed (default: $SEPP_SEED, else a random one)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.seed is not None:
        first = args.seed
    elif os.environ.get("SEPP_SEED"):
        first = int(os.environ["SEPP_SEED"])
    else:
        first = random.SystemRandom().randrange(2**32)
    print(
        f"sepp sim: seeds {first}..{first + args.seeds - 1} (SEPP_SEED={first}), "
        f"build {build_name()}",
        flush=True,
    )
    started = time.monotonic()

    def progress(summary: Summary) -> None:
        if not args.quiet:
            print(
                f"  {summary.seeds} seeds, {summary.cycles} crash/restart cycles, "
                f"{summary.operations} operations, {len(summary.failures)} violations "
                f"({time.monotonic() - started:.0f}s)",
                flush=True,
            )

    summary = run_seeds(range(first, first + args.seeds), jobs=args.jobs, on_progress=progress)
    elapsed = time.monotonic() - started
    for failure in summary.failures[:20]:
        print(f"VIOLATION seed {failure.seed}: {failure.violation}", flush=True)
        print(f"  replay: {replay_command(failure.seed)}", flush=True)
    print(
        f"sepp sim: {summary.seeds} seeds, {summary.cycles} crash/restart cycles survived, "
        f"{summary.operations} operations checked, {len(summary.failures)} violations "
        f"in {elapsed:.1f}s (SEPP_SEED={first})"
    )
    interesting = ", ".join(f"{k}={v}" for k, v in sorted(summary.stats.items()))
    print(f"  coverage: {interesting}")
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
