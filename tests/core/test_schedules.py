"""Schedules in the core (issue 17): the cron parser and its DST rules
(sepp/core/schedules.py), one test per row of the decision table in
sepp/core/decide.py ("Schedules"), the catch-up policies of the sweep, and replay
and snapshots of schedules (ticks keep their anchor)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from sepp.core import CoreConfig, QueuePolicy, State, Sweep, apply_record, check_invariants
from sepp.core.commands import DeleteSchedule, PauseSchedule, PutSchedule, ResumeSchedule
from sepp.core.events import AdminAction, ScheduleAdvanced, ScheduleDefined, ScheduleDeleted
from sepp.core.results import (
    InvalidArgument,
    PermissionDenied,
    QueueNotFound,
    ScheduleNotFound,
    ScheduleResult,
    SweepResult,
)
from sepp.core.schedules import (
    SCHEDULE_ON_TIME_MS,
    SCHEDULES_MAX,
    UTC_ZONE,
    CronError,
    next_cron_tick,
    parse_cron,
)
from sepp.server.timezones import zone_table

from .helpers import Harness, make_job
from .test_admin import replayed, snapshot_round_trip

NY = "America/New_York"
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def ms(*args: int, tz: str = NY) -> int:
    return int(datetime(*args, tzinfo=ZoneInfo(tz)).timestamp() * 1000)  # type: ignore[misc]


def local(t: int, tz: str = NY) -> str:
    return datetime.fromtimestamp(t / 1000, ZoneInfo(tz)).isoformat()


def ticks(expr: str, tz: str, start: int, end: int) -> list[int]:
    cron, zone, out, t = parse_cron(expr), zone_table(tz), [], start
    while True:
        nxt = next_cron_tick(cron, zone, t)
        assert nxt is not None and nxt > t
        if nxt > end:
            return out
        out.append(nxt)
        t = nxt


def put(**fields: Any) -> PutSchedule:
    base: dict[str, Any] = {
        "actor": "ann",
        "role": "admin",
        "name": "tick",
        "queue": "q",
        "job_type": "ping",
        "every_ms": 1_000,
    }
    base.update(fields)
    return PutSchedule(**base)


def admin(cls: Any, name: str = "tick", role: str = "admin") -> Any:
    return cls(actor="ann", role=role, name=name)


def fired_jobs(h: Harness) -> list[tuple[int, str]]:
    """(schedule_tick_ms, job id) of every live job a schedule fired."""
    return sorted(
        (job.custom["schedule_tick_ms"], job.job_id)
        for job in h.state.jobs.values()
        if job.custom and "schedule" in job.custom
    )


# ---------------------------------------------------------------------------
# Cron parsing


def test_cron_fields_take_lists_ranges_steps_and_names() -> None:
    cron = parse_cron("*/15 9-17 1,15 jan-mar MON-fri")
    assert cron.minutes == frozenset({0, 15, 30, 45})
    assert cron.hours == frozenset(range(9, 18))
    assert cron.days == frozenset({1, 15})
    assert cron.months == frozenset({1, 2, 3})
    assert cron.weekdays == frozenset({1, 2, 3, 4, 5})


def test_cron_weekday_seven_is_sunday() -> None:
    assert parse_cron("0 0 * * 7").weekdays == frozenset({0})


@pytest.mark.parametrize(
    "expr",
    ["* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *",
     "5-1 * * * *", "*/0 * * * *", "a * * * *", "1,,2 * * * *"],
)  # fmt: skip
def test_a_malformed_cron_is_refused_by_the_parser(expr: str) -> None:
    with pytest.raises(CronError):
        parse_cron(expr)


def test_day_of_month_and_weekday_both_restricted_match_either() -> None:
    # 2026-06: the 13th is a Saturday; Fridays are 5, 12, 19, 26.
    got = ticks("0 12 13 * fri", "UTC", ms(2026, 6, 1, tz="UTC"), ms(2026, 6, 30, tz="UTC"))
    assert [datetime.fromtimestamp(t / 1000, UTC).day for t in got] == [5, 12, 13, 19, 26]


# ---------------------------------------------------------------------------
# DST rules (ours): skipped local time fires once at the next valid minute; a
# repeated one fires once, at its first occurrence.


def test_a_skipped_local_time_fires_once_at_the_next_valid_minute() -> None:
    got = ticks("30 2 * * *", NY, ms(2026, 3, 7, 12), ms(2026, 3, 9, 12))
    assert [local(t) for t in got] == ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]


def test_every_minute_of_a_skipped_hour_fires_once_in_all() -> None:
    got = ticks("* 2 * * *", NY, ms(2026, 3, 8, 0), ms(2026, 3, 8, 12))
    assert [local(t) for t in got] == ["2026-03-08T03:00:00-04:00"]


def test_a_repeated_local_time_fires_once_at_its_first_occurrence() -> None:
    got = ticks("30 1 * * *", NY, ms(2026, 10, 31, 12), ms(2026, 11, 2, 12))
    assert [local(t) for t in got] == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]


def test_every_minute_of_a_repeated_hour_fires_sixty_times_not_one_hundred_and_twenty() -> None:
    got = ticks("* 1 * * *", NY, ms(2026, 11, 1, 0), ms(2026, 11, 1, 4))
    assert len(got) == 60
    assert local(got[0]) == "2026-11-01T01:00:00-04:00"
    assert local(got[-1]) == "2026-11-01T01:59:00-04:00"


def test_a_search_starting_inside_the_second_occurrence_skips_the_repeated_times() -> None:
    # 01:10 EST (the second 01:10): 01:30 fired at its first occurrence (EDT), so
    # the next "*/30 * * * *" tick is 02:00 EST.
    start = ms(2026, 11, 1, 6, 10, tz="UTC")
    assert local(start) == "2026-11-01T01:10:00-05:00"
    got = next_cron_tick(parse_cron("*/30 * * * *"), zone_table(NY), start)
    assert got is not None and local(got) == "2026-11-01T02:00:00-05:00"


def test_the_zone_table_gives_zoneinfo_offsets() -> None:
    zone = zone_table("Europe/Berlin")
    from sepp.core.schedules import offset_at

    for t in range(ms(2021, 1, 1, tz="UTC"), ms(2031, 1, 1, tz="UTC"), 7 * 3_600_000 + 17):
        delta = datetime.fromtimestamp(t / 1000, ZoneInfo("Europe/Berlin")).utcoffset()
        assert delta is not None
        assert offset_at(zone, t) == int(delta.total_seconds() * 1000), t


# ---------------------------------------------------------------------------
# Decision table: put / pause / resume / delete


def test_a_viewer_may_not_put_a_schedule() -> None:
    assert isinstance(Harness().refuse(put(role="viewer"), now=T0), PermissionDenied)


def test_an_empty_actor_is_refused() -> None:
    assert isinstance(Harness().refuse(put(actor=""), now=T0), InvalidArgument)


@pytest.mark.parametrize("name", ["", "x" * 201, "a\nb", 7])
def test_a_bad_schedule_name_is_refused(name: object) -> None:
    assert isinstance(Harness().refuse(put(name=name), now=T0), InvalidArgument)


def test_a_bad_queue_name_is_refused() -> None:
    assert isinstance(Harness().refuse(put(queue="a/b"), now=T0), InvalidArgument)


def test_an_undeclared_queue_under_strict_queues_is_not_found() -> None:
    h = Harness(CoreConfig(strict_queues=True, queues={"known": QueuePolicy()}))
    assert isinstance(h.refuse(put(queue="other"), now=T0), QueueNotFound)


@pytest.mark.parametrize("fields", [{"every_ms": None}, {"every_ms": 1_000, "cron": "* * * * *"}])
def test_a_schedule_needs_exactly_one_of_cron_and_every_ms(fields: dict[str, Any]) -> None:
    assert isinstance(Harness().refuse(put(**fields), now=T0), InvalidArgument)


@pytest.mark.parametrize("every_ms", [999, 366 * 86_400_000 + 1, True, "1000"])
def test_every_ms_outside_its_bounds_is_refused(every_ms: object) -> None:
    assert isinstance(Harness().refuse(put(every_ms=every_ms), now=T0), InvalidArgument)


@pytest.mark.parametrize("cron", ["* * *", "0 0 30 2 *"])
def test_a_cron_that_does_not_parse_or_never_fires_is_refused(cron: str) -> None:
    result = Harness().refuse(put(every_ms=None, cron=cron), now=T0)
    assert isinstance(result, InvalidArgument)


@pytest.mark.parametrize(
    "fields",
    [{"timezone": ""}, {"zone": ()}, {"zone": (0, 0)}, {"zone": (-(2**62), 30 * 3_600_000)}],
)
def test_a_bad_timezone_or_zone_table_is_refused(fields: dict[str, Any]) -> None:
    assert isinstance(Harness().refuse(put(**fields), now=T0), InvalidArgument)


def test_an_unknown_catch_up_policy_is_refused() -> None:
    assert isinstance(Harness().refuse(put(catch_up="some"), now=T0), InvalidArgument)


@pytest.mark.parametrize("fields", [{"job_type": ""}, {"priority": 99}, {"custom": {"k": [1]}}])
def test_a_schedule_whose_jobs_the_queue_would_refuse_is_refused(fields: dict[str, Any]) -> None:
    assert isinstance(Harness().refuse(put(**fields), now=T0), InvalidArgument)


def test_a_new_schedule_over_schedules_max_is_refused() -> None:
    h = Harness()
    spec = ScheduleDefined(
        name="", queue="q", job_type="ping", payload_data=None, payload_encoding=None,
        priority=None, max_attempts=None, custom=None, cron=None, timezone="UTC",
        zone=UTC_ZONE, every_ms=1_000, catch_up="one", next_ms=T0 + 1_000, created_at=T0,
    )  # fmt: skip
    apply_record(h.state, T0, [spec._replace(name=f"s{i}") for i in range(SCHEDULES_MAX)])
    assert isinstance(h.refuse(put(name="one-more"), now=T0), InvalidArgument)
    # An update of an existing one is still accepted.
    assert h.accept(put(name="s1", every_ms=2_000), now=T0) == ScheduleResult(
        "s1", False, True, False, T0 + 2_000
    )


def test_the_same_definition_again_changes_nothing() -> None:
    h = Harness()
    assert h.accept(put(), now=T0) == ScheduleResult("tick", True, True, False, T0 + 1_000)
    assert h.accept(put(), now=T0 + 500) == ScheduleResult("tick", False, False, False, T0 + 1_000)
    assert h.records[-1][1] == ()


def test_the_same_definition_after_ticks_fired_changes_nothing() -> None:
    # Found by the simulation (SEPP_SEED=90754068): the stored definition keeps the
    # next tick it was put with, ticks move the schedule on, and a re-put of the
    # same table (a config reload) was taken for a change and logged again.
    h = Harness()
    h.accept(put(), now=T0)
    h.accept(Sweep(), now=T0 + 1_000)
    logged = len(h.records)
    reply = h.accept(put(), now=T0 + 1_500)
    assert reply == ScheduleResult("tick", False, False, False, T0 + 2_000)
    assert len(h.records) == logged or h.records[-1][1] == ()


def test_a_put_logs_an_admin_header_then_the_definition() -> None:
    h = Harness()
    h.accept(put(reason="heartbeat"), now=T0)
    header, spec = h.records[-1][1]
    assert isinstance(header, AdminAction) and header.action == "schedule.put"
    assert (header.actor, header.role, header.reason, header.queue) == (
        "ann", "admin", "heartbeat", "q"
    )  # fmt: skip
    assert isinstance(spec, ScheduleDefined) and spec.next_ms == T0 + 1_000


def test_an_update_that_keeps_the_timing_keeps_the_anchor() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    reply = h.accept(put(job_type="other", catch_up="all"), now=T0 + 700)
    assert reply == ScheduleResult("tick", False, True, False, T0 + 1_000)


def test_an_update_that_changes_the_timing_starts_a_new_anchor() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    reply = h.accept(put(every_ms=5_000), now=T0 + 700)
    assert reply == ScheduleResult("tick", False, True, False, T0 + 5_700)


@pytest.mark.parametrize("cls", [PauseSchedule, ResumeSchedule, DeleteSchedule])
def test_a_command_on_an_unknown_schedule_is_not_found(cls: Any) -> None:
    assert isinstance(Harness().refuse(admin(cls, "nope"), now=T0), ScheduleNotFound)


def test_pausing_a_paused_schedule_and_resuming_a_running_one_change_nothing() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    assert h.accept(admin(ResumeSchedule), now=T0).changed is False
    assert h.records[-1][1] == ()
    h.accept(admin(PauseSchedule), now=T0)
    assert h.accept(admin(PauseSchedule), now=T0).changed is False
    assert h.records[-1][1] == ()


def test_a_resume_fires_from_the_first_tick_after_now_without_catching_up() -> None:
    h = Harness()
    h.accept(put(catch_up="all"), now=T0)
    h.accept(admin(PauseSchedule), now=T0 + 10)
    assert h.accept(Sweep(), now=T0 + 5_500) == SweepResult()
    reply = h.accept(admin(ResumeSchedule), now=T0 + 5_500)
    assert reply == ScheduleResult("tick", False, True, False, T0 + 6_000)
    assert h.accept(Sweep(), now=T0 + 6_000).schedule_ticks_fired == 1
    assert [t for t, _ in fired_jobs(h)] == [T0 + 6_000]


def test_a_deleted_schedule_fires_nothing_and_its_jobs_stay() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    h.accept(Sweep(), now=T0 + 1_000)
    h.accept(admin(DeleteSchedule), now=T0 + 1_100)
    assert isinstance(h.records[-1][1][-1], ScheduleDeleted)
    assert h.accept(Sweep(), now=T0 + 9_000) == SweepResult()
    assert len(fired_jobs(h)) == 1
    assert h.state.schedules == {} and h.state.schedule_heap == []


# ---------------------------------------------------------------------------
# The sweep


def test_nothing_due_logs_nothing_and_the_next_deadline_is_the_tick() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    assert h.state.next_deadline() == T0 + 1_000
    decision = h.run(Sweep(), now=T0 + 999)
    assert not isinstance(decision, InvalidArgument) and decision.events == ()  # type: ignore[union-attr]


def test_a_due_tick_fires_a_job_with_its_origin_and_key() -> None:
    h = Harness()
    h.accept(put(custom={"team": "ops"}, priority=3), now=T0)
    assert h.accept(Sweep(), now=T0 + 1_000).schedule_ticks_fired == 1
    (tick, job_id), = fired_jobs(h)  # fmt: skip
    job = h.state.jobs[job_id]
    assert tick == T0 + 1_000
    assert job.custom == {"team": "ops", "schedule": "tick", "schedule_tick_ms": T0 + 1_000}
    assert job.idempotency_key == f"schedule:tick:{T0 + 1_000}"
    assert (job.queue, job.job_type, job.priority) == ("q", "ping", 3)
    assert isinstance(h.records[-1][1][-1], ScheduleAdvanced)
    assert h.state.next_deadline() == T0 + 2_000


def test_a_second_sweep_at_the_same_time_fires_nothing_more() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    h.accept(Sweep(), now=T0 + 1_000)
    assert h.accept(Sweep(), now=T0 + 1_000).schedule_ticks_fired == 0
    assert len(fired_jobs(h)) == 1


def test_catch_up_all_fires_every_missed_tick_oldest_first() -> None:
    h = Harness()
    h.accept(put(catch_up="all"), now=T0)
    reply = h.accept(Sweep(), now=T0 + 5_500)
    assert (reply.schedule_ticks_fired, reply.schedule_ticks_skipped) == (5, 0)
    assert [t for t, _ in fired_jobs(h)] == [T0 + k * 1_000 for k in range(1, 6)]
    assert h.state.next_deadline() == T0 + 6_000


def test_catch_up_all_spreads_a_long_backlog_over_sweeps_of_sweep_limit() -> None:
    h = Harness(CoreConfig(sweep_limit=10))
    h.accept(put(catch_up="all"), now=T0)
    assert h.accept(Sweep(), now=T0 + 25_000).schedule_ticks_fired == 10
    assert h.state.next_deadline() == T0 + 11_000  # still due: the server sweeps again
    assert h.accept(Sweep(), now=T0 + 25_000).schedule_ticks_fired == 10
    assert h.accept(Sweep(), now=T0 + 25_000).schedule_ticks_fired == 5
    assert [t for t, _ in fired_jobs(h)] == [T0 + k * 1_000 for k in range(1, 26)]


def test_catch_up_one_fires_only_the_newest_missed_tick() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    reply = h.accept(Sweep(), now=T0 + 5_500)
    assert (reply.schedule_ticks_fired, reply.schedule_ticks_skipped) == (1, 4)
    assert [t for t, _ in fired_jobs(h)] == [T0 + 5_000]
    assert h.state.next_deadline() == T0 + 6_000


def test_catch_up_none_skips_a_tick_missed_by_more_than_the_on_time_window() -> None:
    h = Harness()
    h.accept(put(catch_up="none", every_ms=10_000), now=T0)
    late = T0 + 10_000 + SCHEDULE_ON_TIME_MS + 1
    reply = h.accept(Sweep(), now=late)
    assert (reply.schedule_ticks_fired, reply.schedule_ticks_skipped) == (0, 1)
    assert h.state.next_deadline() == T0 + 20_000


def test_catch_up_none_fires_a_tick_seen_on_time() -> None:
    h = Harness()
    h.accept(put(catch_up="none"), now=T0)
    assert h.accept(Sweep(), now=T0 + 1_000 + SCHEDULE_ON_TIME_MS).schedule_ticks_fired == 1


def test_a_tick_whose_key_is_already_used_is_skipped() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    h.enqueue(make_job(idempotency_key=f"schedule:tick:{T0 + 1_000}"), now=T0 + 1)
    reply = h.accept(Sweep(), now=T0 + 1_000)
    assert (reply.schedule_ticks_fired, reply.schedule_ticks_skipped) == (0, 1)


def test_a_tick_for_a_full_queue_is_skipped() -> None:
    h = Harness(CoreConfig(queues={"q": QueuePolicy(max_queue_depth=1)}))
    h.accept(put(catch_up="all"), now=T0)
    reply = h.accept(Sweep(), now=T0 + 3_000)
    assert (reply.schedule_ticks_fired, reply.schedule_ticks_skipped) == (1, 2)


def test_a_paused_schedule_fires_nothing_and_sets_no_deadline() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    h.accept(admin(PauseSchedule), now=T0)
    assert h.state.next_deadline() is None
    assert h.accept(Sweep(), now=T0 + 10_000) == SweepResult()


def test_a_cron_schedule_in_new_york_fires_once_across_the_spring_gap() -> None:
    h = Harness()
    zone = zone_table(NY)
    h.accept(put(every_ms=None, cron="30 2 * * *", timezone=NY, zone=zone), now=ms(2026, 3, 7, 12))
    assert h.state.next_deadline() == ms(2026, 3, 8, 3)
    assert h.accept(Sweep(), now=ms(2026, 3, 8, 3)).schedule_ticks_fired == 1
    assert h.state.next_deadline() == ms(2026, 3, 9, 2, 30)


def test_a_cron_schedule_catches_up_one_after_a_long_outage() -> None:
    h = Harness()
    h.accept(put(every_ms=None, cron="* * * * *"), now=T0)
    reply = h.accept(Sweep(), now=T0 + 30 * 86_400_000)  # a month of minutes
    assert reply.schedule_ticks_fired == 1
    assert reply.schedule_ticks_skipped >= 1_000  # a lower bound, far behind
    assert [t for t, _ in fired_jobs(h)] == [(T0 + 30 * 86_400_000) // 60_000 * 60_000]


# ---------------------------------------------------------------------------
# Replay and snapshots


def _busy(h: Harness) -> None:
    h.accept(put(), now=T0)
    h.accept(
        put(name="nightly", every_ms=None, cron="0 2 * * *", timezone=NY, zone=zone_table(NY)),
        now=T0,
    )
    h.accept(put(name="paused", every_ms=3_000), now=T0)
    h.accept(admin(PauseSchedule, "paused"), now=T0 + 1)
    h.accept(Sweep(), now=T0 + 2_500)


def test_replaying_schedule_records_rebuilds_the_live_state() -> None:
    h = Harness()
    _busy(h)
    assert replayed(h).canonical() == h.state.canonical()


def test_schedules_survive_a_snapshot_with_their_anchor() -> None:
    h = Harness()
    _busy(h)
    rebuilt = snapshot_round_trip(h.state)
    assert rebuilt.canonical() == h.state.canonical()
    assert rebuilt.next_deadline() == h.state.next_deadline() == T0 + 3_000
    # The rebuilt state fires the same next tick as the live one.
    live = Harness()
    live.state = rebuilt
    assert live.accept(Sweep(), now=T0 + 3_000).schedule_ticks_fired == 1
    check_invariants(rebuilt)


def test_a_schedule_deleted_and_created_again_never_reuses_a_job_id() -> None:
    h = Harness()
    h.accept(put(), now=T0)
    h.accept(Sweep(), now=T0 + 1_000)
    first = {jid for _, jid in fired_jobs(h)}
    h.accept(admin(DeleteSchedule), now=T0 + 1_001)
    h.accept(put(), now=T0 + 1_001)
    h.accept(Sweep(), now=T0 + 2_001)
    second = {jid for _, jid in fired_jobs(h)} - first
    assert len(second) == 1 and not first & second


def test_an_empty_state_has_no_schedules() -> None:
    assert State().schedules == {} and State().next_deadline() is None
