"""The in-memory state of sepp: every live job, its indexes, dedup records and
dead letters.

Owns: `Job`, `QueueState`, `DeadLetter`, `State`, the index entry conventions and
the read-only queries over them (`JobView` building, stats, next deadline,
canonical form for comparisons).

Promises:
- A job is in exactly one of: a ready level (READY), the scheduled heap (SCHEDULED),
  the lease heap (IN_FLIGHT), the dead-letter store (DEAD). `invariants.py` checks it.
- Ready order within a priority is FIFO by original enqueue time, ties by arrival
  (`Job.order`, a counter assigned when the job is stored). Each priority level is
  a `ReadyLevel`: a deque for jobs that arrive in order (every fresh enqueue: O(1)
  in and out) and a heap for the few that come back out of order (redeliveries and
  promoted scheduled jobs keep their original enqueue time).
- Indexes use lazy deletion: an entry is valid only while the job still matches it
  (see `ready_entry_valid` and friends). `apply` keeps the *head* of every deque
  and heap valid, so a head is always a real candidate.
- The dead-letter dicts are ordered by `failed_at`, because the state's clock never
  goes backwards and records are appended in apply order.
- `queues` holds the declared queues and every other queue only while it holds
  something (a live job, a dead letter, a dedup record): `apply` forgets an
  undeclared queue the moment it becomes empty (`State.forget_if_empty`), so the
  live path, a replay and a snapshot keep the same queues (issue 13). The string
  intern table is bounded (`STRINGS_INTERNED_MAX`).

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections import deque
from collections.abc import Iterator
from heapq import heappop, heappush
from typing import Any

from sepp.core.config import CoreConfig, QueuePolicy
from sepp.core.results import DeadLetterView, JobView
from sepp.core.schedules import Schedule

READY = 0
SCHEDULED = 1
IN_FLIGHT = 2
DEAD = 3
DELETED = 4
STATUS_NAMES = ("ready", "scheduled", "in_flight", "dead", "deleted")

PRIORITY_LEVELS = 10

# A dict never gives back its table when entries are deleted (100k dedup records
# expired left 5 MiB behind). `apply` copies one of the state's dicts (a copy keeps
# the order) when, at a size that is a multiple of COMPACT_CHECK_EVERY, its table
# takes more than COMPACT_BYTES_PER_ENTRY per entry plus COMPACT_SLACK_BYTES: a dict
# in use takes 30-60 bytes per entry, so a copy always makes it at least 4x smaller
# and the cost is O(1) amortised.
COMPACT_CHECK_EVERY = 256
COMPACT_BYTES_PER_ENTRY = 256
COMPACT_SLACK_BYTES = 65536


def is_sparse(d: dict[Any, Any]) -> bool:
    """Whether `d` is due for a compacting copy (see COMPACT_CHECK_EVERY)."""
    n = len(d)
    return n % COMPACT_CHECK_EVERY == 0 and (
        # __sizeof__: the table's bytes, without importing sys into the core.
        d.__sizeof__() > COMPACT_BYTES_PER_ENTRY * n + COMPACT_SLACK_BYTES
    )


# Entries of the string intern table (State.intern) before it starts over: at most
# ~4,096 x (512-byte queue name + ~100 bytes of objects), about 2.5 MiB.
STRINGS_INTERNED_MAX = 4096

# The latest time the server stores or sends (PROTOCOL.md conventions):
# 9999-12-31T23:59:59.999Z, the last instant Python's datetime (and the other
# clients' date types) can represent. decide refuses a scheduled_at_ms beyond it
# and clamps every deadline it computes to it, so a client can decode every time
# it is sent.
TIME_MS_MAX = 253_402_300_799_999


def echoed_scheduled_at(scheduled_at: int | None, enqueued_at: int) -> int | None:
    """The `scheduled_at_ms` a job view echoes: nil unless it was in the future when
    the job was enqueued. decide stores a past or present scheduled_at as None; jobs
    of older logs and snapshots may still hold one as requested (negative even), and
    are echoed by the same rule, so what the server sends is always decodable."""
    if scheduled_at is None or scheduled_at <= enqueued_at:
        return None
    return scheduled_at if scheduled_at <= TIME_MS_MAX else TIME_MS_MAX


# The per-queue settings an operator may override at runtime (PutQueue, issue
# 15): the scalar ones. dedup_window_ms is restart-only (sepp-semantics.md) and
# the lists (allowed_encodings, allowed_job_types) are set in the file only.
#
# Precedence: a queue's runtime overrides win over the configuration file key by
# key (its [[queues]] entry, then the global [limits]); keys not overridden follow
# the file. DeleteQueue removes the runtime overrides: the file rules again.
QUEUE_OVERRIDE_KEYS = (
    "max_lease_duration_ms",
    "default_max_attempts",
    "max_attempts_ceiling",
    "default_priority",
    "retry_delay_ms",
    "retry_backoff",
    "retry_delay_max_ms",
    "max_payload_bytes",
    "max_schedule_horizon_ms",
    "max_custom_entries",
    "max_custom_total_bytes",
    "max_custom_key_bytes",
    "max_queue_depth",
    "max_in_flight",
    "rate_limit_jobs",
    "rate_limit_per_ms",
    "weight",
)


# A job's stored fields, in `Job.__init__` order: the layout of a snapshot's job
# row (`entry`, the in-memory index handle, is rebuilt on load). Spelled out
# because a compiled `Job` has no `__slots__` to read it from.
JOB_ROW_FIELDS = (
    "job_id",
    "queue",
    "job_type",
    "payload_data",
    "payload_encoding",
    "priority",
    "max_attempts",
    "enqueued_at",
    "scheduled_at",
    "idempotency_key",
    "traceparent",
    "tracestate",
    "custom",
    # Arrival number, unique in the state: breaks ties of enqueued_at (FIFO).
    "order",
    # Mutable part.
    "attempt",
    "status",
    # SCHEDULED: when it becomes Ready. IN_FLIGHT: the lease deadline. Else 0.
    "due_ms",
    "worker_id",
    "last_reason",
)


class Job:
    """One job. Mutable: `apply` changes its status, attempt and deadline in place
    (snapshots copy the whole state by forking, so nothing here needs to be
    persistent)."""

    # + entry: while READY, the ready-level entry that currently stands for this job.
    # + iseq: the sequence number of its entry in its queue's status index
    #   (`StatusIndex`), set each time it enters Ready, Scheduled, In-flight or Dead.
    __slots__ = (*JOB_ROW_FIELDS, "entry", "iseq")

    def __init__(
        self,
        job_id: str,
        queue: str,
        job_type: str,
        payload_data: bytes | None,
        payload_encoding: str | None,
        priority: int,
        max_attempts: int,
        enqueued_at: int,
        scheduled_at: int | None,
        idempotency_key: str | None,
        traceparent: str | None,
        tracestate: str | None,
        custom: dict[str, Any] | None,
        order: int,
        attempt: int,
        status: int,
        due_ms: int,
        worker_id: str | None,
        last_reason: str | None,
    ) -> None:
        self.job_id = job_id
        self.queue = queue
        self.job_type = job_type
        self.payload_data = payload_data
        self.payload_encoding = payload_encoding
        self.priority = priority
        self.max_attempts = max_attempts
        self.enqueued_at = enqueued_at
        self.scheduled_at = scheduled_at
        self.idempotency_key = idempotency_key
        self.traceparent = traceparent
        self.tracestate = tracestate
        self.custom = custom
        self.order = order
        self.attempt = attempt
        self.status = status
        self.due_ms = due_ms
        self.worker_id = worker_id
        self.last_reason = last_reason
        self.entry: ReadyEntry | None = None
        self.iseq = 0

    def view(self, lease_expires_at: int | None = None) -> JobView:
        """The job as a worker or an operator sees it. `lease_expires_at`: the lease
        of a delivery being decided (the job is not In-flight yet); by default the
        current lease, if any."""
        if lease_expires_at is None and self.status == IN_FLIGHT:
            lease_expires_at = self.due_ms
        # Positional, in JobView's field order (one per delivered job: hot path).
        view: JobView = tuple.__new__(
            JobView,
            (
                self.job_id,
                self.queue,
                self.job_type,
                self.payload_data,
                self.payload_encoding,
                self.priority,
                self.max_attempts,
                self.attempt,
                self.enqueued_at,
                echoed_scheduled_at(self.scheduled_at, self.enqueued_at),
                lease_expires_at,
                self.traceparent,
                self.tracestate,
                dict(self.custom) if self.custom else None,
            ),
        )
        return view

    def __repr__(self) -> str:
        return (
            f"Job({self.job_id}, {self.queue!r}, {STATUS_NAMES[self.status]}, "
            f"attempt={self.attempt}/{self.max_attempts}, p={self.priority})"
        )


class DeadLetter:
    __slots__ = ("job", "cause", "failed_at", "final_attempt", "last_reason")

    def __init__(
        self, job: Job, cause: int, failed_at: int, final_attempt: int, last_reason: str | None
    ) -> None:
        self.job = job
        self.cause = cause
        self.failed_at = failed_at
        self.final_attempt = final_attempt
        self.last_reason = last_reason

    def view(self) -> DeadLetterView:
        return DeadLetterView(
            self.job.view(), self.cause, self.failed_at, self.final_attempt, self.last_reason
        )


# (enqueued_at, order, job). Typed as a variable-length tuple on purpose: the
# lazy deletion of ready entries tests *identity* (`job.entry is entry`), and the
# compiled build unboxes fixed-length tuple types into C structs, re-boxing a new
# tuple at each use, so `is` would fail for live entries. Every place that makes
# an entry annotates it with this type, so it is boxed exactly once.
ReadyEntry = tuple[Any, ...]


class ReadyLevel:
    """The Ready jobs of one priority of one queue, oldest first."""

    __slots__ = ("fifo", "heap")

    def __init__(self) -> None:
        # Entries in increasing (enqueued_at, order): appended on the right.
        self.fifo: deque[ReadyEntry] = deque()
        # Entries that arrived out of order (older than the fifo's newest).
        self.heap: list[ReadyEntry] = []

    def __bool__(self) -> bool:
        return bool(self.fifo) or bool(self.heap)

    def push(self, entry: ReadyEntry) -> None:
        fifo = self.fifo
        # `order` is unique, so comparing entries never reaches the job.
        if not fifo or entry > fifo[-1]:
            fifo.append(entry)
        else:
            heappush(self.heap, entry)

    def head(self) -> ReadyEntry | None:
        """The oldest entry (valid when `prune` ran after the last change)."""
        fifo, heap = self.fifo, self.heap
        if fifo:
            if heap and heap[0] < fifo[0]:
                return heap[0]
            return fifo[0]
        return heap[0] if heap else None

    def prune(self) -> None:
        """Drop stale entries from both heads."""
        fifo, heap = self.fifo, self.heap
        while fifo and fifo[0][2].entry is not fifo[0]:
            fifo.popleft()
        while heap and heap[0][2].entry is not heap[0]:
            heappop(heap)

    def entries(self) -> list[ReadyEntry]:
        """Every entry, stale ones included (for checks and snapshots)."""
        return [*self.fifo, *self.heap]


# The level every priority of a new queue starts with: one shared, always empty
# `ReadyLevel` (a deque costs ~0.7 KiB, and ten per queue made an idle queue cost
# ~9 KiB). A push never goes to it: `ready_level_for_push` swaps in a level of the
# queue's own first. Readers treat it as any empty level.
EMPTY_READY_LEVEL = ReadyLevel()


# A status index keeps at most this many stale entries beyond its live ones
# before `index_add` compacts it (amortised O(1) per transition).
INDEX_STALE_SLACK_ENTRIES = 1024
# The statuses a queue's status index covers (positions in QueueState.index).
INDEXED_STATUSES = (READY, SCHEDULED, IN_FLIGHT, DEAD)


class StatusIndex:
    """The jobs of one queue in one status, in the order they entered it: parallel
    `seqs` (increasing, unique in the state) and `jobs`. The admin listing pages
    through it with a cursor holding the last seq it returned (`sepp.core.reads`):
    a bisect, then a walk, so a page costs O(log n + page + stale entries skipped),
    and a cursor stays valid whatever happens to the queue in between.

    Lazy deletion like the ready levels: entry i is valid while
    `jobs[i].status == status and jobs[i].iseq == seqs[i]`. Entries before
    `head` are all stale; `index_left` advances `head` past stale entries at the
    front (the usual FIFO consumption leaves nothing to skip), `index_add`
    compacts when stale entries outnumber the live ones by
    INDEX_STALE_SLACK_ENTRIES."""

    __slots__ = ("status", "seqs", "jobs", "head")

    def __init__(self, status: int) -> None:
        self.status = status
        self.seqs: array[int] = array("q")
        self.jobs: list[Job] = []
        self.head = 0

    def valid(self, i: int) -> bool:
        job = self.jobs[i]
        return job.status == self.status and job.iseq == self.seqs[i]

    def live_jobs(self) -> list[Job]:
        """The valid entries' jobs, in index order."""
        return [j for i, j in enumerate(self.jobs) if i >= self.head and self.valid(i)]


class QueueState:
    __slots__ = (
        "name",
        "ready",
        "ready_count",
        "scheduled_count",
        "in_flight_count",
        "dead",
        "dedup_count",
        "paused",
        "index",
        "fair_last",
        "fair_turn_start",
        "fair_turn_count",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: list[ReadyLevel] = [EMPTY_READY_LEVEL] * PRIORITY_LEVELS
        self.ready_count = 0
        self.scheduled_count = 0
        self.in_flight_count = 0
        # This queue's dead letters, oldest first.
        self.dead: dict[str, DeadLetter] = {}
        # Dedup records (idempotency keys in their window) naming this queue.
        self.dedup_count = 0
        # An operator paused it (QueuePaused): reserve skips it, enqueues still
        # land. Durable: in the log and in snapshots (meta "paused").
        self.paused = False
        # By status (READY, SCHEDULED, IN_FLIGHT, DEAD): created on first use.
        self.index: list[StatusIndex] | None = None
        # Fair reserve bookkeeping (issue 17, `fair_served`): the delivery number
        # (State.delivery_seq) of its newest delivery -- at creation, the number
        # then, so a queue that comes (back) is not owed a past it never had --
        # and its current turn: the number it was granted at and its deliveries.
        self.fair_last = 0
        self.fair_turn_start = 0
        self.fair_turn_count = 0

    @property
    def live_count(self) -> int:
        return self.ready_count + self.scheduled_count + self.in_flight_count

    def holds_nothing(self) -> bool:
        """No live job, no dead letter, no idempotency key in its window, not
        paused: an undeclared queue in this condition is forgotten (`State.forget_if_empty`)."""
        return (
            self.ready_count == 0
            and self.scheduled_count == 0
            and self.in_flight_count == 0
            and not self.dead
            and self.dedup_count == 0
            and not self.paused
        )


def fair_key(q: QueueState, weight: int) -> int:
    """Where `q` stands in a fair reserve (the smallest key is served next, ties
    in the order the reserve names the queues): the delivery number its turn was
    granted at while the turn lasts (fewer than `weight` deliveries), else the
    number of its newest delivery. Keys never decrease."""
    count = q.fair_turn_count
    return q.fair_turn_start if 0 < count < weight else q.fair_last


def fair_served(q: QueueState, weight: int, seq: int) -> None:
    """`q` got delivery number `seq` (any reserve's, strict or fair): a finished
    (or no) turn starts a new one, granted at the key it had; else the turn goes
    on. decide._pick_fair plays the same steps ahead for a batch."""
    count = q.fair_turn_count
    if count == 0 or count >= weight:
        q.fair_turn_start = q.fair_last
        q.fair_turn_count = 1
    else:
        q.fair_turn_count = count + 1
    q.fair_last = seq


def ready_level_for_push(q: QueueState, priority: int) -> ReadyLevel:
    """The level of `q` a Ready job of `priority` is pushed onto (its own, never
    the shared empty one)."""
    level = q.ready[priority]
    if level is EMPTY_READY_LEVEL:
        level = q.ready[priority] = ReadyLevel()
    return level


# Windows of queues that may have gone idle are looked at when the dict of rate
# windows doubles (at least this big): an expired one is dropped (amortised O(1)).
RATE_WINDOWS_PRUNE_MIN = 64


class RateWindow:
    """The recent deliveries of one rate-limited queue (issue 17): runs of
    [time_ms, count], oldest first, holding the newest deliveries only -- at most
    the queue's rate_limit_jobs of them, none older than its rate_limit_per_ms
    (apply trims on each delivery; a window at the limit is exactly full)."""

    __slots__ = ("runs", "total")

    def __init__(self) -> None:
        self.runs: deque[list[int]] = deque()
        self.total = 0

    def add(self, at_ms: int, count: int, jobs: int, per_ms: int) -> None:
        runs = self.runs
        if runs and runs[-1][0] == at_ms:
            runs[-1][1] += count
        else:
            runs.append([at_ms, count])
        self.total += count
        horizon = at_ms - per_ms
        while runs and (runs[0][0] <= horizon or self.total - runs[0][1] >= jobs):
            self.total -= runs[0][1]
            runs.popleft()
        if self.total > jobs:  # the oldest run reaches past the newest `jobs`
            runs[0][1] -= self.total - jobs
            self.total = jobs

    def used(self, now_ms: int, per_ms: int) -> int:
        """Deliveries in the window that ends at `now_ms`: after now_ms - per_ms."""
        horizon = now_ms - per_ms
        n = self.total
        for run in self.runs:
            if run[0] > horizon:
                break
            n -= run[1]
        return n

    def in_window(self, now_ms: int, per_ms: int) -> list[list[int]]:
        horizon = now_ms - per_ms
        return [list(run) for run in self.runs if run[0] > horizon]


def rate_room(state: State, name: str, policy: QueuePolicy, now_ms: int) -> int:
    """How many more of `name`'s jobs its rate limit lets a reserve at `now_ms`
    deliver; -1 = no rate limit."""
    jobs = policy.rate_limit_jobs
    per_ms = policy.rate_limit_per_ms
    if jobs is None or per_ms is None:
        return -1
    window = state.rate_windows.get(name)
    if window is None:
        return jobs
    return max(0, jobs - window.used(now_ms, per_ms))


def rate_limited_until(state: State, name: str, now_ms: int) -> int | None:
    """When `name`'s rate window next has room, if it has none at `now_ms` (the
    oldest delivery in it leaves the window then); None when it has room now or
    the queue has no rate limit. The server wakes long polls parked on it then."""
    policy = state.config.policy(name)
    jobs = policy.rate_limit_jobs
    per_ms = policy.rate_limit_per_ms
    window = state.rate_windows.get(name)
    if jobs is None or per_ms is None or window is None:
        return None
    # Room comes back once enough of the oldest deliveries have left the window
    # (more than one run when the limit was lowered since they were counted).
    excess = window.used(now_ms, per_ms) - jobs + 1
    if excess <= 0:
        return None
    horizon = now_ms - per_ms
    for run in window.runs:
        if run[0] <= horizon:
            continue
        excess -= run[1]
        if excess <= 0:
            return run[0] + per_ms
    return None  # pragma: no cover - used() counted these very runs


class State:
    """Everything `decide` reads and `apply` changes."""

    def __init__(self, config: CoreConfig | None = None) -> None:
        self.config = config if config is not None else CoreConfig()
        # The configuration file's settings; `config` is them merged with the
        # runtime queue definitions (`queue_overrides`, QueueDefined events), so
        # decide sees a runtime-created queue as declared, with its settings.
        self.base_config = self.config
        # Queue name -> its runtime overrides (keys of QUEUE_OVERRIDE_KEYS).
        self.queue_overrides: dict[str, dict[str, Any]] = {}
        # The high-water mark of command times: decide never stamps an earlier one.
        self.clock_ms = 0
        # The next status-index sequence number (`index_add`). Not durable: a
        # snapshot load rebuilds the indexes, and `index_epoch` tells a cursor
        # from before it (the clock at build time; 0 for a fresh state).
        self.next_iseq = 1
        self.index_epoch = 0
        # The next arrival number (`Job.order`).
        self.next_order = 1
        # Live jobs (Ready, Scheduled, In-flight) by id.
        self.jobs: dict[str, Job] = {}
        self.queues: dict[str, QueueState] = {}
        # (run_at, job_id, job) for SCHEDULED jobs.
        self.scheduled: list[tuple[int, str, Job]] = []
        # (lease deadline, job_id, job) for IN_FLIGHT jobs.
        self.leases: list[tuple[int, str, Job]] = []
        # (queue, idempotency_key) -> (job_id, expires_at).
        self.dedup: dict[tuple[str, str], tuple[str, int]] = {}
        # (expires_at, queue, idempotency_key).
        self.dedup_expiry: list[tuple[int, str, str]] = []
        # All dead letters by job id, oldest (smallest failed_at) first.
        self.dead: dict[str, DeadLetter] = {}
        # Interned strings (queue names, job types, encodings) so a million jobs
        # share a handful of str objects. Bounded (issue 13: distinct job types were
        # kept forever): at STRINGS_INTERNED_MAX entries the table starts over --
        # the jobs keep the strings they hold, a string nothing holds any more is
        # freed, and later jobs share new copies. Identity is never relied on:
        # interning only saves memory, so it cannot change what the state means.
        self._strings: dict[str, str] = {}
        # Schedules (issue 17) by name, and (next_ms, name) of the running ones:
        # a heap with lazy deletion (an entry is live while its schedule exists,
        # runs and still has that next_ms), so a sweep looks at due ones only.
        self.schedules: dict[str, Schedule] = {}
        self.schedule_heap: list[tuple[int, str]] = []
        # Rate windows (issue 17) of the queues that had a rate limit when their
        # jobs were delivered, by queue name: kept apart from `queues` because a
        # queue may be forgotten (emptied) while its window still counts. Built by
        # apply from each JobReserved and its record's time (so replay rebuilds
        # it) under the rate limit then in force; an expired window is dropped
        # when the dict doubles (RATE_WINDOWS_PRUNE_MIN).
        self.rate_windows: dict[str, RateWindow] = {}
        self.rate_windows_prune_at = RATE_WINDOWS_PRUNE_MIN
        # Deliveries (JobReserved events) applied since the log began: the clock
        # of the fair reserve (QueueState.fair_last).
        self.delivery_seq = 0
        # The queues kept even when they hold nothing (State.forget_if_empty).
        self.declared: frozenset[str] = frozenset(self.config.queues)
        for name in self.config.queues:
            self.queue(name)

    def set_queue_overrides(self, name: str, overrides: dict[str, Any] | None) -> None:
        """Define `name` at runtime with `overrides` (None: remove the runtime
        definition), and merge the configuration again."""
        if overrides is None:
            self.queue_overrides.pop(name, None)
        else:
            self.queue_overrides[name] = dict(overrides)
        self.set_base_config(self.base_config)

    def set_base_config(self, config: CoreConfig) -> None:
        """Use `config` (a reloaded file) under the runtime queue definitions."""
        self.base_config = config
        self.config = self.merged_config(config)
        self.declared = frozenset(self.config.queues)

    def merged_config(self, config: CoreConfig) -> CoreConfig:
        """`config` (the file's) with the runtime queue definitions on top."""
        if not self.queue_overrides:
            return config
        queues = dict(config.queues)
        for name, overrides in self.queue_overrides.items():
            start = config.queues.get(name, config.defaults)
            known = {k: v for k, v in overrides.items() if k in QUEUE_OVERRIDE_KEYS}
            queues[name] = dataclasses.replace(start, **known)
        return dataclasses.replace(config, queues=queues)

    def reconfigure(self, config: CoreConfig) -> None:
        """Switch to `config` (a hot reload of the file, between two commands):
        the runtime queue definitions stay on top of it, a newly declared queue
        exists from now on, and a queue no longer declared that holds nothing is
        forgotten -- the queues a restart with this config would recover. Not an
        event: replay reads only which queues are declared (module docstring of
        sepp.core.config), so the log stays the same under either config."""
        before = self.declared
        self.set_base_config(config)
        for name in sorted(self.declared - before):
            self.queue(name)
        for name in sorted(before - self.declared):
            q = self.queues.get(name)
            if q is not None:
                self.forget_if_empty(q)

    def intern(self, value: str) -> str:
        strings = self._strings
        known = strings.get(value)
        if known is not None:
            return known
        if len(strings) >= STRINGS_INTERNED_MAX:
            strings.clear()
        strings[value] = value
        return value

    def forget_if_empty(self, q: QueueState) -> None:
        """Drop `q` when it holds nothing and is not declared (issue 13: 100k
        distinct queue names kept ~1 GiB after every job was acked). Called by
        `apply` after each event that can empty a queue (ack, a dead-lettering
        that keeps no record, a dead letter drained or expired, an idempotency key
        expired), so the live path, a replay and a snapshot's rows all give the
        same set of queues: the declared ones plus those holding something."""
        if q.holds_nothing() and q.name not in self.declared:
            name = q.name
            del self.queues[name]
            self._strings.pop(name, None)
            if is_sparse(self.queues):
                self.queues = dict(self.queues)

    def count_delivery(self, name: str, policy: QueuePolicy) -> None:
        """One job of `name` was delivered at `clock_ms` (apply of JobReserved):
        counted in its rate window when the queue has a rate limit."""
        jobs = policy.rate_limit_jobs
        per_ms = policy.rate_limit_per_ms
        if jobs is None or per_ms is None:
            return
        windows = self.rate_windows
        window = windows.get(name)
        if window is None:
            if len(windows) >= self.rate_windows_prune_at:
                self.prune_rate_windows()
            window = windows[name] = RateWindow()
        window.add(self.clock_ms, 1, jobs, per_ms)

    def prune_rate_windows(self) -> None:
        """Drop the windows with nothing left in them at `clock_ms` (or whose
        queue has no rate limit any more)."""
        config = self.config
        now = self.clock_ms
        for name in list(self.rate_windows):
            per_ms = config.policy(name).rate_limit_per_ms
            window = self.rate_windows[name]
            if per_ms is None or window.used(now, per_ms) == 0:
                del self.rate_windows[name]
        self.rate_windows = dict(self.rate_windows)
        self.rate_windows_prune_at = max(RATE_WINDOWS_PRUNE_MIN, 2 * len(self.rate_windows))

    def rate_windows_now(self) -> dict[str, list[list[int]]]:
        """The deliveries each rate window still counts at `clock_ms` (for
        snapshots and comparisons: runs already out of the window are left out)."""
        config = self.config
        out: dict[str, list[list[int]]] = {}
        for name, window in sorted(self.rate_windows.items()):
            per_ms = config.policy(name).rate_limit_per_ms
            if per_ms is None:
                continue
            runs = window.in_window(self.clock_ms, per_ms)
            if runs:
                out[name] = runs
        return out

    def queue(self, name: str) -> QueueState:
        q = self.queues.get(name)
        if q is None:
            name = self.intern(name)
            q = self.queues[name] = QueueState(name)
            q.fair_last = self.delivery_seq
        return q

    # -- heap entry validity (lazy deletion) --------------------------------

    @staticmethod
    def ready_entry_valid(entry: ReadyEntry) -> bool:
        return entry[2].entry is entry

    @staticmethod
    def scheduled_entry_valid(entry: tuple[int, str, Job]) -> bool:
        job = entry[2]
        return job.status == SCHEDULED and job.due_ms == entry[0]

    @staticmethod
    def lease_entry_valid(entry: tuple[int, str, Job]) -> bool:
        job = entry[2]
        return job.status == IN_FLIGHT and job.due_ms == entry[0]

    def dedup_entry_valid(self, entry: tuple[int, str, str]) -> bool:
        record = self.dedup.get((entry[1], entry[2]))
        return record is not None and record[1] == entry[0]

    def schedule_entry_valid(self, entry: tuple[int, str]) -> bool:
        sched = self.schedules.get(entry[1])
        return sched is not None and not sched.paused and sched.next_ms == entry[0]

    def push_schedule(self, sched: Schedule) -> None:
        """(Re)index a schedule after its next tick or pause flag changed."""
        if not sched.paused:
            heappush(self.schedule_heap, (sched.next_ms, sched.spec.name))
        heap = self.schedule_heap
        while heap and not self.schedule_entry_valid(heap[0]):
            heappop(heap)

    def prune_scheduled(self) -> None:
        heap = self.scheduled
        while heap and not self.scheduled_entry_valid(heap[0]):
            heappop(heap)

    def prune_leases(self) -> None:
        heap = self.leases
        while heap and not self.lease_entry_valid(heap[0]):
            heappop(heap)

    def prune_dedup(self) -> None:
        heap = self.dedup_expiry
        while heap and not self.dedup_entry_valid(heap[0]):
            heappop(heap)

    # -- queries -------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest time at which a sweep would have something to do."""
        # Runs after every command that changed the state: no list, no min().
        best: int | None = None
        if self.scheduled:
            best = self.scheduled[0][0]
        if self.leases:
            at: int = self.leases[0][0]
            if best is None or at < best:
                best = at
        if self.dedup_expiry:
            at = self.dedup_expiry[0][0]
            if best is None or at < best:
                best = at
        if self.schedule_heap:
            at = self.schedule_heap[0][0]
            if best is None or at < best:
                best = at
        if self.dead:
            retention = self.config.dead_letter_retention_ms
            if retention > 0:
                at = next(iter(self.dead.values())).failed_at + retention
                if best is None or at < best:
                    best = at
        return best

    def oldest_ready_enqueued_at(self, queue: str) -> int | None:
        q = self.queues.get(queue)
        if q is None or q.ready_count == 0:
            return None
        heads = [head[0] for level in q.ready if (head := level.head()) is not None]
        return min(heads) if heads else None

    def dedup_lookup(self, queue: str, key: str, now_ms: int) -> str | None:
        record = self.dedup.get((queue, key))
        if record is not None and now_ms < record[1]:
            return record[0]
        return None

    def canonical(self) -> dict[str, Any]:
        """A plain, order-normalised description of the state, for equality
        checks between a live state and its replay (heap layouts and stale
        entries are implementation details and are left out)."""
        jobs = {jid: _job_tuple(job) for jid, job in self.jobs.items()}
        ready = {}
        for name, q in self.queues.items():
            order: list[str] = []
            for prio in range(PRIORITY_LEVELS - 1, -1, -1):
                entries = sorted(e for e in q.ready[prio].entries() if self.ready_entry_valid(e))
                order.extend(e[2].job_id for e in entries)
            ready[name] = order
        return {
            "clock_ms": self.clock_ms,
            "next_order": self.next_order,
            "jobs": dict(sorted(jobs.items())),
            "ready": ready,
            "counts": {
                name: (q.ready_count, q.scheduled_count, q.in_flight_count, len(q.dead))
                for name, q in sorted(self.queues.items())
            },
            "dedup": dict(sorted(self.dedup.items())),
            "dead": [
                (jid, _job_tuple(d.job), d.cause, d.failed_at, d.final_attempt, d.last_reason)
                for jid, d in self.dead.items()
            ],
            "paused": sorted(name for name, q in self.queues.items() if q.paused),
            "queue_overrides": {
                n: dict(sorted(o.items())) for n, o in sorted(self.queue_overrides.items())
            },
            "schedules": {
                n: (tuple(sc.spec), sc.paused, sc.next_ms)
                for n, sc in sorted(self.schedules.items())
            },
            "queue_dead_order": {
                name: list(q.dead) for name, q in sorted(self.queues.items()) if q.dead
            },
            "rate_windows": self.rate_windows_now(),
            "delivery_seq": self.delivery_seq,
            "fair": {
                name: (q.fair_last, q.fair_turn_start, q.fair_turn_count)
                for name, q in sorted(self.queues.items())
            },
        }

    def iter_jobs(self) -> Iterator[Job]:
        return iter(self.jobs.values())


def _job_tuple(job: Job) -> tuple[Any, ...]:
    return (
        job.job_id,
        job.queue,
        job.job_type,
        job.payload_data,
        job.payload_encoding,
        job.priority,
        job.max_attempts,
        job.enqueued_at,
        job.scheduled_at,
        job.idempotency_key,
        job.traceparent,
        job.tracestate,
        job.custom,
        job.order,
        job.attempt,
        job.status,
        job.due_ms,
        job.worker_id,
        job.last_reason,
    )


def job_fields(job: Job) -> list[Any]:
    """The job as a flat list, in `Job.__init__` order (used by snapshots)."""
    return list(_job_tuple(job))


def index_add(state: State, q: QueueState, job: Job) -> None:
    """Record that `job` (of `q`) has just entered its current status."""
    index = q.index
    if index is None:
        index = q.index = [StatusIndex(status) for status in INDEXED_STATUSES]
    seq = state.next_iseq
    state.next_iseq = seq + 1
    job.iseq = seq
    ix = index[job.status]
    jobs = ix.jobs
    jobs.append(job)
    ix.seqs.append(seq)
    if len(jobs) - ix.head > 2 * _status_count(q, ix.status) + INDEX_STALE_SLACK_ENTRIES:
        keep = [i for i in range(ix.head, len(jobs)) if ix.valid(i)]
        ix.seqs = array("q", [ix.seqs[i] for i in keep])
        ix.jobs = [jobs[i] for i in keep]
        ix.head = 0


def index_remove(q: QueueState, job: Job, status: int) -> None:
    """`job` of `q` leaves `status`: its entry goes stale at once."""
    job.iseq = 0
    index_left(q, status)


def index_left(q: QueueState, status: int) -> None:
    """After a job of `q` left `status`: drop stale entries at the front."""
    index = q.index
    if index is None:
        return
    ix = index[status]
    jobs, seqs = ix.jobs, ix.seqs
    head, end = ix.head, len(jobs)
    while head < end:
        job = jobs[head]
        if job.status == status and job.iseq == seqs[head]:
            break
        head += 1
    if head == end:
        if end:
            ix.jobs = []
            ix.seqs = array("q")
        head = 0
    ix.head = head


def _status_count(q: QueueState, status: int) -> int:
    if status == READY:
        return q.ready_count
    if status == SCHEDULED:
        return q.scheduled_count
    if status == IN_FLIGHT:
        return q.in_flight_count
    return len(q.dead)


def push_ready(q: QueueState, job: Job) -> None:
    entry: ReadyEntry = (job.enqueued_at, job.order, job)
    job.entry = entry
    ready_level_for_push(q, job.priority).push(entry)
