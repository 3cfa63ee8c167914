"""Shared builders for the core tests.

`Harness` runs commands the way the server does — `decide`, then `apply_record` of
the decision — and after every command checks the two promises every test relies
on: `decide` left the state untouched (its `canonical()` form is the same before
and after), and the state still satisfies `check_invariants`. Each accepted
decision is recorded as `(time_ms, events)` so a test can replay the log.

Time is always an argument: tests pass `now=` explicitly; nothing reads a clock.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from sepp.core import (
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
    RequeueDeadLetters,
    Reserve,
    State,
    Sweep,
    apply_record,
    check_invariants,
    decide,
    validate_config,
)
from sepp.core.events import Event
from sepp.core.results import (
    Accepted,
    AckResult,
    AdminResult,
    CommandError,
    DeadLetterView,
    DrainResult,
    EnqueueResult,
    ExtendResult,
    JobView,
    NackResult,
    Reply,
    ReserveResult,
    SweepResult,
)
from sepp.core.state import STATUS_NAMES, Job

# An arbitrary, non-zero start time: tests that care about time say so explicitly.
NOW = 1_000_000


# Job ids break ties in the ready order, so they are drawn from the run's seed,
# never from uuid4: tests/core/conftest.py reseeds this stream before each test
# from SEPP_SEED and the test's id, so a failure replays with `SEPP_SEED=...`.
_ids = random.Random(0)


def seed_ids(seed: str) -> None:
    """Restart the id stream (tests/core/conftest.py does, before every test)."""
    _ids.seed(seed)


def new_id() -> str:
    return str(uuid.UUID(int=_ids.getrandbits(128), version=4))


def ordered_ids(count: int) -> list[str]:
    """`count` job ids in ascending order (ids break ties in the ready order)."""
    return [str(uuid.UUID(int=(i + 1) << 64 | 0xABC)) for i in range(count)]


def make_job(queue: str = "q", job_type: str = "work", **fields: Any) -> NewJob:
    """A valid job unless `fields` say otherwise; a fresh id unless one is given."""
    job_id = fields.pop("job_id", None) or new_id()
    return NewJob(job_id=job_id, queue=queue, job_type=job_type, **fields)


class Harness:
    """A State plus the live path (decide, then apply) with checks after each step."""

    def __init__(self, config: CoreConfig | None = None) -> None:
        self.config = config if config is not None else CoreConfig()
        validate_config(self.config)
        self.state = State(self.config)
        self.records: list[tuple[int, tuple[Event, ...]]] = []
        self.decisions: list[Decision] = []

    # -- the live path -------------------------------------------------------

    def run(self, command: Command, now: int) -> Decision | CommandError:
        before = self.state.canonical()
        result = decide(self.state, command, now)
        assert self.state.canonical() == before, f"decide mutated the state for {command!r}"
        if isinstance(result, Decision):
            apply_record(self.state, result.time_ms, result.events)
            self.records.append((result.time_ms, result.events))
            self.decisions.append(result)
        else:
            assert isinstance(result, CommandError), result
        check_invariants(self.state)
        return result

    def accept(self, command: Command, now: int) -> Reply:
        result = self.run(command, now)
        assert isinstance(result, Decision), f"{command!r} was refused: {result!r}"
        return result.reply

    def refuse(self, command: Command, now: int) -> CommandError:
        before = self.state.canonical()
        result = self.run(command, now)
        assert isinstance(result, CommandError), f"{command!r} was accepted: {result!r}"
        assert self.state.canonical() == before
        return result

    # -- commands ------------------------------------------------------------

    def enqueue_results(self, *jobs: NewJob, now: int, atomic: bool = False) -> tuple[Any, ...]:
        reply = self.accept(Enqueue(jobs=tuple(jobs), atomic=atomic), now)
        assert isinstance(reply, EnqueueResult), reply
        return reply.results

    def enqueue(self, *jobs: NewJob, now: int, atomic: bool = False) -> list[str]:
        """Enqueue jobs that must all be accepted as new jobs; their ids."""
        results = self.enqueue_results(*jobs, now=now, atomic=atomic)
        ids = []
        for job, result in zip(jobs, results, strict=True):
            assert result == Accepted(job.job_id, False), result
            ids.append(result.job_id)
        return ids

    def reserve(
        self,
        *queues: str,
        now: int,
        lease_ms: int = 30_000,
        max_jobs: int = 1,
        worker_id: str | None = None,
    ) -> tuple[JobView, ...]:
        reply = self.accept(
            Reserve(queues=queues, lease_ms=lease_ms, max_jobs=max_jobs, worker_id=worker_id),
            now,
        )
        assert isinstance(reply, ReserveResult), reply
        return reply.jobs

    def reserve_one(self, *queues: str, now: int, lease_ms: int = 30_000) -> JobView:
        jobs = self.reserve(*queues, now=now, lease_ms=lease_ms)
        assert len(jobs) == 1, jobs
        return jobs[0]

    def ack(self, job_id: str, attempt: int, now: int) -> AckResult:
        reply = self.accept(Ack(job_id=job_id, attempt=attempt), now)
        assert isinstance(reply, AckResult), reply
        return reply

    def nack(self, job_id: str, attempt: int, now: int, **fields: Any) -> NackResult:
        reply = self.accept(Nack(job_id=job_id, attempt=attempt, **fields), now)
        assert isinstance(reply, NackResult), reply
        return reply

    def extend(self, job_id: str, attempt: int, lease_ms: int, now: int) -> ExtendResult:
        reply = self.accept(Extend(job_id=job_id, attempt=attempt, lease_ms=lease_ms), now)
        assert isinstance(reply, ExtendResult), reply
        return reply

    def sweep(self, now: int) -> SweepResult:
        reply = self.accept(Sweep(), now)
        assert isinstance(reply, SweepResult), reply
        return reply

    def drain(
        self, now: int, queue: str | None = None, max_records: int = 1
    ) -> tuple[DeadLetterView, ...]:
        reply = self.accept(DrainDeadLetters(queue=queue, max_records=max_records), now)
        assert isinstance(reply, DrainResult), reply
        return reply.records

    def dead_letter(self, *job_ids: str, now: int, reason: str | None = None) -> AdminResult:
        reply = self.accept(DeadLetterJobs(job_ids=job_ids, reason=reason), now)
        assert isinstance(reply, AdminResult), reply
        return reply

    def requeue(self, *job_ids: str, now: int) -> AdminResult:
        reply = self.accept(RequeueDeadLetters(job_ids=job_ids), now)
        assert isinstance(reply, AdminResult), reply
        return reply

    # -- observations --------------------------------------------------------

    def status(self, job_id: str) -> str:
        """'ready', 'scheduled', 'in_flight', 'dead' (retained) or 'gone'."""
        job = self.state.jobs.get(job_id)
        if job is not None:
            return STATUS_NAMES[job.status]
        return "dead" if job_id in self.state.dead else "gone"

    def job(self, job_id: str) -> Job:
        return self.state.jobs[job_id]

    def counts(self, queue: str) -> tuple[int, int, int, int]:
        """(ready, scheduled, in flight, dead letters) of one queue (all zero for a
        queue the state does not keep: an undeclared one that holds nothing)."""
        q = self.state.queues.get(queue)
        if q is None:
            return (0, 0, 0, 0)
        return (q.ready_count, q.scheduled_count, q.in_flight_count, len(q.dead))

    def ready_order(self, queue: str) -> list[str]:
        return list(self.state.canonical()["ready"].get(queue, []))
