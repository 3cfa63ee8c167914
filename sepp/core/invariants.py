"""Invariant checks over a whole `State`: run after every apply in tests, and by
`sepp-log verify` after a replay.

Owns: `check_invariants(state)`, which raises `InvariantViolation` naming the first
broken rule. O(size of the state): never on the hot path.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

import itertools

from sepp.core.errors import InvariantViolation as InvariantViolation
from sepp.core.state import (
    DEAD,
    EMPTY_READY_LEVEL,
    IN_FLIGHT,
    PRIORITY_LEVELS,
    READY,
    SCHEDULED,
    QueueState,
    State,
)


def _fail(message: str) -> None:
    raise InvariantViolation(message)


def _check_heap(name: str, heap: list) -> None:  # type: ignore[type-arg]
    for i in range(1, len(heap)):
        if heap[(i - 1) // 2] > heap[i]:
            _fail(f"{name}: heap order broken at index {i}")


def check_invariants(state: State) -> None:
    counts: dict[str, list[int]] = {name: [0, 0, 0] for name in state.queues}
    scheduled_ids = {e[1] for e in state.scheduled if state.scheduled_entry_valid(e)}
    lease_ids = {e[1] for e in state.leases if state.lease_entry_valid(e)}
    for job_id, job in state.jobs.items():
        if job.job_id != job_id:
            _fail(f"job stored under {job_id} has id {job.job_id}")
        if job.queue not in state.queues:
            _fail(f"job {job_id} is in unknown queue {job.queue!r}")
        if not 0 <= job.priority < PRIORITY_LEVELS:
            _fail(f"job {job_id} has priority {job.priority}")
        if not 1 <= job.attempt <= job.max_attempts:
            _fail(f"job {job_id} has attempt {job.attempt} of {job.max_attempts}")
        if job_id in state.dead:
            _fail(f"job {job_id} is both live and dead")
        if not 1 <= job.order < state.next_order:
            _fail(f"job {job_id} has arrival number {job.order}, next is {state.next_order}")
        q = state.queues[job.queue]
        if job.status == READY:
            entry = job.entry
            if entry is None or entry[2] is not job or entry[:2] != (job.enqueued_at, job.order):
                _fail(f"ready job {job_id} has no matching ready entry")
            counts[job.queue][0] += 1
            if job.due_ms != 0 or job.worker_id is not None:
                _fail(f"ready job {job_id} has a deadline or a worker")
        elif job.status == SCHEDULED:
            if job_id not in scheduled_ids:
                _fail(f"scheduled job {job_id} is missing from the scheduled heap")
            counts[job.queue][1] += 1
        elif job.status == IN_FLIGHT:
            if job_id not in lease_ids:
                _fail(f"in-flight job {job_id} is missing from the lease heap")
            counts[job.queue][2] += 1
        else:
            _fail(f"live job {job_id} has status {job.status}")
        if job.status != READY and job.entry is not None:
            _fail(f"job {job_id} is not ready but holds a ready entry")
        del q
    if EMPTY_READY_LEVEL:
        _fail("the shared empty ready level holds entries")
    dedup_counts: dict[str, int] = {}
    for queue, _key in state.dedup:
        dedup_counts[queue] = dedup_counts.get(queue, 0) + 1
    for name, q in state.queues.items():
        if q.name != name:
            _fail(f"queue stored under {name!r} is named {q.name!r}")
        if q.dedup_count != dedup_counts.get(name, 0):
            _fail(
                f"queue {name} counts {q.dedup_count} dedup records, "
                f"the store holds {dedup_counts.get(name, 0)}"
            )
        if q.holds_nothing() and name not in state.declared:
            _fail(f"queue {name} holds nothing and is not declared, but is kept")
        valid_ready = 0
        for prio in range(PRIORITY_LEVELS):
            level = q.ready[prio]
            where = f"queue {name} priority {prio}"
            _check_heap(where, level.heap)
            fifo = list(level.fifo)
            for a, b in itertools.pairwise(fifo):
                if not a < b:
                    _fail(f"{where}: the fifo is out of (enqueued_at, order) order")
            for head in (
                level.fifo[0] if level.fifo else None,
                level.heap[0] if level.heap else None,
            ):
                if head is not None and head[2].entry is not head:
                    _fail(f"{where}: stale entry at a head")
            for entry in level.entries():
                if entry[2].entry is entry:
                    valid_ready += 1
                    job = entry[2]
                    if (
                        job.priority != prio
                        or job.queue != name
                        or entry[:2] != (job.enqueued_at, job.order)
                    ):
                        _fail(f"job {job.job_id} sits in the wrong ready level or with a stale key")
        expected = counts[name]
        if (q.ready_count, q.scheduled_count, q.in_flight_count) != tuple(expected):
            _fail(
                f"queue {name} counts {(q.ready_count, q.scheduled_count, q.in_flight_count)} "
                f"but jobs say {tuple(expected)}"
            )
        if valid_ready != q.ready_count:
            _fail(f"queue {name} has {valid_ready} ready entries for {q.ready_count} ready jobs")
        for job_id, record in q.dead.items():
            if state.dead.get(job_id) is not record or record.job.queue != name:
                _fail(f"dead letter {job_id} of queue {name} is not in the global store")
        _check_status_index(state, name, q)
    if sum(len(q.dead) for q in state.queues.values()) != len(state.dead):
        _fail("per-queue dead-letter stores do not add up to the global one")
    last_failed_at = None
    for job_id, record in state.dead.items():
        if record.job.status != DEAD or record.job.job_id != job_id:
            _fail(f"dead letter {job_id} holds a job in status {record.job.status}")
        if last_failed_at is not None and record.failed_at < last_failed_at:
            _fail(f"dead letter {job_id} is out of failed_at order")
        last_failed_at = record.failed_at
    for heap_name, heap, valid in (
        ("scheduled", state.scheduled, state.scheduled_entry_valid),
        ("leases", state.leases, state.lease_entry_valid),
    ):
        _check_heap(heap_name, heap)
        if heap and not valid(heap[0]):
            _fail(f"stale entry on top of the {heap_name} heap")
    _check_heap("dedup_expiry", state.dedup_expiry)
    if state.dedup_expiry and not state.dedup_entry_valid(state.dedup_expiry[0]):
        _fail("stale entry on top of the dedup expiry heap")
    dedup_entries = {(e[1], e[2], e[0]) for e in state.dedup_expiry}
    for (queue, key), (_job_id, expires_at) in state.dedup.items():
        if queue not in state.queues:
            _fail(f"dedup record {(queue, key)} names unknown queue {queue!r}")
        if (queue, key, expires_at) not in dedup_entries:
            _fail(f"dedup record {(queue, key)} has no expiry entry")


def _check_status_index(state: State, name: str, q: QueueState) -> None:
    """The status indexes of `q` (issue 15, admin listing) hold exactly its jobs:
    each Ready / Scheduled / In-flight job and each dead letter has one valid
    entry in the index of its status, seqs increase, nothing before `head` is
    valid and the head entry is valid (or the index is empty)."""
    expected: list[set[str]] = [set(), set(), set(), set()]
    for job in state.jobs.values():
        if job.queue == name:
            expected[job.status].add(job.job_id)
    expected[DEAD] = set(q.dead)
    index = q.index
    if index is None:
        if any(expected):
            _fail(f"queue {name} holds jobs but has no status index")
        return
    for status, ix in enumerate(index):
        where = f"queue {name} status index {status}"
        if ix.status != status or len(ix.seqs) != len(ix.jobs):
            _fail(f"{where}: malformed")
        if not 0 <= ix.head <= len(ix.jobs):
            _fail(f"{where}: head {ix.head} out of range")
        for a, b in itertools.pairwise(ix.seqs):
            if not a < b:
                _fail(f"{where}: seqs out of order")
        valid = [ix.jobs[i].job_id for i in range(len(ix.jobs)) if ix.valid(i)]
        if any(ix.valid(i) for i in range(ix.head)):
            _fail(f"{where}: a valid entry before the head")
        if ix.head < len(ix.jobs) and not ix.valid(ix.head):
            _fail(f"{where}: stale entry at the head")
        if len(valid) != len(set(valid)) or set(valid) != expected[status]:
            _fail(f"{where}: holds {sorted(valid)}, the jobs say {sorted(expected[status])}")
        for job in ix.jobs:
            if job.queue != name:
                _fail(f"{where}: job {job.job_id} of queue {job.queue}")
        if ix.seqs and ix.seqs[-1] >= state.next_iseq:
            _fail(f"{where}: seq {ix.seqs[-1]} not below next_iseq {state.next_iseq}")
