"""The admin operations of the service layer (issue 15): the role table (one test
per row), reads after the read barrier, the commands through `run` with the
principal in the audit header, and wakes of parked reserves after resume and
requeue. A fake sink stands for a front end; no sockets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sepp.core.decide import Decision
from sepp.core.events import AdminAction
from sepp.core.reads import JobPage, QueueInfo
from sepp.core.results import (
    OUTCOME_DONE,
    OUTCOME_NOT_FOUND,
    AdminOutcomes,
    CommandError,
    InvalidArgument,
    PermissionDenied,
    PurgeResult,
    QueueAdminResult,
    QueueInUse,
    QueueNotFound,
)
from sepp.server.service import (
    LOCAL_ADMIN,
    ROLE_REQUIRED,
    ROLES,
    Principal,
    SeppService,
    ShuttingDown,
    role_allows,
)
from tests.server.test_service import PARK_MS, FakeSink, enqueue, reserve, running_service

OPERATOR = Principal("ops", "operator")
VIEWER = Principal("eve", "viewer")
# Dead letters are kept only with a retention (the default keeps none).
RETAIN = {"storage__dead_letter_retention_ms": "3600000"}

# One call of each admin operation, for the role table.
CALLS: dict[str, Callable[[SeppService, Principal], tuple[Any, int]]] = {
    "get_job": lambda s, p: s.get_job(p, "no-such-job"),
    "list_jobs": lambda s, p: s.list_jobs(p, "q", "ready"),
    "list_dead_letters": lambda s, p: s.list_dead_letters(p, "q"),
    "list_queues": lambda s, p: s.list_queues(p),
    "queue_info": lambda s, p: s.queue_info(p, "q"),
    "dead_letter_jobs": lambda s, p: s.dead_letter_jobs(p, ["no-such-job"]),
    "cancel_jobs": lambda s, p: s.cancel_jobs(p, ["no-such-job"]),
    "requeue_dead_letters": lambda s, p: s.requeue_dead_letters(p, job_ids=["no-such-job"]),
    "delete_dead_letters": lambda s, p: s.delete_dead_letters(p, job_ids=["no-such-job"]),
    "pause_queue": lambda s, p: s.pause_queue(p, "q"),
    "resume_queue": lambda s, p: s.resume_queue(p, "q"),
    "purge_queue": lambda s, p: s.purge_queue(p, "q"),
    "put_queue": lambda s, p: s.put_queue(p, "newq", {}),
    "delete_queue": lambda s, p: s.delete_queue(p, "q"),
    "list_schedules": lambda s, p: s.list_schedules(p),
    "put_schedule": lambda s, p: s.put_schedule(p, "beat", "q", "tick", every_ms=60_000),
    "pause_schedule": lambda s, p: s.pause_schedule(p, "no-such-schedule"),
    "resume_schedule": lambda s, p: s.resume_schedule(p, "no-such-schedule"),
    "delete_schedule": lambda s, p: s.delete_schedule(p, "no-such-schedule"),
    # Checked by the admin API's `require` (sepp/admin/auth.py), no service method.
    "audit": lambda s, p: (s._denied(p, "audit"), 0),
    "events": lambda s, p: (s._denied(p, "events"), 0),
    "enqueue_jobs": lambda s, p: (s._denied(p, "enqueue_jobs"), 0),
    "server_info": lambda s, p: (s._denied(p, "server_info"), 0),
    "backup": lambda s, p: (s._denied(p, "backup"), 0),
}
# The rows above that only the admin API's `require` checks: no service call that
# could refuse while stopping.
REQUIRE_ONLY = {"audit", "events", "enqueue_jobs", "server_info", "backup"}


def test_every_admin_operation_has_a_row_in_the_role_table():
    assert set(CALLS) == set(ROLE_REQUIRED)


@pytest.mark.parametrize("operation", sorted(ROLE_REQUIRED))
async def test_role_row_the_weakest_role_allowed_passes_and_the_one_below_is_refused(operation):
    needed = ROLE_REQUIRED[operation]
    rank = ROLES.index(needed)
    async with running_service() as service:
        await enqueue(service, "q")
        for role in ROLES:
            outcome, _barrier = CALLS[operation](service, Principal("someone", role))
            refused = isinstance(outcome, PermissionDenied)
            assert refused == (ROLES.index(role) < rank), (operation, role, outcome)
            assert role_allows(role, operation) == (not refused)


async def test_an_unknown_role_may_do_nothing():
    async with running_service() as service:
        for operation, call in CALLS.items():
            outcome, _barrier = call(service, Principal("x", "superuser"))
            assert isinstance(outcome, PermissionDenied), operation


async def test_get_job_answers_a_job_after_the_read_barrier_and_none_for_an_unknown_id():
    async with running_service() as service:
        job_id = await enqueue(service, "q")
        info, barrier = service.get_job(VIEWER, job_id)
        await service.durable(barrier)
        assert info is not None and not isinstance(info, CommandError)
        assert (info.job_id, info.queue, info.state) == (job_id, "q", "ready")
        assert service.get_job(VIEWER, "unknown")[0] is None


async def test_list_jobs_pages_a_queue_with_its_cursor():
    async with running_service() as service:
        ids = [await enqueue(service, "q") for _ in range(5)]
        page, _ = service.list_jobs(VIEWER, "q", "ready", limit=3)
        assert isinstance(page, JobPage) and page.next_cursor is not None
        rest, _ = service.list_jobs(VIEWER, "q", "ready", cursor=page.next_cursor, limit=3)
        assert isinstance(rest, JobPage)
        assert [j.job_id for j in page.jobs + rest.jobs] == ids


async def test_queue_info_of_an_unknown_queue_is_queue_not_found():
    async with running_service() as service:
        assert isinstance(service.queue_info(VIEWER, "nope")[0], QueueNotFound)
        await enqueue(service, "q")
        info, _ = service.queue_info(VIEWER, "q")
        assert isinstance(info, QueueInfo) and info.ready == 1
        (listed,) = service.list_queues(VIEWER)[0]  # type: ignore[misc]
        assert listed.name == "q"


async def test_an_unknown_cause_name_is_an_invalid_argument():
    async with running_service() as service:
        outcome, _ = service.requeue_dead_letters(OPERATOR, queue="q", cause="bogus")
        assert isinstance(outcome, InvalidArgument)
        outcome, _ = service.delete_dead_letters(OPERATOR, queue="q", cause="bogus")
        assert isinstance(outcome, InvalidArgument)


async def test_dead_letter_then_requeue_by_ids_reports_per_id_outcomes_and_audits_the_actor():
    async with running_service(**RETAIN) as service:
        job_id = await enqueue(service, "q")
        decision, barrier = service.dead_letter_jobs(OPERATOR, [job_id], reason="stuck")
        await service.durable(barrier)
        assert isinstance(decision, Decision)
        header = decision.events[0]
        assert isinstance(header, AdminAction)
        assert (header.actor, header.role, header.reason) == ("ops", "operator", "stuck")
        page, _ = service.list_dead_letters(VIEWER, "q", cause="admin")
        assert isinstance(page, JobPage) and [j.job_id for j in page.jobs] == [job_id]
        decision, barrier = service.requeue_dead_letters(OPERATOR, job_ids=[job_id, "gone"])
        await service.durable(barrier)
        assert isinstance(decision, Decision)
        assert isinstance(decision.reply, AdminOutcomes)
        assert decision.reply.outcomes == ((job_id, OUTCOME_DONE), ("gone", OUTCOME_NOT_FOUND))


async def test_resume_wakes_a_reserve_parked_on_the_paused_queue():
    async with running_service() as service:
        decision, _ = service.pause_queue(OPERATOR, "q")
        assert isinstance(decision, Decision) and isinstance(decision.reply, QueueAdminResult)
        job_id = await enqueue(service, "q")
        sink = FakeSink()
        assert reserve(service, sink, wait_ms=PARK_MS) is not None
        assert sink.calls == 0
        service.resume_queue(OPERATOR, "q")
        (job,) = await sink.answer()
        assert job.job_id == job_id


async def test_requeue_wakes_a_parked_reserve():
    async with running_service(**RETAIN) as service:
        job_id = await enqueue(service, "q")
        service.dead_letter_jobs(OPERATOR, [job_id])
        sink = FakeSink()
        assert reserve(service, sink, wait_ms=PARK_MS) is not None
        service.requeue_dead_letters(OPERATOR, queue="q")
        (job,) = await sink.answer()
        assert (job.job_id, job.attempt) == (job_id, 1)


async def test_purge_returns_the_count_and_delete_queue_is_refused_while_a_job_is_in_flight():
    async with running_service() as service:
        decision, _ = service.put_queue(LOCAL_ADMIN, "q", {})
        assert isinstance(decision, Decision), decision
        for _ in range(3):
            await enqueue(service, "q")
        sink = FakeSink()
        reserve(service, sink)
        await sink.answer()
        decision, _ = service.purge_queue(OPERATOR, "q")
        assert isinstance(decision, Decision) and isinstance(decision.reply, PurgeResult)
        assert (decision.reply.purged, decision.reply.remaining) == (2, 0)
        outcome, _ = service.delete_queue(LOCAL_ADMIN, "q")
        assert isinstance(outcome, QueueInUse)


async def test_admin_operations_are_refused_while_stopping():
    async with running_service() as service:
        service.stop()
        for operation, call in CALLS.items():
            if operation in REQUIRE_ONLY:
                continue
            with pytest.raises(ShuttingDown):
                call(service, LOCAL_ADMIN)


async def test_schedules_through_the_service_put_list_pause_resume_delete():
    async with running_service() as service:
        put, barrier = service.put_schedule(
            LOCAL_ADMIN, "nightly", "q", "digest", cron="0 2 * * *", timezone="Europe/Berlin"
        )
        await service.durable(barrier)
        assert isinstance(put, Decision) and put.reply.created
        listed, _ = service.list_schedules(VIEWER)
        assert not isinstance(listed, CommandError)
        (info,) = listed
        assert (info.name, info.cron, info.timezone, info.paused) == (
            "nightly", "0 2 * * *", "Europe/Berlin", False
        )  # fmt: skip
        assert info.next_ms > 0
        assert service.pause_schedule(OPERATOR, "nightly")[0].reply.paused  # type: ignore[union-attr]
        assert not service.resume_schedule(OPERATOR, "nightly")[0].reply.paused  # type: ignore[union-attr]
        assert service.delete_schedule(LOCAL_ADMIN, "nightly")[0].reply.next_ms is None  # type: ignore[union-attr]
        assert service.list_schedules(VIEWER)[0] == ()


async def test_a_schedule_in_an_unknown_time_zone_is_refused_at_the_edge():
    async with running_service() as service:
        outcome, _ = service.put_schedule(
            LOCAL_ADMIN, "x", "q", "t", cron="* * * * *", timezone="Mars/Olympus"
        )
        assert isinstance(outcome, InvalidArgument)
