"""The simulation's checks of issue 17 (`tools/sim.py`), apart from the model:
`ScheduleAudit` (every sweep fires what its catch-up policy allows, each tick at
most once in the log's history, across crashes) and `check_max_in_flight`.
Fed real sweeps of the core they must pass; fed what a broken core would log
they must fail. The seeded runs are tests/crash/test_sim.py's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sepp.core import CoreConfig, Decision, Reserve, Sweep
from sepp.core.commands import PutSchedule
from sepp.core.events import JobEnqueued, ScheduleAdvanced
from tests.core.helpers import Harness
from tools import sim
from tools.refmodel import Model

T0 = 1_700_000_000_000
EVERY_MS = 1_000


def scheduled(catch_up: str, every_ms: int = EVERY_MS) -> Harness:
    core = Harness(CoreConfig())
    core.accept(
        PutSchedule(
            actor="ann",
            role="admin",
            name="s",
            queue="q",
            job_type="tick",
            every_ms=every_ms,
            catch_up=catch_up,
        ),
        T0,
    )
    return core


def sweep(core: Harness, audit: sim.ScheduleAudit, now: int, seq: int) -> tuple[Any, Decision]:
    """A real sweep of the core at `now`, audited as logged at `seq`."""
    before = sim.ScheduleAudit.before(core.state)
    decision = core.run(Sweep(), now)
    assert isinstance(decision, Decision)
    audit.decided(before, decision, seq, now, core.config.sweep_limit, Counter(), sweep=True)
    return before, decision


def fired_in(decision: Decision) -> list[int]:
    return [t for ev in decision.events if type(ev) is ScheduleAdvanced for t in ev.fired]


@pytest.mark.parametrize(
    ("catch_up", "fired"),
    [("all", [1_000, 2_000, 3_000]), ("one", [3_000]), ("none", [3_000])],
)
def test_a_real_sweep_passes_the_audit_under_each_catch_up_policy(
    catch_up: str, fired: list[int]
) -> None:
    core, audit = scheduled(catch_up), sim.ScheduleAudit()
    _, decision = sweep(core, audit, T0 + 3_500, seq=2)
    assert fired_in(decision) == [T0 + t for t in fired]
    # Every 2.5 s, swept 1.6 s after the newest due tick: more than
    # SCHEDULE_ON_TIME_MS late, so none fires nothing, one the newest, all every one.
    slow = scheduled(catch_up, every_ms=2_500)
    _, late = sweep(slow, sim.ScheduleAudit(), T0 + 6_600, seq=2)
    expected = {"none": [], "one": [5_000], "all": [2_500, 5_000]}[catch_up]
    assert fired_in(late) == [T0 + t for t in expected]


def test_a_tick_fired_again_is_caught_unless_a_crash_took_its_record_back() -> None:
    core, audit = scheduled("all"), sim.ScheduleAudit()
    before, decision = sweep(core, audit, T0 + 1_500, seq=2)  # fires T0 + 1000
    # A broken core whose schedule went back: the same tick fired in a later record.
    with pytest.raises(sim.Violation, match="fired again"):
        audit.decided(before, decision, 3, T0 + 1_500, 100, Counter(), sweep=True)
    # The crash lost record 2: the tick never fired, and firing it again is right.
    audit.recovered(1)
    audit.decided(before, decision, 2, T0 + 1_500, 100, Counter(), sweep=True)


def test_a_sweep_firing_more_than_its_catch_up_policy_allows_is_caught() -> None:
    core, audit = scheduled("all"), sim.ScheduleAudit()
    before = sim.ScheduleAudit.before(core.state)
    decision = core.run(Sweep(), T0 + 3_500)
    assert isinstance(decision, Decision) and len(fired_in(decision)) == 3
    # The same three ticks under catch_up = one: only the newest may fire.
    spec, first, paused, cron = before["s"]
    as_one = {"s": (spec._replace(catch_up="one"), first, paused, cron)}
    with pytest.raises(sim.Violation, match="catch_up = one"):
        audit.decided(as_one, decision, 2, T0 + 3_500, 100, Counter(), sweep=True)


def test_catch_up_none_firing_a_late_tick_is_caught() -> None:
    core, audit = scheduled("none", every_ms=2_500), sim.ScheduleAudit()
    before = sim.ScheduleAudit.before(core.state)
    decision = core.run(Sweep(), T0 + 6_600)  # the newest tick is 1.6 s late: skipped
    assert isinstance(decision, Decision) and fired_in(decision) == []
    tick = T0 + 5_000
    job = next(ev for ev in scheduled("all").run(Sweep(), tick).events if type(ev) is JobEnqueued)
    job = job._replace(
        custom={"schedule": "s", "schedule_tick_ms": tick}, idempotency_key=f"schedule:s:{tick}"
    )
    advanced = next(ev for ev in decision.events if type(ev) is ScheduleAdvanced)
    forged = decision._replace(
        events=(job, advanced._replace(fired=(tick,), skipped=advanced.skipped - 1))
    )
    with pytest.raises(sim.Violation, match="catch_up = none"):
        audit.decided(before, forged, 2, T0 + 6_600, 100, Counter(), sweep=True)


def test_a_due_schedule_left_alone_or_a_paused_one_firing_is_caught() -> None:
    core, audit = scheduled("one"), sim.ScheduleAudit()
    before = sim.ScheduleAudit.before(core.state)
    decision = core.run(Sweep(), T0 + 1_500)
    assert isinstance(decision, Decision)
    quiet = decision._replace(events=())
    with pytest.raises(sim.Violation, match="left alone"):
        audit.decided(before, quiet, 2, T0 + 1_500, 100, Counter(), sweep=True)
    spec, first, _, cron = before["s"]
    with pytest.raises(sim.Violation, match="paused"):
        audit.decided(
            {"s": (spec, first, True, cron)}, decision, 2, T0 + 1_500, 100, Counter(), sweep=True
        )


def test_a_command_taking_a_capped_queue_past_its_max_in_flight_is_caught() -> None:
    model = Model(CoreConfig().with_queue("c", max_in_flight=2))
    stats: Counter[str] = Counter()
    sim.check_max_in_flight(model, {"c": 1}, {"c": 2, "a": 9}, "Reserve", stats)
    assert stats["max_in_flight_reached"] == 1
    # A cap lowered below the jobs already leased leaves them: no new lease.
    sim.check_max_in_flight(model, {"c": 3}, {"c": 3}, "PutQueue", stats)
    with pytest.raises(sim.Violation, match="3 jobs of queue c in flight, max_in_flight 2"):
        sim.check_max_in_flight(model, {"c": 1}, {"c": 3}, "Reserve", stats)


def test_more_deliveries_in_a_window_than_the_rate_limit_is_caught() -> None:
    config = CoreConfig().with_queue("a", rate_limit_jobs=2, rate_limit_per_ms=1_000)
    model, core, audit = Model(config), Harness(config), sim.RateAudit()
    for i in range(4):
        core.enqueue_results(new_job(i), now=T0)
    limits = sim.RateAudit.limits(model)
    reserved = core.run(Reserve(queues=("a",), lease_ms=5_000, max_jobs=3), T0 + 1)
    assert isinstance(reserved, Decision) and len(reserved.events) == 2  # the core holds
    audit.decided(limits, limits, reserved, 2, core.state, Counter())
    # A broken core: a third delivery 500 ms later, inside the window.
    third = core.run(Reserve(queues=("a",), lease_ms=5_000, max_jobs=1), T0 + 1_001)
    assert isinstance(third, Decision) and len(third.events) == 1
    early = third._replace(time_ms=T0 + 500)
    with pytest.raises(sim.Violation, match="3 deliveries in the 1000 ms up to"):
        audit.decided(limits, limits, early, 3, core.state, Counter())
    # A crash took record 3 back; the same delivery a window later is allowed.
    audit.recovered(2)
    audit.decided(limits, limits, third, 3, core.state, Counter())
    # Deliveries made before the limit took its present value do not count.
    fresh = sim.RateAudit()
    unlimited = {queue: (None, None) for queue in limits}
    fresh.decided(unlimited, unlimited, reserved, 2, core.state, Counter())
    fresh.decided(unlimited, limits, core.run(Sweep(), T0 + 2), 3, core.state, Counter())
    fresh.decided(limits, limits, early, 4, core.state, Counter())
    # A crash took the change back (found by the simulation: the audit then had no
    # change left to count from): the limit counts from the start again.
    fresh.recovered(2)
    with pytest.raises(sim.Violation, match="3 deliveries"):
        fresh.decided(limits, limits, early, 3, core.state, Counter())


def new_job(i: int) -> Any:
    from sepp.core import NewJob

    return NewJob(
        job_id=f"00000000-0000-4000-8000-{i + 1:012d}",
        queue="a",
        job_type="work",
        payload_data=None,
        payload_encoding=None,
    )
