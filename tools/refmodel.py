"""A small, obviously-correct reference model of sepp's job semantics, and how
to compare the real core with it.

Written from sepp-semantics.md (§4-§15) and the project decisions listed in the
test brief, not from the core: plain dicts and lists, linear scans, sorting on
every reserve, no heaps and no lazy deletion. Two users drive it and the real core
with the same commands and compare every answer and the observable state:
`tests/core/test_stateful.py` (hypothesis, in memory) and `tools/sim.py` (the
seeded crash/restart simulation over the fault-injecting file system).

Where the documentation leaves the order of checks open (a job that breaks two
limits at once), the model answers with the *set* of acceptable rejections or
error classes, and the comparison accepts any member.

Replies are plain tuples:
    ("error", {error class names})
    ("enqueue", [("ok", job_id, deduplicated) | ("rej", {(reason, fields), ...})])
    ("atomic_rejected", [(index, {(reason, fields), ...})])
    ("reserve", [delivered job tuple, in the field order of results.JobView])
    ("ack", job_id) / ("nack", job_id, dead_lettered) / ("extend", job_id, deadline)
    ("release", job_id)
    ("drain", [(job_id, queue, cause, failed_at, final_attempt, reason, attempt)])
    ("sweep", (promoted, redelivered, dead_lettered, dedup_expired, dead_expired,
               schedule_ticks_fired, schedule_ticks_skipped))
    ("schedule", name, created, changed, paused, next_ms)
    ("admin", affected ids, refused ids)

`normalise` turns the core's answer into that vocabulary, `same_answer` compares
one with the model's, `observe_core` is the core-side twin of `Model.observe`.

Moved here from tests/core/model.py so that `tools/sim.py` can use it; it is
importable by tools and tests alike. Must not import: sepp.storage, sepp.server,
sepp.client (the model is pure: no I/O, no clock, no randomness).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import unicodedata
import zlib
from dataclasses import dataclass
from typing import Any

from sepp.core import ConfigError, CoreConfig, Decision, NewJob, QueuePolicy, validate_config
from sepp.core.events import CAUSE_NAMES
from sepp.core.results import (
    Accepted,
    AckResult,
    AdminOutcomes,
    AdminResult,
    AtomicRejected,
    CommandError,
    DeleteQueueResult,
    DrainResult,
    EnqueueResult,
    ExtendResult,
    InvalidRequest,
    NackResult,
    PurgeResult,
    PutQueueResult,
    QueueAdminResult,
    ReleaseResult,
    ReserveResult,
    ScheduleResult,
    SweepResult,
)
from sepp.core.state import QUEUE_OVERRIDE_KEYS, STATUS_NAMES, State

READY = "ready"
SCHEDULED = "scheduled"
IN_FLIGHT = "in_flight"

IA = "InvalidArgument"
# ADMIN_IDS_PER_CALL_MAX and ADMIN_JOBS_PER_CHUNK_MAX of the admin commands (issue 15).
ADMIN_CHUNK_MAX = 1000
# PROTOCOL.md conventions: the latest time the server stores or sends
# (9999-12-31T23:59:59.999Z); deadlines are clamped to it.
TIME_MS_MAX = 253_402_300_799_999
NOT_FOUND = "NotFound"
MISMATCH = "AttemptMismatch"
PRECONDITION = "FailedPrecondition"

UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)

Problems = set[tuple[str, tuple[Any, ...]]]


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def valid_queue_name(name: object) -> bool:
    """§12: non-empty, not '.' or '..', no '/', no control characters."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and not any(unicodedata.category(c) == "Cc" for c in name)
    )


def canonical_id(job_id: object) -> str | None:
    if isinstance(job_id, str) and UUID_TEXT.fullmatch(job_id):
        return job_id.lower()
    return None


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def policy_delay(policy: QueuePolicy, job_id: str, attempt: int) -> int:
    """§6 with exact integers: growth, cap, jitter = crc32("id:attempt") mod (d//4+1)."""
    base = policy.retry_delay_ms
    if base == 0:
        return 0
    growth: int = base * 2 ** (attempt - 1) if policy.retry_backoff == "exponential" else base
    d: int = min(growth, policy.retry_delay_max_ms, policy.max_schedule_horizon_ms)
    return d - zlib.crc32(f"{job_id}:{attempt}".encode()) % (d // 4 + 1)


@dataclass
class MJob:
    job_id: str
    queue: str
    job_type: str
    payload_data: bytes | None
    payload_encoding: str | None
    priority: int
    max_attempts: int
    enqueued_at: int
    scheduled_at: int | None
    traceparent: str | None
    tracestate: str | None
    custom: dict[str, Any] | None
    attempt: int = 1
    status: str = READY
    due: int = 0  # Scheduled: when it becomes Ready. In flight: the lease deadline.
    last_reason: str | None = None
    # Arrival number: ties of enqueued_at are served in arrival order.
    arrival: int = 0

    def delivered(self) -> tuple[Any, ...]:
        """The job as a worker receives it, in JobView field order."""
        return (
            self.job_id,
            self.queue,
            self.job_type,
            self.payload_data,
            self.payload_encoding,
            self.priority,
            self.max_attempts,
            self.attempt,
            self.enqueued_at,
            self.scheduled_at,
            self.due,
            self.traceparent,
            self.tracestate,
            self.custom,
        )


@dataclass
class MSchedule:
    name: str
    queue: str
    job_type: str
    every_ms: int
    catch_up: str
    created_at: int
    next: int  # the first tick not yet fired
    paused: bool = False
    # A cron schedule ("*/k * * * *" in UTC, k dividing 60: see cron_period_ms):
    # its ticks are the multiples of every_ms = k minutes since the epoch.
    cron: str | None = None


def cron_period_ms(cron: str) -> int | None:
    """The model's cron vocabulary, plainly: `* * * * *` and `*/k * * * *` with k
    dividing 60 fire at every multiple of k minutes since the epoch (in UTC, an
    hour and a day are whole numbers of k minutes). None: not in the vocabulary."""
    fields = cron.split()
    if len(fields) != 5 or fields[1:] != ["*"] * 4:
        return None
    minute = fields[0]
    step = "1" if minute == "*" else minute.removeprefix("*/")
    if not step.isdigit() or minute not in ("*", f"*/{step}") or int(step) not in (1, 2, 3, 5):
        return None
    return int(step) * 60_000


def fair_key(row: list[int], weight: int) -> int:
    """A queue's place in a fair reserve (smallest first): the number its turn
    was granted at while the turn lasts (fewer than `weight` deliveries), else
    the number of its newest delivery. row = [newest, turn granted at, count]."""
    newest, granted, count = row
    return granted if 0 < count < weight else newest


def fair_step(row: list[int], weight: int, seq: int) -> None:
    """The queue of `row` got delivery number `seq`: a finished (or no) turn
    starts a new one, granted at the key it had; else the turn goes on."""
    newest, _granted, count = row
    if count == 0 or count >= weight:
        row[1] = newest
        row[2] = 1
    else:
        row[2] = count + 1
    row[0] = seq


def schedule_job_id(name: str, created_at: int, tick: int) -> str:
    """The id of a schedule's job: sha256 of name, creation time and tick, as a
    version-8 UUID (the core's rule, restated)."""
    h = hashlib.sha256(f"{name}:{created_at}:{tick}".encode()).hexdigest()
    h = h[:12] + "8" + h[13:16] + "a" + h[17:32]
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class MDeadLetter:
    job: MJob
    cause: str
    failed_at: int
    final_attempt: int
    reason: str | None


class Model:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.clock = 0
        self.jobs: dict[str, MJob] = {}
        self.dedup: dict[tuple[str, str], tuple[str, int]] = {}
        self.dead: list[MDeadLetter] = []  # in the order the jobs died
        # Set by each command: its decision time and the queues that gained Ready jobs.
        self.time = 0
        self.woken: set[str] = set()
        self.arrivals = 0
        # Queues an operator paused (issue 15): reserve takes nothing from them.
        self.paused: set[str] = set()
        # Queues defined at runtime (PutQueue): name -> overrides of the file's policy.
        self.overrides: dict[str, dict[str, Any]] = {}
        # Schedules (issue 17): fixed intervals, and crons of a small vocabulary in
        # UTC (cron_period_ms; the parser, DST and zones are checked by their own
        # tests against zoneinfo): name -> MSchedule.
        self.schedules: dict[str, MSchedule] = {}
        # Rate limits (issue 17): queue -> the times of its deliveries counted
        # while it had a rate limit, one entry per job, the newest rate_limit_jobs
        # of them and none older than rate_limit_per_ms (the core's window, plainly).
        self.deliveries: dict[str, list[int]] = {}
        # The fair reserve (issue 17): deliveries so far, and per queue the state
        # keeps [newest delivery number, turn granted at, deliveries in the turn]
        # -- a queue that appears starts at the number then (`_sync_fair`).
        self.delivery_seq = 0
        self.fair: dict[str, list[int]] = {}
        self._sync_fair()

    # -- helpers ---------------------------------------------------------------

    def _arrive(self) -> int:
        self.arrivals += 1
        return self.arrivals

    def policy(self, queue: str) -> QueuePolicy:
        base = self.config.queues.get(queue, self.config.defaults)
        extra = self.overrides.get(queue)
        return dataclasses.replace(base, **extra) if extra else base

    def declared(self, queue: str) -> bool:
        """Declared in the configuration file or defined at runtime."""
        return queue in self.config.queues or queue in self.overrides

    def _start(self, now: int) -> int:
        """Decision time: never before the clock. The clock moves only when the
        command is answered without a whole-command error (`_commit_time`)."""
        self.time = max(now, self.clock)
        self.woken = set()
        self._sync_fair()
        return self.time

    def _sync_fair(self) -> None:
        """The fair bookkeeping follows the queues the state keeps: a queue that
        was forgotten loses it, one that appeared starts at delivery_seq."""
        names = self.queue_names()
        for name in [n for n in self.fair if n not in names]:
            del self.fair[name]
        for name in names:
            self.fair.setdefault(name, [self.delivery_seq, 0, 0])

    def _fair_served(self, queue: str) -> None:
        self.delivery_seq += 1
        row = self.fair.setdefault(queue, [self.delivery_seq - 1, 0, 0])
        fair_step(row, self.policy(queue).weight, self.delivery_seq)

    def _commit_time(self) -> None:
        self.clock = self.time

    def _error(self, *names: str) -> tuple[Any, ...]:
        return ("error", set(names))

    def live_count(self, queue: str) -> int:
        return sum(1 for j in self.jobs.values() if j.queue == queue)

    def _kill(self, job: MJob, cause: str, t: int, reason: str | None) -> None:
        del self.jobs[job.job_id]
        if self.config.dead_letter_retention_ms > 0:
            self.dead.append(MDeadLetter(job, cause, t, job.attempt, reason))

    def _rate_room(self, queue: str, t: int) -> int | None:
        """Deliveries of `queue` its rate limit still allows at `t` (None = no
        limit): rate_limit_jobs less those after t - rate_limit_per_ms."""
        policy = self.policy(queue)
        if policy.rate_limit_jobs is None or policy.rate_limit_per_ms is None:
            return None
        recent = [d for d in self.deliveries.get(queue, []) if d > t - policy.rate_limit_per_ms]
        return max(0, policy.rate_limit_jobs - len(recent))

    def _count_delivery(self, queue: str, t: int) -> None:
        policy = self.policy(queue)
        if policy.rate_limit_jobs is None or policy.rate_limit_per_ms is None:
            return
        times = [*self.deliveries.get(queue, []), t]
        times = [d for d in times if d > t - policy.rate_limit_per_ms]
        self.deliveries[queue] = times[-policy.rate_limit_jobs :]

    def _freed(self, queue: str) -> None:
        """A job of `queue` left In-flight: a queue with a max_in_flight wakes
        its parked reserves (the cap may have held them)."""
        if self.policy(queue).max_in_flight is not None:
            self.woken.add(queue)

    def _make_ready(self, job: MJob) -> None:
        job.status = READY
        job.due = 0
        self.woken.add(job.queue)

    # -- enqueue -----------------------------------------------------------------

    def job_problems(self, job: NewJob, now: int) -> Problems:
        """Every rejection that applies to `job` on its own (§12, §13)."""
        lim = self.config.limits
        out: Problems = set()
        invalid = ("invalid_request", ())
        queue = job.queue
        if not valid_queue_name(queue):
            out.add(invalid)
        elif utf8_len(queue) > lim.max_queue_name_bytes:
            out.add(("queue_name_too_long", (lim.max_queue_name_bytes, utf8_len(queue))))
        if not job.job_type:
            out.add(invalid)
        elif utf8_len(job.job_type) > lim.max_job_type_bytes:
            out.add(("job_type_name_too_long", (lim.max_job_type_bytes, utf8_len(job.job_type))))
        data, encoding = job.payload_data, job.payload_encoding
        if (data is not None or encoding is not None) and (not data or not encoding):
            out.add(invalid)
        key = job.idempotency_key
        if key is not None:
            if key == "":
                out.add(invalid)
            elif utf8_len(key) > lim.max_idempotency_key_bytes:
                out.add(
                    ("idempotency_key_too_long", (lim.max_idempotency_key_bytes, utf8_len(key)))
                )
        if job.priority is not None and not (is_int(job.priority) and 0 <= job.priority <= 9):
            out.add(invalid)
        if job.max_attempts is not None and not (
            is_int(job.max_attempts) and job.max_attempts >= 1
        ):
            out.add(invalid)
        if (job.traceparent is not None or job.tracestate is not None) and not job.traceparent:
            out.add(invalid)
        if self.config.strict_queues and not self.declared(queue):
            out.add(("unknown_queue", (queue,)))
        policy = self.policy(queue)
        if data is not None and len(data) > policy.max_payload_bytes:
            out.add(("payload_too_large", (policy.max_payload_bytes, len(data))))
        allowed = policy.allowed_encodings
        if allowed is not None and encoding is not None and encoding not in allowed:
            out.add(("encoding_not_allowed", (encoding, tuple(allowed))))
        types = policy.allowed_job_types
        if types is not None and job.job_type not in types:
            out.add(("job_type_not_allowed", (job.job_type, tuple(types))))
        out |= self.custom_problems(job.custom, policy)
        horizon = policy.max_schedule_horizon_ms
        if job.scheduled_at is not None and job.scheduled_at > TIME_MS_MAX:
            out.add(invalid)
        elif job.scheduled_at is not None and job.scheduled_at > now + horizon:
            out.add(("scheduled_too_far", (horizon, job.scheduled_at)))
        return out

    @staticmethod
    def custom_problems(custom: Any, policy: QueuePolicy) -> Problems:
        if not custom:
            return set()
        out: Problems = set()
        if len(custom) > policy.max_custom_entries:
            out.add(("custom_entries_too_many", (policy.max_custom_entries, len(custom))))
        total: int | None = 0
        for key, value in custom.items():
            if key == "":
                out.add(("invalid_request", ()))
            elif utf8_len(key) > policy.max_custom_key_bytes:
                out.add(("custom_key_too_long", (key, policy.max_custom_key_bytes, utf8_len(key))))
            if isinstance(value, bool):
                size: int | None = 1
            elif isinstance(value, int):
                size = 8 if -(2**63) <= value < 2**63 else None
            elif isinstance(value, float):
                size = 8
            elif isinstance(value, str):
                size = utf8_len(value)
            else:
                size = None
            if size is None:
                out.add(("invalid_request", ()))
                total = None
            elif total is not None:
                total += utf8_len(key) + size
        if total is not None and total > policy.max_custom_total_bytes:
            out.add(("custom_map_too_large", (policy.max_custom_total_bytes, total)))
        return out

    def dedup_hit(self, queue: str, key: str, now: int) -> str | None:
        record = self.dedup.get((queue, key))
        if record is not None and now < record[1]:
            return record[0]
        return None

    def enqueue(self, jobs: tuple[NewJob, ...], atomic: bool, now: int) -> tuple[Any, ...]:
        t = self._start(now)
        if not jobs or len(jobs) > self.config.limits.max_enqueue_batch:
            return self._error(IA)
        results: list[tuple[Any, ...]] = []
        failures: list[tuple[int, Problems]] = []
        created: list[MJob] = []
        new_keys: dict[tuple[str, str], tuple[str, int]] = {}
        for index, job in enumerate(jobs):
            problems = self.job_problems(job, t)
            if problems:
                results.append(("rej", problems))
                failures.append((index, problems))
                continue
            queue, key = job.queue, job.idempotency_key
            policy = self.policy(queue)
            if key is not None:
                earlier = new_keys.get((queue, key))
                original = earlier[0] if earlier else self.dedup_hit(queue, key, t)
                if original is not None:
                    results.append(("ok", original, True))
                    continue
            cap = policy.max_queue_depth
            pending = sum(1 for c in created if c.queue == queue)
            if cap is not None and self.live_count(queue) + pending >= cap:
                problem = {("queue_full", (queue, cap))}
                results.append(("rej", problem))
                failures.append((index, problem))
                continue
            job_id = job.job_id.lower()
            max_attempts = (
                policy.default_max_attempts if job.max_attempts is None else job.max_attempts
            )
            scheduled = job.scheduled_at is not None and job.scheduled_at > t
            created.append(
                MJob(
                    job_id=job_id,
                    queue=queue,
                    job_type=job.job_type,
                    payload_data=job.payload_data,
                    payload_encoding=job.payload_encoding,
                    priority=policy.default_priority if job.priority is None else job.priority,
                    max_attempts=min(max_attempts, policy.max_attempts_ceiling),
                    enqueued_at=t,
                    # A past or present scheduled_at is stored as "not scheduled".
                    scheduled_at=job.scheduled_at if scheduled else None,
                    traceparent=job.traceparent,
                    tracestate=job.tracestate,
                    custom=dict(job.custom) if job.custom else None,
                    status=SCHEDULED if scheduled else READY,
                    due=job.scheduled_at if scheduled and job.scheduled_at is not None else 0,
                )
            )
            if key is not None and policy.dedup_window_ms > 0:
                new_keys[(queue, key)] = (job_id, t + policy.dedup_window_ms)
            results.append(("ok", job_id, False))
        self._commit_time()
        if atomic and failures:
            return ("atomic_rejected", failures)
        for new in created:
            new.arrival = self._arrive()
            self.jobs[new.job_id] = new
            if new.status == READY:
                self.woken.add(new.queue)
        self.dedup.update(new_keys)
        return ("enqueue", results)

    # -- reserve -------------------------------------------------------------------

    def reserve(
        self,
        queues: tuple[str, ...],
        lease_ms: int,
        max_jobs: int,
        worker_id: str | None,
        now: int,
        order: str = "strict",
    ) -> tuple[Any, ...]:
        t = self._start(now)
        lim = self.config.limits
        errors = set()
        if not queues or len(queues) > lim.max_reserve_queues:
            errors.add(IA)
        for name in queues:
            if not valid_queue_name(name) or utf8_len(name) > lim.max_queue_name_bytes:
                errors.add(IA)
            elif self.config.strict_queues and not self.declared(name):
                errors.add(PRECONDITION)
        if lease_ms <= 0 or max_jobs < 1 or worker_id == "" or order not in ("strict", "fair"):
            errors.add(IA)
        if errors:
            return ("error", errors)
        self._commit_time()
        cap = min(self.policy(name).max_lease_duration_ms for name in queues)
        deadline = min(t + min(lease_ms, cap), TIME_MS_MAX)
        want = min(max_jobs, lim.max_reserve_batch)
        names = list(dict.fromkeys(queues))
        # The jobs this reserve may take from each queue, in delivery order.
        lanes: dict[str, list[MJob]] = {}
        for name in names:
            if name in self.paused:
                continue
            ready = [j for j in self.jobs.values() if j.queue == name and j.status == READY]
            ready.sort(key=lambda j: (-j.priority, j.enqueued_at, j.arrival))
            take = len(ready)
            in_flight_cap = self.policy(name).max_in_flight
            if in_flight_cap is not None:  # max_in_flight: fewer jobs, never an error
                leased = sum(
                    1 for j in self.jobs.values() if j.queue == name and j.status == IN_FLIGHT
                )
                take = min(take, max(0, in_flight_cap - leased))
            rate_room = self._rate_room(name, t)
            if rate_room is not None:  # rate limit: fewer jobs, never an error
                take = min(take, rate_room)
            lanes[name] = ready[:take]
        picked: list[MJob] = []
        if order == "fair" and len(names) > 1:
            # Weighted round robin: each job to the queue with the smallest key
            # (ties: the order given), the bookkeeping played ahead per job.
            rows = {n: list(self.fair.get(n, [self.delivery_seq, 0, 0])) for n in lanes}
            seq = self.delivery_seq
            while len(picked) < want:
                open_lanes = [n for n in names if lanes.get(n)]
                if not open_lanes:
                    break
                best = min(
                    open_lanes,
                    key=lambda n: (fair_key(rows[n], self.policy(n).weight), names.index(n)),
                )
                picked.append(lanes[best].pop(0))
                seq += 1
                fair_step(rows[best], self.policy(best).weight, seq)
        else:
            for name in names:
                picked.extend(lanes.get(name, [])[: want - len(picked)])
        for job in picked:
            job.status = IN_FLIGHT
            job.due = deadline
            self._count_delivery(job.queue, t)
            self._fair_served(job.queue)
        return ("reserve", [job.delivered() for job in picked])

    # -- ack, nack, extend ------------------------------------------------------

    def _fence(
        self, job_id: object, attempt: object, enqueued_at: object = None
    ) -> MJob | tuple[Any, ...]:
        """§7 fencing by (job_id, attempt), plus the project's token: an ack, nack
        or extend may carry the enqueued_at its delivery carried; a different one
        (the job was requeued since) is fenced like a stale attempt."""
        jid = canonical_id(job_id)
        if jid is None or not is_int(attempt) or attempt < 1:  # type: ignore[operator]
            return self._error(IA)
        if enqueued_at is not None and not is_int(enqueued_at):
            return self._error(IA)
        job = self.jobs.get(jid)
        if job is None or job.status != IN_FLIGHT:
            return self._error(NOT_FOUND)
        if job.attempt != attempt:
            return self._error(MISMATCH)
        if enqueued_at is not None and job.enqueued_at != enqueued_at:
            return self._error(MISMATCH)
        return job

    def ack(
        self, job_id: str, attempt: int, now: int, enqueued_at: int | None = None
    ) -> tuple[Any, ...]:
        self._start(now)
        job = self._fence(job_id, attempt, enqueued_at)
        if not isinstance(job, MJob):
            return job
        self._commit_time()
        del self.jobs[job.job_id]
        self._freed(job.queue)
        return ("ack", job.job_id)

    def nack(
        self,
        job_id: str,
        attempt: int,
        retry: str,
        delay_ms: int | None,
        reason: str | None,
        now: int,
        enqueued_at: int | None = None,
    ) -> tuple[Any, ...]:
        t = self._start(now)
        if retry not in ("default", "delay", "dead_letter"):
            return self._error(IA)
        if retry == "delay" and (delay_ms is None or delay_ms < 0):
            return self._error(IA)
        job = self._fence(job_id, attempt, enqueued_at)
        if not isinstance(job, MJob):
            return job
        self._commit_time()
        self._freed(job.queue)
        if retry == "dead_letter":
            self._kill(job, "rejected", t, reason)
            return ("nack", job.job_id, True)
        if job.attempt >= job.max_attempts:
            self._kill(job, "attempts_exhausted", t, reason)
            return ("nack", job.job_id, True)
        policy = self.policy(job.queue)
        if retry == "delay" and delay_ms is not None:
            delay = min(delay_ms, policy.max_schedule_horizon_ms)
        else:
            delay = policy_delay(policy, job.job_id, job.attempt)
        job.attempt += 1
        job.last_reason = reason
        if delay == 0:
            self._make_ready(job)
        else:
            job.status = SCHEDULED
            job.due = t + delay
        return ("nack", job.job_id, False)

    def release(self, job_id: str, attempt: int, now: int) -> tuple[Any, ...]:
        """An attempt handed back unused: Ready again at once, same attempt number
        (it does not count against max_attempts), fenced like an ack."""
        self._start(now)
        job = self._fence(job_id, attempt)
        if not isinstance(job, MJob):
            return job
        self._commit_time()
        self._make_ready(job)
        return ("release", job.job_id)

    def extend(
        self, job_id: str, attempt: int, lease_ms: int, now: int, enqueued_at: int | None = None
    ) -> tuple[Any, ...]:
        t = self._start(now)
        if lease_ms <= 0:
            return self._error(IA)
        job = self._fence(job_id, attempt, enqueued_at)
        if not isinstance(job, MJob):
            return job
        self._commit_time()
        job.due = min(t + min(lease_ms, self.policy(job.queue).max_lease_duration_ms), TIME_MS_MAX)
        return ("extend", job.job_id, job.due)

    # -- dead letters ----------------------------------------------------------

    def drain(self, queue: str | None, max_records: int, now: int) -> tuple[Any, ...]:
        self._start(now)
        if queue == "" or max_records < 1:
            return self._error(IA)
        self._commit_time()
        want = min(max_records, self.config.limits.max_reserve_batch)
        chosen = [d for d in self.dead if queue is None or d.job.queue == queue][:want]
        for record in chosen:
            self.dead.remove(record)
        return (
            "drain",
            [
                (
                    d.job.job_id,
                    d.job.queue,
                    d.cause,
                    d.failed_at,
                    d.final_attempt,
                    d.reason,
                    d.job.attempt,
                )
                for d in chosen
            ],
        )

    def dead_letter_jobs(
        self, job_ids: tuple[str, ...], reason: str | None, now: int
    ) -> tuple[Any, ...]:
        t = self._start(now)
        if len(job_ids) > 100:
            return self._error(IA)
        self._commit_time()
        affected: list[str] = []
        refused: list[str] = []
        for raw in job_ids:
            jid = canonical_id(raw)
            if jid is not None and jid in affected:
                continue
            job = self.jobs.get(jid) if jid is not None else None
            if job is None or job.status not in (READY, SCHEDULED):
                refused.append(raw.lower())
                continue
            self._kill(job, "admin", t, reason)
            affected.append(job.job_id)
        return ("admin", tuple(affected), tuple(refused))

    # -- admin commands of issue 15 (by ids, and pause / resume) ----------------

    def live_jobs_admin(
        self, job_ids: tuple[str, ...], dead_letter: bool, reason: str | None, now: int
    ) -> tuple[Any, ...]:
        """AdminDeadLetterJobs (dead_letter) or CancelJobs: per id done /
        not_found / wrong_state."""
        t = self._start(now)
        if len(job_ids) > 1000:
            return self._error("TooManyIds")
        self._commit_time()
        outcomes: list[tuple[str, str]] = []
        seen: set[str] = set()
        for raw in job_ids:
            jid = canonical_id(raw)
            if jid is None:
                outcomes.append((str(raw), "not_found"))
                continue
            if jid in seen:
                continue
            seen.add(jid)
            job = self.jobs.get(jid)
            if job is None:
                dead = any(d.job.job_id == jid for d in self.dead)
                outcomes.append((jid, "wrong_state" if dead else "not_found"))
            elif job.status not in (READY, SCHEDULED):
                outcomes.append((jid, "wrong_state"))
            else:
                if dead_letter:
                    self._kill(job, "admin", t, reason)
                else:
                    del self.jobs[jid]
                outcomes.append((jid, "done"))
        return ("outcomes", tuple(outcomes), 0)

    def delete_dead_letters(self, job_ids: tuple[str, ...], now: int) -> tuple[Any, ...]:
        return self.dead_letters_admin(job_ids, None, None, ADMIN_CHUNK_MAX, False, now)

    def _queue_name_error(self, queue: object) -> bool:
        return not valid_queue_name(queue) or (
            isinstance(queue, str) and utf8_len(queue) > self.config.limits.max_queue_name_bytes
        )

    def dead_letters_admin(
        self,
        job_ids: tuple[str, ...],
        queue: str | None,
        cause: int | None,
        max_jobs: int,
        requeue: bool,
        now: int,
    ) -> tuple[Any, ...]:
        """AdminRequeueDeadLetters (requeue) or DeleteDeadLetters: by ids (per id
        done / not_found), or by queue and / or cause in a chunk of `max_jobs`
        with what remains (with a cause: matches among the next sweep_limit)."""
        t = self._start(now)
        if len(job_ids) > ADMIN_CHUNK_MAX:
            return self._error("TooManyIds")
        if not 1 <= max_jobs <= ADMIN_CHUNK_MAX:
            return self._error(IA)
        if queue is not None and self._queue_name_error(queue):
            return self._error(IA)
        if cause is not None and cause not in CAUSE_NAMES:
            return self._error(IA)
        has_filter = queue is not None or cause is not None
        if bool(job_ids) == has_filter:
            return self._error(IA)  # ids and a filter, or neither
        self._commit_time()
        records: list[MDeadLetter] = []
        outcomes: list[tuple[str, str]] = []
        remaining = 0
        if job_ids:
            seen: set[str] = set()
            for raw in job_ids:
                jid = canonical_id(raw)
                record = next((d for d in self.dead if d.job.job_id == jid), None)
                if jid is None or record is None:
                    outcomes.append((str(raw) if jid is None else jid, "not_found"))
                elif jid not in seen:
                    seen.add(jid)
                    records.append(record)
                    outcomes.append((jid, "done"))
        else:
            source = [d for d in self.dead if queue is None or d.job.queue == queue]
            if cause is None:
                records = source[:max_jobs]
                remaining = len(source) - len(records)
            else:
                wanted = CAUSE_NAMES[cause]
                scanned = 0
                for record in source:
                    if len(records) < max_jobs:
                        if record.cause == wanted:
                            records.append(record)
                        continue
                    if scanned >= self.config.sweep_limit:
                        break
                    scanned += 1
                    remaining += record.cause == wanted
            outcomes = [(d.job.job_id, "done") for d in records]
        for record in records:
            self.dead.remove(record)
            if requeue:
                self._requeue_dead(record, t)
        return ("outcomes", tuple(outcomes), remaining)

    def _requeue_dead(self, record: MDeadLetter, t: int) -> None:
        job = record.job
        job.attempt = 1
        # Now, but always later than before: the fencing token changes.
        job.enqueued_at = max(t, job.enqueued_at + 1)
        job.arrival = self._arrive()
        job.scheduled_at = None
        job.last_reason = None
        self._make_ready(job)
        self.jobs[job.job_id] = job

    def purge(self, queue: str, max_jobs: int, now: int) -> tuple[Any, ...]:
        """PurgeQueue: up to `max_jobs` Ready jobs in delivery order, then
        Scheduled ones by due time, deleted; in-flight jobs and dead letters stay."""
        self._start(now)
        if self._queue_name_error(queue) or not 1 <= max_jobs <= ADMIN_CHUNK_MAX:
            return self._error(IA)
        self._commit_time()
        jobs = [j for j in self.jobs.values() if j.queue == queue]
        ready = sorted(
            (j for j in jobs if j.status == READY),
            key=lambda j: (-j.priority, j.enqueued_at, j.arrival),
        )
        scheduled = sorted(
            (j for j in jobs if j.status == SCHEDULED), key=lambda j: (j.due, j.job_id)
        )
        picked = (ready + scheduled)[:max_jobs]
        for job in picked:
            del self.jobs[job.job_id]
        return ("purge", queue, len(picked), len(ready) + len(scheduled) - len(picked))

    def put_queue(self, queue: str, overrides: dict[str, Any], now: int) -> tuple[Any, ...]:
        """PutQueue: the queue's runtime overrides replaced (valid keys and types,
        and an effective configuration that passes the configuration rules)."""
        self._start(now)
        if self._queue_name_error(queue):
            return self._error(IA)
        for key, value in overrides.items():
            if key not in QUEUE_OVERRIDE_KEYS:
                return self._error(IA)
            if not (isinstance(value, str) if key == "retry_backoff" else is_int(value)):
                return self._error(IA)
        base = self.config.queues.get(queue, self.config.defaults)
        policy = dataclasses.replace(base, **overrides)
        queues = dict(self.config.queues)
        queues.update({name: self.policy(name) for name in self.overrides})
        queues[queue] = policy
        try:
            validate_config(dataclasses.replace(self.config, queues=queues))
        except ConfigError:
            return self._error(IA)
        self._commit_time()
        previous = self.overrides.get(queue)
        if previous == overrides:
            return ("put_queue", queue, False, False, policy)
        before = self.policy(queue)
        if (
            policy.max_in_flight is not None
            or before.max_in_flight is not None
            or policy.rate_limit_jobs is not None
            or before.rate_limit_jobs is not None
        ):
            self.woken.add(queue)  # a changed max_in_flight or rate limit may serve parked reserves
        self.overrides[queue] = dict(overrides)
        return ("put_queue", queue, previous is None, True, policy)

    def delete_queue(self, queue: str, now: int) -> tuple[Any, ...]:
        """DeleteQueue: the runtime definition removed; a queue the file does not
        declare loses its Ready and Scheduled jobs too."""
        self._start(now)
        if self._queue_name_error(queue):
            return self._error(IA)
        if queue not in self.overrides:
            return self._error("QueueNotFound")
        by_file = queue in self.config.queues
        jobs = [j for j in self.jobs.values() if j.queue == queue]
        if any(j.status == IN_FLIGHT for j in jobs):
            return self._error("QueueInUse")
        if not by_file and len(jobs) > ADMIN_CHUNK_MAX:
            return self._error("QueueInUse")
        self._commit_time()
        doomed = [] if by_file else jobs
        for job in doomed:
            del self.jobs[job.job_id]
        del self.overrides[queue]
        return ("delete_queue", queue, len(doomed), by_file)

    def pause(self, queue: str, paused: bool, now: int) -> tuple[Any, ...]:
        self._start(now)
        if self.config.strict_queues and not self.declared(queue):
            return self._error("QueueNotFound")
        self._commit_time()
        if (queue in self.paused) == paused:
            return ("queue_admin", queue, paused, False)
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)
            self.woken.add(queue)
        return ("queue_admin", queue, paused, True)

    def requeue(self, job_ids: tuple[str, ...], now: int) -> tuple[Any, ...]:
        t = self._start(now)
        if len(job_ids) > 100:
            return self._error(IA)
        self._commit_time()
        affected: list[str] = []
        refused: list[str] = []
        for raw in job_ids:
            jid = canonical_id(raw)
            if jid is not None and jid in affected:
                continue
            record = next((d for d in self.dead if d.job.job_id == jid), None)
            if record is None:
                refused.append(raw.lower())
                continue
            self.dead.remove(record)
            self._requeue_dead(record, t)
            affected.append(record.job.job_id)
        return ("admin", tuple(affected), tuple(refused))

    # -- sweep -----------------------------------------------------------------

    def sweep(self, now: int) -> tuple[Any, ...]:
        """Everything due at `now`, each phase limited to sweep_limit entries taken
        earliest deadline first (ties by job id, or by queue and key)."""
        t = self._start(now)
        self._commit_time()
        limit = self.config.sweep_limit
        # Schedules decide against the state as the sweep found it (the core's
        # decide sees the state before any of the sweep's events): queue depths
        # and the ids in use before this sweep's dead-lettering.
        before_live = {q: self.live_count(q) for q in self.queue_names()}
        before_ids = set(self.jobs) | {d.job.job_id for d in self.dead}
        due = [j for j in self.jobs.values() if j.status == SCHEDULED and j.due <= t]
        due.sort(key=lambda j: (j.due, j.job_id))
        for job in due[:limit]:
            self._make_ready(job)
        promoted = len(due[:limit])

        expired = [j for j in self.jobs.values() if j.status == IN_FLIGHT and j.due <= t]
        expired.sort(key=lambda j: (j.due, j.job_id))
        redelivered = dead_lettered = 0
        for job in expired[:limit]:
            if job.attempt >= job.max_attempts:
                self._kill(job, "lease_expired", t, None)
                self._freed(job.queue)
                dead_lettered += 1
            else:
                job.attempt += 1
                self._make_ready(job)
                redelivered += 1

        lapsed = sorted((d, q, k) for (q, k), (_, d) in self.dedup.items() if d <= t)[:limit]
        for _, queue, key in lapsed:
            del self.dedup[(queue, key)]

        dead_expired = 0
        retention = self.config.dead_letter_retention_ms
        if retention > 0:
            old = [d for d in self.dead if d.failed_at + retention <= t][:limit]
            for record in old:
                self.dead.remove(record)
            dead_expired = len(old)
        self._sync_fair()  # queues this sweep forgot, before its schedules fire
        fired, skipped = self._fire_schedules(t, limit, before_live, before_ids)
        return (
            "sweep",
            (promoted, redelivered, dead_lettered, len(lapsed), dead_expired, fired, skipped),
        )

    # -- schedules (every_ms, and crons as their period: cron_period_ms) -----------

    def _fire_schedules(
        self, t: int, limit: int, before_live: dict[str, int], before_ids: set[str]
    ) -> tuple[int, int]:
        fired_total = skipped_total = 0
        added: dict[str, int] = {}
        due = sorted(
            (sc for sc in self.schedules.values() if not sc.paused and sc.next <= t),
            key=lambda sc: (sc.next, sc.name),
        )
        for sc in due:
            if fired_total >= limit:
                break
            every = sc.every_ms
            ticks = list(range(sc.next, t + 1, every))  # every due tick
            following = ticks[-1] + every
            if sc.catch_up == "all":
                chosen = ticks[: limit - fired_total]
                skipped = 0
                following = chosen[-1] + every
            elif sc.catch_up == "one" or t - ticks[-1] <= 1_000:
                chosen, skipped = ticks[-1:], len(ticks) - 1
            else:
                chosen, skipped = [], len(ticks)
            for tick in chosen:
                if self._fire(sc, tick, t, before_live, before_ids, added):
                    fired_total += 1
                else:
                    skipped += 1
            skipped_total += skipped
            sc.next = following
        return fired_total, skipped_total

    def _fire(
        self,
        sc: MSchedule,
        tick: int,
        t: int,
        before_live: dict[str, int],
        before_ids: set[str],
        added: dict[str, int],
    ) -> bool:
        key = f"schedule:{sc.name}:{tick}"
        policy = self.policy(sc.queue)
        job_id = schedule_job_id(sc.name, sc.created_at, tick)
        if self.dedup_hit(sc.queue, key, t) is not None:
            return False
        if job_id in before_ids:
            return False
        cap = policy.max_queue_depth
        if cap is not None and before_live.get(sc.queue, 0) + added.get(sc.queue, 0) >= cap:
            return False
        added[sc.queue] = added.get(sc.queue, 0) + 1
        job = MJob(
            job_id=job_id,
            queue=sc.queue,
            job_type=sc.job_type,
            payload_data=None,
            payload_encoding=None,
            priority=policy.default_priority,
            max_attempts=min(policy.default_max_attempts, policy.max_attempts_ceiling),
            enqueued_at=t,
            scheduled_at=None,
            traceparent=None,
            tracestate=None,
            custom={"schedule": sc.name, "schedule_tick_ms": tick},
        )
        job.arrival = self._arrive()
        self.jobs[job_id] = job
        self.woken.add(sc.queue)
        if policy.dedup_window_ms > 0:
            self.dedup[(sc.queue, key)] = (job_id, t + policy.dedup_window_ms)
        return True

    def put_schedule(
        self,
        name: str,
        queue: str,
        job_type: str,
        every_ms: int | None,
        catch_up: str,
        now: int,
        cron: str | None = None,
    ) -> tuple[Any, ...]:
        """PutSchedule with every_ms, or a cron of the model's vocabulary
        (cron_period_ms) in UTC; any other cron must be refused (the simulation
        puts only those and ones that do not parse)."""
        t = self._start(now)
        if not name or self._queue_name_error(queue):
            return self._error(IA)
        if self.config.strict_queues and not self.declared(queue):
            return self._error("QueueNotFound")
        if cron is not None:
            every_ms = cron_period_ms(cron)
            if every_ms is None:
                return self._error(IA)
        if (
            every_ms is None
            or not 1_000 <= every_ms <= 366 * 86_400_000
            or catch_up not in ("none", "one", "all")
        ):
            return self._error(IA)
        # The job as the sweep will enqueue it, with the longest key and tick.
        probe = NewJob(
            job_id=uuid_zero(),
            queue=queue,
            job_type=job_type,
            idempotency_key=f"schedule:{name}:{TIME_MS_MAX}",
            custom={"schedule": name, "schedule_tick_ms": TIME_MS_MAX},
        )
        if self.job_problems(probe, t):
            return self._error(IA)
        self._commit_time()
        old = self.schedules.get(name)
        # The first tick: every_ms after now, or the cron's first tick after now.
        first = t + every_ms if cron is None else (t // every_ms + 1) * every_ms
        if old is None:
            self.schedules[name] = MSchedule(
                name, queue, job_type, every_ms, catch_up, t, first, cron=cron
            )
            return ("schedule", name, True, True, False, first)
        same_timing = old.every_ms == every_ms and old.cron == cron
        new_next = old.next if same_timing else first
        changed = (old.queue, old.job_type, old.every_ms, old.catch_up, old.next, old.cron) != (
            queue, job_type, every_ms, catch_up, new_next, cron
        )  # fmt: skip
        old.queue, old.job_type, old.every_ms, old.catch_up, old.next, old.cron = (
            queue, job_type, every_ms, catch_up, new_next, cron
        )  # fmt: skip
        return ("schedule", name, False, changed, old.paused, new_next)

    def pause_schedule(self, name: str, paused: bool, now: int) -> tuple[Any, ...]:
        t = self._start(now)
        sc = self.schedules.get(name)
        if sc is None:
            return self._error("ScheduleNotFound")
        self._commit_time()
        if sc.paused == paused:
            return ("schedule", name, False, False, paused, sc.next)
        sc.paused = paused
        # Resumed: the first tick after now on the schedule's grid (no catch-up).
        if not paused and t >= sc.next:
            sc.next += ((t - sc.next) // sc.every_ms + 1) * sc.every_ms
        return ("schedule", name, False, True, paused, sc.next)

    def delete_schedule(self, name: str, now: int) -> tuple[Any, ...]:
        self._start(now)
        sc = self.schedules.pop(name, None)
        if sc is None:
            return self._error("ScheduleNotFound")
        self._commit_time()
        return ("schedule", name, False, True, sc.paused, None)

    # -- observation -------------------------------------------------------------

    def next_deadline(self) -> int | None:
        times = [j.due for j in self.jobs.values() if j.status in (SCHEDULED, IN_FLIGHT)]
        times.extend(deadline for _, deadline in self.dedup.values())
        if self.dead and self.config.dead_letter_retention_ms > 0:
            times.append(self.dead[0].failed_at + self.config.dead_letter_retention_ms)
        times.extend(sc.next for sc in self.schedules.values() if not sc.paused)
        return min(times) if times else None

    def queue_names(self) -> set[str]:
        """The queues the state keeps (issue 13): the declared ones, and every other
        queue only while it holds a job, a dead letter or an idempotency key."""
        return (
            set(self.config.queues)
            | set(self.overrides)
            | self.paused
            | {j.queue for j in self.jobs.values()}
            | {d.job.queue for d in self.dead}
            | {queue for queue, _key in self.dedup}
        )

    def observe(self) -> dict[str, Any]:
        self._sync_fair()  # as the next command would find it
        queues = {}
        oldest_ready: dict[str, int | None] = {}
        for name in self.queue_names():
            jobs = [j for j in self.jobs.values() if j.queue == name]
            counts = tuple(
                sum(1 for j in jobs if j.status == s) for s in (READY, SCHEDULED, IN_FLIGHT)
            )
            queues[name] = (*counts, sum(1 for d in self.dead if d.job.queue == name))
            ready = [j.enqueued_at for j in jobs if j.status == READY]
            oldest_ready[name] = min(ready) if ready else None
        return {
            "clock": self.clock,
            "jobs": {
                j.job_id: (
                    j.queue,
                    j.status,
                    j.attempt,
                    j.max_attempts,
                    j.priority,
                    j.enqueued_at,
                    j.scheduled_at,
                    j.due,
                    j.last_reason,
                )
                for j in self.jobs.values()
            },
            "queues": queues,
            "oldest_ready": oldest_ready,
            "dead": [
                (d.job.job_id, d.job.queue, d.cause, d.failed_at, d.final_attempt, d.reason)
                for d in self.dead
            ],
            "dedup": dict(self.dedup),
            "next_deadline": self.next_deadline(),
            "overrides": dict(self.overrides),
            "schedules": {n: (sc.paused, sc.next) for n, sc in self.schedules.items()},
            "fair": (self.delivery_seq, {n: tuple(row) for n, row in sorted(self.fair.items())}),
        }


def uuid_zero() -> str:
    return "00000000-0000-8000-a000-000000000000"


# ---------------------------------------------------------------------------
# Comparing the core with the model.


def values(obj: Any) -> tuple[Any, ...]:
    """The field values of a reply object (a dataclass or a NamedTuple), shallow."""
    if dataclasses.is_dataclass(obj):
        return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))
    if not isinstance(obj, tuple):
        raise TypeError(f"not a reply value: {obj!r}")
    return tuple(obj)


def rejection_key(rejection: Any) -> tuple[str, tuple[Any, ...]]:
    if isinstance(rejection, InvalidRequest):
        return (rejection.reason, ())
    return (rejection.reason, values(rejection))


def normalise(result: Decision | CommandError) -> tuple[Any, ...]:
    """The core's answer in the model's vocabulary (see the module docstring)."""
    if isinstance(result, CommandError):
        return ("error", type(result).__name__)
    reply = result.reply
    if isinstance(reply, EnqueueResult):
        return (
            "enqueue",
            [
                ("ok", r.job_id, r.deduplicated)
                if isinstance(r, Accepted)
                else ("rej", rejection_key(r))
                for r in reply.results
            ],
        )
    if isinstance(reply, AtomicRejected):
        return ("atomic_rejected", [(i, rejection_key(r)) for i, r in reply.failures])
    if isinstance(reply, ReserveResult):
        return ("reserve", [values(view) for view in reply.jobs])
    if isinstance(reply, AckResult):
        return ("ack", reply.job_id)
    if isinstance(reply, NackResult):
        return ("nack", reply.job_id, reply.dead_lettered)
    if isinstance(reply, ReleaseResult):
        return ("release", reply.job_id)
    if isinstance(reply, ExtendResult):
        return ("extend", reply.job_id, reply.lease_expires_at)
    if isinstance(reply, DrainResult):
        return (
            "drain",
            [
                (
                    r.job.job_id,
                    r.job.queue,
                    CAUSE_NAMES[r.cause],
                    r.failed_at,
                    r.final_attempt,
                    r.last_reason,
                    r.job.attempt,
                )
                for r in reply.records
            ],
        )
    if isinstance(reply, SweepResult):
        return ("sweep", values(reply))
    if isinstance(reply, AdminResult):
        return ("admin", reply.affected, tuple(raw.lower() for raw, _ in reply.refused))
    if isinstance(reply, AdminOutcomes):
        return ("outcomes", reply.outcomes, reply.remaining)
    if isinstance(reply, QueueAdminResult):
        return ("queue_admin", reply.queue, reply.paused, reply.changed)
    if isinstance(reply, PurgeResult):
        return ("purge", reply.queue, reply.purged, reply.remaining)
    if isinstance(reply, PutQueueResult):
        return ("put_queue", reply.queue, reply.created, reply.changed, reply.policy)
    if isinstance(reply, ScheduleResult):
        return ("schedule", reply.name, reply.created, reply.changed, reply.paused, reply.next_ms)
    if isinstance(reply, DeleteQueueResult):
        return ("delete_queue", reply.queue, reply.cancelled, reply.declared_by_file)
    raise TypeError(f"unexpected reply {reply!r}")


def answer_difference(core: tuple[Any, ...], model: tuple[Any, ...]) -> str | None:
    """None if the core's (normalised) answer is one the model allows, else why not."""
    kind = model[0]
    if core[0] != kind:
        return f"core answered {core!r}, model {model!r}"
    if kind == "error":
        return None if core[1] in model[1] else f"core error {core[1]}, model allows {model[1]}"
    if kind == "enqueue":
        if len(core[1]) != len(model[1]):
            return f"core answered {core!r}, model {model!r}"
        for c, m in zip(core[1], model[1]):
            if (m[0] == "ok" and c != m) or (m[0] != "ok" and (c[0] != "rej" or c[1] not in m[1])):
                return f"enqueue result {c!r}, model {m!r}"
        return None
    if kind == "atomic_rejected":
        if [i for i, _ in core[1]] != [i for i, _ in model[1]]:
            return f"core answered {core!r}, model {model!r}"
        for (_, c), (_, m) in zip(core[1], model[1]):
            if c not in m:
                return f"atomic failure {c!r}, model allows {m!r}"
        return None
    return None if core == model else f"core answered {core!r}, model {model!r}"


def assert_same_answer(core: tuple[Any, ...], model: tuple[Any, ...]) -> None:
    difference = answer_difference(core, model)
    if difference is not None:
        raise AssertionError(difference)


def observe_core(state: State) -> dict[str, Any]:
    """The core state in the shape of `Model.observe()`."""
    queues = {}
    oldest_ready = {}
    for name, q in state.queues.items():
        queues[name] = (q.ready_count, q.scheduled_count, q.in_flight_count, len(q.dead))
        oldest_ready[name] = state.oldest_ready_enqueued_at(name)
    return {
        "clock": state.clock_ms,
        "jobs": {
            j.job_id: (
                j.queue,
                STATUS_NAMES[j.status],
                j.attempt,
                j.max_attempts,
                j.priority,
                j.enqueued_at,
                j.scheduled_at,
                j.due_ms,
                j.last_reason,
            )
            for j in state.jobs.values()
        },
        "queues": queues,
        "oldest_ready": oldest_ready,
        "dead": [
            (jid, d.job.queue, CAUSE_NAMES[d.cause], d.failed_at, d.final_attempt, d.last_reason)
            for jid, d in state.dead.items()
        ],
        "dedup": dict(state.dedup),
        "next_deadline": state.next_deadline(),
        "overrides": dict(state.queue_overrides),
        "schedules": {n: (sc.paused, sc.next_ms) for n, sc in state.schedules.items()},
        "fair": (
            state.delivery_seq,
            {
                n: (q.fair_last, q.fair_turn_start, q.fair_turn_count)
                for n, q in sorted(state.queues.items())
            },
        ),
    }
