"""Fencing of ack, nack, extend and release by (job_id, attempt) (sepp-semantics.md §7):
NotFound when there is no in-flight record, AttemptMismatch when someone else
holds a newer attempt; a fenced command changes nothing and logs nothing. Ack,
nack and extend may also carry the delivery's enqueued_at (the token that tells
deliveries apart across an operator requeue): see the table further down.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sepp.core import RETRY_DEAD_LETTER, Ack, Command, CoreConfig, Extend, Nack, Release
from sepp.core.commands import AdminRequeueDeadLetters
from sepp.core.results import (
    AckResult,
    AttemptMismatch,
    ExtendResult,
    InvalidArgument,
    NackResult,
    NotFound,
    ReleaseResult,
)
from tests.core.helpers import NOW, Harness, make_job, new_id

LEASE = 1_000
OPERATIONS: dict[str, Callable[[str, int], Command]] = {
    "ack": lambda job_id, attempt: Ack(job_id=job_id, attempt=attempt),
    "nack": lambda job_id, attempt: Nack(job_id=job_id, attempt=attempt),
    "extend": lambda job_id, attempt: Extend(job_id=job_id, attempt=attempt, lease_ms=LEASE),
    "release": lambda job_id, attempt: Release(job_id=job_id, attempt=attempt),
}


def scenario(name: str) -> tuple[Harness, str, int]:
    """Set up one fencing situation; return the harness, the id and the attempt
    the (former) holder would send."""
    h = Harness(CoreConfig(dead_letter_retention_ms=60_000))
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW, lease_ms=LEASE)
    if name == "unknown":
        return h, new_id(), 1
    if name == "never_reserved":
        [other] = h.enqueue(make_job(), now=NOW)
        return h, other, 1
    if name == "acked":
        h.ack(job_id, 1, now=NOW + 1)
    elif name == "dead_lettered":
        h.nack(job_id, 1, now=NOW + 1, retry=RETRY_DEAD_LETTER)
    elif name == "expired_and_swept":
        h.sweep(now=NOW + LEASE)
        assert h.status(job_id) == "ready"
    elif name == "between_nack_and_reserve":
        h.nack(job_id, 1, now=NOW + 1)
        assert h.status(job_id) == "ready"
    elif name == "nacked_with_delay":
        h.nack(job_id, 1, now=NOW + 1, retry="delay", delay_ms=5_000)
        assert h.status(job_id) == "scheduled"
    elif name in ("redelivered", "redelivered_after_nack"):
        if name == "redelivered":
            h.sweep(now=NOW + LEASE)
        else:
            h.nack(job_id, 1, now=NOW + 1)
        assert h.reserve_one("q", now=NOW + LEASE, lease_ms=LEASE).attempt == 2
    elif name == "future_attempt":
        return h, job_id, 2
    else:  # pragma: no cover - a typo in a row
        raise AssertionError(name)
    return h, job_id, 1


NOT_FOUND = [
    pytest.param("unknown", id="an unknown id"),
    pytest.param("never_reserved", id="a ready job that was never reserved"),
    pytest.param("acked", id="an acked job"),
    pytest.param("dead_lettered", id="a dead-lettered job"),
    pytest.param("expired_and_swept", id="an expired lease the sweep reclaimed"),
    pytest.param("between_nack_and_reserve", id="a nacked job before the next reserve"),
    pytest.param("nacked_with_delay", id="a job waiting for its retry delay"),
]
MISMATCH = [
    pytest.param("redelivered", id="a lease reassigned after expiry"),
    pytest.param("redelivered_after_nack", id="a job redelivered after a nack"),
    pytest.param("future_attempt", id="an attempt newer than the one in flight"),
]


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("situation", NOT_FOUND)
def test_an_operation_without_an_in_flight_record_is_not_found(
    situation: str, operation: str
) -> None:
    h, job_id, attempt = scenario(situation)
    before = h.state.canonical()

    error = h.refuse(OPERATIONS[operation](job_id, attempt), now=NOW + LEASE + 1)

    assert type(error) is NotFound
    assert error.code == "not_found"
    assert h.state.canonical() == before


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("situation", MISMATCH)
def test_an_operation_on_a_reassigned_lease_is_an_attempt_mismatch(
    situation: str, operation: str
) -> None:
    h, job_id, attempt = scenario(situation)
    holder = h.job(job_id)
    held = (holder.attempt, holder.due_ms)

    error = h.refuse(OPERATIONS[operation](job_id, attempt), now=NOW + LEASE + 1)

    assert type(error) is AttemptMismatch
    assert error.code == "failed_precondition"
    # The rightful holder is untouched and can still finish the job.
    assert (h.status(job_id), h.job(job_id).attempt, h.job(job_id).due_ms) == ("in_flight", *held)
    h.ack(job_id, held[0], now=NOW + LEASE + 2)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_an_operation_after_the_deadline_but_before_the_sweep_is_accepted(
    operation: str,
) -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    deadline = h.reserve_one("q", now=NOW, lease_ms=LEASE).lease_expires_at
    late = deadline + 500

    reply = h.accept(OPERATIONS[operation](job_id, 1), now=late)

    if operation == "ack":
        assert reply == AckResult(job_id)
        assert h.status(job_id) == "gone"
    elif operation == "nack":
        assert reply == NackResult(job_id, False)
        assert (h.status(job_id), h.job(job_id).attempt) == ("ready", 2)
    elif operation == "release":
        assert reply == ReleaseResult(job_id)
        assert (h.status(job_id), h.job(job_id).attempt) == ("ready", 1)
    else:
        assert reply == ExtendResult(job_id, late + LEASE)
        h.sweep(now=late)
        assert h.status(job_id) == "in_flight"


def test_a_fenced_command_does_not_disturb_other_jobs() -> None:
    h = Harness()
    a, b = h.enqueue(make_job(), make_job(), now=NOW)
    h.reserve("q", now=NOW, max_jobs=2)
    h.refuse(Ack(job_id=a, attempt=7), now=NOW)
    h.refuse(Ack(job_id=new_id(), attempt=1), now=NOW)
    h.ack(a, 1, now=NOW)
    h.ack(b, 1, now=NOW)
    assert h.state.jobs == {}


def test_ids_are_compared_case_insensitively() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW)
    h.extend(job_id.upper(), 1, 10, now=NOW)
    assert h.ack(job_id.upper(), 1, now=NOW) == AckResult(job_id)


# -- the delivery token: enqueued_at ---------------------------------------------
#
# An operator requeue of a dead letter restarts the job at attempt 1, so
# (job_id, attempt) alone lets the holder of an expired lease of attempt 1
# settle the job's new delivery. Ack, nack and extend may carry the
# enqueued_at their delivery carried (the requeue always moves it forward):
#
# | token                        | outcome                                    |
# | ---------------------------- | ------------------------------------------ |
# | the current enqueued_at      | accepted                                   |
# | another value (requeued)     | AttemptMismatch, nothing changed           |
# | absent                       | attempt-only fence (the old behaviour)     |
# | not an integer               | InvalidArgument                            |

TOKENED: dict[str, Callable[[str, int, int | None], Command]] = {
    "ack": lambda job_id, attempt, token: Ack(job_id=job_id, attempt=attempt, enqueued_at=token),
    "nack": lambda job_id, attempt, token: Nack(job_id=job_id, attempt=attempt, enqueued_at=token),
    "extend": lambda job_id, attempt, token: Extend(
        job_id=job_id, attempt=attempt, lease_ms=LEASE, enqueued_at=token
    ),
}


def requeued_after_a_lapsed_lease(
    requeue: Callable[[Harness, str, int], object] | None = None,
) -> tuple[Harness, str, int, int]:
    """The colleague's repro: a job with max_attempts=1 reserved by A, A's lease
    lapses (dead-lettered, cause lease_expired), an operator requeues it, B
    reserves it at attempt 1. Returns the harness, the id, A's token and B's."""
    h = Harness(CoreConfig(dead_letter_retention_ms=60_000))
    [job_id] = h.enqueue(make_job(max_attempts=1), now=NOW)
    first = h.reserve_one("q", now=NOW, lease_ms=LEASE)
    h.sweep(now=NOW + LEASE)
    assert h.status(job_id) == "dead"
    if requeue is None:
        h.requeue(job_id, now=NOW + LEASE + 1)
    else:
        requeue(h, job_id, NOW + LEASE + 1)
    second = h.reserve_one("q", now=NOW + LEASE + 2, lease_ms=LEASE)
    assert (first.attempt, second.attempt) == (1, 1)
    return h, job_id, first.enqueued_at, second.enqueued_at


@pytest.mark.parametrize("operation", sorted(TOKENED))
def test_an_operation_carrying_the_current_delivery_token_is_accepted(operation: str) -> None:
    h, job_id, _, token = requeued_after_a_lapsed_lease()

    h.accept(TOKENED[operation](job_id, 1, token), now=NOW + LEASE + 3)

    expected = {"ack": "gone", "nack": "dead", "extend": "in_flight"}[operation]
    assert h.status(job_id) == expected


@pytest.mark.parametrize("operation", sorted(TOKENED))
def test_an_operation_carrying_the_token_of_a_delivery_before_a_requeue_is_fenced(
    operation: str,
) -> None:
    h, job_id, stale, token = requeued_after_a_lapsed_lease()
    assert stale != token
    held = h.job(job_id).due_ms

    error = h.refuse(TOKENED[operation](job_id, 1, stale), now=NOW + LEASE + 3)

    assert type(error) is AttemptMismatch
    assert error.code == "failed_precondition"
    assert error.current_attempt == 1
    # B, the rightful holder, is untouched and can still finish the job.
    assert (h.status(job_id), h.job(job_id).due_ms) == ("in_flight", held)
    reply = h.accept(Ack(job_id=job_id, attempt=1, enqueued_at=token), now=NOW + LEASE + 4)
    assert reply == AckResult(job_id)


@pytest.mark.parametrize("operation", sorted(TOKENED))
def test_an_operation_without_a_token_is_fenced_by_its_attempt_only(operation: str) -> None:
    """The limitation of clients that do not send the token (the official gRPC
    clients): after a requeue, A's stale attempt 1 is taken for B's."""
    h, job_id, _, _ = requeued_after_a_lapsed_lease()

    h.accept(TOKENED[operation](job_id, 1, None), now=NOW + LEASE + 3)

    expected = {"ack": "gone", "nack": "dead", "extend": "in_flight"}[operation]
    assert h.status(job_id) == expected


@pytest.mark.parametrize("operation", sorted(TOKENED))
def test_a_token_carried_without_a_requeue_matches_every_attempt_of_the_job(
    operation: str,
) -> None:
    """Redeliveries (lease expiry, nack) keep enqueued_at: the token of any
    delivery of the job is the current one until a requeue."""
    h = Harness()
    [job_id] = h.enqueue(make_job(max_attempts=3), now=NOW)
    token = h.reserve_one("q", now=NOW, lease_ms=LEASE).enqueued_at
    h.sweep(now=NOW + LEASE)
    assert h.reserve_one("q", now=NOW + LEASE, lease_ms=LEASE).enqueued_at == token

    h.accept(TOKENED[operation](job_id, 2, token), now=NOW + LEASE + 1)

    expected = {"ack": "gone", "nack": "ready", "extend": "in_flight"}[operation]
    assert h.status(job_id) == expected


@pytest.mark.parametrize("operation", sorted(TOKENED))
@pytest.mark.parametrize("token", ["1", 1.5, True])
def test_a_token_that_is_not_an_integer_is_an_invalid_argument(
    operation: str, token: object
) -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW, lease_ms=LEASE)

    error = h.refuse(TOKENED[operation](job_id, 1, token), now=NOW)  # type: ignore[arg-type]

    assert type(error) is InvalidArgument


def _admin_requeue(h: Harness, job_id: str, now: int) -> None:
    h.accept(AdminRequeueDeadLetters(job_ids=(job_id,), actor="ann", role="operator"), now)


def test_an_admin_requeue_fences_the_lease_before_it_too() -> None:
    h, job_id, stale, token = requeued_after_a_lapsed_lease(_admin_requeue)
    assert stale != token

    assert type(h.refuse(Ack(job_id=job_id, attempt=1, enqueued_at=stale), NOW + 9)) is (
        AttemptMismatch
    )
    h.accept(Ack(job_id=job_id, attempt=1, enqueued_at=token), NOW + 9)


@pytest.mark.parametrize("requeue", ["operator", "admin"])
def test_a_requeue_in_the_millisecond_of_the_enqueue_still_moves_enqueued_at_forward(
    requeue: str,
) -> None:
    """The token must change with every requeue: max(now, old + 1)."""
    h = Harness(CoreConfig(dead_letter_retention_ms=60_000))
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.dead_letter(job_id, now=NOW)
    if requeue == "operator":
        h.requeue(job_id, now=NOW)
    else:
        _admin_requeue(h, job_id, NOW)
    assert h.job(job_id).enqueued_at == NOW + 1
    # And again in the same millisecond: forward again.
    h.dead_letter(job_id, now=NOW)
    h.requeue(job_id, now=NOW)
    assert h.job(job_id).enqueued_at == NOW + 2
    # A requeue later than that takes its own time.
    h.dead_letter(job_id, now=NOW + 50)
    h.requeue(job_id, now=NOW + 50)
    assert h.job(job_id).enqueued_at == NOW + 50
