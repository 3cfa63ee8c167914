"""The crash harness's checks of issue 17 (`tools/crash.py`): the schedule
SCHEDULE_NAME fires every tick exactly once across SIGKILLs (catch_up = "all"),
and CAP_QUEUE never has more than CAP_MAX_IN_FLIGHT jobs leased at once.

The real runs are tests/crash/test_harness.py's (the schedule and the capped
queue run in every cycle). Here the ledger is fed sequences by hand: a correct
server's racy ones must pass, and a broken server's must be caught -- so the
checks are sound and can fail.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sepp.client import Job, JobCtx, Payload
from sepp.core import CoreConfig, QueuePolicy, Reserve, Sweep
from sepp.core.commands import Ack, PutSchedule
from sepp.core.state import JOB_ROW_FIELDS, State
from sepp.core.state import Job as CoreJob
from tests.core.helpers import Harness as CoreHarness
from tools.crash import (
    CAP_MAX_IN_FLIGHT,
    CAP_QUEUE,
    SCHEDULE_NAME,
    TICK_EVERY_MS,
    TICK_MAX_ATTEMPTS,
    TICK_QUEUE,
    JobRec,
    Ledger,
    Report,
    tick_tag,
)

LEASE_MS = 1_000
T0 = 1_800_000_000_000


def delivery(
    tag: str, queue: str, attempt: int, at_ms: int, *, tick: int | None = None, job_id: str = ""
) -> Job:
    """A job as a reserve answers it, decided at `at_ms` with a LEASE_MS lease."""
    custom = {} if tick is None else {"schedule": SCHEDULE_NAME, "schedule_tick_ms": tick}
    ctx = JobCtx(
        id=job_id or f"id-{tag}",
        queue=queue,
        job_type="crash-test",
        priority=0,
        attempt=attempt,
        max_attempts=TICK_MAX_ATTEMPTS if tick is not None else 3,
        enqueued_at=datetime.fromtimestamp(0, tz=UTC),
        custom=custom,
        trace_context=None,
        lease_expires_at=datetime.fromtimestamp((at_ms + LEASE_MS) / 1000, tz=UTC),
    )
    data = b"tick" if tick is not None else tag.encode()
    return Job(Payload(data, "text/plain"), ctx)


def capped_ledger(count: int) -> tuple[Ledger, list[JobRec]]:
    ledger = Ledger(Report(seed=0))
    recs = []
    for i in range(count):
        rec = JobRec(f"c{i}", CAP_QUEUE, 0, False, None, 3, None, job_id=f"id-c{i}", enq="ok")
        ledger.add(rec)
        recs.append(rec)
    return ledger, recs


def cap_violations(ledger: Ledger) -> list[str]:
    return [v for v in ledger.report.violations if f"jobs of {CAP_QUEUE} leased at once" in v]


# ---------------------------------------------------------------- max_in_flight


def test_a_delivery_past_the_cap_while_the_others_are_surely_leased_is_a_violation() -> None:
    assert CAP_MAX_IN_FLIGHT == 3
    ledger, _ = capped_ledger(4)
    for i in range(4):  # four leases, none ended: the fourth came at the cap
        ledger.delivered(delivery(f"c{i}", CAP_QUEUE, 1, T0 + 10 * i), LEASE_MS)
    assert len(cap_violations(ledger)) == 1, ledger.report.violations
    assert "4 jobs of ccap leased at once" in cap_violations(ledger)[0]


def test_a_lease_whose_ack_was_sent_or_whose_deadline_passed_does_not_count() -> None:
    # The ack of c0 was sent before the fourth delivery was decided: the server may
    # have applied it first (its answer, on another connection, not read yet).
    ledger, recs = capped_ledger(4)
    for i in range(3):
        ledger.delivered(delivery(f"c{i}", CAP_QUEUE, 1, T0 + 10 * i), LEASE_MS)
    ledger.ending(recs[0], T0 + 25)
    ledger.delivered(delivery("c3", CAP_QUEUE, 1, T0 + 30), LEASE_MS)
    ledger.check_cap("the lifetime")
    assert not ledger.report.violations

    # c0's lease lapsed at its deadline (T0 + LEASE_MS): a delivery at the deadline
    # may follow its expiry.
    lapsed, _ = capped_ledger(4)
    for i in range(3):
        lapsed.delivered(delivery(f"c{i}", CAP_QUEUE, 1, T0 + 10 * i), LEASE_MS)
    lapsed.delivered(delivery("c3", CAP_QUEUE, 1, T0 + LEASE_MS), LEASE_MS)
    lapsed.check_cap("the lifetime")
    assert not lapsed.report.violations

    # An ack sent after the fourth delivery was decided does not excuse it.
    late, recs = capped_ledger(4)
    for i in range(3):
        late.delivered(delivery(f"c{i}", CAP_QUEUE, 1, T0 + 10 * i), LEASE_MS)
    late.ending(recs[0], T0 + 31)
    late.delivered(delivery("c3", CAP_QUEUE, 1, T0 + 30), LEASE_MS)
    assert len(cap_violations(late)) == 1


def test_an_acknowledged_extend_keeps_the_lease_counted_past_its_first_deadline() -> None:
    ledger, recs = capped_ledger(4)
    for i in range(3):
        ledger.delivered(delivery(f"c{i}", CAP_QUEUE, 1, T0 + 10 * i), LEASE_MS)
    ledger.extended(recs[0], 1, T0 + 5 * LEASE_MS)
    ledger.extended(recs[1], 1, T0 + 5 * LEASE_MS)
    ledger.extended(recs[2], 1, T0 + 5 * LEASE_MS)
    ledger.delivered(delivery("c3", CAP_QUEUE, 1, T0 + 2 * LEASE_MS), LEASE_MS)
    assert len(cap_violations(ledger)) == 1


def test_deliveries_read_out_of_order_are_counted_when_the_lifetime_is_checked() -> None:
    """Four reserves on four connections: the one decided last is read first, so
    no single delivery, when read, shows four leases; the lifetime's check does."""
    ledger, _ = capped_ledger(4)
    ledger.delivered(delivery("c3", CAP_QUEUE, 1, T0 + 30), LEASE_MS)
    for i in range(3):
        ledger.delivered(delivery(f"c{i}", CAP_QUEUE, 1, T0 + 10 * i), LEASE_MS)
    assert not ledger.report.violations
    ledger.check_cap("the lifetime")
    assert len(cap_violations(ledger)) == 1
    assert "4 jobs of ccap leased at once at" in cap_violations(ledger)[0]


def test_a_lease_carried_over_a_restart_counts_until_its_deadline() -> None:
    """In flight in the recovered state: leased from the restart on."""
    config = CoreConfig().with_queue(CAP_QUEUE, max_in_flight=CAP_MAX_IN_FLIGHT)
    core = CoreHarness(config)
    for i in range(4):
        core.enqueue_results(_new_job(f"c{i}", CAP_QUEUE), now=T0)
    core.accept(Reserve(queues=(CAP_QUEUE,), lease_ms=5_000, max_jobs=3), T0 + 1)
    ledger, recs = capped_ledger(4)
    for i, rec in enumerate(recs):
        rec.job_id = _job_id(i)
    ledger.check_recovered(core.state, T0 + 100)
    assert not ledger.report.violations
    # The server restarted and, ignoring the three recovered leases, delivers a fourth.
    ledger.delivered(delivery("c3", CAP_QUEUE, 1, T0 + 200, job_id=_job_id(3)), LEASE_MS)
    assert len(cap_violations(ledger)) == 1


def _job_id(i: int) -> str:
    return f"00000000-0000-4000-8000-{i + 1:012d}"


def _new_job(tag: str, queue: str) -> object:
    from sepp.core import NewJob

    return NewJob(
        job_id=_job_id(int(tag[1:])),
        queue=queue,
        job_type="crash-test",
        payload_data=tag.encode(),
        payload_encoding="text/plain",
    )


# ---------------------------------------------------------------- the schedule


def scheduled_state(sweep_at: int) -> tuple[CoreHarness, int]:
    """A core state with SCHEDULE_NAME put at T0 and swept at `sweep_at`: every
    tick from its anchor up to then fired (catch_up = all). Returns the anchor."""
    core = CoreHarness(CoreConfig(defaults=QueuePolicy()))
    core.accept(
        PutSchedule(
            actor="config",
            role="admin",
            name=SCHEDULE_NAME,
            queue=TICK_QUEUE,
            job_type="tick",
            payload_data=b"tick",
            payload_encoding="text/plain",
            max_attempts=TICK_MAX_ATTEMPTS,
            every_ms=TICK_EVERY_MS,
            catch_up="all",
        ),
        T0,
    )
    core.accept(Sweep(), sweep_at)
    return core, T0 + TICK_EVERY_MS


def fired(state: State) -> dict[int, str]:
    """tick -> job id of every tick job in `state`."""
    return {
        job.custom["schedule_tick_ms"]: job.job_id
        for job in state.jobs.values()
        if job.custom and job.custom.get("schedule") == SCHEDULE_NAME
    }


def test_every_tick_below_the_next_one_in_the_recovered_state_is_accounted_for() -> None:
    core, anchor = scheduled_state(T0 + 3_500)
    ticks = fired(core.state)
    assert sorted(ticks) == [anchor, anchor + 1_000, anchor + 2_000]
    ledger = Ledger(Report(seed=0))
    # The first tick was delivered before the crash (and is in flight in S).
    core.accept(Reserve(queues=(TICK_QUEUE,), lease_ms=LEASE_MS, max_jobs=1), T0 + 3_600)
    job = delivery("", TICK_QUEUE, 1, T0 + 3_600, tick=anchor, job_id=ticks[anchor])
    ledger.delivered(job, LEASE_MS)
    ledger.check_recovered(core.state, T0 + 3_700)
    assert not ledger.report.violations, ledger.report.violations
    assert ledger.anchor == anchor and ledger.schedule_next == anchor + 3_000
    assert {tick_tag(t) for t in ticks} <= set(ledger.jobs)


def test_a_tick_below_the_next_one_that_nobody_saw_is_lost() -> None:
    """A broken server: the schedule moved past a tick whose job is neither in the
    recovered state nor ever delivered (here: acked behind the ledger's back)."""
    core, anchor = scheduled_state(T0 + 3_500)
    middle = fired(core.state)[anchor + 1_000]
    core.accept(Reserve(queues=(TICK_QUEUE,), lease_ms=LEASE_MS, max_jobs=3), T0 + 3_600)
    core.accept(Ack(job_id=middle, attempt=1), T0 + 3_601)
    ledger = Ledger(Report(seed=0))
    ledger.check_recovered(core.state, T0 + 3_700)
    lost = [v for v in ledger.report.violations if "lost" in v]
    assert lost and f"[{anchor + 1_000}]" in lost[0], ledger.report.violations


def test_a_tick_delivered_again_after_its_acknowledged_ack_is_a_tick_fired_twice() -> None:
    core, anchor = scheduled_state(T0 + 1_500)
    job_id = fired(core.state)[anchor]
    ledger = Ledger(Report(seed=0))
    rec = ledger.delivered(
        delivery("", TICK_QUEUE, 1, T0 + 1_600, tick=anchor, job_id=job_id), LEASE_MS
    )
    assert rec is not None and not ledger.report.violations
    rec.acked = "ok"  # the worker's ack was answered
    ledger.delivered(delivery("", TICK_QUEUE, 1, T0 + 1_700, tick=anchor, job_id=job_id), LEASE_MS)
    text = "\n".join(ledger.report.violations)
    assert "delivered again after an acknowledged ack" in text
    assert "attempt not above 1" in text


def test_the_same_tick_twice_in_the_recovered_state_is_a_violation() -> None:
    core, anchor = scheduled_state(T0 + 1_500)
    state = core.state
    original = state.jobs[fired(state)[anchor]]
    # A field-by-field copy under another id (copy.copy cannot rebuild the
    # compiled build's Job: its __new__ takes the constructor's arguments).
    twin = CoreJob(*(getattr(original, name) for name in JOB_ROW_FIELDS))
    twin.job_id = "00000000-0000-4000-8000-00000000abcd"
    state.jobs[twin.job_id] = twin  # a second job for the same tick (a forged state)
    ledger = Ledger(Report(seed=0))
    ledger.check_recovered(state, T0 + 1_600)
    assert any("a tick fired twice" in v for v in ledger.report.violations), (
        ledger.report.violations
    )


def test_a_tick_off_the_schedule_or_ahead_of_its_next_tick_is_a_violation() -> None:
    core, anchor = scheduled_state(T0 + 1_500)
    ledger = Ledger(Report(seed=0))
    ledger.check_recovered(core.state, T0 + 1_600)
    assert not ledger.report.violations
    ledger.delivered(delivery("", TICK_QUEUE, 1, anchor + 600, tick=anchor + 500), LEASE_MS)
    assert any("not a tick of" in v for v in ledger.report.violations)
    early = Ledger(Report(seed=0))
    early.delivered(delivery("", TICK_QUEUE, 1, anchor - 1, tick=anchor), LEASE_MS)
    assert any("before its tick" in v for v in early.report.violations)
