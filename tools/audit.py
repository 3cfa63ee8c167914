"""`sepp-log audit DATA_DIR JOB_ID | --key QUEUE KEY | --queue Q --since T`: the
history of one job, or the transitions of a queue over a period.

Owns: `audit_jobs` (every event of the jobs asked for, in log order, with the
attempt each concerns, and each job's current state), `JobHistory`, `JobEntry`,
`queue_transitions` and `QueueTransitions`.

Promises:
- The current state is the replayed state's own view of the job (the storage
  layer's `replay_record` from the newest usable snapshot, as recovery does), not a
  reinterpretation of its events; for a job no longer in the state, the event that
  removed it says how it ended (acked, drained, expired, dropped).
- The log is read once. Records before the replay start are only searched for the
  job's id (a substring test on the record bytes, at memory speed) and decoded when
  it occurs; `--key` finds the jobs enqueued under that idempotency key in that
  queue (several, if the key was reused after its dedup window) and follows each.
- A job enqueued before the start of the log (retention removed the head) is
  shown from its first event still in the log, and the report says its earlier
  history is gone.
- Queue summaries count, per event type, the events of the queue's jobs whose
  record time falls in [since, until]; dead letters are split by cause.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from log_format import COMMAND_KIND_NAMES, Envelope, FormatError, Record, decode_envelope
from sepp.core.state import STATUS_NAMES, State
from sepp.storage.audit import AdminRecord, admin_record
from sepp.storage.replay import ReplayError, replay_record

from .datadir import ERROR, DataDir, Problem
from .events import (
    DEAD_LETTER_CAUSES,
    JobQueues,
    event_fields,
    event_name,
    human_fields,
    job_id_of,
    json_fields,
)
from .output import Emitter, format_time_ms
from .segments import CHUNK_BYTES, LogWalker, SegmentStart
from .states import as_fallback, choose_base, paused_gc

__all__ = [
    "AdminActions",
    "AdminEntry",
    "AuditResult",
    "JobEntry",
    "JobHistory",
    "QueueTransitions",
    "admin_actions",
    "audit_jobs",
    "emit_admin",
    "emit_histories",
    "emit_transitions",
    "queue_transitions",
]

_ENQUEUED, _NACKED, _LEASE_EXPIRED, _DEAD_LETTERED, _DEDUP_EXPIRED, _REQUEUED = 1, 4, 6, 8, 11, 12
_ADMIN_ACTION = 14
_ENDINGS = {
    3: "acked: completed and deleted",
    15: "cancelled by an operator (deleted; see the admin action before it)",
    16: "dead letter deleted by an operator (see the admin action before it)",
    9: "dead letter drained (handed to a caller and deleted)",
    10: "dead letter expired (outlived the retention and deleted)",
}


@dataclass(frozen=True, slots=True)
class JobEntry:
    """One event of a job's history."""

    seq: int
    time_ms: int
    command_kind: int
    attempt: int | None
    event: list[Any]

    def human(self) -> str:
        details = " ".join(
            part
            for part in human_fields(self.event).split(" ")
            if not part.startswith(("job_id=", "attempt="))
        )
        attempt = str(self.attempt) if self.attempt is not None else "-"
        line = f"{self.seq:>8}  {format_time_ms(self.time_ms)}  {event_name(self.event):<18} {attempt:>7}  {details}"
        return line.rstrip()

    def data(self, job_id: str) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "seq": self.seq,
            "time": format_time_ms(self.time_ms),
            "time_ms": self.time_ms,
            "command": COMMAND_KIND_NAMES.get(self.command_kind, self.command_kind),
            "event": event_name(self.event),
            "attempt": self.attempt,
            "fields": json_fields(self.event),
        }


@dataclass
class JobHistory:
    job_id: str
    entries: list[JobEntry] = field(default_factory=list)
    # The attempt the next delivery carries, as the events tell it.
    next_attempt: int | None = None
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether the history starts with the job's enqueue."""
        return bool(self.entries) and self.entries[0].event[0] == _ENQUEUED

    def add(self, seq: int, time_ms: int, command_kind: int, event: list[Any]) -> None:
        fields = event_fields(event)
        type_id = event[0]
        attempt = fields.get("attempt")
        if type_id in (_ENQUEUED, _REQUEUED):
            attempt, self.next_attempt = 1, 1
        elif type_id in (_NACKED, _LEASE_EXPIRED) and isinstance(attempt, int):
            self.next_attempt = attempt + 1
        elif isinstance(attempt, int):
            self.next_attempt = attempt
        else:
            attempt = self.next_attempt
        self.entries.append(JobEntry(seq, time_ms, command_kind, attempt, event))


def _describe(state: State | None, history: JobHistory) -> dict[str, Any]:
    """The job's current state, from the replayed state when it holds the job."""
    job_id = history.job_id
    if state is not None:
        job = state.jobs.get(job_id)
        if job is not None:
            out: dict[str, Any] = {
                "status": STATUS_NAMES[job.status],
                "queue": job.queue,
                "attempt": job.attempt,
                "max_attempts": job.max_attempts,
                "priority": job.priority,
            }
            if job.status == 1:  # scheduled
                out["run_at"] = format_time_ms(job.due_ms)
            if job.status == 2:  # in flight
                out["lease_expires_at"] = format_time_ms(job.due_ms)
                out["worker_id"] = job.worker_id
            if job.last_reason is not None:
                out["last_reason"] = job.last_reason
            return out
        record = state.dead.get(job_id)
        if record is not None:
            return {
                "status": "dead",
                "queue": record.job.queue,
                "cause": DEAD_LETTER_CAUSES.get(record.cause, str(record.cause)),
                "failed_at": format_time_ms(record.failed_at),
                "final_attempt": record.final_attempt,
                "last_reason": record.last_reason,
            }
    if not history.entries:
        return {"status": "unknown", "note": "no event of this job is in the log"}
    last = history.entries[-1].event
    if last[0] in _ENDINGS:
        return {"status": "gone", "note": _ENDINGS[last[0]]}
    if last[0] == _DEAD_LETTERED and event_fields(last).get("retained") is False:
        return {"status": "gone", "note": "dead-lettered and dropped (no dead-letter retention)"}
    return {"status": "unknown", "note": "the replay did not reach the end of the log"}


@dataclass
class AuditResult:
    histories: dict[str, JobHistory] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    log_first_seq: int | None = None
    # Whether the replay reached the end of the log (the current states are known).
    replayed: bool = False

    @property
    def exit_code(self) -> int:
        return 1 if any(p.severity == ERROR for p in self.problems) else 0


def audit_jobs(
    data_dir: DataDir,
    *,
    job_id: str | None = None,
    key: tuple[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> AuditResult:
    """The histories of `job_id`, or of the jobs enqueued with idempotency `key`
    (queue, key), and their current states."""
    if (job_id is None) == (key is None):
        raise ValueError("give a job id or a key")
    result = AuditResult()
    needles: list[bytes] = []
    if job_id is not None:
        result.histories[job_id] = JobHistory(job_id)
        needles.append(job_id.encode())
    if key is not None:
        needles.append(key[1].encode())
    base = choose_base(data_dir, newest=True)
    result.problems.extend(as_fallback(base.problems))
    state = base.state
    walker = LogWalker(data_dir, chunk_bytes=chunk_bytes, on_bytes=on_bytes)
    with paused_gc():
        _search(walker, result, base.seq, state, needles, key)
    for history in result.histories.values():
        history.state = _describe(state if result.replayed else None, history)
    return result


def _search(
    walker: LogWalker,
    result: AuditResult,
    base_seq: int,
    state: State | None,
    needles: list[bytes],
    key: tuple[str, str] | None,
) -> None:
    """One pass: replay records after `base_seq` into `state`, and collect the
    events of the jobs asked for (found by a substring test first)."""
    replaying = state is not None
    rel = ""
    for item in walker.walk():
        if type(item) is Record:
            seq = item.seq
            if replaying and state is not None and seq > base_seq:
                try:
                    replay_record(state, item.body)
                except ReplayError as exc:
                    result.problems.append(
                        Problem(
                            ERROR, "apply", rel, item.offset, seq, f"record does not replay: {exc}"
                        )
                    )
                    replaying = False
            body = bytes(item.body)
            if not any(needle in body for needle in needles):
                continue
            try:
                envelope = decode_envelope(body)
            except FormatError as exc:
                result.problems.append(Problem(ERROR, "decode", rel, item.offset, seq, exc.reason))
                continue
            for event in envelope.events:
                if event[0] == _ADMIN_ACTION:
                    # The operator's header: part of the history of each job it names.
                    ids = event_fields(event).get("job_ids")
                    for jid in ids if isinstance(ids, list) else ():
                        named = result.histories.get(jid)
                        if named is not None:
                            named.add(seq, envelope.time_ms, envelope.command_kind, event)
                    continue
                history = result.histories.get(job_id_of(event) or "")
                if key is not None and event[0] in (_ENQUEUED, _DEDUP_EXPIRED):
                    fields = event_fields(event)
                    if (fields.get("queue"), fields.get("idempotency_key")) == key:
                        if event[0] == _ENQUEUED:
                            found = str(fields["job_id"])
                            history = result.histories.setdefault(found, JobHistory(found))
                            needles.append(found.encode())
                        elif result.histories:
                            # The key's dedup record lapsed: part of the history of
                            # the job it last pointed at.
                            history = list(result.histories.values())[-1]
                if history is not None:
                    history.add(seq, envelope.time_ms, envelope.command_kind, event)
        elif type(item) is SegmentStart:
            rel = item.segment.rel
            if result.log_first_seq is None:
                result.log_first_seq = item.first_seq
        elif type(item) is Problem:
            result.problems.append(item)
            if item.severity == ERROR:
                replaying = False
    result.replayed = replaying


# ---------------------------------------------------------------- queues


@dataclass
class QueueTransitions:
    queue: str
    since_ms: int
    until_ms: int | None
    counts: Counter[str] = field(default_factory=Counter)
    causes: Counter[str] = field(default_factory=Counter)
    jobs: set[str] = field(default_factory=set)
    first_seq: int | None = None
    last_seq: int | None = None
    records: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(p.severity == ERROR for p in self.problems) else 0


def queue_transitions(
    data_dir: DataDir,
    queue: str,
    *,
    since_ms: int,
    until_ms: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> QueueTransitions:
    """Count the events of `queue`'s jobs in records timed in [since, until]."""
    out = QueueTransitions(queue, since_ms, until_ms)
    index = JobQueues()
    base = choose_base(data_dir, newest=False)
    if base.state is not None and base.seq > 0:
        index.seed(base.state)
    walker = LogWalker(data_dir, chunk_bytes=chunk_bytes, on_bytes=on_bytes)
    for item, envelope in _records_until(walker, until_ms, out.problems):
        if envelope.time_ms >= since_ms:
            touched = False
            for event in envelope.events:
                if index.queue_of(event) != queue:
                    continue
                touched = True
                name = event_name(event)
                out.counts[name] += 1
                if event[0] == _DEAD_LETTERED:
                    cause = event_fields(event).get("cause")
                    out.causes[
                        DEAD_LETTER_CAUSES.get(cause, str(cause)) if isinstance(cause, int) else "?"
                    ] += 1
                job = job_id_of(event)
                if job is not None:
                    out.jobs.add(job)
            if touched:
                out.records += 1
                out.first_seq = out.first_seq if out.first_seq is not None else item.seq
                out.last_seq = item.seq
        index.update(envelope.events)
    return out


def _records_until(
    walker: LogWalker, until_ms: int | None, problems: list[Problem]
) -> Iterator[tuple[Record, Envelope]]:
    """The log's records with their envelopes, oldest first, up to the first one
    timed after `until_ms`; a record that does not decode, and every problem the
    walker meets, goes to `problems`."""
    rel = ""
    for item in walker.walk():
        if type(item) is Record:
            try:
                envelope = decode_envelope(item.body)
            except FormatError as exc:
                problems.append(Problem(ERROR, "decode", rel, item.offset, item.seq, exc.reason))
                continue
            if until_ms is not None and envelope.time_ms > until_ms:
                return
            yield item, envelope
        elif type(item) is SegmentStart:
            rel = item.segment.rel
        elif type(item) is Problem:
            problems.append(item)


# ---------------------------------------------------------------- admin actions


class AdminEntry(AdminRecord):
    """One operator action (an AdminAction header) and what its record changed: the
    fields of sepp/storage/audit.py's `AdminRecord`, rendered for `sepp-log audit`."""

    __slots__ = ()

    def human(self) -> str:
        ids = ",".join(self.job_ids[:5]) + (
            f",... ({len(self.job_ids)} ids)" if len(self.job_ids) > 5 else ""
        )
        parts = [
            f"{self.seq:>8}  {format_time_ms(self.time_ms)}  {self.action:<20}",
            f"actor={self.actor} role={self.role}",
        ]
        if self.queue is not None:
            parts.append(f"queue={self.queue}")
        if self.reason is not None:
            parts.append(f"reason={json.dumps(self.reason, ensure_ascii=False)}")
        if self.job_ids:
            parts.append(f"ids={ids}")
        return "  ".join(parts)

    def data(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": format_time_ms(self.time_ms),
            "time_ms": self.time_ms,
            "action": self.action,
            "actor": self.actor,
            "role": self.role,
            "reason": self.reason,
            "queue": self.queue,
            "job_ids": list(self.job_ids),
            "changes": dict(self.changes),
        }


@dataclass
class AdminActions:
    entries: list[AdminEntry] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(p.severity == ERROR for p in self.problems) else 0


def admin_actions(
    data_dir: DataDir,
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    actor: str | None = None,
    action_prefix: str | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> AdminActions:
    """Every operator action in the log (oldest first): the records whose first
    event is an AdminAction header, filtered by time, actor and action prefix."""
    out = AdminActions()
    walker = LogWalker(data_dir, chunk_bytes=chunk_bytes, on_bytes=on_bytes)
    for item, envelope in _records_until(walker, until_ms, out.problems):
        if since_ms is not None and envelope.time_ms < since_ms:
            continue
        # The decoding the admin API's /audit shares (sepp/storage/audit.py).
        record = admin_record(item.seq, envelope)
        if record is None:
            continue
        if actor is not None and record.actor != actor:
            continue
        if action_prefix is not None and not record.action.startswith(action_prefix):
            continue
        out.entries.append(AdminEntry(*record))
    return out


def emit_admin(result: AdminActions, out: Emitter) -> None:
    out.note(f"{len(result.entries)} admin actions")
    for entry in result.entries:
        out.emit("admin-action", entry.human(), entry.data())


# ---------------------------------------------------------------- output


def emit_histories(result: AuditResult, out: Emitter, *, key: list[str] | None) -> None:
    """Each job's events and current state (human lines or JSON objects)."""
    if not result.histories and key is not None:
        out.emit(
            "job",
            f"no job was enqueued in queue {key[0]!r} with idempotency key {key[1]!r} in the log",
            {"job_id": None, "queue": key[0], "idempotency_key": key[1]},
        )
        return
    for history in result.histories.values():
        out.note(f"job {history.job_id}")
        if history.entries and not history.complete:
            out.note(
                f"  (enqueued before the start of the log, seq {result.log_first_seq}: "
                "its earlier history is not in the log)"
            )
        if history.entries:
            out.note(f"{'seq':>8}  {'time':<24}  {'event':<18} {'attempt':>7}  details")
        for entry in history.entries:
            out.emit("job-event", entry.human(), entry.data(history.job_id))
        described = ", ".join(
            str(v) if k == "note" else f"{k} {v}"
            for k, v in history.state.items()
            if k != "status" and v is not None
        )
        out.emit(
            "job-state",
            f"current state: {history.state['status']}" + (f" ({described})" if described else ""),
            {"job_id": history.job_id, "complete_history": history.complete, **history.state},
        )


def emit_transitions(summary: QueueTransitions, out: Emitter) -> None:
    """A queue's transitions over the period."""
    since_ms, until_ms = summary.since_ms, summary.until_ms
    period = (
        f"{format_time_ms(since_ms)} .. {format_time_ms(until_ms) if until_ms else 'end of log'}"
    )
    seqs = (
        f"seqs {summary.first_seq}..{summary.last_seq}, {summary.records} records"
        if summary.first_seq is not None
        else "no records"
    )
    out.note(f"queue {summary.queue}, {period}: {seqs}, {len(summary.jobs)} jobs")
    width = max((len(name) for name in summary.counts), default=0)
    for name, count in sorted(summary.counts.items()):
        causes = ""
        if name == "JobDeadLettered" and summary.causes:
            causes = "  (" + ", ".join(f"{c} {n}" for c, n in sorted(summary.causes.items())) + ")"
        out.note(f"  {name:<{width}}  {count:>8}{causes}")
    out.emit(
        "queue-transitions",
        None,
        {
            "queue": summary.queue,
            "since": format_time_ms(since_ms),
            "until": format_time_ms(until_ms) if until_ms else None,
            "first_seq": summary.first_seq,
            "last_seq": summary.last_seq,
            "records": summary.records,
            "jobs": len(summary.jobs),
            "events": dict(sorted(summary.counts.items())),
            "dead_letter_causes": dict(sorted(summary.causes.items())),
        },
    )
