"""`sepp-log audit --admin` (issue 15): the operators' actions, from the AdminAction
headers the core logs -- who (actor, role), what, why, which queue and ids -- and
the admin events in a job's history; `sepp-log verify` accepts the new events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sepp.core import Enqueue, Reserve
from sepp.core.commands import (
    AdminDeadLetterJobs,
    CancelJobs,
    DeleteDeadLetters,
    DeleteQueue,
    PauseQueue,
    PurgeQueue,
    PutQueue,
    ResumeQueue,
)
from tests.storage.helpers import numbered_id
from tests.tools.helpers import T0, LiveLog, job
from tests.tools.test_cli import run_main
from tools.audit import admin_actions, audit_jobs
from tools.datadir import open_data_dir
from tools.events import event_name

ANN = {"actor": "ann", "role": "operator"}
ROOT = {"actor": "root-key", "role": "admin"}


@pytest.fixture
def admin_log(tmp_path: Path) -> LiveLog:
    live = LiveLog.open(tmp_path / "data")
    live.run(Enqueue(jobs=tuple(job(n) for n in range(1, 7))), T0)
    live.run(Reserve(queues=("emails",), lease_ms=30_000), T0 + 1)
    live.run(
        AdminDeadLetterJobs(job_ids=(numbered_id(2), numbered_id(3)), reason="bad data", **ANN),
        T0 + 2,
    )
    live.run(CancelJobs(job_ids=(numbered_id(4),), **ROOT), T0 + 3)
    live.run(PauseQueue(queue="emails", reason="deploy", **ANN), T0 + 4)
    live.run(ResumeQueue(queue="emails", **ANN), T0 + 5)
    live.run(DeleteDeadLetters(job_ids=(numbered_id(3),), **ROOT), T0 + 6)
    live.run(PurgeQueue(queue="emails", reason="reset", **ROOT), T0 + 7)
    live.run(PutQueue(queue="bulk", overrides={"default_priority": 1}, **ROOT), T0 + 8)
    live.run(DeleteQueue(queue="bulk", reason="gone", **ROOT), T0 + 9)
    live.close()
    return live


def test_admin_actions_lists_each_action_with_actor_role_reason_and_ids(admin_log: LiveLog) -> None:
    result = admin_actions(open_data_dir(str(admin_log.data_dir)))
    assert result.problems == []
    rows = [(e.action, e.actor, e.role, e.reason, e.queue, e.job_ids) for e in result.entries]
    assert rows == [
        ("jobs.dead_letter", "ann", "operator", "bad data", None, (numbered_id(2), numbered_id(3))),
        ("jobs.cancel", "root-key", "admin", None, None, (numbered_id(4),)),
        ("queue.pause", "ann", "operator", "deploy", "emails", ()),
        ("queue.resume", "ann", "operator", None, "emails", ()),
        ("dead_letters.delete", "root-key", "admin", None, None, (numbered_id(3),)),
        ("queue.purge", "root-key", "admin", "reset", "emails", (numbered_id(5), numbered_id(6))),
        ("queue.put", "root-key", "admin", None, "bulk", ()),
        ("queue.delete", "root-key", "admin", "gone", "bulk", ()),
    ]
    assert result.entries[0].changes == {"JobDeadLettered": 2}
    assert result.entries[5].changes == {"JobCancelled": 2}
    assert result.entries[-1].changes == {"QueueDeleted": 1}


def test_admin_actions_filter_by_actor_action_prefix_and_time(admin_log: LiveLog) -> None:
    data_dir = open_data_dir(str(admin_log.data_dir))
    assert [e.action for e in admin_actions(data_dir, actor="ann").entries] == [
        "jobs.dead_letter",
        "queue.pause",
        "queue.resume",
    ]
    assert [e.action for e in admin_actions(data_dir, action_prefix="queue.").entries] == [
        "queue.pause",
        "queue.resume",
        "queue.purge",
        "queue.put",
        "queue.delete",
    ]
    assert [
        e.action for e in admin_actions(data_dir, since_ms=T0 + 6, until_ms=T0 + 6).entries
    ] == ["dead_letters.delete"]


def test_a_jobs_history_shows_the_admin_action_that_ended_it(admin_log: LiveLog) -> None:
    jid = numbered_id(4)
    result = audit_jobs(open_data_dir(str(admin_log.data_dir)), job_id=jid)
    steps = [event_name(e.event) for e in result.histories[jid].entries]
    assert steps == ["JobEnqueued", "AdminAction", "JobCancelled"]
    assert "actor=root-key role=admin" in result.histories[jid].entries[1].human()
    assert result.histories[jid].state["status"] == "gone"


def test_sepp_log_audit_admin_prints_json_lines_and_verify_accepts_the_log(
    admin_log: LiveLog, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(
        ["audit", str(admin_log.data_dir), "--admin", "--actor", "ann", "--json"], capsys
    )
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    actions = [line for line in lines if line.get("action")]
    assert [(a["action"], a["actor"], a["role"]) for a in actions] == [
        ("jobs.dead_letter", "ann", "operator"),
        ("queue.pause", "ann", "operator"),
        ("queue.resume", "ann", "operator"),
    ]
    assert actions[0]["reason"] == "bad data" and actions[0]["job_ids"] == [
        numbered_id(2),
        numbered_id(3),
    ]
    code, out, err = run_main(["verify", str(admin_log.data_dir)], capsys)
    assert code == 0, out + err


def test_actor_without_admin_is_a_usage_error(
    admin_log: LiveLog, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run_main(
        ["audit", str(admin_log.data_dir), numbered_id(1), "--actor", "ann"], capsys
    )
    assert code != 0


@pytest.mark.parametrize("snapshot", [False, True], ids=["from the log", "from a snapshot"])
def test_admin_changes_survive_a_restart(tmp_path: Path, snapshot: bool) -> None:
    live = LiveLog.open(tmp_path / "data")
    live.run(Enqueue(jobs=tuple(job(n) for n in range(1, 4))), T0)
    live.run(PauseQueue(queue="emails", **ANN), T0 + 1)
    live.run(PutQueue(queue="bulk", overrides={"default_priority": 7}, **ROOT), T0 + 2)
    live.run(AdminDeadLetterJobs(job_ids=(numbered_id(1),), reason="bad", **ANN), T0 + 3)
    live.run(CancelJobs(job_ids=(numbered_id(2),), **ANN), T0 + 4)
    if snapshot:
        live.engine.snapshot_now()
    before = live.engine.state.canonical()
    live.close()

    again = LiveLog.open(tmp_path / "data")
    state = again.engine.state
    assert state.canonical() == before
    assert state.queues["emails"].paused
    assert state.config.policy("bulk").default_priority == 7
    assert numbered_id(1) in state.dead and numbered_id(2) not in state.jobs
    # Still paused after the restart: a reserve gets nothing until resumed.
    reserved = again.engine.execute(Reserve(queues=("emails",), lease_ms=1_000), T0 + 5)[0]
    assert reserved.reply.jobs == ()  # type: ignore[union-attr]
    again.run(ResumeQueue(queue="emails", **ANN), T0 + 6)
    reserved = again.engine.execute(Reserve(queues=("emails",), lease_ms=1_000), T0 + 7)[0]
    assert [v.job_id for v in reserved.reply.jobs] == [numbered_id(3)]  # type: ignore[union-attr]
    again.close()
