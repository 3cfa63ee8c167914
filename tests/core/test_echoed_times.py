"""Every time the core echoes back is one a client can decode (issue 12, section 2).

PROTOCOL.md's conventions: the server stores and sends times in 0 .. TIME_MS_MAX
(9999-12-31T23:59:59.999Z); a scheduled_at_ms that was not in the future at enqueue
is "not scheduled" and echoed as nil. The enqueue side of the rule is the
rejections table (test_rejections.py) and the transitions table
(test_transitions.py); here: what older logs and snapshots hold, and deadlines the
core computes from a producer's or worker's numbers.
"""

from __future__ import annotations

import pytest

from sepp.core import CoreConfig, apply_record
from sepp.core.events import JobEnqueued
from sepp.core.state import TIME_MS_MAX, Job, echoed_scheduled_at
from tests.core.helpers import NOW, Harness, make_job, new_id

HUGE = 2**62  # a configured cap far beyond any representable deadline


def _old_enqueued(job_id: str, scheduled_at: int) -> JobEnqueued:
    """A JobEnqueued as an older server logged it: scheduled_at kept as requested
    even when it was in the past (run_at None: the job landed Ready)."""
    return JobEnqueued(
        job_id=job_id,
        queue="q",
        job_type="work",
        payload_data=None,
        payload_encoding=None,
        priority=4,
        max_attempts=3,
        enqueued_at=NOW,
        scheduled_at=scheduled_at,
        run_at=None,
        idempotency_key=None,
        dedup_expires_at=None,
        traceparent=None,
        tracestate=None,
        custom=None,
    )


@pytest.mark.parametrize(
    "scheduled_at",
    [
        pytest.param(-5, id="a negative scheduled_at"),
        pytest.param(-(2**63), id="the smallest 64-bit scheduled_at"),
        pytest.param(0, id="scheduled_at at time zero"),
        pytest.param(NOW, id="scheduled_at equal to the enqueue time"),
    ],
)
def test_an_old_log_with_a_past_scheduled_at_replays_and_echoes_nil(scheduled_at: int) -> None:
    h = Harness()
    job_id = new_id()
    apply_record(h.state, NOW, (_old_enqueued(job_id, scheduled_at),))  # apply never refuses

    assert h.state.jobs[job_id].scheduled_at == scheduled_at  # stored as logged
    [view] = h.reserve("q", now=NOW + 1)
    assert (view.job_id, view.scheduled_at) == (job_id, None)


@pytest.mark.parametrize(
    ("scheduled_at", "enqueued_at", "echoed"),
    [
        pytest.param(None, NOW, None, id="no scheduled_at echoes nil"),
        pytest.param(NOW + 1, NOW, NOW + 1, id="a future scheduled_at is echoed as requested"),
        pytest.param(NOW, NOW, None, id="scheduled_at equal to the enqueue time echoes nil"),
        pytest.param(-1, NOW, None, id="a negative scheduled_at echoes nil"),
        pytest.param(TIME_MS_MAX, NOW, TIME_MS_MAX, id="the last representable time is echoed"),
        pytest.param(
            TIME_MS_MAX + 1, NOW, TIME_MS_MAX, id="an old time past 9999 is echoed clamped"
        ),
    ],
)
def test_the_echoed_scheduled_at_is_nil_unless_it_was_in_the_future(
    scheduled_at: int | None, enqueued_at: int, echoed: int | None
) -> None:
    assert echoed_scheduled_at(scheduled_at, enqueued_at) == echoed


def test_a_snapshot_job_with_a_negative_scheduled_at_is_viewed_with_nil() -> None:
    # A snapshot row of an older server: the Job as loaded, scheduled_at as logged.
    job = Job(
        new_id(), "q", "work", None, None, 4, 3, NOW, -1_000, None, None, None, None,
        0, 1, 0, 0, None, None,
    )  # fmt: skip
    assert job.view().scheduled_at is None


def test_a_dead_letter_of_an_old_job_echoes_nil_for_its_past_scheduled_at() -> None:
    h = Harness(CoreConfig(dead_letter_retention_ms=60_000))
    job_id = new_id()
    apply_record(h.state, NOW, (_old_enqueued(job_id, -5),))
    h.dead_letter(job_id, now=NOW + 1)
    [record] = h.drain(now=NOW + 2)
    assert (record.job.job_id, record.job.scheduled_at) == (job_id, None)


def test_a_lease_under_a_huge_cap_ends_at_the_last_representable_time() -> None:
    h = Harness(CoreConfig().with_queue("q", max_lease_duration_ms=HUGE))
    [job_id] = h.enqueue(make_job(), now=NOW)
    view = h.reserve_one("q", now=NOW, lease_ms=HUGE)
    assert view.lease_expires_at == TIME_MS_MAX
    extended = h.extend(job_id, 1, HUGE, now=NOW + 1)
    assert extended.lease_expires_at == TIME_MS_MAX
