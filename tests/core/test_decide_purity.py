"""`decide` never mutates the state, a refused command comes without events, and
time never goes backwards: a `now_ms` lower than the state's clock is clamped up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sepp.core import (
    RETRY_DEAD_LETTER,
    RETRY_DELAY,
    Ack,
    CoreConfig,
    DeadLetterJobs,
    Decision,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Nack,
    Release,
    RequeueDeadLetters,
    Reserve,
    State,
    Sweep,
    apply_record,
    decide,
)
from sepp.core.results import (
    Accepted,
    AtomicRejected,
    CommandError,
    EnqueueResult,
    InvalidArgument,
    InvalidRequest,
)
from tests.core.helpers import NOW, Harness, make_job, new_id

CONFIG = CoreConfig(dead_letter_retention_ms=10_000).with_queue(
    "q", dedup_window_ms=5_000, retry_delay_ms=100, max_queue_depth=20
)


class Populated:
    """A state with a job in every status, a dedup record, dead letters and
    deadlines that a sweep at `LATE` would act on."""

    def __init__(self) -> None:
        h = Harness(CONFIG)
        self.h = h
        [self.flying, self.flying_last] = h.enqueue(
            make_job(priority=9), make_job(priority=9, max_attempts=1), now=NOW
        )
        h.reserve("q", now=NOW, lease_ms=1_000, max_jobs=2)
        [self.ready] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
        [self.scheduled] = h.enqueue(make_job(scheduled_at=NOW + 500), now=NOW)
        [self.dead, self.dead2] = h.enqueue(make_job(queue="d"), make_job(queue="d"), now=NOW)
        h.dead_letter(self.dead, self.dead2, now=NOW + 1)
        self.state = h.state


LATE = NOW + 20_000
CommandFor = Callable[[Populated], Any]

COMMAND_ROWS = [
    pytest.param(lambda p: Enqueue(jobs=(make_job(), make_job(scheduled_at=NOW + 50))), id="a best-effort enqueue"),
    pytest.param(lambda p: Enqueue(jobs=(make_job(), make_job()), atomic=True), id="an atomic enqueue"),
    pytest.param(lambda p: Enqueue(jobs=(make_job(idempotency_key="k"),)), id="an enqueue that is a dedup hit"),
    pytest.param(lambda p: Enqueue(jobs=(make_job(priority=10),)), id="an enqueue of an invalid job"),
    pytest.param(lambda p: Enqueue(jobs=(make_job(), make_job(priority=10)), atomic=True), id="an atomic enqueue that fails"),
    pytest.param(lambda p: Enqueue(jobs=()), id="an empty enqueue"),
    pytest.param(lambda p: Reserve(queues=("q", "d"), lease_ms=100, max_jobs=5), id="a reserve"),
    pytest.param(lambda p: Reserve(queues=("nowhere",), lease_ms=100), id="a reserve of an unknown queue"),
    pytest.param(lambda p: Reserve(queues=("q",), lease_ms=0), id="an invalid reserve"),
    pytest.param(lambda p: Ack(job_id=p.flying, attempt=1), id="an ack"),
    pytest.param(lambda p: Ack(job_id=p.flying, attempt=2), id="a fenced ack"),
    pytest.param(lambda p: Nack(job_id=p.flying, attempt=1), id="a default nack"),
    pytest.param(lambda p: Nack(job_id=p.flying, attempt=1, retry=RETRY_DELAY, delay_ms=0), id="a zero-delay nack"),
    pytest.param(lambda p: Nack(job_id=p.flying, attempt=1, retry=RETRY_DEAD_LETTER), id="a dead-letter nack"),
    pytest.param(lambda p: Nack(job_id=p.flying_last, attempt=1), id="a nack of the final attempt"),
    pytest.param(lambda p: Nack(job_id=p.ready, attempt=1), id="a fenced nack"),
    pytest.param(lambda p: Extend(job_id=p.flying, attempt=1, lease_ms=50_000), id="an extend"),
    pytest.param(lambda p: Extend(job_id=p.flying, attempt=1, lease_ms=0), id="an invalid extend"),
    pytest.param(lambda p: Release(job_id=p.flying, attempt=1), id="a release"),
    pytest.param(lambda p: Release(job_id=p.ready, attempt=1), id="a fenced release"),
    pytest.param(lambda p: DrainDeadLetters(max_records=5), id="a drain"),
    pytest.param(lambda p: DrainDeadLetters(max_records=0), id="an invalid drain"),
    pytest.param(lambda p: Sweep(), id="a sweep with everything due"),
    pytest.param(lambda p: DeadLetterJobs(job_ids=(p.ready, p.scheduled, p.flying, new_id())), id="an operator dead-letter"),
    pytest.param(lambda p: RequeueDeadLetters(job_ids=(p.dead, p.ready)), id="an operator requeue"),
]  # fmt: skip


def raw_layout(state: State) -> Any:
    """Everything canonical() leaves out: heap layouts (with stale entries), each
    job's ready-entry identity, dict orders."""
    return (
        [
            [(list(level.fifo), list(level.heap)) for level in q.ready]
            for q in state.queues.values()
        ],
        list(state.scheduled),
        list(state.leases),
        list(state.dedup_expiry),
        [(job.job_id, id(job.entry), job.due_ms, job.status) for job in state.jobs.values()],
        [list(q.dead) for q in state.queues.values()],
        list(state.dead),
        list(state.queues),
    )


@pytest.mark.parametrize("command_for", COMMAND_ROWS)
def test_decide_never_mutates_the_state(command_for: CommandFor) -> None:
    p = Populated()
    command = command_for(p)
    canonical, layout = p.state.canonical(), raw_layout(p.state)

    result = decide(p.state, command, LATE)

    assert p.state.canonical() == canonical
    assert raw_layout(p.state) == layout
    # Deciding twice gives the same answer: nothing was consumed.
    assert decide(p.state, command, LATE) == result


@pytest.mark.parametrize("command_for", COMMAND_ROWS)
def test_a_refused_command_or_a_fully_rejected_batch_comes_without_events(
    command_for: CommandFor,
) -> None:
    p = Populated()
    result = decide(p.state, command_for(p), LATE)
    if isinstance(result, CommandError):
        return
    assert isinstance(result, Decision)
    reply = result.reply
    if isinstance(reply, AtomicRejected):
        assert result.events == ()
    elif isinstance(reply, EnqueueResult):
        created = [r for r in reply.results if isinstance(r, Accepted) and not r.deduplicated]
        assert len(result.events) == len(created)
    assert result.time_ms == LATE


def test_an_unknown_command_is_an_invalid_argument() -> None:
    state = State()
    result = decide(state, object(), NOW)  # type: ignore[arg-type]
    assert isinstance(result, InvalidArgument)


# ---------------------------------------------------------------------------
# Time never goes back


def clock_at(h: Harness, t: int) -> None:
    """Move the state's clock to `t` with a command that changes nothing else."""
    h.accept(Reserve(queues=("idle",), lease_ms=1), now=t)
    assert h.state.clock_ms == t


STALE = NOW - 5_000


def test_a_decision_stamped_in_the_past_is_made_at_the_clock() -> None:
    h = Harness()
    clock_at(h, NOW)
    result = h.run(Enqueue(jobs=(make_job(),)), now=STALE)
    assert isinstance(result, Decision)
    assert result.time_ms == NOW
    assert h.state.clock_ms == NOW


@pytest.mark.parametrize(
    "check",
    [
        pytest.param("enqueued_at", id="an enqueue gets enqueued_at of the clock"),
        pytest.param("scheduled_at", id="a scheduled_at at the clock lands ready"),
        pytest.param("lease", id="a reserve leases from the clock"),
        pytest.param("nack_delay", id="a delayed nack counts its delay from the clock"),
        pytest.param("extend", id="an extend counts from the clock"),
        pytest.param("failed_at", id="a dead letter fails at the clock"),
        pytest.param("sweep", id="a sweep acts on what is due at the clock"),
        pytest.param("dedup", id="a dedup lookup compares the deadline with the clock"),
    ],
)
def test_a_stale_now_is_clamped_up_to_the_clock(check: str) -> None:
    h = Harness(CoreConfig(dead_letter_retention_ms=1).with_queue("q", dedup_window_ms=1_000))
    if check == "enqueued_at":
        clock_at(h, NOW)
        [job_id] = h.enqueue(make_job(), now=STALE)
        assert h.job(job_id).enqueued_at == NOW
    elif check == "scheduled_at":
        clock_at(h, NOW)
        [job_id] = h.enqueue(make_job(scheduled_at=NOW), now=STALE)
        assert h.status(job_id) == "ready"
    elif check == "lease":
        h.enqueue(make_job(), now=STALE)
        clock_at(h, NOW)
        assert h.reserve_one("q", now=STALE, lease_ms=100).lease_expires_at == NOW + 100
    elif check in ("nack_delay", "extend", "failed_at"):
        [job_id] = h.enqueue(make_job(), now=STALE)
        h.reserve_one("q", now=STALE, lease_ms=100_000)
        clock_at(h, NOW)
        if check == "nack_delay":
            h.nack(job_id, 1, now=STALE, retry=RETRY_DELAY, delay_ms=10)
            assert h.job(job_id).due_ms == NOW + 10
        elif check == "extend":
            assert h.extend(job_id, 1, 10, now=STALE).lease_expires_at == NOW + 10
        else:
            h.nack(job_id, 1, now=STALE, retry=RETRY_DEAD_LETTER)
            assert h.state.dead[job_id].failed_at == NOW
    elif check == "sweep":
        [job_id] = h.enqueue(make_job(scheduled_at=NOW), now=STALE)
        clock_at(h, NOW)
        assert h.sweep(now=STALE).promoted == 1
        assert h.status(job_id) == "ready"
    else:
        h.enqueue(make_job(idempotency_key="k"), now=NOW - 1_000)
        clock_at(h, NOW)  # the record's deadline
        fresh = make_job(idempotency_key="k")
        assert h.enqueue_results(fresh, now=STALE) == (Accepted(fresh.job_id, False),)


def test_apply_record_never_moves_the_clock_back() -> None:
    state = State()
    apply_record(state, NOW, ())
    apply_record(state, STALE, ())
    assert state.clock_ms == NOW


def test_rejections_do_not_move_the_clock() -> None:
    h = Harness()
    clock_at(h, NOW)
    h.refuse(Reserve(queues=(), lease_ms=1), now=NOW + 10)
    assert h.state.clock_ms == NOW
    [result] = h.enqueue_results(make_job(priority=10), now=NOW + 20)
    assert isinstance(result, InvalidRequest)
    # An accepted decision with no events still carries its time.
    assert h.state.clock_ms == NOW + 20
