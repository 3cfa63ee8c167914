"""Admin operations in the core (issue 15): one test per row of the decision table
in sepp/core/decide.py ("Admin commands"), the reads of sepp/core/reads.py, replay
and snapshots of the new state (pause flags, status indexes)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from sepp.core import CoreConfig, QueuePolicy, State, apply_record, check_invariants
from sepp.core.commands import (
    ADMIN_IDS_PER_CALL_MAX,
    AdminDeadLetterJobs,
    AdminRequeueDeadLetters,
    CancelJobs,
    DeleteDeadLetters,
    DeleteQueue,
    PauseQueue,
    PurgeQueue,
    PutQueue,
    ResumeQueue,
)
from sepp.core.events import (
    CAUSE_ADMIN,
    CAUSE_ATTEMPTS_EXHAUSTED,
    AdminAction,
    DeadLetterDeleted,
    DeadLetterRequeued,
    JobCancelled,
    JobDeadLettered,
    QueueDefined,
    QueueDeleted,
    QueuePaused,
    QueueResumed,
)
from sepp.core.reads import JobPage, get_job, list_jobs, list_queues, queue_info
from sepp.core.results import (
    AdminOutcomes,
    DeleteQueueResult,
    InvalidArgument,
    InvalidCursor,
    PermissionDenied,
    PurgeResult,
    PutQueueResult,
    QueueAdminResult,
    QueueInUse,
    QueueNotFound,
    TooManyIds,
)
from sepp.core.snapshot import StateBuilder, export_dead, export_dedup, export_jobs, export_meta
from tests.core.helpers import NOW, Harness, make_job, new_id

KEPT = CoreConfig(dead_letter_retention_ms=3_600_000).with_queue("q")
WHO: dict[str, Any] = {"actor": "ann", "role": "operator"}


def harness() -> Harness:
    return Harness(KEPT)


def dead_letters(h: Harness, count: int, queue: str = "q") -> list[str]:
    ids = h.enqueue(*(make_job(queue=queue) for _ in range(count)), now=NOW)
    h.accept(AdminDeadLetterJobs(job_ids=tuple(ids), reason="setup", **WHO), NOW)
    return ids


def outcomes(reply: object) -> dict[str, str]:
    assert isinstance(reply, AdminOutcomes), reply
    return dict(reply.outcomes)


def snapshot_round_trip(state: State) -> State:
    body = [
        export_meta(state),
        list(export_jobs(state)),
        list(export_dedup(state)),
        list(export_dead(state)),
    ]
    meta, jobs, dedup, dead = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)
    builder = StateBuilder(state.config, meta)
    builder.add_jobs(jobs)
    builder.add_dedup(dedup)
    builder.add_dead(dead)
    rebuilt = builder.finish()
    check_invariants(rebuilt)
    return rebuilt


def replayed(h: Harness) -> State:
    state = State(h.config)
    for time_ms, events in h.records:
        apply_record(state, time_ms, events)
    check_invariants(state)
    return state


# ---------------------------------------------------------------------------
# Refusals (whole command, nothing logged)


@pytest.mark.parametrize(
    "who",
    [
        pytest.param({"actor": "", "role": "admin"}, id="an empty actor"),
        pytest.param({"actor": "a" * 257, "role": "admin"}, id="an actor over 256 bytes"),
        pytest.param({"actor": "ann", "role": "root"}, id="an unknown role"),
    ],
)
def test_an_admin_command_with_a_bad_actor_or_role_is_an_invalid_argument(
    who: dict[str, Any],
) -> None:
    h = harness()
    [jid] = h.enqueue(make_job(), now=NOW)
    assert isinstance(h.refuse(CancelJobs(job_ids=(jid,), **who), NOW), InvalidArgument)


def test_a_viewer_may_not_change_anything() -> None:
    h = harness()
    [jid] = h.enqueue(make_job(), now=NOW)
    refused = h.refuse(CancelJobs(job_ids=(jid,), actor="val", role="viewer"), NOW)
    assert isinstance(refused, PermissionDenied)
    assert isinstance(
        h.refuse(PauseQueue(queue="q", actor="val", role="viewer"), NOW), PermissionDenied
    )


def test_a_reason_over_max_reason_bytes_is_refused() -> None:
    h = harness()
    long = "x" * (KEPT.limits.max_reason_bytes + 1)
    assert isinstance(h.refuse(PauseQueue(queue="q", reason=long, **WHO), NOW), InvalidArgument)


def test_more_than_1000_ids_in_one_call_is_refused_with_too_many_ids() -> None:
    h = harness()
    ids = tuple(new_id() for _ in range(ADMIN_IDS_PER_CALL_MAX + 1))
    for command in (
        CancelJobs(job_ids=ids, **WHO),
        AdminDeadLetterJobs(job_ids=ids, **WHO),
        AdminRequeueDeadLetters(job_ids=ids, **WHO),
        DeleteDeadLetters(job_ids=ids, **WHO),
    ):
        refused = h.refuse(command, NOW)
        assert isinstance(refused, TooManyIds)
        assert (refused.limit, refused.actual) == (1000, 1001)


def test_exactly_1000_ids_are_accepted() -> None:
    h = harness()
    ids = tuple(new_id() for _ in range(ADMIN_IDS_PER_CALL_MAX))
    reply = h.accept(CancelJobs(job_ids=ids, **WHO), NOW)
    assert set(outcomes(reply).values()) == {"not_found"}


def test_dead_letter_ids_and_a_filter_together_are_refused() -> None:
    h = harness()
    [jid] = dead_letters(h, 1)
    command = DeleteDeadLetters(job_ids=(jid,), queue="q", **WHO)
    assert isinstance(h.refuse(command, NOW), InvalidArgument)


def test_dead_letters_without_ids_or_a_filter_are_refused() -> None:
    h = harness()
    dead_letters(h, 1)
    assert isinstance(h.refuse(AdminRequeueDeadLetters(**WHO), NOW), InvalidArgument)


@pytest.mark.parametrize("max_jobs", [0, 1001, True])
def test_a_chunk_size_outside_1_to_1000_is_refused(max_jobs: Any) -> None:
    h = harness()
    assert isinstance(
        h.refuse(DeleteDeadLetters(queue="q", max_jobs=max_jobs, **WHO), NOW), InvalidArgument
    )
    assert isinstance(
        h.refuse(PurgeQueue(queue="q", max_jobs=max_jobs, **WHO), NOW), InvalidArgument
    )


def test_an_unknown_cause_is_refused() -> None:
    h = harness()
    assert isinstance(h.refuse(DeleteDeadLetters(cause=99, **WHO), NOW), InvalidArgument)


@pytest.mark.parametrize("queue", ["", "a/b", ".."])
def test_a_bad_queue_name_is_refused(queue: str) -> None:
    h = harness()
    assert isinstance(h.refuse(PauseQueue(queue=queue, **WHO), NOW), InvalidArgument)
    assert isinstance(h.refuse(PurgeQueue(queue=queue, **WHO), NOW), InvalidArgument)


def test_pausing_an_undeclared_queue_under_strict_queues_is_queue_not_found() -> None:
    h = Harness(CoreConfig(strict_queues=True).with_queue("q"))
    refused = h.refuse(PauseQueue(queue="other", **WHO), NOW)
    assert isinstance(refused, QueueNotFound) and refused.queue == "other"


# ---------------------------------------------------------------------------
# Per-id outcomes


def test_dead_lettering_a_ready_and_a_scheduled_job_logs_cause_admin_with_the_header() -> None:
    h = harness()
    ready, scheduled = h.enqueue(make_job(), make_job(scheduled_at=NOW + 60_000), now=NOW)
    missing = new_id()
    reply = h.accept(
        AdminDeadLetterJobs(job_ids=(ready, scheduled, missing), reason="bad data", **WHO), NOW + 1
    )
    assert outcomes(reply) == {ready: "done", scheduled: "done", missing: "not_found"}
    header, *changes = h.records[-1][1]
    assert header == AdminAction(
        action="jobs.dead_letter",
        actor="ann",
        role="operator",
        reason="bad data",
        queue=None,
        job_ids=(ready, scheduled),
    )
    assert all(isinstance(e, JobDeadLettered) and e.cause == CAUSE_ADMIN for e in changes)
    assert h.status(ready) == h.status(scheduled) == "dead"


def test_an_in_flight_job_cannot_be_dead_lettered_or_cancelled_it_is_the_wrong_state() -> None:
    h = harness()
    [jid] = h.enqueue(make_job(), now=NOW)
    h.reserve("q", now=NOW)
    for command in (CancelJobs(job_ids=(jid,), **WHO), AdminDeadLetterJobs(job_ids=(jid,), **WHO)):
        decision = h.run(command, NOW)
        assert outcomes(decision.reply) == {jid: "wrong_state"}  # type: ignore[union-attr]
        assert decision.events == ()  # type: ignore[union-attr]
    assert h.status(jid) == "in_flight"


def test_cancelling_a_dead_letter_is_the_wrong_state_and_an_unknown_id_is_not_found() -> None:
    h = harness()
    [dead] = dead_letters(h, 1)
    unknown = new_id()
    reply = h.accept(CancelJobs(job_ids=(dead, unknown, "not-a-uuid"), **WHO), NOW)
    assert outcomes(reply) == {dead: "wrong_state", unknown: "not_found", "not-a-uuid": "not_found"}


def test_cancel_deletes_ready_and_scheduled_jobs_without_a_dead_letter() -> None:
    h = harness()
    ready, scheduled = h.enqueue(make_job(), make_job(scheduled_at=NOW + 60_000), now=NOW)
    reply = h.accept(CancelJobs(job_ids=(ready, scheduled, ready), reason="oops", **WHO), NOW)
    assert outcomes(reply) == {ready: "done", scheduled: "done"}
    header, *changes = h.records[-1][1]
    assert header.action == "jobs.cancel" and header.job_ids == (ready, scheduled)
    assert changes == [
        JobCancelled(job_id=ready, attempt=1),
        JobCancelled(job_id=scheduled, attempt=1),
    ]
    assert h.status(ready) == h.status(scheduled) == "gone"
    assert h.counts("q") == (0, 0, 0, 0)


def test_a_command_that_changes_nothing_logs_nothing() -> None:
    h = harness()
    decision = h.run(CancelJobs(job_ids=(new_id(),), **WHO), NOW)
    assert decision.events == ()  # type: ignore[union-attr]


def test_requeue_by_ids_puts_dead_letters_back_ready_at_attempt_1_with_the_same_id() -> None:
    h = harness()
    [jid] = h.enqueue(make_job(max_attempts=1), now=NOW)
    view = h.reserve_one("q", now=NOW)
    h.nack(view.job_id, 1, now=NOW, reason="boom")
    assert h.status(jid) == "dead"
    missing = new_id()
    decision = h.run(
        AdminRequeueDeadLetters(job_ids=(jid, missing), reason="fixed", **WHO), NOW + 5
    )
    assert outcomes(decision.reply) == {jid: "done", missing: "not_found"}  # type: ignore[union-attr]
    assert decision.woken == frozenset({"q"})  # type: ignore[union-attr]
    assert h.records[-1][1][1] == DeadLetterRequeued(job_id=jid, enqueued_at=NOW + 5)
    assert h.status(jid) == "ready" and h.job(jid).attempt == 1


def test_delete_by_ids_removes_dead_letters_and_reports_unknown_ones() -> None:
    h = harness()
    a, b = dead_letters(h, 2)
    missing = new_id()
    reply = h.accept(DeleteDeadLetters(job_ids=(a, missing), **WHO), NOW)
    assert outcomes(reply) == {a: "done", missing: "not_found"}
    assert h.records[-1][1][1:] == (DeadLetterDeleted(job_id=a),)
    assert h.status(a) == "gone" and h.status(b) == "dead"


def test_a_filtered_delete_works_in_chunks_and_reports_what_remains() -> None:
    h = harness()
    ids = dead_letters(h, 5)
    first = h.accept(DeleteDeadLetters(queue="q", max_jobs=2, **WHO), NOW)
    assert isinstance(first, AdminOutcomes)
    assert first.done == tuple(ids[:2]) and first.remaining == 3
    second = h.accept(DeleteDeadLetters(queue="q", max_jobs=1000, **WHO), NOW)
    assert isinstance(second, AdminOutcomes)
    assert second.done == tuple(ids[2:]) and second.remaining == 0
    assert h.counts("q") == (0, 0, 0, 0)


def test_a_filtered_requeue_by_cause_takes_only_that_cause() -> None:
    h = harness()
    [admin] = dead_letters(h, 1)
    [jid] = h.enqueue(make_job(max_attempts=1), now=NOW)
    h.reserve_one("q", now=NOW)
    h.nack(jid, 1, now=NOW)
    reply = h.accept(AdminRequeueDeadLetters(cause=CAUSE_ATTEMPTS_EXHAUSTED, **WHO), NOW)
    assert outcomes(reply) == {jid: "done"}
    assert h.status(jid) == "ready" and h.status(admin) == "dead"


# ---------------------------------------------------------------------------
# Pause, resume, purge


def test_a_paused_queue_accepts_enqueues_and_delivers_nothing_until_resumed() -> None:
    h = harness()
    reply = h.accept(PauseQueue(queue="q", reason="deploy", **WHO), NOW)
    assert reply == QueueAdminResult("q", True, True)
    assert h.records[-1][1][1] == QueuePaused(queue="q")
    [jid] = h.enqueue(make_job(), now=NOW)
    assert h.reserve("q", "other", now=NOW) == ()
    decision = h.run(ResumeQueue(queue="q", **WHO), NOW)
    assert decision.events[1] == QueueResumed(queue="q")  # type: ignore[union-attr]
    assert decision.woken == frozenset({"q"})  # type: ignore[union-attr]
    assert [v.job_id for v in h.reserve("q", now=NOW)] == [jid]


def test_a_paused_queue_is_skipped_for_the_next_one_in_a_reserve() -> None:
    h = harness()
    h.enqueue(make_job(queue="q"), now=NOW)
    [other] = h.enqueue(make_job(queue="r"), now=NOW)
    h.accept(PauseQueue(queue="q", **WHO), NOW)
    assert [v.job_id for v in h.reserve("q", "r", now=NOW, max_jobs=5)] == [other]


def test_pausing_a_paused_queue_or_resuming_a_running_one_changes_nothing() -> None:
    h = harness()
    h.accept(PauseQueue(queue="q", **WHO), NOW)
    again = h.run(PauseQueue(queue="q", **WHO), NOW)
    assert again.reply == QueueAdminResult("q", True, False)  # type: ignore[union-attr]
    assert again.events == ()  # type: ignore[union-attr]
    running = h.run(ResumeQueue(queue="idle", **WHO), NOW)
    assert running.reply == QueueAdminResult("idle", False, False)  # type: ignore[union-attr]


def test_an_undeclared_paused_queue_is_kept_while_empty() -> None:
    h = harness()
    h.accept(PauseQueue(queue="temp", **WHO), NOW)
    assert "temp" in h.state.queues
    h.accept(ResumeQueue(queue="temp", **WHO), NOW)
    assert "temp" not in h.state.queues


def test_purge_deletes_ready_and_scheduled_jobs_in_chunks_and_leaves_in_flight_ones() -> None:
    h = harness()
    ids = h.enqueue(*(make_job() for _ in range(4)), make_job(scheduled_at=NOW + 9_000), now=NOW)
    flying = h.reserve_one("q", now=NOW).job_id
    first = h.accept(PurgeQueue(queue="q", max_jobs=2, reason="reset", **WHO), NOW)
    assert first == PurgeResult("q", 2, 2)
    header = h.records[-1][1][0]
    assert header.action == "queue.purge" and header.queue == "q" and len(header.job_ids) == 2
    second = h.accept(PurgeQueue(queue="q", **WHO), NOW)
    assert second == PurgeResult("q", 2, 0)
    assert h.counts("q") == (0, 0, 1, 0)
    assert h.status(flying) == "in_flight"
    assert all(h.status(j) == "gone" for j in ids if j != flying)


def test_purging_an_unknown_queue_purges_nothing() -> None:
    h = harness()
    assert h.accept(PurgeQueue(queue="nope", **WHO), NOW) == PurgeResult("nope", 0, 0)


# ---------------------------------------------------------------------------
# Reads


def test_get_job_shows_a_job_in_each_state() -> None:
    h = harness()
    ready, scheduled, flying, dead = h.enqueue(
        make_job(custom={"tenant": "acme"}, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"),
        make_job(scheduled_at=NOW + 60_000),
        make_job(priority=9),
        make_job(),
        now=NOW,
    )
    assert h.reserve_one("q", now=NOW, lease_ms=30_000).job_id == flying
    h.accept(AdminDeadLetterJobs(job_ids=(dead,), reason="bad", **WHO), NOW + 3)
    info = get_job(h.state, ready)
    assert info is not None and info.state == "ready" and info.custom == {"tenant": "acme"}
    assert info.traceparent is not None
    info = get_job(h.state, scheduled)
    assert info is not None and info.state == "scheduled" and info.run_at == NOW + 60_000
    info = get_job(h.state, flying)
    assert info is not None and info.state == "inflight" and info.lease_expires_at == NOW + 30_000
    info = get_job(h.state, dead)
    assert info is not None and info.state == "dead_letter"
    assert (info.dead_letter_cause, info.failed_at, info.last_reason) == ("admin", NOW + 3, "bad")
    assert get_job(h.state, new_id()) is None


def page_ids(page: object) -> list[str]:
    assert isinstance(page, JobPage), page
    return [j.job_id for j in page.jobs]


def test_list_jobs_pages_with_a_cursor_that_stays_valid_while_the_queue_changes() -> None:
    h = harness()
    ids = h.enqueue(*(make_job() for _ in range(10)), now=NOW)
    first = list_jobs(h.state, "q", "ready", limit=4)
    assert page_ids(first) == ids[:4]
    # Between pages: the listed ones and one not yet listed leave, new ones arrive.
    h.accept(CancelJobs(job_ids=(ids[0], ids[5]), **WHO), NOW)
    later = h.enqueue(make_job(), now=NOW)
    assert isinstance(first, JobPage) and first.next_cursor is not None
    second = list_jobs(h.state, "q", "ready", cursor=first.next_cursor, limit=4)
    assert page_ids(second) == [ids[4], ids[6], ids[7], ids[8]]
    assert isinstance(second, JobPage) and second.next_cursor is not None
    third = list_jobs(h.state, "q", "ready", cursor=second.next_cursor, limit=4)
    assert page_ids(third) == [ids[9], *later]
    assert isinstance(third, JobPage) and third.next_cursor is None


def test_list_jobs_lists_each_state_and_dead_letters_by_cause_without_consuming_them() -> None:
    h = harness()
    ready, flying, scheduled = h.enqueue(
        make_job(), make_job(priority=9), make_job(scheduled_at=NOW + 5_000), now=NOW
    )
    h.reserve_one("q", now=NOW)
    [dead] = dead_letters(h, 1)
    assert page_ids(list_jobs(h.state, "q", "ready")) == [ready]
    assert page_ids(list_jobs(h.state, "q", "scheduled")) == [scheduled]
    assert page_ids(list_jobs(h.state, "q", "inflight")) == [flying]
    assert page_ids(list_jobs(h.state, "q", "dead_letter", cause="admin")) == [dead]
    assert page_ids(list_jobs(h.state, "q", "dead_letter", cause="rejected")) == []
    assert h.status(dead) == "dead"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param({"job_state": "done"}, InvalidArgument, id="an unknown state"),
        pytest.param({"job_state": "ready", "limit": 0}, InvalidArgument, id="a limit of 0"),
        pytest.param({"job_state": "ready", "limit": 1001}, InvalidArgument, id="a limit over 1000"),
        pytest.param({"job_state": "ready", "cause": "admin"}, InvalidArgument, id="a cause on live jobs"),
        pytest.param({"job_state": "ready", "cursor": "zz"}, InvalidCursor, id="a cursor not ours"),
        pytest.param({"job_state": "ready", "queue": "nope"}, QueueNotFound, id="an unknown queue"),
    ],
)  # fmt: skip
def test_list_jobs_refusals(args: dict[str, Any], error: type) -> None:
    h = harness()
    h.enqueue(make_job(), now=NOW)
    args = {"queue": "q", **args}
    assert isinstance(list_jobs(h.state, **args), error)


def test_a_cursor_from_before_a_restart_is_refused() -> None:
    h = harness()
    h.enqueue(*(make_job() for _ in range(3)), now=NOW)
    page = list_jobs(h.state, "q", "ready", limit=1)
    assert isinstance(page, JobPage) and page.next_cursor is not None
    restarted = snapshot_round_trip(h.state)
    assert isinstance(list_jobs(restarted, "q", "ready", cursor=page.next_cursor), InvalidCursor)


def test_list_queues_shows_counts_pause_and_effective_settings() -> None:
    h = Harness(CoreConfig(dead_letter_retention_ms=60_000).with_queue("q", default_priority=4))
    h.enqueue(make_job(queue="q"), make_job(queue="r"), now=NOW)
    h.accept(PauseQueue(queue="r", **WHO), NOW)
    by_name = {info.name: info for info in list_queues(h.state)}
    assert by_name["q"].declared and not by_name["q"].paused and by_name["q"].ready == 1
    assert by_name["q"].policy.default_priority == 4
    assert by_name["r"].paused and not by_name["r"].declared
    assert queue_info(h.state, "nope") is None


# ---------------------------------------------------------------------------
# Replay and snapshots


def _admin_history(rng: random.Random) -> Harness:
    h = harness()
    ids = h.enqueue(*(make_job(queue=rng.choice("qr")) for _ in range(30)), now=NOW)
    h.reserve("q", "r", now=NOW, max_jobs=3)
    h.accept(AdminDeadLetterJobs(job_ids=tuple(rng.sample(ids, 8)), **WHO), NOW + 1)
    h.accept(CancelJobs(job_ids=tuple(rng.sample(ids, 5)), **WHO), NOW + 2)
    h.accept(AdminRequeueDeadLetters(queue="q", max_jobs=2, **WHO), NOW + 3)
    h.accept(DeleteDeadLetters(queue="r", max_jobs=1, **WHO), NOW + 4)
    h.accept(PauseQueue(queue="r", **WHO), NOW + 5)
    h.accept(PauseQueue(queue="empty", **WHO), NOW + 5)
    h.accept(PurgeQueue(queue="q", max_jobs=3, **WHO), NOW + 6)
    return h


def test_replaying_admin_records_rebuilds_the_live_state(rng: random.Random) -> None:
    h = _admin_history(rng)
    state = replayed(h)
    assert state.canonical() == h.state.canonical()
    for queue in ("q", "r"):
        for job_state in ("ready", "scheduled", "inflight", "dead_letter"):
            assert page_ids(list_jobs(state, queue, job_state)) == page_ids(
                list_jobs(h.state, queue, job_state)
            )


def test_a_snapshot_carries_paused_queues_and_rebuilds_the_indexes(rng: random.Random) -> None:
    h = _admin_history(rng)
    rebuilt = snapshot_round_trip(h.state)
    assert rebuilt.canonical() == h.state.canonical()
    assert rebuilt.queues["r"].paused and rebuilt.queues["empty"].paused
    for queue in ("q", "r"):
        for job_state in ("ready", "scheduled", "inflight", "dead_letter"):
            assert sorted(page_ids(list_jobs(rebuilt, queue, job_state, limit=1000))) == sorted(
                page_ids(list_jobs(h.state, queue, job_state, limit=1000))
            )


def test_a_snapshot_without_a_paused_key_loads_with_no_queue_paused() -> None:
    h = harness()
    h.enqueue(make_job(), now=NOW)
    meta = export_meta(h.state)
    del meta["paused"]
    builder = StateBuilder(KEPT, meta)
    builder.add_jobs(list(export_jobs(h.state)))
    state = builder.finish()
    assert not any(q.paused for q in state.queues.values())


# ---------------------------------------------------------------------------
# Queue create / update / delete at runtime


def test_put_creates_a_queue_whose_overrides_win_over_the_file_key_by_key() -> None:
    h = Harness(
        CoreConfig(defaults=QueuePolicy(default_max_attempts=5)).with_queue("q", default_priority=2)
    )
    reply = h.accept(PutQueue(queue="q", overrides={"default_max_attempts": 2}, **WHO), NOW)
    assert isinstance(reply, PutQueueResult) and reply.created and reply.changed
    assert h.records[-1][1][1] == QueueDefined(queue="q", overrides={"default_max_attempts": 2})
    [jid] = h.enqueue(make_job(), now=NOW)
    # The runtime key wins; the file's queue entry still rules the others.
    assert (h.job(jid).max_attempts, h.job(jid).priority) == (2, 2)
    info = queue_info(h.state, "q")
    assert info is not None and info.overrides == {"default_max_attempts": 2}


def test_a_queue_created_at_runtime_is_declared_kept_while_empty_and_allowed_under_strict() -> None:
    h = Harness(CoreConfig(strict_queues=True).with_queue("q"))
    h.accept(PutQueue(queue="new", overrides={"default_priority": 9}, **WHO), NOW)
    assert "new" in h.state.queues and "new" in h.state.config.queues
    [jid] = h.enqueue(make_job(queue="new"), now=NOW)
    assert h.job(jid).priority == 9
    assert [v.job_id for v in h.reserve("new", now=NOW)] == [jid]


def test_putting_the_same_overrides_again_changes_nothing() -> None:
    h = harness()
    h.accept(PutQueue(queue="x", overrides={"default_priority": 1}, **WHO), NOW)
    again = h.run(PutQueue(queue="x", overrides={"default_priority": 1}, **WHO), NOW)
    assert again.events == ()  # type: ignore[union-attr]
    assert again.reply.changed is False  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"dedup_window_ms": 5}, id="a restart-only setting"),
        pytest.param({"nope": 1}, id="an unknown setting"),
        pytest.param({"default_priority": "high"}, id="a value of the wrong type"),
        pytest.param({"default_priority": True}, id="a bool for an integer"),
        pytest.param({"default_priority": 12}, id="a value the config rules refuse"),
        pytest.param({"default_max_attempts": 50, "max_attempts_ceiling": 10}, id="two that contradict"),
    ],
)  # fmt: skip
def test_put_refuses_bad_overrides(overrides: dict[str, Any]) -> None:
    h = harness()
    assert isinstance(
        h.refuse(PutQueue(queue="x", overrides=overrides, **WHO), NOW), InvalidArgument
    )


def test_delete_removes_the_runtime_definition_and_the_file_rules_again() -> None:
    h = Harness(CoreConfig().with_queue("q", default_priority=3))
    h.accept(PutQueue(queue="q", overrides={"default_priority": 8}, **WHO), NOW)
    [kept] = h.enqueue(make_job(), now=NOW)
    reply = h.accept(DeleteQueue(queue="q", **WHO), NOW)
    assert reply == DeleteQueueResult("q", 0, True)
    assert h.status(kept) == "ready"  # a queue the file declares keeps its jobs
    [later] = h.enqueue(make_job(), now=NOW)
    assert (h.job(kept).priority, h.job(later).priority) == (8, 3)


def test_deleting_a_runtime_only_queue_cancels_its_jobs_and_forgets_it() -> None:
    h = harness()
    h.accept(PutQueue(queue="tmp", **WHO), NOW)
    ids = h.enqueue(make_job(queue="tmp"), make_job(queue="tmp", scheduled_at=NOW + 9_000), now=NOW)
    reply = h.accept(DeleteQueue(queue="tmp", reason="done", **WHO), NOW)
    assert reply == DeleteQueueResult("tmp", 2, False)
    header = h.records[-1][1][0]
    assert header.action == "queue.delete" and sorted(header.job_ids) == sorted(ids)
    assert h.records[-1][1][-1] == QueueDeleted(queue="tmp")
    assert "tmp" not in h.state.queues


def test_delete_is_refused_while_jobs_are_in_flight() -> None:
    h = harness()
    h.accept(PutQueue(queue="tmp", **WHO), NOW)
    h.enqueue(make_job(queue="tmp"), now=NOW)
    h.reserve("tmp", now=NOW)
    refused = h.refuse(DeleteQueue(queue="tmp", **WHO), NOW)
    assert isinstance(refused, QueueInUse) and refused.queue == "tmp"


def test_delete_of_a_queue_too_big_for_one_command_asks_for_a_purge_first() -> None:
    h = harness()
    h.accept(PutQueue(queue="tmp", **WHO), NOW)
    for _ in range(11):
        h.enqueue(*(make_job(queue="tmp") for _ in range(100)), now=NOW)
    assert isinstance(h.refuse(DeleteQueue(queue="tmp", **WHO), NOW), QueueInUse)


def test_delete_of_a_queue_not_defined_at_runtime_is_queue_not_found() -> None:
    h = harness()
    refused = h.refuse(DeleteQueue(queue="q", **WHO), NOW)
    assert isinstance(refused, QueueNotFound) and "configuration file" in refused.message


def test_runtime_queues_survive_a_snapshot_and_a_replay() -> None:
    h = Harness(CoreConfig().with_queue("q"))
    h.accept(PutQueue(queue="q", overrides={"default_priority": 6}, **WHO), NOW)
    h.accept(PutQueue(queue="empty", overrides={"max_lease_duration_ms": 500}, **WHO), NOW)
    for state in (snapshot_round_trip(h.state), replayed(h)):
        assert state.canonical() == h.state.canonical()
        assert state.config.policy("q").default_priority == 6
        assert state.config.policy("empty").max_lease_duration_ms == 500
        assert "empty" in state.queues
