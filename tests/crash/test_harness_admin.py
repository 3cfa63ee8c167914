"""The crash harness's model of the admin mutations of issue 15 (tools/crash.py:
the operator task of its workload, and the ledger's checks of what it answered):
cancel and dead-letter by id, requeue and delete of dead letters by id, pause and
resume, purge. Each ledger rule has a pair of tests: a real violation is caught,
an allowed outcome (an answer read after the delivery it made possible, an
in-doubt call the recovered state resolves) is not.

The last test is a mutation test against real servers: a client that reports
admin calls as done without sending them must be caught.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sepp.client import Job, JobCtx, Payload
from sepp.core import CoreConfig
from sepp.core.commands import AdminDeadLetterJobs, PauseQueue
from tests.core.helpers import NOW, Harness, make_job
from tests.crash.helpers import harness_ledger, harness_rec
from tools.crash import PURGE_QUEUE, HarnessOptions, JobRec, Ledger, run_harness

LEASE = 1_000
WHO: dict[str, Any] = {"actor": "ann", "role": "operator"}


def _rec(tag: str, queue: str = "cq0", **state: object) -> JobRec:
    return harness_rec(tag, queue, seen=True, **state)


def _delivery(rec: JobRec, attempt: int, at_ms: int, queue: str = "cq0") -> Job:
    ctx = JobCtx(
        id=rec.job_id or "",
        queue=queue,
        job_type="crash-test",
        priority=0,  # type: ignore[arg-type]
        attempt=attempt,
        max_attempts=rec.max_attempts,
        enqueued_at=datetime.fromtimestamp(0, tz=UTC),
        custom={},
        trace_context=None,
        lease_expires_at=datetime.fromtimestamp((at_ms + LEASE) / 1000, tz=UTC),
    )
    return Job(Payload(rec.tag.encode(), "text/plain"), ctx)


def _violations(ledger: Ledger) -> str:
    return "\n".join(ledger.report.violations)


# -- requeue ---------------------------------------------------------------------------


def test_a_requeue_answer_read_after_the_delivery_it_allowed_is_no_violation() -> None:
    """The operator requeues a dead letter; a parked reserve of a worker gets it
    at attempt 1 at once, and the worker's answer is read before the operator's
    (two connections). The delivery proves the requeue applied."""
    rec = _rec("r", dead="ok", last_attempt=3)
    ledger = harness_ledger(rec)
    pending = ledger.admin_sent(rec, "requeue", 10_000)
    ledger.delivered(_delivery(rec, 1, 10_005), LEASE)
    assert not ledger.report.violations
    assert rec.dead == "no" and rec.last_attempt == 1 and rec.next_attempt == 2
    ledger.admin_answered(rec, pending, "done", 10_010)
    assert not ledger.report.violations
    assert ledger.report.stats["requeue_answer_read_after_the_delivery"] == 1


def test_a_delivery_of_a_dead_letter_whose_requeue_answered_not_found_is_a_violation() -> None:
    rec = _rec("r", dead="ok", last_attempt=3)
    ledger = harness_ledger(rec)
    pending = ledger.admin_sent(rec, "requeue", 10_000)
    ledger.delivered(_delivery(rec, 1, 10_005), LEASE)
    ledger.admin_answered(rec, pending, "not_found", 10_010)
    assert "its requeue answered not_found" in _violations(ledger)


def test_a_dead_letter_delivered_again_with_no_requeue_in_flight_is_a_violation() -> None:
    rec = _rec("r", dead="ok", last_attempt=3)
    ledger = harness_ledger(rec)
    ledger.delivered(_delivery(rec, 1, 10_005), LEASE)
    text = _violations(ledger)
    assert "delivered after it was dead-lettered" in text
    assert "attempt not above 3" in text


def test_a_requeue_answered_done_resets_the_attempt_to_exactly_1() -> None:
    rec = _rec("r", dead="ok", last_attempt=3)
    ledger = harness_ledger(rec)
    pending = ledger.admin_sent(rec, "requeue", 10_000)
    ledger.admin_answered(rec, pending, "done", 10_010)
    assert rec.dead == "no" and rec.next_attempt == 1
    ledger.delivered(_delivery(rec, 2, 10_020), LEASE)  # attempt 1 was due, not 2
    assert "expected attempt 1" in _violations(ledger)


def test_a_known_dead_letter_answered_not_found_by_a_requeue_or_delete_is_a_violation() -> None:
    for action in ("requeue", "delete"):
        rec = _rec("r", dead="ok", last_attempt=3)
        ledger = harness_ledger(rec)
        pending = ledger.admin_sent(rec, action, 10_000)
        ledger.admin_answered(rec, pending, "not_found", 10_010)
        assert "but it was a dead letter" in _violations(ledger), action


def _state_with_job(tag: str, job_id: str, *, dead: bool = False, paused: bool = False) -> Any:
    h = Harness(CoreConfig(dead_letter_retention_ms=3_600_000))
    h.enqueue(
        make_job(
            queue="cq0", job_id=job_id, payload_data=tag.encode(), payload_encoding="text/plain"
        ),
        now=NOW,
    )
    if dead:
        h.accept(AdminDeadLetterJobs(job_ids=(job_id,), reason="x", **WHO), NOW + 1)
    if paused:
        h.accept(PauseQueue(queue="cq0", **WHO), NOW + 2)
    return h.state


_JOB_ID = "018f0000-0000-7000-8000-000000000001"


def test_an_in_doubt_requeue_lets_the_recovered_state_reset_the_attempt_and_nothing_else() -> None:
    state = _state_with_job("r", _JOB_ID)  # Ready at attempt 1: the requeue applied
    rec = _rec("r", dead="ok", last_attempt=3, job_id=_JOB_ID)
    ledger = harness_ledger(rec)
    ledger.admin_in_doubt(rec, ledger.admin_sent(rec, "requeue", 10_000))
    ledger.check_recovered(state, 20_000)
    assert not ledger.report.violations
    assert rec.dead == "no" and rec.next_attempt == 1 and not rec.requeue_doubt

    # The same state with no requeue sent: the attempt went back.
    lone = _rec("r", dead="ok", last_attempt=3, job_id=_JOB_ID)
    bad = harness_ledger(lone)
    bad.check_recovered(state, 20_000)
    text = _violations(bad)
    assert "a dead letter came back" in text and "attempt went back" in text

    # Not applied after all: still the dead letter, and the doubt is settled.
    dead_state = _state_with_job("r", _JOB_ID, dead=True)
    kept = _rec("r", dead="ok", last_attempt=0, job_id=_JOB_ID)
    still = harness_ledger(kept)
    still.admin_in_doubt(kept, still.admin_sent(kept, "requeue", 10_000))
    still.check_recovered(dead_state, 20_000)
    assert not still.report.violations and kept.dead == "ok" and not kept.requeue_doubt


# -- cancel and dead-letter by id ------------------------------------------------------------


def test_a_cancel_done_of_a_job_in_flight_for_sure_is_a_violation() -> None:
    rec = _rec("c", last_attempt=1, lease_attempt=1, lease_until=50_000, lease_deadline=50_000)
    ledger = harness_ledger(rec)
    pending = ledger.admin_sent(rec, "cancel", 10_000)
    ledger.admin_answered(rec, pending, "done", 10_010)
    assert "but it was in flight (attempt 1) until 50000 for sure" in _violations(ledger)


def test_a_cancel_done_while_a_worker_acted_on_the_job_is_allowed() -> None:
    # A release by the worker (its answer not read yet) may have made it Ready.
    rec = _rec("c", last_attempt=1, lease_attempt=1, lease_until=50_000, lease_deadline=50_000)
    ledger = harness_ledger(rec)
    pending = ledger.admin_sent(rec, "cancel", 10_000)
    rec.acting += 1
    rec.acts += 1
    ledger.admin_answered(rec, pending, "done", 10_010)
    rec.acting -= 1
    assert not ledger.report.violations
    assert rec.acked == "ok" and rec.removed == "cancel"


def test_a_cancelled_job_delivered_again_or_recovered_is_a_violation() -> None:
    rec = _rec("c")
    ledger = harness_ledger(rec)
    ledger.admin_answered(rec, ledger.admin_sent(rec, "cancel", 10_000), "done", 10_010)
    assert not ledger.report.violations
    ledger.delivered(_delivery(rec, 1, 10_020), LEASE)
    assert "delivered again after an acknowledged cancel" in _violations(ledger)

    again = _rec("c", job_id=_JOB_ID)
    after = harness_ledger(again)
    after.admin_answered(again, after.admin_sent(again, "cancel", 10_000), "done", 10_010)
    after.check_recovered(_state_with_job("c", _JOB_ID), 20_000)
    assert "an acknowledged cancel was undone" in _violations(after)


def test_not_found_for_a_job_that_surely_existed_is_a_violation_and_wrong_state_is_not() -> None:
    for outcome, caught in (("not_found", True), ("wrong_state", False)):
        rec = _rec("c", last_attempt=1, lease_attempt=1, lease_until=50_000)
        ledger = harness_ledger(rec)
        pending = ledger.admin_sent(rec, "dead_letter", 10_000)
        ledger.admin_answered(rec, pending, outcome, 10_010)
        assert ("but the job existed" in _violations(ledger)) is caught, outcome
        assert rec.dead == "no"


def test_a_dead_letter_done_makes_the_job_a_dead_letter_the_drain_must_return() -> None:
    rec = _rec("d")
    ledger = harness_ledger(rec)
    ledger.admin_answered(rec, ledger.admin_sent(rec, "dead_letter", 10_000), "done", 10_010)
    assert rec.dead == "ok" and not ledger.report.violations
    ledger.drained([])
    assert "dead letter not drained" in _violations(ledger)


def test_an_in_doubt_cancel_or_dead_letter_leaves_the_job_maybe_gone_or_maybe_dead() -> None:
    cancelled, dead = _rec("c"), _rec("d")
    ledger = harness_ledger(cancelled, dead)
    ledger.admin_in_doubt(cancelled, ledger.admin_sent(cancelled, "cancel", 10_000))
    ledger.admin_in_doubt(dead, ledger.admin_sent(dead, "dead_letter", 10_000))
    assert cancelled.acked == "doubt" and dead.dead == "maybe"
    # Neither in the recovered state: the cancel happened; the dead letter is lost.
    ledger.check_recovered(_state_with_job("other", _JOB_ID), 20_000)
    text = _violations(ledger)
    assert "d (id-d): acknowledged job lost" in text
    assert "c (id-c)" not in text


# -- pause / resume -------------------------------------------------------------------------


def test_a_delivery_decided_after_an_acknowledged_pause_is_a_violation() -> None:
    early, late, after = _rec("p1"), _rec("p2"), _rec("p3")
    ledger = harness_ledger(early, late, after)
    before = ledger.pause_sent("cq0", True)
    ledger.delivered(_delivery(early, 1, 9_995), LEASE)  # while the pause is in flight
    ledger.pause_answered("cq0", True, before, True, True, 10_000)
    assert not ledger.report.violations
    # Decided before the answer left (t <= the answer's arrival): read late, allowed.
    ledger.delivered(_delivery(late, 1, 10_000), LEASE)
    assert not ledger.report.violations
    ledger.delivered(_delivery(after, 1, 10_001), LEASE)
    assert "p3 (id-p3) attempt 1 at 10001: delivered from queue cq0, paused" in _violations(ledger)


def test_a_delivery_while_a_resume_is_in_flight_is_allowed() -> None:
    rec = _rec("p")
    ledger = harness_ledger(rec)
    ledger.pause_answered("cq0", True, ledger.pause_sent("cq0", True), True, True, 10_000)
    before = ledger.pause_sent("cq0", False)
    ledger.delivered(_delivery(rec, 1, 10_500), LEASE)  # the resume's answer not read yet
    ledger.pause_answered("cq0", False, before, False, True, 10_600)
    assert not ledger.report.violations


def test_a_pause_or_resume_answer_must_say_whether_it_changed_anything() -> None:
    ledger = harness_ledger()
    ledger.pause_answered("cq0", True, ledger.pause_sent("cq0", True), True, False, 10_000)
    assert "answered changed=False, the queue was running" in _violations(ledger)


def test_an_acknowledged_pause_must_survive_the_crash() -> None:
    ledger = harness_ledger(_rec("x", job_id=_JOB_ID))
    ledger.pause_answered("cq0", True, ledger.pause_sent("cq0", True), True, True, 10_000)
    ledger.check_recovered(_state_with_job("x", _JOB_ID), 20_000)
    assert "queue cq0: paused=False in the recovered state" in _violations(ledger)

    kept = harness_ledger(_rec("x", job_id=_JOB_ID))
    kept.pause_answered("cq0", True, kept.pause_sent("cq0", True), True, True, 10_000)
    kept.check_recovered(_state_with_job("x", _JOB_ID, paused=True), 20_000)
    assert not kept.report.violations
    assert kept.paused["cq0"] == "ok" and kept.paused_at["cq0"] == 0  # nothing after restart


def test_an_in_doubt_pause_is_what_the_recovered_state_says() -> None:
    for paused in (False, True):
        ledger = harness_ledger(_rec("x", job_id=_JOB_ID))
        ledger.pause_sent("cq0", True)
        ledger.pause_in_doubt("cq0")
        ledger.check_recovered(_state_with_job("x", _JOB_ID, paused=paused), 20_000)
        assert not ledger.report.violations
        assert ledger.paused["cq0"] == ("ok" if paused else "no")


# -- purge ------------------------------------------------------------------------------------


def test_a_purge_must_count_exactly_the_jobs_of_the_purge_queue() -> None:
    recs = [_rec(f"q{i}", PURGE_QUEUE) for i in range(3)]
    dead = _rec("qd", PURGE_QUEUE, dead="ok")
    ledger = harness_ledger(*recs, dead)
    sure, maybe = ledger.purge_candidates()
    assert sorted(r.tag for r in sure) == ["q0", "q1", "q2"] and not maybe
    ledger.purged(sure, maybe, 3, 0)
    assert not ledger.report.violations
    assert all(r.acked == "ok" and r.removed == "purge" for r in recs) and dead.acked == "no"

    short = harness_ledger(*[_rec(f"q{i}", PURGE_QUEUE) for i in range(3)])
    sure, maybe = short.purge_candidates()
    short.purged(sure, maybe, 2, 0)
    assert "purge of cpurge answered purged=2 remaining=0" in _violations(short)


def test_a_purge_may_count_a_job_whose_enqueue_is_in_doubt() -> None:
    doubt = _rec("q1", PURGE_QUEUE, enq="doubt")
    ledger = harness_ledger(_rec("q0", PURGE_QUEUE), doubt)
    sure, maybe = ledger.purge_candidates()
    ledger.purged(sure, maybe, 2, 0)
    assert not ledger.report.violations and doubt.acked == "doubt"


# -- against real servers -------------------------------------------------------------------


def test_the_harness_catches_admin_calls_that_never_happened(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that answers cancels and pauses itself ("done", "paused") without
    sending them: cancelled jobs come back, paused queues keep delivering."""
    from sepp.client import AdminOutcomes, QueueChange, SeppClient

    async def lying_cancel(self: SeppClient, ids: Any, *, reason: str | None = None) -> Any:
        return AdminOutcomes([(i, "done") for i in ids], 0)

    async def lying_pause(self: SeppClient, queue: str, *, reason: str | None = None) -> Any:
        return QueueChange(queue, True, True)

    monkeypatch.setattr(SeppClient, "cancel_jobs", lying_cancel)
    monkeypatch.setattr(SeppClient, "pause_queue", lying_pause)
    report = run_harness(HarnessOptions(crashes=3, seed=seed, fast=True, points=False, final=False))
    text = "\n".join(report.violations)
    assert "acknowledged cancel" in text or "answered done, but" in text, report.summary("")
    assert "paused (acknowledged" in text, report.summary("")
