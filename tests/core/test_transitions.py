"""The transitions of sepp-semantics.md §4 (rows 1-15) as given/when/then tables,
one test per row. Row 16 (queue purge and delete) does not exist in this core.

Every command goes through `Harness`, which also checks after each step that
`decide` did not mutate the state and that the invariants hold.
"""

from __future__ import annotations

import random
import uuid
import zlib
from typing import Any

import pytest

from sepp.core import (
    RETRY_DEAD_LETTER,
    RETRY_DEFAULT,
    RETRY_DELAY,
    CoreConfig,
    QueuePolicy,
    Release,
    Sweep,
)
from sepp.core.decide import (
    DRAIN_TOO_LARGE_ENTRY_BYTES,
    dead_letter_answer_bytes,
)
from sepp.core.events import (
    CAUSE_ADMIN,
    CAUSE_ATTEMPTS_EXHAUSTED,
    CAUSE_LEASE_EXPIRED,
    CAUSE_REJECTED,
    JobNacked,
    JobReleased,
)
from sepp.core.results import (
    Accepted,
    DrainResult,
    InvalidArgument,
    ReleaseResult,
    SweepResult,
)
from tests.core.helpers import NOW, Harness, make_job, new_id, ordered_ids

HORIZON = QueuePolicy().max_schedule_horizon_ms
RETAINED = CoreConfig(dead_letter_retention_ms=60_000)


def retained_with_queue(**overrides: object) -> CoreConfig:
    return RETAINED.with_queue("q", **overrides)


# ---------------------------------------------------------------------------
# 1, 2: enqueue lands Ready or Scheduled


@pytest.mark.parametrize(
    ("scheduled_offset", "expected"),
    [
        pytest.param(None, "ready", id="no scheduled_at lands ready"),
        pytest.param(-1, "ready", id="scheduled_at one ms in the past lands ready"),
        pytest.param(-NOW, "ready", id="scheduled_at at time zero lands ready"),
        pytest.param(0, "ready", id="scheduled_at equal to now lands ready"),
        pytest.param(-NOW - 1, "ready", id="a negative scheduled_at lands ready"),
        pytest.param(-(2**63) - NOW, "ready", id="the smallest 64-bit scheduled_at lands ready"),
        pytest.param(1, "scheduled", id="scheduled_at one ms ahead lands scheduled"),
        pytest.param(
            HORIZON, "scheduled", id="scheduled_at exactly at the horizon lands scheduled"
        ),
    ],
)
def test_an_enqueued_job_lands_ready_or_scheduled_by_its_scheduled_at(
    scheduled_offset: int | None, expected: str
) -> None:
    h = Harness()
    scheduled_at = None if scheduled_offset is None else NOW + scheduled_offset
    [job_id] = h.enqueue(make_job(scheduled_at=scheduled_at), now=NOW)

    assert h.status(job_id) == expected
    job = h.job(job_id)
    # A past or present scheduled_at is stored, and echoed, as "not scheduled".
    stored = scheduled_at if expected == "scheduled" else None
    assert (job.attempt, job.enqueued_at, job.scheduled_at) == (1, NOW, stored)
    delivered = h.reserve("q", now=NOW)
    if expected == "ready":
        assert h.counts("q") == (0, 0, 1, 0)
        assert [j.job_id for j in delivered] == [job_id]
        assert [j.scheduled_at for j in delivered] == [None]
        assert h.decisions[0].woken == frozenset({"q"})
    else:
        assert h.counts("q") == (0, 1, 0, 0)
        assert delivered == ()
        assert job.due_ms == scheduled_at
        assert h.decisions[0].woken == frozenset()
        assert h.state.next_deadline() == scheduled_at


# ---------------------------------------------------------------------------
# 3: Scheduled -> Ready by a sweep


@pytest.mark.parametrize(
    ("sweep_offset", "expected", "promoted"),
    [
        pytest.param(-1, "scheduled", 0, id="a sweep one ms early leaves it scheduled"),
        pytest.param(0, "ready", 1, id="a sweep at its time promotes it"),
        pytest.param(5_000, "ready", 1, id="a late sweep promotes it"),
    ],
)
def test_a_sweep_promotes_a_scheduled_job_once_its_time_has_come(
    sweep_offset: int, expected: str, promoted: int
) -> None:
    h = Harness()
    run_at = NOW + 1_000
    [job_id] = h.enqueue(make_job(scheduled_at=run_at), now=NOW)

    result = h.sweep(now=run_at + sweep_offset)

    assert result == SweepResult(promoted=promoted)
    assert h.status(job_id) == expected
    assert h.decisions[-1].woken == (frozenset({"q"}) if promoted else frozenset())


def test_a_promoted_job_keeps_its_priority_and_original_enqueued_at() -> None:
    h = Harness()
    [early] = h.enqueue(make_job(priority=5, scheduled_at=NOW + 1_000), now=NOW)
    [later_same] = h.enqueue(make_job(priority=5), now=NOW + 10)
    [later_low] = h.enqueue(make_job(priority=4), now=NOW + 20)
    h.sweep(now=NOW + 1_000)

    delivered = h.reserve("q", now=NOW + 1_000, max_jobs=3)

    assert [j.job_id for j in delivered] == [early, later_same, later_low]
    first = delivered[0]
    assert (first.priority, first.enqueued_at, first.scheduled_at, first.attempt) == (
        5,
        NOW,
        NOW + 1_000,
        1,
    )


# ---------------------------------------------------------------------------
# 4: Ready -> In-flight by reserve: what the delivered job carries


@pytest.mark.parametrize(
    ("config", "fields", "expected"),
    [
        pytest.param(
            CoreConfig(),
            {},
            {"priority": 0, "max_attempts": 3, "attempt": 1, "payload_data": None},
            id="unset priority and max_attempts resolve to the global defaults",
        ),
        pytest.param(
            CoreConfig().with_queue("q", default_priority=7, default_max_attempts=5),
            {},
            {"priority": 7, "max_attempts": 5},
            id="unset priority and max_attempts resolve to the queue defaults",
        ),
        pytest.param(
            CoreConfig().with_queue("q", default_priority=7),
            {"priority": 2, "max_attempts": 9},
            {"priority": 2, "max_attempts": 9},
            id="explicit priority and max_attempts win over the defaults",
        ),
        pytest.param(
            CoreConfig().with_queue("q", max_attempts_ceiling=5, default_max_attempts=2),
            {"max_attempts": 50},
            {"max_attempts": 5},
            id="max_attempts above the ceiling is clamped silently",
        ),
        pytest.param(
            CoreConfig(),
            {"payload_data": b"\x00\x01", "payload_encoding": "application/octet-stream"},
            {"payload_data": b"\x00\x01", "payload_encoding": "application/octet-stream"},
            id="payload bytes and encoding are delivered untouched",
        ),
        pytest.param(
            CoreConfig(),
            {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v"},
            {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v"},
            id="the trace context is delivered",
        ),
        pytest.param(
            CoreConfig(),
            {"custom": {"s": "x", "i": -(2**63), "f": 1.5, "b": True}},
            {"custom": {"s": "x", "i": -(2**63), "f": 1.5, "b": True}},
            id="the custom map is delivered",
        ),
        pytest.param(
            CoreConfig(),
            {"scheduled_at": NOW - 5},
            {"scheduled_at": None, "enqueued_at": NOW},
            id="a past scheduled_at is delivered as not scheduled",
        ),
    ],
)
def test_reserve_delivers_the_job_with_its_resolved_fields(
    config: CoreConfig, fields: dict[str, object], expected: dict[str, object]
) -> None:
    h = Harness(config)
    [job_id] = h.enqueue(make_job(**fields), now=NOW)

    view = h.reserve_one("q", now=NOW + 7, lease_ms=1_000)

    assert (view.job_id, view.queue, view.job_type) == (job_id, "q", "work")
    assert view.lease_expires_at == NOW + 7 + 1_000
    for name, value in expected.items():
        assert getattr(view, name) == value, name


def test_reserve_moves_the_job_in_flight_under_a_lease() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)

    view = h.reserve_one("q", now=NOW + 3, lease_ms=2_000)

    assert h.status(job_id) == "in_flight"
    assert h.counts("q") == (0, 0, 1, 0)
    assert h.job(job_id).due_ms == view.lease_expires_at == NOW + 2_003
    assert h.state.next_deadline() == NOW + 2_003
    assert h.reserve("q", now=NOW + 4) == ()


def test_reserve_records_the_worker_that_holds_the_lease() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve("q", now=NOW, worker_id="w-7")
    assert h.job(job_id).worker_id == "w-7"


# ---------------------------------------------------------------------------
# 5: ack deletes the job


def test_ack_deletes_the_job_at_once_and_keeps_its_dedup_record() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    view = h.reserve_one("q", now=NOW)

    assert h.ack(job_id, view.attempt, now=NOW + 1).job_id == job_id

    assert h.status(job_id) == "gone"
    assert h.counts("q") == (0, 0, 0, 0)
    assert h.reserve("q", now=NOW + 2) == ()
    assert h.enqueue_results(make_job(idempotency_key="k"), now=NOW + 3) == (
        Accepted(job_id, True),
    )


# ---------------------------------------------------------------------------
# release: an attempt handed back unused (issue 12 §1; PROTOCOL.md §5.11). The
# job was delivered to nobody, so nothing about it failed: Ready at once, the
# same attempt number, its place in the ready order kept, no reason recorded.


def test_a_released_job_is_ready_at_once_under_the_same_attempt() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(max_attempts=1), now=NOW)
    view = h.reserve_one("q", now=NOW)

    reply = h.accept(Release(job_id=job_id, attempt=view.attempt, worker_id="w"), now=NOW + 5)

    assert reply == ReleaseResult(job_id)
    assert (h.status(job_id), h.job(job_id).attempt, h.job(job_id).last_reason) == (
        "ready",
        1,
        None,
    )
    assert h.counts("q") == (1, 0, 0, 0)
    (event,) = h.records[-1][1]
    assert event == JobReleased(job_id=job_id, attempt=1, worker_id="w")


def test_a_released_attempt_does_not_count_against_max_attempts() -> None:
    h = Harness(RETAINED)
    [job_id] = h.enqueue(make_job(max_attempts=1), now=NOW)
    for step in range(3):
        assert h.reserve_one("q", now=NOW + step).attempt == 1
        h.accept(Release(job_id=job_id, attempt=1), now=NOW + step)
    again = h.reserve_one("q", now=NOW + 10)
    assert (again.attempt, again.max_attempts) == (1, 1)
    # The one real failure is the first and the last.
    assert h.nack(job_id, 1, now=NOW + 11).dead_lettered
    assert h.state.dead[job_id].cause == CAUSE_ATTEMPTS_EXHAUSTED


def test_a_released_job_keeps_its_place_in_the_ready_order() -> None:
    h = Harness()
    first, second = h.enqueue(make_job(), make_job(), now=NOW)
    h.reserve_one("q", now=NOW + 1)
    h.accept(Release(job_id=first, attempt=1), now=NOW + 2)
    assert [v.job_id for v in h.reserve("q", now=NOW + 3, max_jobs=2)] == [first, second]


def test_a_release_wakes_the_queue_of_the_job() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(queue="q"), now=NOW)
    h.reserve_one("q", now=NOW)
    h.accept(Release(job_id=job_id, attempt=1), now=NOW + 1)
    assert h.decisions[-1].woken == frozenset({"q"})


def test_a_released_lease_no_longer_expires() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW, lease_ms=1_000)
    h.accept(Release(job_id=job_id, attempt=1), now=NOW + 1)
    assert h.state.next_deadline() is None
    assert h.accept(Sweep(), now=NOW + 5_000) == SweepResult(0, 0, 0, 0, 0)


def test_a_release_with_a_bad_worker_id_is_invalid_argument() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW)
    error = h.refuse(Release(job_id=job_id, attempt=1, worker_id=""), now=NOW + 1)
    assert isinstance(error, InvalidArgument)


# ---------------------------------------------------------------------------
# 6, 7: nack with the default directive follows the queue's retry policy


def expected_policy_delay(
    job_id: str, attempt: int, base: int, backoff: str, cap_ms: int, horizon_ms: int
) -> int:
    """The documented rule (§6), computed with exact integers: growth, cap by
    retry_delay_max_ms and the horizon, minus the crc32 jitter."""
    if base == 0:
        return 0
    growth = base * 2 ** (attempt - 1) if backoff == "exponential" else base
    d = min(growth, cap_ms, horizon_ms)
    jitter = zlib.crc32(f"{job_id}:{attempt}".encode()) % (d // 4 + 1)
    return d - jitter


def _job_at_attempt(h: Harness, attempt: int, now: int, job_id: str) -> None:
    """Enqueue `job_id` and bring it in flight on `attempt` (explicit zero-delay
    nacks, which bypass the policy)."""
    h.enqueue(make_job(job_id=job_id), now=now)
    for a in range(1, attempt):
        assert h.reserve_one("q", now=now).attempt == a
        h.nack(job_id, a, now=now, retry=RETRY_DELAY, delay_ms=0)
    assert h.reserve_one("q", now=now).attempt == attempt


POLICY_ROWS = [
    # (base, backoff, retry_delay_max_ms, horizon, attempt)
    pytest.param(0, "none", 3_600_000, HORIZON, 1, id="base 0 retries at once"),
    pytest.param(0, "exponential", 3_600_000, HORIZON, 4, id="base 0 exponential retries at once"),
    pytest.param(1, "none", 3_600_000, HORIZON, 1, id="base 1 ms has no room for jitter"),
    pytest.param(3, "none", 3_600_000, HORIZON, 2, id="base 3 ms has no room for jitter"),
    pytest.param(1_000, "none", 3_600_000, HORIZON, 1, id="none attempt 1 uses the base"),
    pytest.param(1_000, "none", 3_600_000, HORIZON, 3, id="none attempt 3 still uses the base"),
    pytest.param(
        1_000, "exponential", 3_600_000, HORIZON, 1, id="exponential attempt 1 is the base"
    ),
    pytest.param(1_000, "exponential", 3_600_000, HORIZON, 2, id="exponential attempt 2 doubles"),
    pytest.param(1_000, "exponential", 3_600_000, HORIZON, 4, id="exponential attempt 4 is 8x"),
    pytest.param(
        1_000, "exponential", 5_000, HORIZON, 4, id="exponential is capped by retry_delay_max_ms"
    ),
    pytest.param(10_000, "none", 60_000, 3_000, 1, id="the delay is capped by the horizon"),
    pytest.param(
        7_777, "exponential", 3_600_000, HORIZON, 100, id="exponential saturates at attempt 100"
    ),
    pytest.param(
        2**40, "exponential", 2**45, 2**50, 100, id="a huge base saturates at retry_delay_max_ms"
    ),
]


@pytest.mark.parametrize(("base", "backoff", "cap_ms", "horizon", "attempt"), POLICY_ROWS)
def test_a_default_nack_applies_the_retry_policy_with_deterministic_jitter(
    base: int, backoff: str, cap_ms: int, horizon: int, attempt: int, rng: random.Random
) -> None:
    config = CoreConfig().with_queue(
        "q",
        retry_delay_ms=base,
        retry_backoff=backoff,
        retry_delay_max_ms=cap_ms,
        max_schedule_horizon_ms=horizon,
        max_attempts_ceiling=200,
        default_max_attempts=150,
    )
    h = Harness(config)
    job_id = str(uuid.UUID(int=rng.getrandbits(128)))
    _job_at_attempt(h, attempt, NOW, job_id)
    expected = expected_policy_delay(job_id, attempt, base, backoff, cap_ms, horizon)
    d = min(base * 2 ** (attempt - 1) if backoff == "exponential" else base, cap_ms, horizon)
    assert d - d // 4 <= expected <= d  # the documented bound [0.75 d, d]

    now = NOW + 50
    reply = h.nack(job_id, attempt, now=now)

    assert not reply.dead_lettered
    [event] = h.records[-1][1]
    assert isinstance(event, JobNacked)
    job = h.job(job_id)
    assert job.attempt == attempt + 1
    if expected == 0:
        assert event.run_at is None
        assert h.status(job_id) == "ready"
        assert h.decisions[-1].woken == frozenset({"q"})
        assert h.reserve_one("q", now=now).attempt == attempt + 1
    else:
        assert event.run_at == job.due_ms == now + expected
        assert h.status(job_id) == "scheduled"
        assert h.decisions[-1].woken == frozenset()
        h.sweep(now=now + expected - 1)
        assert h.status(job_id) == "scheduled"
        h.sweep(now=now + expected)
        assert h.reserve_one("q", now=now + expected).attempt == attempt + 1


def test_the_jitter_spreads_jobs_that_fail_together(rng: random.Random) -> None:
    h = Harness(CoreConfig().with_queue("q", retry_delay_ms=100_000))
    ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(20)]
    h.enqueue(*(make_job(job_id=i) for i in ids), now=NOW)
    h.reserve("q", now=NOW, max_jobs=20)
    for job_id in ids:
        h.nack(job_id, 1, now=NOW)
    due = {h.job(i).due_ms for i in ids}
    assert len(due) > 10
    assert all(NOW + 75_000 <= d <= NOW + 100_000 for d in due)


# ---------------------------------------------------------------------------
# 7: nack with an explicit delay


@pytest.mark.parametrize(
    ("policy", "delay_ms", "expected_delay"),
    [
        pytest.param({}, 0, 0, id="delay 0 makes the job ready at once"),
        pytest.param({}, 500, 500, id="delay 500 schedules it 500 ms ahead"),
        pytest.param({"max_schedule_horizon_ms": 2_000}, 9_999, 2_000, id="a delay beyond the horizon is clamped to it"),
        pytest.param({"retry_delay_ms": 10_000}, 5, 5, id="an explicit delay replaces the policy without jitter"),
        pytest.param({"retry_delay_ms": 10_000}, 0, 0, id="an explicit zero delay beats a policy delay"),
        pytest.param({"retry_delay_max_ms": 100, "retry_delay_ms": 50}, 5_000, 5_000, id="retry_delay_max_ms does not cap an explicit delay"),
    ],
)  # fmt: skip
def test_a_nack_with_an_explicit_delay_retries_after_that_delay(
    policy: dict[str, int], delay_ms: int, expected_delay: int
) -> None:
    h = Harness(CoreConfig().with_queue("q", **policy))
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW)

    reply = h.nack(job_id, 1, now=NOW + 10, retry=RETRY_DELAY, delay_ms=delay_ms)

    assert not reply.dead_lettered
    assert h.job(job_id).attempt == 2
    if expected_delay == 0:
        assert h.status(job_id) == "ready"
    else:
        assert h.status(job_id) == "scheduled"
        assert h.job(job_id).due_ms == NOW + 10 + expected_delay


def test_a_nack_keeps_its_reason_on_the_job() -> None:
    h = Harness()
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW)
    h.nack(job_id, 1, now=NOW, reason="flaky upstream")
    assert h.job(job_id).last_reason == "flaky upstream"


# ---------------------------------------------------------------------------
# 9, 10: nack dead-letters (rejected / attempts exhausted)


@pytest.mark.parametrize(
    ("max_attempts", "attempt", "retry", "delay_ms", "cause"),
    [
        pytest.param(3, 1, RETRY_DEAD_LETTER, None, CAUSE_REJECTED, id="dead-letter directive with attempts left is rejected"),
        pytest.param(1, 1, RETRY_DEAD_LETTER, None, CAUSE_REJECTED, id="dead-letter directive on the final attempt is rejected"),
        pytest.param(1, 1, RETRY_DEFAULT, None, CAUSE_ATTEMPTS_EXHAUSTED, id="default nack of the only attempt is attempts_exhausted"),
        pytest.param(3, 3, RETRY_DEFAULT, None, CAUSE_ATTEMPTS_EXHAUSTED, id="default nack of attempt 3 of 3 is attempts_exhausted"),
        pytest.param(2, 2, RETRY_DELAY, 0, CAUSE_ATTEMPTS_EXHAUSTED, id="zero-delay nack of the final attempt is attempts_exhausted"),
        pytest.param(2, 2, RETRY_DELAY, 500, CAUSE_ATTEMPTS_EXHAUSTED, id="delayed nack of the final attempt is attempts_exhausted"),
    ],
)  # fmt: skip
def test_a_nack_dead_letters_with_the_right_cause(
    max_attempts: int, attempt: int, retry: str, delay_ms: int | None, cause: int
) -> None:
    h = Harness(retained_with_queue(retry_delay_ms=1_000))
    job_id = new_id()
    h.enqueue(make_job(job_id=job_id, max_attempts=max_attempts), now=NOW)
    for a in range(1, attempt):
        h.reserve_one("q", now=NOW)
        h.nack(job_id, a, now=NOW, retry=RETRY_DELAY, delay_ms=0)
    h.reserve_one("q", now=NOW)

    reply = h.nack(job_id, attempt, now=NOW + 9, retry=retry, delay_ms=delay_ms, reason="bad")

    assert reply.dead_lettered
    assert h.status(job_id) == "dead"
    assert h.counts("q") == (0, 0, 0, 1)
    [record] = h.drain(now=NOW + 10)
    assert (record.job.job_id, record.cause, record.failed_at) == (job_id, cause, NOW + 9)
    assert (record.final_attempt, record.last_reason) == (attempt, "bad")
    assert h.status(job_id) == "gone"


# ---------------------------------------------------------------------------
# 8, 11: lease expiry


@pytest.mark.parametrize(
    ("sweep_offset", "expected_status", "expected_attempt"),
    [
        pytest.param(-1, "in_flight", 1, id="a sweep one ms before the deadline leaves it in flight"),
        pytest.param(0, "ready", 2, id="a sweep at the deadline makes it ready for attempt 2"),
        pytest.param(60_000, "ready", 2, id="a late sweep makes it ready for attempt 2"),
    ],
)  # fmt: skip
def test_an_expired_lease_with_attempts_left_goes_back_to_ready_at_once(
    sweep_offset: int, expected_status: str, expected_attempt: int
) -> None:
    # The queue has a long retry policy: lease expiry must ignore it.
    h = Harness(CoreConfig().with_queue("q", retry_delay_ms=600_000))
    [job_id] = h.enqueue(make_job(), now=NOW)
    lease = h.reserve_one("q", now=NOW, lease_ms=1_000).lease_expires_at

    result = h.sweep(now=lease + sweep_offset)

    assert h.status(job_id) == expected_status
    assert h.job(job_id).attempt == expected_attempt
    if expected_status == "ready":
        assert result == SweepResult(redelivered=1)
        assert h.decisions[-1].woken == frozenset({"q"})
        again = h.reserve_one("q", now=lease + sweep_offset)
        assert (again.job_id, again.attempt) == (job_id, 2)


@pytest.mark.parametrize(
    ("max_attempts", "nack_reason_before"),
    [
        pytest.param(1, None, id="the only attempt's lease expires"),
        pytest.param(2, "earlier failure", id="the final attempt's lease expires after a nack"),
    ],
)
def test_an_expired_lease_on_the_final_attempt_dead_letters_with_lease_expired(
    max_attempts: int, nack_reason_before: str | None
) -> None:
    h = Harness(RETAINED)
    job_id = new_id()
    h.enqueue(make_job(job_id=job_id, max_attempts=max_attempts), now=NOW)
    if max_attempts == 2:
        h.reserve_one("q", now=NOW)
        h.nack(job_id, 1, now=NOW, reason=nack_reason_before)
    lease = h.reserve_one("q", now=NOW, lease_ms=1_000).lease_expires_at

    assert h.sweep(now=lease) == SweepResult(dead_lettered=1)

    assert h.status(job_id) == "dead"
    [record] = h.drain(now=lease)
    assert (record.cause, record.failed_at, record.final_attempt) == (
        CAUSE_LEASE_EXPIRED,
        lease,
        max_attempts,
    )
    assert record.last_reason is None  # absent when the job died by lease expiry


# ---------------------------------------------------------------------------
# 12: operator dead-letter of live jobs


@pytest.mark.parametrize(
    ("target", "affected"),
    [
        pytest.param("ready", True, id="a ready job is dead-lettered"),
        pytest.param("scheduled", True, id="a scheduled job is dead-lettered"),
        pytest.param("in_flight", False, id="an in-flight job is refused"),
        pytest.param("dead", False, id="a dead letter is refused"),
        pytest.param("unknown", False, id="an unknown id is refused"),
        pytest.param("malformed", False, id="a malformed id is refused"),
    ],
)
def test_an_operator_dead_letters_only_ready_or_scheduled_jobs(target: str, affected: bool) -> None:
    h = Harness(RETAINED)
    ready, scheduled, flying, dead = ordered_ids(4)
    h.enqueue(make_job(job_id=flying), now=NOW)
    assert h.reserve_one("q", now=NOW).job_id == flying
    h.enqueue(make_job(job_id=ready), make_job(job_id=dead), now=NOW + 1)
    h.enqueue(make_job(job_id=scheduled, scheduled_at=NOW + 500), now=NOW + 1)
    h.dead_letter(dead, now=NOW + 1)
    ids = {
        "ready": ready,
        "scheduled": scheduled,
        "in_flight": flying,
        "dead": dead,
        "unknown": new_id(),
        "malformed": "not-a-uuid",
    }
    job_id = ids[target]
    before = h.status(job_id)

    result = h.dead_letter(job_id, now=NOW + 2, reason="operator says so")

    if affected:
        assert result.affected == (job_id,)
        assert result.refused == ()
        assert h.status(job_id) == "dead"
        record = h.state.dead[job_id]
        assert (record.cause, record.failed_at, record.last_reason) == (
            CAUSE_ADMIN,
            NOW + 2,
            "operator says so",
        )
    else:
        assert result.affected == ()
        assert [r[0] for r in result.refused] == [job_id]
        assert h.status(job_id) == before
        assert h.records[-1][1] == ()


def test_an_operator_dead_letter_names_each_job_once() -> None:
    h = Harness(RETAINED)
    [job_id] = h.enqueue(make_job(), now=NOW)
    result = h.dead_letter(job_id, job_id.upper(), job_id, now=NOW)
    assert result.affected == (job_id,)
    assert len(h.records[-1][1]) == 1


def test_an_operator_action_handles_at_most_100_jobs() -> None:
    from sepp.core import DeadLetterJobs, RequeueDeadLetters

    h = Harness(RETAINED)
    ids = tuple(new_id() for _ in range(101))
    assert isinstance(h.refuse(DeadLetterJobs(job_ids=ids), now=NOW), InvalidArgument)
    assert isinstance(h.refuse(RequeueDeadLetters(job_ids=ids), now=NOW), InvalidArgument)


# ---------------------------------------------------------------------------
# 13: operator requeue of a dead letter


def test_a_requeued_dead_letter_keeps_its_id_and_restarts_at_attempt_one() -> None:
    h = Harness(RETAINED)
    [job_id] = h.enqueue(make_job(priority=3, scheduled_at=NOW - 1, max_attempts=2), now=NOW)
    h.reserve_one("q", now=NOW)
    h.nack(job_id, 1, now=NOW)
    h.reserve_one("q", now=NOW)
    h.nack(job_id, 2, now=NOW + 5, reason="gave up")
    assert h.status(job_id) == "dead"

    result = h.requeue(job_id, now=NOW + 100)

    assert result.affected == (job_id,)
    assert h.decisions[-1].woken == frozenset({"q"})
    assert h.status(job_id) == "ready"
    job = h.job(job_id)
    assert (job.attempt, job.enqueued_at, job.scheduled_at, job.priority) == (1, NOW + 100, None, 3)
    assert h.counts("q") == (1, 0, 0, 0)
    view = h.reserve_one("q", now=NOW + 100)
    assert (view.job_id, view.attempt, view.max_attempts) == (job_id, 1, 2)


def test_a_requeued_dead_letter_goes_to_the_back_of_its_priority_band() -> None:
    h = Harness(RETAINED)
    [dead] = h.enqueue(make_job(priority=4), now=NOW)
    h.dead_letter(dead, now=NOW)
    [other_same] = h.enqueue(make_job(priority=4), now=NOW + 10)
    [other_lower] = h.enqueue(make_job(priority=3), now=NOW + 10)
    h.requeue(dead, now=NOW + 20)

    delivered = h.reserve("q", now=NOW + 20, max_jobs=3)

    assert [j.job_id for j in delivered] == [other_same, dead, other_lower]


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("live", id="a live job is not a dead letter"),
        pytest.param("unknown", id="an unknown id is refused"),
        pytest.param("malformed", id="a malformed id is refused"),
        pytest.param("drained", id="a drained dead letter is gone"),
    ],
)
def test_requeue_refuses_ids_that_are_not_dead_letters(target: str) -> None:
    h = Harness(RETAINED)
    [live, drained] = h.enqueue(make_job(), make_job(), now=NOW)
    h.dead_letter(drained, now=NOW)
    h.drain(now=NOW)
    job_id = {"live": live, "unknown": new_id(), "malformed": "zzz", "drained": drained}[target]

    result = h.requeue(job_id, now=NOW + 1)

    assert result.affected == ()
    assert [r[0] for r in result.refused] == [job_id]
    assert h.records[-1][1] == ()


# ---------------------------------------------------------------------------
# 14: drain, oldest first


def _three_dead_letters(config: CoreConfig = RETAINED) -> tuple[Harness, list[str]]:
    """Dead letters failed at NOW+1 (queue a), NOW+2 (queue b), NOW+3 (queue a)."""
    h = Harness(config)
    ids = []
    for i, queue in enumerate(("a", "b", "a"), start=1):
        [job_id] = h.enqueue(make_job(queue=queue), now=NOW + i)
        h.dead_letter(job_id, now=NOW + i)
        ids.append(job_id)
    return h, ids


@pytest.mark.parametrize(
    ("queue", "max_records", "expected"),
    [
        pytest.param(None, 1, [0], id="max defaults to 1 and takes the oldest of all queues"),
        pytest.param(None, 2, [0, 1], id="all queues oldest first"),
        pytest.param(None, 10, [0, 1, 2], id="more than exist returns all"),
        pytest.param("a", 5, [0, 2], id="one queue oldest first"),
        pytest.param("b", 5, [1], id="another queue"),
        pytest.param("nowhere", 5, [], id="an unknown queue drains nothing"),
    ],
)
def test_drain_returns_and_deletes_dead_letters_oldest_first(
    queue: str | None, max_records: int, expected: list[int]
) -> None:
    h, ids = _three_dead_letters()

    records = h.drain(now=NOW + 10, queue=queue, max_records=max_records)

    assert [r.job.job_id for r in records] == [ids[i] for i in expected]
    assert [r.failed_at for r in records] == [NOW + 1 + i for i in expected]
    for i, job_id in enumerate(ids):
        assert h.status(job_id) == ("gone" if i in expected else "dead")
    assert "nowhere" not in h.state.queues


def test_drain_without_max_takes_one_record() -> None:
    from sepp.core import DrainDeadLetters

    h, ids = _three_dead_letters()
    reply = h.accept(DrainDeadLetters(), now=NOW + 10)
    assert isinstance(reply, DrainResult)
    assert [r.job.job_id for r in reply.records] == [ids[0]]


def test_drain_clamps_max_to_max_reserve_batch() -> None:
    from sepp.core import Limits

    h, ids = _three_dead_letters(
        CoreConfig(dead_letter_retention_ms=60_000, limits=Limits(max_reserve_batch=2))
    )
    records = h.drain(now=NOW + 10, max_records=1_000)
    assert [r.job.job_id for r in records] == ids[:2]


@pytest.mark.parametrize(
    ("queue", "max_records"),
    [
        pytest.param(None, 0, id="max 0 is invalid"),
        pytest.param(None, -3, id="a negative max is invalid"),
        pytest.param("", 1, id="an empty queue filter is invalid"),
    ],
)
def test_drain_refuses_bad_arguments(queue: str | None, max_records: int) -> None:
    from sepp.core import DrainDeadLetters

    h, _ = _three_dead_letters()
    error = h.refuse(DrainDeadLetters(queue=queue, max_records=max_records), now=NOW + 10)
    assert isinstance(error, InvalidArgument)


def _dead_letters_of(sizes: list[int], config: CoreConfig = RETAINED) -> tuple[Harness, list[str]]:
    """Dead letters with payloads of `sizes` bytes, oldest first."""
    h = Harness(config)
    ids = []
    for i, size in enumerate(sizes, start=1):
        job = make_job(payload_data=b"x" * size, payload_encoding="bin")
        [job_id] = h.enqueue(job, now=NOW + i)
        h.dead_letter(job_id, now=NOW + i)
        ids.append(job_id)
    return h, ids


def _sized_dead_letters(sizes: list[int]) -> tuple[Harness, list[str], int]:
    """`_dead_letters_of(sizes)` and the answer bytes of a record with a 10-byte
    payload (the unit the caps below are given in)."""
    probe, [probe_id] = _dead_letters_of([10])
    h, ids = _dead_letters_of(sizes)
    return h, ids, dead_letter_answer_bytes(probe.state.dead[probe_id])


LISTED = DRAIN_TOO_LARGE_ENTRY_BYTES


@pytest.mark.parametrize(
    ("sizes", "cap", "delivered", "too_large"),
    [
        pytest.param([10, 10, 10], lambda u: None, [0, 1, 2], [], id="no cap takes every record asked for"),
        pytest.param([10, 10, 10], lambda u: 3 * u, [0, 1, 2], [], id="a cap met exactly"),
        pytest.param([10, 10, 10], lambda u: 2 * u + u // 2, [0, 1], [], id="stops before the record that would pass the cap"),
        pytest.param([10, 10], lambda u: 2 * u - 1, [0], [], id="a record's job metadata counts against the cap, not only its payload"),
        pytest.param([10, 2_000, 10], lambda u: 2 * u + LISTED, [0, 2], [1], id="a record larger than the cap is left in the store and listed"),
        pytest.param([2_000, 10], lambda u: u + LISTED, [1], [0], id="an oversized oldest record does not block the ones behind it"),
        pytest.param([2_000], lambda u: u, [], [0], id="a lone record larger than the cap is never deleted"),
        pytest.param([10, 30, 10], lambda u: 2 * u, [0], [], id="order is kept: a smaller record never jumps one that waits for the next answer"),
    ],
)  # fmt: skip
def test_a_drain_carries_every_record_it_deletes_within_its_byte_cap(
    sizes: list[int], cap: Any, delivered: list[int], too_large: list[int]
) -> None:
    from sepp.core import DrainDeadLetters

    h, ids, unit = _sized_dead_letters(sizes)
    reply = h.accept(DrainDeadLetters(max_records=10, max_bytes=cap(unit)), now=NOW + 10)

    assert isinstance(reply, DrainResult)
    assert [r.job.job_id for r in reply.records] == [ids[i] for i in delivered]
    assert [job_id for job_id, _ in reply.too_large] == [ids[i] for i in too_large]
    for job_id, size in reply.too_large:
        assert size == dead_letter_answer_bytes(h.state.dead[job_id])
    for i, job_id in enumerate(ids):
        assert h.status(job_id) == ("gone" if i in delivered else "dead")
    # The record deletes exactly what the answer carries.
    assert len(h.records[-1][1]) == len(delivered)


def test_repeated_capped_drains_deliver_every_record_once_in_order() -> None:
    from sepp.core import DrainDeadLetters

    h, ids, unit = _sized_dead_letters([10] * 40)
    seen: list[str] = []
    for _ in range(40):
        reply = h.accept(DrainDeadLetters(max_records=256, max_bytes=3 * unit), now=NOW + 10)
        assert isinstance(reply, DrainResult)
        if not reply.records:
            break
        assert len(reply.records) <= 3
        seen.extend(r.job.job_id for r in reply.records)
    assert seen == ids
    assert h.state.dead == {}


def test_a_drain_passes_over_at_most_sweep_limit_oversized_records() -> None:
    from sepp.core import DrainDeadLetters

    h, ids = _dead_letters_of(
        [2_000, 2_000, 2_000, 10], CoreConfig(dead_letter_retention_ms=60_000, sweep_limit=2)
    )
    reply = h.accept(DrainDeadLetters(max_records=10, max_bytes=1_000), now=NOW + 10)
    assert isinstance(reply, DrainResult)
    assert reply.records == ()
    assert [job_id for job_id, _ in reply.too_large] == ids[:2]
    assert all(h.status(job_id) == "dead" for job_id in ids)


# ---------------------------------------------------------------------------
# 14: retention expiry in a sweep


@pytest.mark.parametrize(
    ("sweep_at", "kept"),
    [
        pytest.param(NOW + 1 + 999, [0, 1, 2], id="before the retention ends all are kept"),
        pytest.param(NOW + 1 + 1_000, [1, 2], id="the oldest expires exactly at failed_at plus retention"),
        pytest.param(NOW + 2 + 1_000, [2], id="records expire in failed_at order"),
        pytest.param(NOW + 10_000, [], id="a late sweep expires them all"),
    ],
)  # fmt: skip
def test_a_sweep_drops_dead_letters_older_than_the_retention(
    sweep_at: int, kept: list[int]
) -> None:
    h, ids = _three_dead_letters(CoreConfig(dead_letter_retention_ms=1_000))
    assert h.state.next_deadline() == NOW + 1 + 1_000

    result = h.sweep(now=sweep_at)

    assert result == SweepResult(dead_letters_expired=3 - len(kept))
    assert list(h.state.dead) == [ids[i] for i in kept]


# ---------------------------------------------------------------------------
# 15: retention 0 drops dead letters on the spot


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("nack_dead_letter", id="a dead-letter nack"),
        pytest.param("nack_exhausted", id="a nack of the final attempt"),
        pytest.param("lease_expired", id="a lease expiry on the final attempt"),
        pytest.param("admin_ready", id="an operator dead-letter of a ready job"),
        pytest.param("admin_scheduled", id="an operator dead-letter of a scheduled job"),
    ],
)
def test_with_retention_zero_a_dead_lettered_job_is_dropped(path: str) -> None:
    h = Harness(CoreConfig())  # dead_letter_retention_ms = 0 is the default
    scheduled_at = NOW + 100 if path == "admin_scheduled" else None
    [job_id] = h.enqueue(make_job(max_attempts=1, scheduled_at=scheduled_at), now=NOW)
    if path.startswith("admin"):
        assert h.dead_letter(job_id, now=NOW).affected == (job_id,)
    else:
        lease = h.reserve_one("q", now=NOW, lease_ms=100).lease_expires_at
        if path == "lease_expired":
            assert h.sweep(now=lease).dead_lettered == 1
        else:
            retry = RETRY_DEAD_LETTER if path == "nack_dead_letter" else RETRY_DEFAULT
            assert h.nack(job_id, 1, now=NOW, retry=retry).dead_lettered

    assert h.status(job_id) == "gone"
    assert h.counts("q") == (0, 0, 0, 0)
    assert h.state.dead == {}
    assert h.drain(now=NOW + 200, max_records=10) == ()


# ---------------------------------------------------------------------------
# Dedup window (§10)

WINDOW = 1_000


def dedup_config(window: int = WINDOW, retention: int = 0) -> CoreConfig:
    return CoreConfig(dead_letter_retention_ms=retention).with_queue("q", dedup_window_ms=window)


@pytest.mark.parametrize(
    ("later", "expect_hit"),
    [
        pytest.param(0, True, id="a duplicate at the same instant is a hit"),
        pytest.param(WINDOW // 2, True, id="a duplicate inside the window is a hit"),
        pytest.param(WINDOW - 1, True, id="a duplicate one ms before the deadline is a hit"),
        pytest.param(WINDOW, False, id="a duplicate at the deadline creates a new job"),
        pytest.param(WINDOW + 5_000, False, id="a duplicate after the window creates a new job"),
    ],
)
def test_a_duplicate_key_returns_the_original_id_while_the_window_lasts(
    later: int, expect_hit: bool
) -> None:
    h = Harness(dedup_config())
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)

    duplicate = make_job(idempotency_key="k", priority=9, job_type="other")
    [result] = h.enqueue_results(duplicate, now=NOW + later)

    if expect_hit:
        assert result == Accepted(original, True)
        assert h.records[-1][1] == ()  # nothing stored
        assert list(h.state.jobs) == [original]
    else:
        assert result == Accepted(duplicate.job_id, False)
        assert set(h.state.jobs) == {original, duplicate.job_id}
        assert h.state.dedup[("q", "k")] == (duplicate.job_id, NOW + later + WINDOW)


def test_the_dedup_window_does_not_slide_with_duplicates() -> None:
    h = Harness(dedup_config())
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    for t in (100, 500, 999):
        assert h.enqueue_results(make_job(idempotency_key="k"), now=NOW + t) == (
            Accepted(original, True),
        )
    fresh = make_job(idempotency_key="k")
    assert h.enqueue_results(fresh, now=NOW + WINDOW) == (Accepted(fresh.job_id, False),)


@pytest.mark.parametrize(
    ("fate", "retention"),
    [
        pytest.param("ready", 0, id="still queued"),
        pytest.param("in_flight", 0, id="in flight"),
        pytest.param("acked", 0, id="acked"),
        pytest.param("dead_dropped", 0, id="dead-lettered and dropped"),
        pytest.param("dead_retained", 60_000, id="dead-lettered and retained"),
        pytest.param("drained", 60_000, id="dead-lettered and drained"),
    ],
)
def test_a_dedup_hit_returns_the_original_id_whatever_became_of_the_job(
    fate: str, retention: int
) -> None:
    h = Harness(dedup_config(retention=retention))
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    if fate != "ready":
        h.reserve_one("q", now=NOW)
    if fate == "acked":
        h.ack(original, 1, now=NOW)
    elif fate.startswith("dead") or fate == "drained":
        h.nack(original, 1, now=NOW, retry=RETRY_DEAD_LETTER)
    if fate == "drained":
        h.drain(now=NOW)

    assert h.enqueue_results(make_job(idempotency_key="k"), now=NOW + 10) == (
        Accepted(original, True),
    )
    assert h.records[-1][1] == ()


@pytest.mark.parametrize(
    ("sweep_at", "expired"),
    [
        pytest.param(NOW + WINDOW - 1, 0, id="a sweep before the deadline keeps the record"),
        pytest.param(NOW + WINDOW, 1, id="a sweep at the deadline expires the record"),
    ],
)
def test_a_sweep_expires_dedup_records_and_a_new_enqueue_then_creates_a_job(
    sweep_at: int, expired: int
) -> None:
    h = Harness(dedup_config())
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    assert h.state.next_deadline() == NOW + WINDOW

    assert h.sweep(now=sweep_at) == SweepResult(dedup_expired=expired)

    assert (("q", "k") in h.state.dedup) == (not expired)
    fresh = make_job(idempotency_key="k")
    [result] = h.enqueue_results(fresh, now=sweep_at)
    assert result == (Accepted(fresh.job_id, False) if expired else Accepted(original, True))


def test_a_reinserted_key_survives_the_expiry_of_its_older_record() -> None:
    h = Harness(dedup_config())
    h.enqueue(make_job(idempotency_key="k"), now=NOW)
    # The window lapses but no sweep ran yet: the key is free and is re-used.
    [second] = h.enqueue(make_job(idempotency_key="k"), now=NOW + WINDOW + 10)
    assert h.state.next_deadline() == NOW + 2 * WINDOW + 10

    assert h.sweep(now=NOW + WINDOW + 10).dedup_expired == 0

    assert h.state.dedup[("q", "k")] == (second, NOW + 2 * WINDOW + 10)
    assert h.enqueue_results(make_job(idempotency_key="k"), now=NOW + WINDOW + 20) == (
        Accepted(second, True),
    )
    assert h.sweep(now=NOW + 2 * WINDOW + 10).dedup_expired == 1
    assert h.state.dedup == {}


def test_idempotency_keys_are_scoped_per_queue() -> None:
    h = Harness()
    a = make_job(queue="a", idempotency_key="k")
    b = make_job(queue="b", idempotency_key="k")
    assert h.enqueue_results(a, b, now=NOW) == (
        Accepted(a.job_id, False),
        Accepted(b.job_id, False),
    )


@pytest.mark.parametrize("atomic", [False, True], ids=["best effort", "atomic"])
def test_the_same_key_twice_in_one_batch_creates_one_job(atomic: bool) -> None:
    h = Harness()
    first = make_job(idempotency_key="k")
    second = make_job(idempotency_key="k", priority=9)
    other = make_job(idempotency_key="other")

    results = h.enqueue_results(first, second, other, now=NOW, atomic=atomic)

    assert results == (
        Accepted(first.job_id, False),
        Accepted(first.job_id, True),
        Accepted(other.job_id, False),
    )
    assert set(h.state.jobs) == {first.job_id, other.job_id}
    assert h.job(first.job_id).priority == 0  # the duplicate's fields are discarded


def test_a_dedup_hit_is_not_a_transition_and_wakes_nobody() -> None:
    h = Harness()
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    h.enqueue_results(make_job(idempotency_key="k"), now=NOW + 1)
    assert h.decisions[-1].events == ()
    assert h.decisions[-1].woken == frozenset()
    assert h.counts("q") == (1, 0, 0, 0)
    assert list(h.state.jobs) == [original]


# ---------------------------------------------------------------------------
# Queues come into existence by use or by declaration


def test_a_reserve_of_an_unknown_queue_returns_nothing_and_creates_nothing() -> None:
    h = Harness()
    assert h.reserve("ghost", now=NOW) == ()
    assert h.state.queues == {}
    assert h.records[-1][1] == ()


def test_a_queue_exists_while_it_holds_a_job_or_while_it_is_declared() -> None:
    # Issue 13: an undeclared queue that holds nothing any more is forgotten.
    h = Harness(CoreConfig().with_queue("declared"))
    assert set(h.state.queues) == {"declared"}
    [job_id] = h.enqueue(make_job(queue="used"), now=NOW)
    assert set(h.state.queues) == {"declared", "used"}
    h.reserve_one("used", now=NOW)
    h.ack(job_id, 1, now=NOW)
    assert set(h.state.queues) == {"declared"}
    assert h.counts("used") == (0, 0, 0, 0)
