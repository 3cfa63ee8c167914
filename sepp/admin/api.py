"""The admin HTTP API (issue 15, item 2): JSON routes under /admin/api/v1, each a
thin adapter over one `SeppService` call.

Owns: the route handlers (`add_api_routes`), the HTTP status of every refusal
(STATUS below, one test per row in tests/server/test_admin_api.py), the JSON
form of a payload (base64), and the reading of JSON bodies and query strings.

Routes (README.md "Admin HTTP API"):
  GET    /overview                              server info + per-queue counts
  GET    /server-info                           the server's version, limits, policies
  GET    /queues                                every queue, counts and settings
  GET    /queues/{name}                         one queue
  PUT    /queues/{name}                         create / update runtime overrides (admin)
  DELETE /queues/{name}                         delete the runtime definition (admin)
  GET    /queues/{name}/jobs?state=&cursor=&limit=&cause=   a page of jobs
  POST   /queues/{name}/jobs                    enqueue (operator)
  GET    /jobs/{id}                             one job in any state
  POST   /queues/{name}/jobs:dead-letter        dead-letter live jobs by id
  POST   /queues/{name}/jobs:cancel             cancel live jobs by id
  POST   /queues/{name}/dead-letters:requeue    by ids, or by cause / the whole queue
  POST   /queues/{name}/dead-letters:delete     likewise
  POST   /queues/{name}:pause | :resume | :purge
  GET    /schedules                             every schedule with its next fire time
  GET    /schedules/{name}                      one schedule
  PUT    /schedules/{name}                      create / update (admin; 201 when created)
  DELETE /schedules/{name}                      delete (admin)
  POST   /schedules/{name}:pause | :resume      (operator)
The audit trail (audit.py), the event stream (events.py) and the backup
(backup.py) add their routes next to these in app.py's `build_app`.

Promises: an answer is sent only once its barrier is durable (`service.durable`;
reads wait for the read barrier); a front never builds a command, reads the state
or keeps a rule of its own: the role table is the service's (PermissionDenied,
or `require` for the enqueue and server info), the limits are the core's (at
most ADMIN_IDS_PER_CALL_MAX ids a call, a page of at most PAGE_JOBS_MAX). An
enqueue takes the native protocol's job map (PROTOCOL.md, enqueue) with the
payload's bytes in base64, checked by the native front's own parser
(`parse_job`) and answered by its own translation (`enqueue_body`): both fronts
validate and answer a job alike.

Must not import: storage, the client, another front end's handlers.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sepp.admin.auth import SERVICE_KEY, ApiError, principal_of, require
from sepp.core.commands import ADMIN_IDS_PER_CALL_MAX
from sepp.core.decide import Decision
from sepp.core.reads import JobInfo, QueueInfo, ScheduleInfo
from sepp.core.results import (
    OUTCOME_NOT_FOUND,
    AdminOutcomes,
    AttemptMismatch,
    CommandError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QueueInUse,
    QueueNotFound,
    ScheduleNotFound,
)
from sepp.protocol.errors import ProtocolError
from sepp.protocol.messages import parse_job
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
from sepp.server.service import (
    InvalidRequest,
    Overloaded,
    Principal,
    SeppService,
    ShuttingDown,
    StorageFailed,
)
from sepp.server.wire import enqueue_body, new_job

__all__ = ["API_STATUS", "add_api_routes"]

# The status of each refusal (one test per row). Resource exhaustion (the commit
# backlog full) is 409 like a state conflict, as the reference maps it; 503 means
# the server will not take the request at all (shutting down, storage failed).
API_STATUS: dict[str, int] = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "failed_precondition": 409,
    "queue_in_use": 409,
    "resource_exhausted": 409,
    "payload_too_large": 413,
    "unavailable": 503,
}

JSON_CONTENT_TYPE = "application/json"
STATES = ("ready", "scheduled", "inflight", "dead_letter")
DEFAULT_STATE = "ready"
# The payload encoding of a `{"json": ...}` payload.
JSON_ENCODING = "application/json"


def _error(code: str, message: str, **details: Any) -> ApiError:
    return ApiError(API_STATUS[code], code, message, details=details)


def command_api_error(error: CommandError) -> ApiError:
    """The HTTP refusal of a core or role-table refusal."""
    if isinstance(error, PermissionDenied):
        return _error("permission_denied", error.message)
    if isinstance(error, QueueInUse):
        return _error("queue_in_use", error.message, queue=error.queue)
    if isinstance(error, QueueNotFound):
        return _error("not_found", error.message, queue=error.queue)
    if isinstance(error, NotFound):
        return _error("not_found", error.message)
    if isinstance(error, ScheduleNotFound):
        return _error("not_found", error.message, schedule=error.name)
    if isinstance(error, AttemptMismatch | FailedPrecondition):
        return _error("failed_precondition", error.message)
    if isinstance(error, InvalidArgument):
        return _error("invalid_argument", error.message)
    raise RuntimeError(f"unexpected refusal {error!r}")  # a bug: every kind is mapped


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type=JSON_CONTENT_TYPE)


async def answer(
    service: SeppService,
    call: Callable[[], tuple[Any, int] | Awaitable[Any]],
    render: Callable[[Any], Any],
    status: Callable[[Any], int] = lambda _reply: 200,
) -> web.Response:
    """Run one service call, wait until its barrier is durable, then render its
    outcome (a result, a Decision, or a refusal as an ApiError). A call that
    returns an awaitable (an enqueue stored in parts) has its outcome durable
    once awaited."""
    try:
        called = call()
        if isinstance(called, tuple):
            outcome, barrier = called
            await service.durable(barrier)
        else:
            outcome = await called
    except ShuttingDown as exc:
        raise _error("unavailable", str(exc)) from None
    except StorageFailed as exc:
        raise _error("unavailable", f"storage failed: {exc}") from None
    except Overloaded as exc:
        raise _error("resource_exhausted", str(exc) or "the commit backlog is full") from None
    except InvalidRequest as exc:
        raise _error("invalid_argument", str(exc)) from None
    if isinstance(outcome, CommandError):
        raise command_api_error(outcome)
    reply = outcome.reply if type(outcome) is Decision else outcome
    return json_response(render(reply), status(reply))


# -- reading requests -------------------------------------------------------------------


async def json_body(request: web.Request, required: bool = True) -> dict[str, Any]:
    """The request's JSON object ({} when optional and empty). 400 when it is not
    JSON or not an object; 413 (aiohttp) past client_max_size."""
    raw = await request.read()
    if not raw.strip():
        if required:
            raise _error("invalid_argument", "the body must be a JSON object")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _error("invalid_argument", f"the body is not valid JSON: {exc}") from None
    if type(body) is not dict:
        raise _error("invalid_argument", "the body must be a JSON object")
    return body


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and type(value) is not str:
        raise _error("invalid_argument", f"{key} must be a string")
    return value


def _ids(body: dict[str, Any], required: bool) -> list[str] | None:
    raw = body.get("ids")
    if raw is None:
        if required:
            raise _error("invalid_argument", "ids (a list of job ids) is required")
        return None
    if type(raw) is not list or any(type(i) is not str for i in raw):
        raise _error("invalid_argument", "ids must be a list of strings")
    return raw


def _reason(request: web.Request, body: dict[str, Any]) -> str | None:
    """The reason recorded in the audit trail: the body's, else ?reason=."""
    reason = _opt_str(body, "reason")
    return reason if reason is not None else request.query.get("reason")


def _name(request: web.Request) -> str:
    return request.match_info["name"]


def _int_query(request: web.Request, key: str) -> int | None:
    text = request.query.get(key)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise _error("invalid_argument", f"{key} must be an integer, got {text!r}") from None


# -- rendering ------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def job_json(info: JobInfo) -> dict[str, Any]:
    """A job as JSON: the native shape, the payload's bytes in base64."""
    body = job_info_body(info)
    payload = body["payload"]
    if payload is not None:
        body["payload"] = {"data": _b64(payload["data"]), "encoding": payload["encoding"]}
    return body


def _page_json(page: Any) -> dict[str, Any]:
    body = page_body(page)
    body["jobs"] = [job_json(info) for info in page.jobs]
    return body


# -- handlers -------------------------------------------------------------------------------


def _service(request: web.Request) -> SeppService:
    return request.app[SERVICE_KEY]


async def overview(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)

    def render(queues: tuple[QueueInfo, ...]) -> dict[str, Any]:
        health = service.health()
        totals = {state: 0 for state in STATES}
        rows = []
        for q in queues:
            counts = {
                "ready": q.ready,
                "scheduled": q.scheduled,
                "inflight": q.inflight,
                "dead_letter": q.dead_letter,
            }
            for state, count in counts.items():
                totals[state] += count
            rows.append({"name": q.name, "paused": q.paused, **counts})
        info = service.server_info()
        return {
            "server": {
                "server_version": info["server_version"],
                "server_time_ms": info["server_time_ms"],
                "persist_mode": info["persist_mode"],
                "serving": health.serving,
                "not_serving_reason": health.reason,
                "dead_letter_retention_ms": info["dead_letter_retention_ms"],
            },
            "totals": {"queues": len(rows), **totals},
            "queues": rows,
        }

    return await answer(service, lambda: service.list_queues(principal), render)


async def server_info(request: web.Request) -> web.Response:
    require(request, "server_info")
    service = _service(request)
    if service.stopping:
        raise _error("unavailable", "the server is shutting down")
    return await answer(service, lambda: (service.server_info(), service.read_barrier()), dict)


async def list_queues(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    return await answer(
        service,
        lambda: service.list_queues(principal),
        lambda qs: {"queues": [queue_info_body(q) for q in qs]},
    )


async def get_queue(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    name = _name(request)
    return await answer(
        service,
        lambda: service.queue_info(principal, name),
        lambda info: {"queue": queue_info_body(info)},
    )


async def put_queue(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    body = await json_body(request, required=False)
    raw = body.get("overrides", {})
    if type(raw) is not dict:
        raise _error("invalid_argument", "overrides must be an object")
    overrides: dict[str, int | str] = {}
    for key, value in raw.items():
        # bool is an int in Python, never a setting's value here.
        if type(value) is not str and type(value) is not int:
            raise _error("invalid_argument", f"overrides.{key} must be an integer or a string")
        overrides[key] = value
    reason = _reason(request, body)
    name = _name(request)
    return await answer(
        service,
        lambda: service.put_queue(principal, name, overrides, reason),
        put_queue_body,
        lambda reply: 201 if reply.created else 200,
    )


async def delete_queue(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    body = await json_body(request, required=False)
    reason = _reason(request, body)
    name = _name(request)
    return await answer(
        service, lambda: service.delete_queue(principal, name, reason), delete_queue_body
    )


async def list_jobs(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    name = _name(request)
    state = request.query.get("state", DEFAULT_STATE)
    if state not in STATES:
        raise _error("invalid_argument", f"state must be one of {', '.join(STATES)}")
    cursor = request.query.get("cursor") or None
    cause = request.query.get("cause") or None
    limit = _int_query(request, "limit")
    kwargs: dict[str, Any] = {} if limit is None else {"limit": limit}
    if state == "dead_letter":
        return await answer(
            service,
            lambda: service.list_dead_letters(principal, name, cause, cursor, **kwargs),
            _page_json,
        )
    return await answer(
        service,
        lambda: service.list_jobs(principal, name, state, cursor, cause=cause, **kwargs),
        _page_json,
    )


async def get_job(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    job_id = request.match_info["id"]

    def render(info: JobInfo | None) -> dict[str, Any]:
        if info is None:
            raise _error("not_found", f"no job {job_id!r}")
        return {"job": job_json(info)}

    return await answer(service, lambda: service.get_job(principal, job_id), render)


def json_job_map(raw: Any, queue: str) -> dict[str, Any] | ProtocolError:
    """A job of a JSON enqueue as the native protocol's job map: `queue` from the
    path, the payload's base64 `data` (or a `json` value) as bytes. A problem is
    that job's ProtocolError (rejected in its place, like the native front)."""
    if type(raw) is not dict:
        return ProtocolError("a job must be an object")
    job = dict(raw)
    named = job.get("queue", queue)
    if named != queue:
        return ProtocolError(f"job.queue {named!r} is not the queue of the path {queue!r}")
    job["queue"] = queue
    payload = job.get("payload")
    if type(payload) is dict:
        payload = dict(payload)
        if "json" in payload:
            if "data" in payload:
                return ProtocolError("job.payload takes data (base64) or json, not both")
            payload["data"] = json.dumps(payload.pop("json"), separators=(",", ":")).encode()
            payload.setdefault("encoding", JSON_ENCODING)
        else:
            data = payload.get("data")
            if type(data) is not str:
                return ProtocolError("job.payload.data must be a base64 string")
            try:
                payload["data"] = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                return ProtocolError("job.payload.data is not valid base64")
        job["payload"] = payload
    return job


async def enqueue(request: web.Request) -> web.Response:
    require(request, "enqueue_jobs")
    service = _service(request)
    body = await json_body(request)
    name = _name(request)
    if "jobs" in body:
        raw_jobs = body["jobs"]
        if type(raw_jobs) is not list:
            raise _error("invalid_argument", "jobs must be a list of job objects")
        atomic = body.get("atomic", False)
        if type(atomic) is not bool:
            raise _error("invalid_argument", "atomic must be true or false")
    else:
        raw_jobs, atomic = [body], False
    parsed: list[Any] = []
    for raw in raw_jobs:
        job = json_job_map(raw, name)
        if isinstance(job, ProtocolError):
            parsed.append(job)
            continue
        try:
            parsed.append(parse_job(job))
        except ProtocolError as exc:
            parsed.append(exc)
    jobs = tuple(map(new_job, service.new_job_ids(len(parsed)), parsed))
    # A large best-effort batch is stored in parts (sepp/server/parts.py).
    return await answer(service, lambda: service.enqueue_durable(jobs, atomic), enqueue_body)


def _in_other_queue(
    service: SeppService, principal: Principal, job_ids: list[str], queue: str
) -> set[str]:
    """The ids of jobs that exist in a queue other than `queue`: their outcome is
    not_found (the path names the queue). Read in the same loop turn as the
    command that follows, so nothing changes in between."""
    if len(job_ids) > ADMIN_IDS_PER_CALL_MAX:
        return set()  # the service refuses the whole call (TooManyIds)
    other = set()
    for job_id in job_ids:
        info, _barrier = service.get_job(principal, job_id)
        if isinstance(info, JobInfo) and info.queue != queue:
            other.add(job_id)
    return other


def _by_ids(
    service: SeppService,
    principal: Principal,
    job_ids: list[str],
    queue: str,
    run: Callable[[list[str]], tuple[Any, int]],
) -> Callable[[], tuple[Any, int]]:
    """A call of `run` on the ids of `queue`; the others answered not_found."""

    def call() -> tuple[Any, int]:
        other = _in_other_queue(service, principal, job_ids, queue)
        outcome, barrier = run([i for i in job_ids if i not in other])
        if other and type(outcome) is Decision and isinstance(outcome.reply, AdminOutcomes):
            reply = outcome.reply
            extra = tuple((i, OUTCOME_NOT_FOUND) for i in dict.fromkeys(job_ids) if i in other)
            return reply._replace(outcomes=reply.outcomes + extra), barrier
        return outcome, barrier

    return call


async def jobs_dead_letter(request: web.Request) -> web.Response:
    return await _live_jobs(request, "dead_letter_jobs")


async def jobs_cancel(request: web.Request) -> web.Response:
    return await _live_jobs(request, "cancel_jobs")


async def _live_jobs(request: web.Request, operation: str) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    body = await json_body(request)
    job_ids = _ids(body, required=True) or []
    reason = _reason(request, body)
    method = getattr(service, operation)
    return await answer(
        service,
        _by_ids(
            service, principal, job_ids, _name(request), lambda ids: method(principal, ids, reason)
        ),
        outcomes_body,
    )


async def dead_letters_requeue(request: web.Request) -> web.Response:
    return await _dead_letters(request, "requeue_dead_letters")


async def dead_letters_delete(request: web.Request) -> web.Response:
    return await _dead_letters(request, "delete_dead_letters")


async def _dead_letters(request: web.Request, operation: str) -> web.Response:
    """By `ids` (those of this queue), or by filter: `cause`, or the whole queue
    (a chunk per call; `remaining` says how many more match)."""
    service = _service(request)
    principal = principal_of(request)
    body = await json_body(request, required=False)
    job_ids = _ids(body, required=False)
    cause = _opt_str(body, "cause")
    reason = _reason(request, body)
    name = _name(request)
    method = getattr(service, operation)
    if job_ids is not None:
        if cause is not None:
            raise _error("invalid_argument", "give ids or a cause, not both")
        call = _by_ids(
            service,
            principal,
            job_ids,
            name,
            lambda ids: method(principal, job_ids=ids, reason=reason),
        )
    else:

        def call() -> tuple[Any, int]:
            result: tuple[Any, int] = method(principal, queue=name, cause=cause, reason=reason)
            return result

    return await answer(service, call, outcomes_body)


async def pause(request: web.Request) -> web.Response:
    return await _queue_flow(request, "pause_queue", queue_admin_body)


async def resume(request: web.Request) -> web.Response:
    return await _queue_flow(request, "resume_queue", queue_admin_body)


async def purge(request: web.Request) -> web.Response:
    return await _queue_flow(request, "purge_queue", purge_body)


async def _queue_flow(
    request: web.Request, operation: str, render: Callable[[Any], dict[str, Any]]
) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    body = await json_body(request, required=False)
    reason = _reason(request, body)
    name = _name(request)
    method = getattr(service, operation)
    return await answer(service, lambda: method(principal, name, reason), render)


# -- schedules (issue 17) -----------------------------------------------------------------


async def list_schedules(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    return await answer(
        service,
        lambda: service.list_schedules(principal),
        lambda infos: {"schedules": [schedule_info_body(i) for i in infos]},
    )


async def get_schedule(request: web.Request) -> web.Response:
    service = _service(request)
    principal = principal_of(request)
    name = _name(request)

    def render(infos: tuple[ScheduleInfo, ...]) -> dict[str, Any]:
        for info in infos:
            if info.name == name:
                return {"schedule": schedule_info_body(info)}
        raise _error("not_found", f"schedule {name!r} does not exist", schedule=name)

    return await answer(service, lambda: service.list_schedules(principal), render)


SCHEDULE_BODY_KEYS = (
    "queue", "job_type", "cron", "timezone", "every_ms", "payload", "priority",
    "max_attempts", "custom", "catch_up", "reason",
)  # fmt: skip


async def put_schedule(request: web.Request) -> web.Response:
    """Body: queue, job_type, cron or every_ms, timezone, payload {data (base64),
    encoding}, priority, max_attempts, custom, catch_up, reason. The core checks
    every value (a wrong type is its InvalidArgument)."""
    service = _service(request)
    principal = principal_of(request)
    body = await json_body(request)
    for key in body:
        if key not in SCHEDULE_BODY_KEYS:
            raise _error("invalid_argument", f"unknown field {key!r}")
    data: bytes | None = None
    encoding: Any = None
    payload = body.get("payload")
    if payload is not None:
        if type(payload) is not dict or type(payload.get("data")) is not str:
            raise _error("invalid_argument", "payload must be {data: base64, encoding}")
        try:
            data = base64.b64decode(payload["data"], validate=True)
        except (binascii.Error, ValueError):
            raise _error("invalid_argument", "payload.data is not valid base64") from None
        encoding = payload.get("encoding")
    name = _name(request)
    reason = _reason(request, body)
    return await answer(
        service,
        lambda: service.put_schedule(
            principal,
            name,
            body.get("queue"),  # type: ignore[arg-type]  # the core checks the type
            body.get("job_type"),  # type: ignore[arg-type]
            cron=body.get("cron"),
            timezone=body.get("timezone", "UTC"),
            every_ms=body.get("every_ms"),
            payload_data=data,
            payload_encoding=encoding,
            priority=body.get("priority"),
            max_attempts=body.get("max_attempts"),
            custom=body.get("custom"),
            catch_up=body.get("catch_up", "one"),
            reason=reason,
        ),
        schedule_result_body,
        lambda reply: 201 if reply.created else 200,
    )


async def delete_schedule(request: web.Request) -> web.Response:
    return await _queue_flow(request, "delete_schedule", schedule_result_body)


async def pause_schedule(request: web.Request) -> web.Response:
    return await _queue_flow(request, "pause_schedule", schedule_result_body)


async def resume_schedule(request: web.Request) -> web.Response:
    return await _queue_flow(request, "resume_schedule", schedule_result_body)


# Queue names may hold ":"; a name is everything before the last ":ACTION".
QUEUE = "{name:[^/]+}"


def add_api_routes(app: web.Application, prefix: str) -> None:
    """Register the routes above under `prefix` (/admin/api/v1). The routes with
    an action suffix come first: `/queues/{name}` would match them too."""
    r = app.router
    r.add_get(f"{prefix}/overview", overview)
    r.add_get(f"{prefix}/server-info", server_info)
    r.add_get(f"{prefix}/queues", list_queues)
    r.add_get(f"{prefix}/schedules", list_schedules)
    r.add_post(f"{prefix}/schedules/{QUEUE}:pause", pause_schedule)
    r.add_post(f"{prefix}/schedules/{QUEUE}:resume", resume_schedule)
    r.add_get(f"{prefix}/schedules/{QUEUE}", get_schedule)
    r.add_put(f"{prefix}/schedules/{QUEUE}", put_schedule)
    r.add_delete(f"{prefix}/schedules/{QUEUE}", delete_schedule)
    r.add_post(f"{prefix}/queues/{QUEUE}:pause", pause)
    r.add_post(f"{prefix}/queues/{QUEUE}:resume", resume)
    r.add_post(f"{prefix}/queues/{QUEUE}:purge", purge)
    r.add_get(f"{prefix}/queues/{QUEUE}", get_queue)
    r.add_put(f"{prefix}/queues/{QUEUE}", put_queue)
    r.add_delete(f"{prefix}/queues/{QUEUE}", delete_queue)
    r.add_get(f"{prefix}/queues/{QUEUE}/jobs", list_jobs)
    r.add_post(f"{prefix}/queues/{QUEUE}/jobs", enqueue)
    r.add_post(f"{prefix}/queues/{QUEUE}/jobs:dead-letter", jobs_dead_letter)
    r.add_post(f"{prefix}/queues/{QUEUE}/jobs:cancel", jobs_cancel)
    r.add_post(f"{prefix}/queues/{QUEUE}/dead-letters:requeue", dead_letters_requeue)
    r.add_post(f"{prefix}/queues/{QUEUE}/dead-letters:delete", dead_letters_delete)
    r.add_get(prefix + "/jobs/{id}", get_job)
