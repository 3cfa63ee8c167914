"""`sepp-log audit`: the whole history of a job -- every event with its time,
attempt, lease deadline, worker, nack reason and dead-letter cause, in order -- and
its current state, by job id or by idempotency key; and the transitions of a queue
over a period.

Histories are checked on the scripted log (tests/tools/helpers.py), whose every
record is known.
"""

from __future__ import annotations

from pathlib import Path

from sepp.core import Release, Reserve
from tests.storage.helpers import numbered_id
from tests.tools.helpers import T0, LiveLog, scripted_log, segment_paths
from tools.audit import AuditResult, audit_jobs, queue_transitions
from tools.datadir import open_data_dir
from tools.events import event_name


def _audit(
    data_dir: Path, job: str | None = None, key: tuple[str, str] | None = None
) -> AuditResult:
    return audit_jobs(open_data_dir(str(data_dir)), job_id=job, key=key)


def _steps(result: AuditResult, job: str) -> list[tuple[int, str, int | None]]:
    return [(e.seq, event_name(e.event), e.attempt) for e in result.histories[job].entries]


def test_history_of_a_job_that_failed_twice_and_was_drained(scripted: LiveLog) -> None:
    job = numbered_id(2)
    result = _audit(scripted.data_dir, job)
    assert result.problems == []
    assert _steps(result, job) == [
        (3, "JobEnqueued", 1),
        (27, "JobReserved", 1),
        (28, "JobNacked", 1),
        (29, "JobPromoted", 2),
        (30, "JobReserved", 2),
        (31, "JobLeaseExtended", 2),
        (32, "JobDeadLettered", 2),
        (37, "DeadLetterDrained", 2),
    ]
    entries = result.histories[job].entries
    assert entries[1].human() == (
        "      27  2023-11-14T22:13:47.000Z  JobReserved              1  "
        "lease_expires_at=2023-11-14T22:14:17.000Z worker_id=w2"
    )
    assert entries[2].human() == (
        "      28  2023-11-14T22:13:48.000Z  JobNacked                1  "
        'run_at=2023-11-14T22:13:48.157Z reason="smtp down" worker_id=w2'
    )
    assert entries[6].human() == (
        "      32  2023-11-14T22:13:52.000Z  JobDeadLettered          2  "
        "cause=attempts_exhausted failed_at=2023-11-14T22:13:52.000Z "
        'reason="smtp down again" retained=true'
    )
    assert result.histories[job].complete
    assert result.histories[job].state == {
        "status": "gone",
        "note": "dead letter drained (handed to a caller and deleted)",
    }


def test_current_state_of_a_ready_job_after_its_lease_expired(scripted: LiveLog) -> None:
    job = numbered_id(6)
    result = _audit(scripted.data_dir, job)
    assert _steps(result, job) == [
        (7, "JobEnqueued", 1),
        (38, "JobReserved", 1),
        (39, "JobLeaseExpired", 1),
    ]
    assert result.histories[job].state == {
        "status": "ready",
        "queue": "emails",
        "attempt": 2,
        "max_attempts": 2,
        "priority": 0,
    }


def test_current_state_of_a_dead_letter(scripted: LiveLog) -> None:
    job = numbered_id(3)
    result = _audit(scripted.data_dir, job)
    assert _steps(result, job)[-1] == (40, "JobDeadLettered", 1)
    assert result.histories[job].state == {
        "status": "dead",
        "queue": "reports",
        "cause": "rejected",
        "failed_at": "2023-11-14T22:14:05.000Z",
        "final_attempt": 1,
        "last_reason": "bad input",
    }


def test_current_state_of_an_in_flight_job(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    live.run(Reserve(queues=("reports",), lease_ms=30_000, worker_id="w9"), T0 + 50_000)
    live.close()
    job = numbered_id(5)
    result = _audit(live.data_dir, job)
    assert result.histories[job].state == {
        "status": "in_flight",
        "queue": "reports",
        "attempt": 1,
        "max_attempts": 2,
        "priority": 0,
        "lease_expires_at": "2023-11-14T22:14:40.000Z",  # T0 + 50 s + 30 s
        "worker_id": "w9",
    }


def test_ends_of_jobs_that_are_gone(scripted: LiveLog) -> None:
    acked = _audit(scripted.data_dir, numbered_id(0)).histories[numbered_id(0)]
    assert acked.state == {"status": "gone", "note": "acked: completed and deleted"}
    expired = _audit(scripted.data_dir, numbered_id(4)).histories[numbered_id(4)]
    assert [e.seq for e in expired.entries] == [5, 36, 39]
    assert expired.state == {
        "status": "gone",
        "note": "dead letter expired (outlived the retention and deleted)",
    }


def test_audit_by_idempotency_key_follows_the_job_and_its_dedup_record(scripted: LiveLog) -> None:
    result = _audit(scripted.data_dir, key=("emails", "welcome-24"))
    job = numbered_id(24)
    assert list(result.histories) == [job]
    assert _steps(result, job) == [(35, "JobEnqueued", 1), (39, "DedupExpired", 1)]
    assert _audit(scripted.data_dir, key=("reports", "welcome-24")).histories == {}


def test_unknown_job_has_no_history(scripted: LiveLog) -> None:
    job = numbered_id(777)
    result = _audit(scripted.data_dir, job)
    assert result.histories[job].entries == []
    assert result.histories[job].state == {
        "status": "unknown",
        "note": "no event of this job is in the log",
    }


def test_job_enqueued_before_the_start_of_the_log_has_an_incomplete_history(
    tmp_path: Path,
) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(24,))
    live.close()
    for path in segment_paths(live.data_dir)[:2]:
        path.unlink()
    job = numbered_id(2)
    result = _audit(live.data_dir, job)
    history = result.histories[job]
    assert (result.log_first_seq, history.complete) == (25, False)
    assert [e.seq for e in history.entries] == [27, 28, 29, 30, 31, 32, 37]
    # Its attempt is known from the first event that names one.
    assert [e.attempt for e in history.entries] == [1, 1, 2, 2, 2, 2, 2]


def test_queue_transitions_over_a_period(scripted: LiveLog) -> None:
    data_dir = open_data_dir(str(scripted.data_dir))
    reports = queue_transitions(data_dir, "reports", since_ms=T0 + 30_000, until_ms=T0 + 40_000)
    assert dict(reports.counts) == {"JobReserved": 2, "JobAcked": 1}
    assert (reports.first_seq, reports.last_seq, reports.records, len(reports.jobs)) == (
        33,
        34,
        2,
        2,
    )
    late = queue_transitions(data_dir, "reports", since_ms=T0 + 40_000)
    assert dict(late.counts) == {"JobDeadLettered": 1}
    assert dict(late.causes) == {"rejected": 1}
    emails = queue_transitions(data_dir, "emails", since_ms=T0 + 40_000)
    assert dict(emails.counts) == {
        "JobLeaseExpired": 1,
        "DedupExpired": 1,
        "DeadLetterExpired": 1,
    }
    assert (emails.first_seq, emails.last_seq, len(emails.jobs)) == (39, 39, 2)
    everything = queue_transitions(data_dir, "emails", since_ms=0)
    assert everything.counts["JobEnqueued"] == 13
    assert everything.problems == []


def test_a_released_attempt_shows_in_the_history_and_the_next_delivery_reuses_it(
    tmp_path: Path,
) -> None:
    live = scripted_log(tmp_path / "data")
    job = numbered_id(5)
    live.run(Reserve(queues=("reports",), lease_ms=30_000, worker_id="w9"), T0 + 50_000)
    released = live.run(Release(job_id=job, attempt=1, worker_id="w9"), T0 + 50_001)
    live.run(Reserve(queues=("reports",), lease_ms=30_000, worker_id="w7"), T0 + 50_002)
    live.close()
    result = _audit(live.data_dir, job)
    steps = _steps(result, job)
    assert [name for _, name, _ in steps][-3:] == ["JobReserved", "JobReleased", "JobReserved"]
    # The release hands attempt 1 back; the next delivery is attempt 1 again.
    assert [attempt for _, _, attempt in steps][-3:] == [1, 1, 1]
    entry = result.histories[job].entries[-2]
    assert entry.data(job)["command"] == "release"
    assert entry.human().endswith("JobReleased              1  worker_id=w9")
    assert released.time_ms == T0 + 50_001
    assert result.histories[job].state["attempt"] == 1
    assert result.histories[job].state["worker_id"] == "w7"
