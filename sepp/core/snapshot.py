"""The state as plain rows and back: what a snapshot holds, without the bytes.

Owns: `export_meta`, `export_jobs`, `export_dedup`, `export_dead` (iterators of
msgpack-ready rows) and `StateBuilder`, which rebuilds a `State` from those rows.
The storage layer frames and writes the rows (log_format/FORMAT.md, "Snapshot
record bodies").

Promises: `StateBuilder` fed the exported rows of a state produces a state with the
same `canonical()` form. Row layouts are versioned by SNAPSHOT_ROWS_VERSION.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from heapq import heapify
from typing import Any

from sepp.core.config import CoreConfig
from sepp.core.errors import SnapshotContentError as SnapshotContentError
from sepp.core.events import ScheduleDefined, from_fields
from sepp.core.schedules import Schedule
from sepp.core.state import (
    DEAD,
    IN_FLIGHT,
    READY,
    SCHEDULED,
    DeadLetter,
    Job,
    RateWindow,
    ReadyEntry,
    State,
    index_add,
    job_fields,
    ready_level_for_push,
)
from sepp.core.state import (
    JOB_ROW_FIELDS as JOB_ROW_FIELDS,
)

SNAPSHOT_ROWS_VERSION = 1
# A job row holds `JOB_ROW_FIELDS` (sepp.core.state) in order: one source of truth
# for the layout.
DEAD_ROW_EXTRA_FIELDS = ("cause", "failed_at", "final_attempt", "dead_reason")


def export_meta(state: State) -> dict[str, Any]:
    return {
        "rows_version": SNAPSHOT_ROWS_VERSION,
        "clock_ms": state.clock_ms,
        "next_order": state.next_order,
        "queues": list(state.queues),
        "jobs": len(state.jobs),
        "dedup": len(state.dedup),
        "dead": len(state.dead),
        # Paused queues (issue 15). Absent in older snapshots: none paused.
        "paused": [name for name, q in state.queues.items() if q.paused],
        # Runtime queue definitions (issue 15): name -> overrides. Absent: none.
        "queue_overrides": {name: dict(o) for name, o in state.queue_overrides.items()},
        # Schedules (issue 17): [ScheduleDefined fields..., paused, next_ms] each.
        # Absent in older snapshots: none.
        "schedules": [
            [*sched.spec, sched.paused, sched.next_ms] for sched in state.schedules.values()
        ],
        # Rate windows (issue 17): queue -> [[time_ms, deliveries], ...], oldest
        # first, the runs still in the window. Absent in older snapshots: none.
        "rate_windows": state.rate_windows_now(),
        # The fair reserve's bookkeeping (issue 17): the deliveries applied so far
        # and, per queue, [fair_last, fair_turn_start, fair_turn_count]. Absent in
        # older snapshots: 0, and each queue at 0.
        "delivery_seq": state.delivery_seq,
        "fair": {
            name: [q.fair_last, q.fair_turn_start, q.fair_turn_count]
            for name, q in state.queues.items()
        },
    }


def export_jobs(state: State) -> Iterator[list[Any]]:
    for job in state.jobs.values():
        yield job_fields(job)


def export_dedup(state: State) -> Iterator[list[Any]]:
    for (queue, key), (job_id, expires_at) in state.dedup.items():
        yield [queue, key, job_id, expires_at]


def export_dead(state: State) -> Iterator[list[Any]]:
    for record in state.dead.values():
        row = job_fields(record.job)
        row.extend((record.cause, record.failed_at, record.final_attempt, record.last_reason))
        yield row


class StateBuilder:
    """Rebuilds a State from snapshot rows: meta first, then rows of each kind in
    any number of chunks, then `finish()`."""

    def __init__(self, config: CoreConfig, meta: dict[str, Any]) -> None:
        if meta.get("rows_version") != SNAPSHOT_ROWS_VERSION:
            raise SnapshotContentError(
                f"unsupported snapshot rows version {meta.get('rows_version')!r}"
            )
        self.meta = meta
        self.state = State(config)
        clock = meta.get("clock_ms")
        if not isinstance(clock, int):
            raise SnapshotContentError("snapshot meta has no clock_ms")
        self.state.clock_ms = clock
        next_order = meta.get("next_order")
        if not isinstance(next_order, int) or next_order < 1:
            raise SnapshotContentError("snapshot meta has no next_order")
        self.state.next_order = next_order
        paused = meta.get("paused", [])
        if not isinstance(paused, list) or not all(isinstance(n, str) for n in paused):
            raise SnapshotContentError("snapshot meta paused must be a list of queue names")
        overrides = meta.get("queue_overrides", {})
        if not isinstance(overrides, dict) or not all(
            isinstance(n, str) and isinstance(o, dict) for n, o in overrides.items()
        ):
            raise SnapshotContentError("snapshot meta queue_overrides must map names to maps")
        for name, queue_overrides in overrides.items():
            self.state.set_queue_overrides(name, queue_overrides)
            self.state.queue(name)
        for name in paused:
            self.state.queue(name).paused = True
        self._schedules(meta.get("schedules", []))
        self._rate_windows(meta.get("rate_windows", {}))
        delivery_seq = meta.get("delivery_seq", 0)
        if type(delivery_seq) is not int or delivery_seq < 0:
            raise SnapshotContentError("snapshot meta delivery_seq must be an int >= 0")
        self.state.delivery_seq = delivery_seq
        fair = meta.get("fair", {})
        if not isinstance(fair, dict) or not all(
            isinstance(name, str)
            and isinstance(row, list)
            and len(row) == 3
            and all(type(v) is int for v in row)
            for name, row in fair.items()
        ):
            raise SnapshotContentError("snapshot meta fair must map queues to 3 ints")
        self.fair: dict[str, list[int]] = fair
        # meta["queues"] is not read: the state's queues are the declared ones (from
        # the config) and those its rows put something in. A snapshot written before
        # issue 13 lists every queue ever used; empty ones must not come back.

    def _schedules(self, rows: object) -> None:
        width = len(ScheduleDefined._fields)
        if not isinstance(rows, list):
            raise SnapshotContentError("snapshot meta schedules must be a list of rows")
        for row in rows:
            if not isinstance(row, list) or len(row) != width + 2:
                raise SnapshotContentError(f"schedule row must have {width + 2} fields")
            paused, next_ms = row[width], row[width + 1]
            if type(paused) is not bool or type(next_ms) is not int:
                raise SnapshotContentError("schedule row: paused must be a bool, next_ms an int")
            try:
                spec: Any = from_fields(
                    [ScheduleDefined.TYPE, ScheduleDefined.VERSION, *row[:width]]
                )
                spec = spec._replace(zone=tuple(spec.zone))
                sched = Schedule(spec, paused, next_ms)
            except (ValueError, TypeError, AttributeError) as exc:
                raise SnapshotContentError(f"bad schedule row: {exc}") from exc
            if spec.name in self.state.schedules:
                raise SnapshotContentError(f"schedule {spec.name!r} appears twice")
            self.state.schedules[spec.name] = sched
            if not paused:
                self.state.schedule_heap.append((next_ms, spec.name))

    def _rate_windows(self, raw: object) -> None:
        if not isinstance(raw, dict):
            raise SnapshotContentError("snapshot meta rate_windows must be a map")
        for name, runs in raw.items():
            if not isinstance(name, str) or not isinstance(runs, list) or not runs:
                raise SnapshotContentError("a rate window must map a queue to its runs")
            window = RateWindow()
            for run in runs:
                if (
                    not isinstance(run, list)
                    or len(run) != 2
                    or type(run[0]) is not int
                    or type(run[1]) is not int
                    or run[1] < 1
                    or (window.runs and run[0] <= window.runs[-1][0])
                ):
                    raise SnapshotContentError(f"bad rate window run {run!r:.80} of {name!r}")
                window.runs.append([run[0], run[1]])
                window.total += run[1]
            self.state.rate_windows[name] = window

    def _job(self, row: list[Any]) -> Job:
        if len(row) != len(JOB_ROW_FIELDS):
            raise SnapshotContentError(
                f"job row has {len(row)} fields, expected {len(JOB_ROW_FIELDS)}"
            )
        intern = self.state.intern
        row[1] = intern(row[1])
        row[2] = intern(row[2])
        if row[4] is not None:
            row[4] = intern(row[4])
        return Job(*row)

    def add_jobs(self, rows: Iterable[list[Any]]) -> None:
        # The cold-start hot loop (a million rows must load in a few seconds):
        # everything local, no per-row method calls beyond Job().
        state = self.state
        jobs = state.jobs
        queues = state.queues
        strings = state._strings
        width = len(JOB_ROW_FIELDS)
        scheduled = state.scheduled
        leases = state.leases
        for row in rows:
            if len(row) != width:
                raise SnapshotContentError(f"job row has {len(row)} fields, expected {width}")
            name = row[1]
            row[1] = name = strings.get(name) or state.intern(name)
            job_type = row[2]
            row[2] = strings.get(job_type) or state.intern(job_type)
            encoding = row[4]
            if encoding is not None:
                row[4] = strings.get(encoding) or state.intern(encoding)
            job = Job(*row)
            job_id = job.job_id
            if job_id in jobs:
                raise SnapshotContentError(f"job {job_id} appears twice")
            jobs[job_id] = job
            q = queues.get(name) or state.queue(name)
            status = job.status
            if status == READY:
                # Rows come in arrival order, which is ready order: the push lands
                # every entry on its level's fifo without sorting.
                entry: ReadyEntry = (job.enqueued_at, job.order, job)
                job.entry = entry
                ready_level_for_push(q, job.priority).push(entry)
                q.ready_count += 1
            elif status == SCHEDULED:
                scheduled.append((job.due_ms, job_id, job))
                q.scheduled_count += 1
            elif status == IN_FLIGHT:
                leases.append((job.due_ms, job_id, job))
                q.in_flight_count += 1
            else:
                raise SnapshotContentError(f"live job {job_id} has status {status}")

    def add_dedup(self, rows: Iterable[list[Any]]) -> None:
        state = self.state
        for row in rows:
            if len(row) != 4:
                raise SnapshotContentError("dedup row must have 4 fields")
            queue, key, job_id, expires_at = row
            queue = state.intern(queue)
            if (queue, key) in state.dedup:
                raise SnapshotContentError(f"dedup record {(queue, key)!r} appears twice")
            state.dedup[(queue, key)] = (job_id, expires_at)
            state.dedup_expiry.append((expires_at, queue, key))
            (state.queues.get(queue) or state.queue(queue)).dedup_count += 1

    def add_dead(self, rows: Iterable[list[Any]]) -> None:
        state = self.state
        width = len(JOB_ROW_FIELDS)
        for row in rows:
            if len(row) != width + len(DEAD_ROW_EXTRA_FIELDS):
                raise SnapshotContentError("dead-letter row has the wrong number of fields")
            job = self._job(row[:width])
            if job.status != DEAD:
                raise SnapshotContentError(f"dead letter {job.job_id} has status {job.status}")
            cause, failed_at, final_attempt, reason = row[width:]
            record = DeadLetter(job, cause, failed_at, final_attempt, reason)
            state.dead[job.job_id] = record
            (state.queues.get(job.queue) or state.queue(job.queue)).dead[job.job_id] = record

    def finish(self) -> State:
        state = self.state
        counts = (len(state.jobs), len(state.dedup), len(state.dead))
        expected = (self.meta.get("jobs"), self.meta.get("dedup"), self.meta.get("dead"))
        if counts != expected:
            raise SnapshotContentError(f"snapshot holds {counts} rows, its meta says {expected}")
        heapify(state.scheduled)
        heapify(state.leases)
        heapify(state.dedup_expiry)
        heapify(state.schedule_heap)
        # The status indexes are not stored: rebuilt in the rows' order (live jobs
        # in arrival order, dead letters oldest first). Cursors handed out before
        # are told apart by the new epoch (`sepp.core.reads`).
        queues = state.queues
        for job in state.jobs.values():
            index_add(state, queues[job.queue], job)
        for record in state.dead.values():
            index_add(state, queues[record.job.queue], record.job)
        state.index_epoch = state.clock_ms
        for name, q in queues.items():
            row = self.fair.get(name)
            if row is not None:
                q.fair_last, q.fair_turn_start, q.fair_turn_count = row
        return state
