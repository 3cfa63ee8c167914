"""The admin operations of the native protocol (issue 15, PROTOCOL.md 5.14-5.27;
the schedule operations of issue 17, 5.28-5.32):
each decodes its body into a `SeppService` admin call and renders the outcome.

Owns: the handlers (`HANDLERS`, op name -> handler, merged into the native
front's dispatch table) and `native_principal` (who a native connection acts
as). The shapes of a `JobInfo`, a `JobPage`, a `QueueInfo` and of the admin
results are shared with the admin HTTP API (sepp/server/admin_shapes.py).

Promises: an answer is sent only once its barrier is durable (reads: the read
barrier); the core's and the role table's refusals go out as the codes of
PROTOCOL.md §4 (`command_error`). Nothing here builds a command or reads the
state: the service does.

Must not import: another front end (the admin HTTP API, gRPC). Not compiled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sepp.core.decide import Decision
from sepp.core.results import CommandError, InvalidArgument
from sepp.protocol import errors as perr
from sepp.protocol import messages as pm
from sepp.protocol.framing import encode_frame
from sepp.server.admin_shapes import (
    delete_queue_body,
    job_info_body,
    outcomes_body,
    page_body,
    purge_body,
    put_queue_body,
    queue_admin_body,
    queue_info_body,
    schedule_info_body,
    schedule_result_body,
)
from sepp.server.service import LOCAL_ADMIN, Principal
from sepp.server.wire import command_error

if TYPE_CHECKING:
    from sepp.server.server import ClientConnection

# Hex digits of the key's SHA-256 that name an API-key actor in the audit trail.
API_KEY_ACTOR_HEX_DIGITS = 8


def native_principal(api_key: str | None, auth_required: bool) -> Principal:
    """Who a native connection acts as. Without configured keys: `local`, role
    admin. With keys: `api-key:<first 8 hex digits of the key's SHA-256>` (never
    the key itself), role admin: API keys have no roles yet."""
    if not auth_required or api_key is None:
        return LOCAL_ADMIN
    digest = hashlib.sha256(api_key.encode()).hexdigest()[:API_KEY_ACTOR_HEX_DIGITS]
    return Principal(f"api-key:{digest}", "admin")


# -- handlers ----------------------------------------------------------------------------


def _answer(
    conn: ClientConnection,
    request_id: int,
    outcome: Any,
    barrier: int,
    render: Callable[[Any], dict[str, Any]],
) -> None:
    """Send `outcome` (a result, a Decision or a CommandError) once `barrier` is
    durable."""
    if isinstance(outcome, CommandError):
        code, body = command_error(outcome)
        conn.outcome = code  # sepp_requests_total's outcome
    else:
        code = perr.OK
        body = render(outcome.reply if type(outcome) is Decision else outcome)
    frame = encode_frame(pm.encode_response(request_id, code, body))
    conn.server.service.after_durable(barrier, conn.send_after, frame, request_id)


def op_get_job(conn: ClientConnection, request_id: int, body: pm.GetJobBody) -> None:
    info, barrier = conn.server.service.get_job(conn.principal, body.job_id)
    _answer(
        conn, request_id, info, barrier, lambda i: {"job": None if i is None else job_info_body(i)}
    )


def op_list_jobs(conn: ClientConnection, request_id: int, body: pm.ListJobsBody) -> None:
    service = conn.server.service
    if body.limit is None:
        page, barrier = service.list_jobs(
            conn.principal, body.queue, body.state, body.cursor, cause=body.cause
        )
    else:
        page, barrier = service.list_jobs(
            conn.principal, body.queue, body.state, body.cursor, body.limit, body.cause
        )
    _answer(conn, request_id, page, barrier, page_body)


def op_list_queues(conn: ClientConnection, request_id: int, body: None) -> None:
    queues, barrier = conn.server.service.list_queues(conn.principal)
    _answer(
        conn, request_id, queues, barrier, lambda qs: {"queues": [queue_info_body(q) for q in qs]}
    )


def op_queue_info(conn: ClientConnection, request_id: int, body: pm.QueueBody) -> None:
    info, barrier = conn.server.service.queue_info(conn.principal, body.queue)
    _answer(conn, request_id, info, barrier, lambda i: {"queue": queue_info_body(i)})


def op_dead_letter_jobs(conn: ClientConnection, request_id: int, body: pm.JobIdsBody) -> None:
    decision, barrier = conn.server.service.dead_letter_jobs(
        conn.principal, body.job_ids, body.reason
    )
    _answer(conn, request_id, decision, barrier, outcomes_body)


def op_cancel_jobs(conn: ClientConnection, request_id: int, body: pm.JobIdsBody) -> None:
    decision, barrier = conn.server.service.cancel_jobs(conn.principal, body.job_ids, body.reason)
    _answer(conn, request_id, decision, barrier, outcomes_body)


def op_requeue_dead_letters(
    conn: ClientConnection, request_id: int, body: pm.DeadLettersBody
) -> None:
    _dead_letters_by(conn, request_id, body, conn.server.service.requeue_dead_letters)


def op_delete_dead_letters(
    conn: ClientConnection, request_id: int, body: pm.DeadLettersBody
) -> None:
    _dead_letters_by(conn, request_id, body, conn.server.service.delete_dead_letters)


def _dead_letters_by(
    conn: ClientConnection,
    request_id: int,
    body: pm.DeadLettersBody,
    operation: Callable[..., tuple[Decision | CommandError, int]],
) -> None:
    decision, barrier = operation(
        conn.principal,
        job_ids=body.job_ids,
        queue=body.queue,
        cause=body.cause,
        reason=body.reason,
    )
    _answer(conn, request_id, decision, barrier, outcomes_body)


def op_pause_queue(conn: ClientConnection, request_id: int, body: pm.QueueBody) -> None:
    decision, barrier = conn.server.service.pause_queue(conn.principal, body.queue, body.reason)
    _answer(conn, request_id, decision, barrier, queue_admin_body)


def op_resume_queue(conn: ClientConnection, request_id: int, body: pm.QueueBody) -> None:
    decision, barrier = conn.server.service.resume_queue(conn.principal, body.queue, body.reason)
    _answer(conn, request_id, decision, barrier, queue_admin_body)


def op_purge_queue(conn: ClientConnection, request_id: int, body: pm.QueueBody) -> None:
    decision, barrier = conn.server.service.purge_queue(conn.principal, body.queue, body.reason)
    _answer(conn, request_id, decision, barrier, purge_body)


def op_put_queue(conn: ClientConnection, request_id: int, body: pm.PutQueueBody) -> None:
    decision, barrier = conn.server.service.put_queue(
        conn.principal, body.queue, body.overrides, body.reason
    )
    _answer(conn, request_id, decision, barrier, put_queue_body)


def op_delete_queue(conn: ClientConnection, request_id: int, body: pm.QueueBody) -> None:
    decision, barrier = conn.server.service.delete_queue(conn.principal, body.queue, body.reason)
    _answer(conn, request_id, decision, barrier, delete_queue_body)


# -- schedules (issue 17) -------------------------------------------------------------------

# The fields of a put_schedule whose refusal names them (the core's and the
# service's messages start with the field's name; an unknown time zone says so).
SCHEDULE_FIELDS = (
    "cron", "timezone", "every_ms", "catch_up", "custom", "queue", "job_type",
    "priority", "max_attempts", "payload", "name",
)  # fmt: skip


def schedule_field(message: str) -> str | None:
    """The put_schedule field an invalid_argument message is about, or None."""
    if message.startswith("unknown time zone") or message.startswith("zone"):
        return "timezone"
    for name in SCHEDULE_FIELDS:
        if message.startswith((f"{name} ", f"{name}:", f"{name}.")):
            return name
    return None


def op_list_schedules(conn: ClientConnection, request_id: int, body: None) -> None:
    infos, barrier = conn.server.service.list_schedules(conn.principal)
    _answer(
        conn,
        request_id,
        infos,
        barrier,
        lambda items: {"schedules": [schedule_info_body(i) for i in items]},
    )


def op_put_schedule(conn: ClientConnection, request_id: int, body: pm.PutScheduleBody) -> None:
    decision, barrier = conn.server.service.put_schedule(
        conn.principal, body.name, body.queue, body.job_type,
        cron=body.cron, timezone=body.timezone, every_ms=body.every_ms,
        payload_data=body.payload_data, payload_encoding=body.payload_encoding,
        priority=body.priority, max_attempts=body.max_attempts, custom=body.custom,
        catch_up=body.catch_up, reason=body.reason,
    )  # fmt: skip
    if isinstance(decision, InvalidArgument):
        code, error_body = command_error(decision)
        field = schedule_field(decision.message)
        if field is not None:
            error_body["field"] = field
        conn.outcome = code
        frame = encode_frame(pm.encode_response(request_id, code, error_body))
        conn.server.service.after_durable(barrier, conn.send_after, frame, request_id)
        return
    _answer(conn, request_id, decision, barrier, schedule_result_body)


def op_pause_schedule(conn: ClientConnection, request_id: int, body: pm.ScheduleBody) -> None:
    decision, barrier = conn.server.service.pause_schedule(conn.principal, body.name, body.reason)
    _answer(conn, request_id, decision, barrier, schedule_result_body)


def op_resume_schedule(conn: ClientConnection, request_id: int, body: pm.ScheduleBody) -> None:
    decision, barrier = conn.server.service.resume_schedule(conn.principal, body.name, body.reason)
    _answer(conn, request_id, decision, barrier, schedule_result_body)


def op_delete_schedule(conn: ClientConnection, request_id: int, body: pm.ScheduleBody) -> None:
    decision, barrier = conn.server.service.delete_schedule(conn.principal, body.name, body.reason)
    _answer(conn, request_id, decision, barrier, schedule_result_body)


HANDLERS: dict[str, Callable[[ClientConnection, int, Any], None]] = {
    pm.OP_GET_JOB: op_get_job,
    pm.OP_LIST_JOBS: op_list_jobs,
    pm.OP_LIST_QUEUES: op_list_queues,
    pm.OP_QUEUE_INFO: op_queue_info,
    pm.OP_DEAD_LETTER_JOBS: op_dead_letter_jobs,
    pm.OP_CANCEL_JOBS: op_cancel_jobs,
    pm.OP_REQUEUE_DEAD_LETTERS: op_requeue_dead_letters,
    pm.OP_DELETE_DEAD_LETTERS: op_delete_dead_letters,
    pm.OP_PAUSE_QUEUE: op_pause_queue,
    pm.OP_RESUME_QUEUE: op_resume_queue,
    pm.OP_PURGE_QUEUE: op_purge_queue,
    pm.OP_PUT_QUEUE: op_put_queue,
    pm.OP_DELETE_QUEUE: op_delete_queue,
    pm.OP_LIST_SCHEDULES: op_list_schedules,
    pm.OP_PUT_SCHEDULE: op_put_schedule,
    pm.OP_PAUSE_SCHEDULE: op_pause_schedule,
    pm.OP_RESUME_SCHEDULE: op_resume_schedule,
    pm.OP_DELETE_SCHEDULE: op_delete_schedule,
}
