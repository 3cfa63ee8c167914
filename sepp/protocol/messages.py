"""Messages: the msgpack shapes inside frames, and their validation.

Owns: the request and response envelopes (`[id, op, body]` and
`[id, status, body]`), the operation names, and per-operation body validation
that turns a decoded map into plain, type-checked Python values (or a
`ProtocolError` naming the field). PROTOCOL.md is the specification.

Promises: decoding never raises anything but `ProtocolError`/`ProtocolViolation`
on bad input (tests fuzz it); values handed on are of the documented types, ints
within signed 64 bits. Business rules (empty names, ranges, limits) are the state
machine's job and come back as its rejections, not as protocol errors.

Must not import: asyncio, socket, sepp.core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from sepp.protocol.errors import (
    INVALID_ARGUMENT,
    OK,
    STATUSES,
    ProtocolError,
    ProtocolViolation,
)
from sepp.protocol.framing import LENGTH_PREFIX

PROTOCOL_VERSION = 1
SUPPORTED_PROTOCOL_VERSIONS = (1,)

OP_HELLO = "hello"
OP_HEALTH = "health"
OP_ENQUEUE = "enqueue"
OP_RESERVE = "reserve"
OP_ACK = "ack"
OP_NACK = "nack"
OP_EXTEND = "extend"
OP_DRAIN_DEAD_LETTERS = "drain_dead_letters"
OP_SERVER_INFO = "server_info"
OP_QUEUE_STATS = "queue_stats"
OP_RELEASE = "release"
OP_WITHDRAW = "withdraw"
OP_SETTLE = "settle"
# Admin operations (issue 15, PROTOCOL.md 5.14-5.27).
OP_GET_JOB = "get_job"
OP_LIST_JOBS = "list_jobs"
OP_LIST_QUEUES = "list_queues"
OP_QUEUE_INFO = "queue_info"
OP_DEAD_LETTER_JOBS = "dead_letter_jobs"
OP_CANCEL_JOBS = "cancel_jobs"
OP_REQUEUE_DEAD_LETTERS = "requeue_dead_letters"
OP_DELETE_DEAD_LETTERS = "delete_dead_letters"
OP_PAUSE_QUEUE = "pause_queue"
OP_RESUME_QUEUE = "resume_queue"
OP_PURGE_QUEUE = "purge_queue"
OP_PUT_QUEUE = "put_queue"
OP_DELETE_QUEUE = "delete_queue"
# Schedule operations (issue 17, PROTOCOL.md 5.28-5.32).
OP_LIST_SCHEDULES = "list_schedules"
OP_PUT_SCHEDULE = "put_schedule"
OP_PAUSE_SCHEDULE = "pause_schedule"
OP_RESUME_SCHEDULE = "resume_schedule"
OP_DELETE_SCHEDULE = "delete_schedule"
ADMIN_OPS = (
    OP_GET_JOB,
    OP_LIST_JOBS,
    OP_LIST_QUEUES,
    OP_QUEUE_INFO,
    OP_DEAD_LETTER_JOBS,
    OP_CANCEL_JOBS,
    OP_REQUEUE_DEAD_LETTERS,
    OP_DELETE_DEAD_LETTERS,
    OP_PAUSE_QUEUE,
    OP_RESUME_QUEUE,
    OP_PURGE_QUEUE,
    OP_PUT_QUEUE,
    OP_DELETE_QUEUE,
    OP_LIST_SCHEDULES,
    OP_PUT_SCHEDULE,
    OP_PAUSE_SCHEDULE,
    OP_RESUME_SCHEDULE,
    OP_DELETE_SCHEDULE,
)
# The most job ids one admin call may name (the core's ADMIN_IDS_PER_CALL_MAX;
# over it the whole call is refused with invalid_argument).
MAX_ADMIN_IDS = 1000
OPS = (
    OP_HELLO,
    OP_HEALTH,
    OP_ENQUEUE,
    OP_RESERVE,
    OP_ACK,
    OP_NACK,
    OP_EXTEND,
    OP_DRAIN_DEAD_LETTERS,
    OP_SERVER_INFO,
    OP_QUEUE_STATS,
    OP_RELEASE,
    OP_WITHDRAW,
    OP_SETTLE,
    *ADMIN_OPS,
)

# The kinds of item a `settle` carries (PROTOCOL.md 5.13): each is the body of
# the single operation of that name plus ``kind``.
SETTLE_KINDS = (OP_ACK, OP_NACK, OP_EXTEND)
# The most items one `settle` may carry (a fixed protocol limit, advertised in
# the hello answer and server_info); more is refused whole.
MAX_SETTLE_BATCH = 256

RETRY_DEFAULT = "default"
RETRY_DELAY = "delay"
RETRY_DEAD_LETTER = "dead_letter"

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
REQUEST_ID_MAX = 2**64 - 1

_unpackb = msgpack.unpackb
_new_tuple = tuple.__new__
_packer_pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
# msgpack's Packer never shrinks its buffer: after one 15 MiB answer the process
# would hold 15 MiB for good (tools.attack drain-payloads: RSS stayed 23 MiB above
# idle). A message past PACKER_BUFFER_BYTES_KEPT gets a fresh Packer after it, so
# only the common small messages keep reusing one buffer.
PACKER_BUFFER_BYTES_KEPT = 1 << 20


class Request(NamedTuple):
    id: int
    op: str
    body: dict[str, Any]


class Response(NamedTuple):
    id: int
    status: str
    body: dict[str, Any]


def _unpack(frame: bytes) -> Any:
    try:
        # msgpack >= 1.0's defaults, which the wire needs (raw=False: str is
        # text; strict_map_key=True: str/bytes keys only; use_list=True), left
        # implicit: every keyword argument costs ~0.07 us per request.
        return _unpackb(frame)
    except Exception as exc:
        # msgpack raises ExtraData, FormatError, StackError, ValueError,
        # TypeError, UnicodeDecodeError... for bad bytes: all mean the same here.
        raise ProtocolViolation(f"frame is not one msgpack value: {type(exc).__name__}") from exc


def pack(value: Any) -> bytes:
    """msgpack with bin for bytes and str for text (the only encoding used)."""
    global _packer_pack
    data: bytes = _packer_pack(value)
    if len(data) > PACKER_BUFFER_BYTES_KEPT:
        _packer_pack = msgpack.Packer(use_bin_type=True).pack
    return data


# -- answers written as parts ------------------------------------------------

# A bytes value at least this long goes into an answer's frame uncopied
# (`response_frame_parts`): a reserve answer of fifteen 1 MiB jobs was copied
# three times on the event loop (msgpack's buffer, its result, the length
# prefix joined on), 45 MiB of memory touched for the first time, 50-60 ms
# during which no other client was answered (tools.attack drain-payloads).
SPLICE_BYTES_MIN = 64 * 1024


def response_frame_parts(request_id: int, status: str, body: dict[str, Any]) -> list[bytes]:
    """The frame of a response, length prefix included, as buffers to write one
    after another: their concatenation is exactly
    `framing.encode_frame(encode_response(request_id, status, body))`, and every
    bytes value of at least SPLICE_BYTES_MIN in `body` is one of them, itself,
    not a copy. For answers that carry large payloads; a small answer is cheaper
    packed whole."""
    parts: list[bytes] = []
    head = bytearray()
    _splice_into([request_id, status, body], parts, head)
    if head:
        parts.append(bytes(head))
    size = 0
    for part in parts:
        size += len(part)
    if size > 0xFFFFFFFF:
        raise ValueError(f"an answer of {size} bytes does not fit a frame")
    parts[0] = LENGTH_PREFIX.pack(size) + parts[0]
    return parts


def _splice_into(value: object, parts: list[bytes], head: bytearray) -> None:
    """msgpack-encode `value` onto `head`, moving each large bytes value (and
    the encoding before it) into `parts`."""
    if isinstance(value, bytes) and len(value) >= SPLICE_BYTES_MIN:
        head += _bin_header(len(value))
        parts.append(bytes(head))
        head.clear()
        parts.append(value)
    elif isinstance(value, dict):
        head += _container_header(len(value), 0x80, 0xDE, 0xDF)
        for key, item in value.items():
            head += pack(key)
            _splice_into(item, parts, head)
    elif isinstance(value, (list, tuple)):
        head += _container_header(len(value), 0x90, 0xDC, 0xDD)
        for item in value:
            _splice_into(item, parts, head)
    else:
        head += pack(value)


def _container_header(count: int, fix: int, marker16: int, marker32: int) -> bytes:
    if count <= 15:
        return bytes((fix | count,))
    if count <= 0xFFFF:
        return bytes((marker16,)) + count.to_bytes(2, "big")
    return bytes((marker32,)) + count.to_bytes(4, "big")


def _bin_header(size: int) -> bytes:
    if size <= 0xFF:
        return bytes((0xC4, size))
    if size <= 0xFFFF:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


# -- envelopes ---------------------------------------------------------------


def decode_request(frame: bytes) -> Request:
    """A request frame. ProtocolViolation if it is not `[id, op, body]` with a
    usable id (no answer is possible); ProtocolError (with `.request_id`) if the
    id is fine but the op or body is not."""
    obj = _unpack(frame)
    if type(obj) is not list or len(obj) != 3:
        raise ProtocolViolation("a request is an array [id, op, body]")
    request_id, op, body = obj
    if type(request_id) is not int or not 0 <= request_id <= REQUEST_ID_MAX:
        raise ProtocolViolation("request id must be an unsigned 64-bit integer")
    if type(op) is not str or op not in OPS:
        raise _error(request_id, f"unknown operation {op!r:.60}")
    if type(body) is not dict:
        raise _error(request_id, "request body must be a map")
    return Request(request_id, op, body)


def encode_request(request_id: int, op: str, body: dict[str, Any]) -> bytes:
    return pack([request_id, op, body])


def encode_response(request_id: int, status: str, body: dict[str, Any]) -> bytes:
    return pack([request_id, status, body])


def error_body(message: str, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"message": message}
    body.update(details)
    return body


def decode_response(frame: bytes) -> Response:
    """A response frame (client side). ProtocolViolation on anything malformed."""
    obj = _unpack(frame)
    if type(obj) is not list or len(obj) != 3:
        raise ProtocolViolation("a response is an array [id, status, body]")
    response_id, status, body = obj
    if type(response_id) is not int or not 0 <= response_id <= REQUEST_ID_MAX:
        raise ProtocolViolation("response id must be an unsigned 64-bit integer")
    if type(status) is not str or status not in STATUSES:
        raise ProtocolViolation(f"unknown response status {status!r:.40}")
    if type(body) is not dict:
        raise ProtocolViolation("response body must be a map")
    if status != OK and type(body.get("message")) is not str:
        raise ProtocolViolation("an error response needs a message")
    return Response(response_id, status, body)


def _error(request_id: int, message: str, code: str = INVALID_ARGUMENT) -> ProtocolError:
    error = ProtocolError(message, code)
    error.request_id = request_id  # type: ignore[attr-defined]
    return error


# -- field readers -------------------------------------------------------------


class Fields:
    """Typed access to a request body; every accessor raises ProtocolError naming
    the field when its type is wrong."""

    __slots__ = ("_body", "_where")

    def __init__(self, body: dict[str, Any], where: str = "") -> None:
        self._body = body
        self._where = where

    def _fail(self, name: str, expected: str) -> ProtocolError:
        return ProtocolError(f"{self._where}{name} must be {expected}")

    def text(self, name: str) -> str:
        value = self._body.get(name)
        if type(value) is not str:
            raise self._fail(name, "a string")
        return value

    def opt_str(self, name: str) -> str | None:
        value = self._body.get(name)
        if value is not None and type(value) is not str:
            raise self._fail(name, "a string or nil")
        return value

    def integer(self, name: str) -> int:
        value = self._body.get(name)
        if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
            raise self._fail(name, "a 64-bit integer")
        return value

    def opt_int(self, name: str) -> int | None:
        value = self._body.get(name)
        if value is None:
            return None
        if type(value) is not int or not INT64_MIN <= value <= INT64_MAX:
            raise self._fail(name, "a 64-bit integer or nil")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        value = self._body.get(name, default)
        if type(value) is not bool:
            raise self._fail(name, "a boolean")
        return value

    def str_list(self, name: str) -> list[str]:
        value = self._body.get(name)
        if type(value) is not list or any(type(v) is not str for v in value):
            raise self._fail(name, "an array of strings")
        return value

    def array(self, name: str) -> list[Any]:
        value = self._body.get(name)
        if type(value) is not list:
            raise self._fail(name, "an array")
        return value


# -- operation bodies ------------------------------------------------------------


class WireJob(NamedTuple):
    """One job of an enqueue, type-checked (values not yet range-checked)."""

    queue: str
    job_type: str
    payload_data: bytes | None
    payload_encoding: str | None
    idempotency_key: str | None
    priority: int | None
    max_attempts: int | None
    scheduled_at_ms: int | None
    traceparent: str | None
    tracestate: str | None
    custom: dict[str, Any] | None


_PRIMITIVES = (str, int, float, bool)


def parse_job(raw: Any) -> WireJob:
    """One job map of an enqueue. ProtocolError (per job: the server turns it into
    that job's InvalidRequest rejection) if a field has the wrong type."""
    if type(raw) is not dict:
        raise ProtocolError("a job must be a map")
    payload = raw.get("payload")
    data = encoding = None
    if payload is not None:
        if type(payload) is not dict:
            raise ProtocolError("job.payload must be a map {data, encoding} or nil")
        data = payload.get("data")
        encoding = payload.get("encoding")
        if type(data) is not bytes:
            raise ProtocolError("job.payload.data must be binary (msgpack bin)")
        if type(encoding) is not str:
            raise ProtocolError("job.payload.encoding must be a string")
    trace = raw.get("trace_context")
    traceparent = tracestate = None
    if trace is not None:
        if type(trace) is not dict:
            raise ProtocolError("job.trace_context must be a map or nil")
        traceparent = trace.get("traceparent")
        tracestate = trace.get("tracestate")
        if type(traceparent) is not str:
            raise ProtocolError("job.trace_context.traceparent must be a string")
        if tracestate is not None and type(tracestate) is not str:
            raise ProtocolError("job.trace_context.tracestate must be a string or nil")
    custom = raw.get("custom")
    if custom is not None:
        if type(custom) is not dict:
            raise ProtocolError("job.custom must be a map or nil")
        for key, value in custom.items():
            if type(value) not in _PRIMITIVES:
                raise ProtocolError(
                    f"job.custom[{key!r:.40}] must be a string, integer, float or bool"
                )
            if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
                raise ProtocolError(f"job.custom[{key!r:.40}] does not fit in 64 bits")
    # The common fields read inline (a batch enqueue parses 256 of these per
    # request); the Fields helpers only produce the error on a wrong type.
    get = raw.get
    queue = get("queue")
    job_type = get("job_type")
    key = get("idempotency_key")
    priority = get("priority")
    max_attempts = get("max_attempts")
    scheduled_at = get("scheduled_at_ms")
    if (
        type(queue) is not str
        or type(job_type) is not str
        or (key is not None and type(key) is not str)
        or (
            priority is not None
            and (type(priority) is not int or not INT64_MIN <= priority <= INT64_MAX)
        )
        or (
            max_attempts is not None
            and (type(max_attempts) is not int or not INT64_MIN <= max_attempts <= INT64_MAX)
        )
        or (
            scheduled_at is not None
            and (type(scheduled_at) is not int or not INT64_MIN <= scheduled_at <= INT64_MAX)
        )
    ):
        f = Fields(raw, "job.")
        f.text("queue")
        f.text("job_type")
        f.opt_str("idempotency_key")
        f.opt_int("priority")
        f.opt_int("max_attempts")
        f.opt_int("scheduled_at_ms")
    job: WireJob = _new_tuple(
        WireJob,
        (
            queue,
            job_type,
            data,
            encoding,
            key,
            priority,
            max_attempts,
            scheduled_at,
            traceparent,
            tracestate,
            custom,
        ),
    )
    return job


class EnqueueBody(NamedTuple):
    jobs: list[WireJob | ProtocolError]
    atomic: bool


def parse_enqueue(body: dict[str, Any]) -> EnqueueBody:
    f = Fields(body)
    raw_jobs = f.array("jobs")
    jobs: list[WireJob | ProtocolError] = []
    for raw in raw_jobs:
        try:
            jobs.append(parse_job(raw))
        except ProtocolError as exc:
            jobs.append(exc)
    return EnqueueBody(jobs, f.flag("atomic"))


# How a reserve answer lays out each job (the request's `job_layout`, PROTOCOL.md
# 5.2): a map with named fields (the default), or an array of JOB_ARRAY_FIELDS in
# this order -- a third of the decoding work of the map for a client, since no
# field name is sent or decoded. A newer server may append fields to a row;
# readers ignore the ones past those they know.
JOB_LAYOUT_MAP = "map"
JOB_LAYOUT_ARRAY = "array"
JOB_ARRAY_FIELDS: tuple[str, ...] = (
    "id",
    "queue",
    "job_type",
    "payload_data",
    "payload_encoding",
    "priority",
    "max_attempts",
    "attempt",
    "enqueued_at_ms",
    "scheduled_at_ms",
    "lease_expires_at_ms",
    "traceparent",
    "tracestate",
    "custom",
)


class ReserveBody(NamedTuple):
    queues: list[str]
    lease_ms: int
    wait_ms: int
    max_jobs: int
    worker_id: str | None
    # "strict" (the default) or "fair" (issue 17); the core checks the value.
    order: str
    # How the answer lays out each job: JOB_LAYOUT_MAP (the default) or
    # JOB_LAYOUT_ARRAY (JOB_ARRAY_FIELDS, positionally; PROTOCOL.md 5.2).
    job_layout: str


def parse_reserve(body: dict[str, Any]) -> ReserveBody:
    get = body.get
    queues, lease_ms, wait_ms = get("queues"), get("lease_ms"), get("wait_ms")
    max_jobs, worker_id, order = get("max_jobs"), get("worker_id"), get("order")
    layout = get("job_layout")
    if (
        type(queues) is list
        and all(type(q) is str for q in queues)
        and type(lease_ms) is int
        and INT64_MIN <= lease_ms <= INT64_MAX
        and (wait_ms is None or (type(wait_ms) is int and INT64_MIN <= wait_ms <= INT64_MAX))
        and (max_jobs is None or (type(max_jobs) is int and INT64_MIN <= max_jobs <= INT64_MAX))
        and (worker_id is None or type(worker_id) is str)
        and (order is None or type(order) is str)
        and (layout is None or layout in (JOB_LAYOUT_ARRAY, JOB_LAYOUT_MAP))
    ):
        # Every field well-typed (a reserve per request): no Fields round trip.
        return _new_tuple(
            ReserveBody,
            (
                queues,
                lease_ms,
                0 if wait_ms is None else wait_ms,
                1 if max_jobs is None else max_jobs,
                worker_id,
                "strict" if order is None else order,
                JOB_LAYOUT_MAP if layout is None else layout,
            ),
        )
    f = Fields(body)  # a field has the wrong type: name it
    wait_ms = f.opt_int("wait_ms")
    max_jobs = f.opt_int("max_jobs")
    order = f.opt_str("order")
    layout = f.opt_str("job_layout")
    if layout is not None and layout not in (JOB_LAYOUT_ARRAY, JOB_LAYOUT_MAP):
        raise ProtocolError(
            f'job_layout must be "{JOB_LAYOUT_MAP}" or "{JOB_LAYOUT_ARRAY}", not {layout!r:.40}'
        )
    return ReserveBody(
        f.str_list("queues"),
        f.integer("lease_ms"),
        0 if wait_ms is None else wait_ms,
        1 if max_jobs is None else max_jobs,
        f.opt_str("worker_id"),
        "strict" if order is None else order,
        JOB_LAYOUT_MAP if layout is None else layout,
    )


class AckBody(NamedTuple):
    job_id: str
    attempt: int
    worker_id: str | None
    # The fencing token (PROTOCOL.md 5.3): the delivery's enqueued_at_ms, optional.
    enqueued_at_ms: int | None


def parse_ack(body: dict[str, Any]) -> AckBody:
    get = body.get
    job_id, attempt, worker_id = get("job_id"), get("attempt"), get("worker_id")
    enqueued_at_ms = get("enqueued_at_ms")
    if (
        type(job_id) is str
        and type(attempt) is int
        and INT64_MIN <= attempt <= INT64_MAX
        and (worker_id is None or type(worker_id) is str)
        and (
            enqueued_at_ms is None
            or (type(enqueued_at_ms) is int and INT64_MIN <= enqueued_at_ms <= INT64_MAX)
        )
    ):
        # Every field well-typed (an ack per request): no Fields round trip.
        return _new_tuple(AckBody, (job_id, attempt, worker_id, enqueued_at_ms))
    f = Fields(body)  # a field has the wrong type: name it
    return AckBody(
        f.text("job_id"), f.integer("attempt"), f.opt_str("worker_id"), f.opt_int("enqueued_at_ms")
    )


class ReleaseBody(NamedTuple):
    job_id: str
    attempt: int
    worker_id: str | None


def parse_release(body: dict[str, Any]) -> ReleaseBody:
    f = Fields(body)
    return ReleaseBody(f.text("job_id"), f.integer("attempt"), f.opt_str("worker_id"))


class WithdrawBody(NamedTuple):
    request_id: int


def parse_withdraw(body: dict[str, Any]) -> WithdrawBody:
    value = body.get("request_id")
    if type(value) is not int or not 0 <= value <= REQUEST_ID_MAX:
        raise ProtocolError("request_id must be an unsigned 64-bit integer")
    return WithdrawBody(value)


class NackBody(NamedTuple):
    job_id: str
    attempt: int
    retry: str
    delay_ms: int | None
    reason: str | None
    worker_id: str | None
    enqueued_at_ms: int | None


def parse_nack(body: dict[str, Any]) -> NackBody:
    f = Fields(body)
    retry = f.opt_str("retry") or RETRY_DEFAULT
    if retry not in (RETRY_DEFAULT, RETRY_DELAY, RETRY_DEAD_LETTER):
        raise ProtocolError(f"retry must be one of default, delay, dead_letter, got {retry!r:.40}")
    delay_ms = f.opt_int("delay_ms")
    if retry == RETRY_DELAY and delay_ms is None:
        raise ProtocolError("retry 'delay' needs delay_ms")
    return NackBody(
        f.text("job_id"),
        f.integer("attempt"),
        retry,
        delay_ms,
        f.opt_str("reason"),
        f.opt_str("worker_id"),
        f.opt_int("enqueued_at_ms"),
    )


class ExtendBody(NamedTuple):
    job_id: str
    attempt: int
    lease_ms: int
    worker_id: str | None
    enqueued_at_ms: int | None


def parse_extend(body: dict[str, Any]) -> ExtendBody:
    f = Fields(body)
    return ExtendBody(
        f.text("job_id"),
        f.integer("attempt"),
        f.integer("lease_ms"),
        f.opt_str("worker_id"),
        f.opt_int("enqueued_at_ms"),
    )


class SettleBody(NamedTuple):
    """A batch of acks, nacks and extends (PROTOCOL.md 5.13): each item parsed
    as the single operation's body (`AckBody`, `NackBody`, `ExtendBody`), or the
    ProtocolError that refused it (that item's ``invalid_argument`` result)."""

    items: list[AckBody | NackBody | ExtendBody | ProtocolError]


def _settle_item(raw: Any) -> AckBody | NackBody | ExtendBody:
    if type(raw) is not dict:
        raise ProtocolError("a settle item must be a map")
    kind = raw.get("kind")
    if kind == OP_ACK:
        return parse_ack(raw)
    if kind == OP_NACK:
        return parse_nack(raw)
    if kind == OP_EXTEND:
        return parse_extend(raw)
    raise ProtocolError(f"a settle item's kind must be ack, nack or extend, got {kind!r:.40}")


def parse_settle(body: dict[str, Any]) -> SettleBody:
    raw_items = Fields(body).array("items")
    if not raw_items:
        raise ProtocolError("a settle needs at least one item")
    if len(raw_items) > MAX_SETTLE_BATCH:
        raise ProtocolError(
            f"a settle holds at most {MAX_SETTLE_BATCH} items (max_settle_batch), "
            f"got {len(raw_items)}"
        )
    items: list[AckBody | NackBody | ExtendBody | ProtocolError] = []
    for raw in raw_items:
        try:
            items.append(_settle_item(raw))
        except ProtocolError as exc:
            items.append(exc)
    return SettleBody(items)


class DrainBody(NamedTuple):
    queue: str | None
    max_records: int


def parse_drain(body: dict[str, Any]) -> DrainBody:
    f = Fields(body)
    max_records = f.opt_int("max")
    return DrainBody(f.opt_str("queue"), 1 if max_records is None else max_records)


class HelloBody(NamedTuple):
    protocol: int
    api_key: str | None
    client: str | None


def parse_hello(body: dict[str, Any]) -> HelloBody:
    f = Fields(body)
    return HelloBody(f.integer("protocol"), f.opt_str("api_key"), f.opt_str("client"))


class QueueStatsBody(NamedTuple):
    queues: list[str] | None


def parse_queue_stats(body: dict[str, Any]) -> QueueStatsBody:
    if body.get("queues") is None:
        return QueueStatsBody(None)
    return QueueStatsBody(Fields(body).str_list("queues"))


# -- admin operation bodies (issue 15) ---------------------------------------------


class GetJobBody(NamedTuple):
    job_id: str


def parse_get_job(body: dict[str, Any]) -> GetJobBody:
    return GetJobBody(Fields(body).text("id"))


class ListJobsBody(NamedTuple):
    queue: str
    state: str
    cursor: str | None
    limit: int | None
    cause: str | None


def parse_list_jobs(body: dict[str, Any]) -> ListJobsBody:
    f = Fields(body)
    return ListJobsBody(
        f.text("queue"),
        f.text("state"),
        f.opt_str("cursor"),
        f.opt_int("limit"),
        f.opt_str("cause"),
    )


class QueueBody(NamedTuple):
    """queue_info, pause_queue, resume_queue, purge_queue, delete_queue."""

    queue: str
    reason: str | None


def parse_queue(body: dict[str, Any]) -> QueueBody:
    f = Fields(body)
    return QueueBody(f.text("queue"), f.opt_str("reason"))


class JobIdsBody(NamedTuple):
    """dead_letter_jobs, cancel_jobs."""

    job_ids: list[str]
    reason: str | None


def parse_job_ids(body: dict[str, Any]) -> JobIdsBody:
    f = Fields(body)
    return JobIdsBody(f.str_list("ids"), f.opt_str("reason"))


class DeadLettersBody(NamedTuple):
    """requeue_dead_letters, delete_dead_letters: by `ids`, or by `queue` and /
    or `cause` when `ids` is absent."""

    job_ids: list[str]
    queue: str | None
    cause: str | None
    reason: str | None


def parse_dead_letters(body: dict[str, Any]) -> DeadLettersBody:
    f = Fields(body)
    ids = [] if body.get("ids") is None else f.str_list("ids")
    return DeadLettersBody(ids, f.opt_str("queue"), f.opt_str("cause"), f.opt_str("reason"))


class PutQueueBody(NamedTuple):
    queue: str
    overrides: dict[str, int | str]
    reason: str | None


def parse_put_queue(body: dict[str, Any]) -> PutQueueBody:
    f = Fields(body)
    raw = body.get("overrides")
    overrides: dict[str, int | str] = {}
    if raw is not None:
        if type(raw) is not dict:
            raise ProtocolError("overrides must be a map")
        for key, value in raw.items():
            if type(key) is not str:
                raise ProtocolError("overrides keys must be strings")
            if not (type(value) is str or (type(value) is int and INT64_MIN <= value <= INT64_MAX)):
                raise ProtocolError(f"overrides.{key} must be a 64-bit integer or a string")
            overrides[key] = value
    return PutQueueBody(f.text("queue"), overrides, f.opt_str("reason"))


class ScheduleBody(NamedTuple):
    """pause_schedule, resume_schedule, delete_schedule."""

    name: str
    reason: str | None


def parse_schedule(body: dict[str, Any]) -> ScheduleBody:
    f = Fields(body)
    return ScheduleBody(f.text("name"), f.opt_str("reason"))


class PutScheduleBody(NamedTuple):
    name: str
    queue: str
    job_type: str
    cron: str | None
    timezone: str
    every_ms: int | None
    payload_data: bytes | None
    payload_encoding: str | None
    priority: int | None
    max_attempts: int | None
    custom: dict[str, Any] | None
    catch_up: str
    reason: str | None


def parse_put_schedule(body: dict[str, Any]) -> PutScheduleBody:
    """The wire types only; the core checks the values (a bad cron, an unknown
    time zone: invalid_argument naming the field)."""
    f = Fields(body)
    data: bytes | None = None
    encoding: str | None = None
    payload = body.get("payload")
    if payload is not None:
        if type(payload) is not dict:
            raise ProtocolError("payload must be a map {data, encoding}")
        data = payload.get("data")
        if type(data) is not bytes:
            raise ProtocolError("payload.data must be binary")
        encoding = Fields(payload).opt_str("encoding")
    custom = body.get("custom")
    if custom is not None and type(custom) is not dict:
        raise ProtocolError("custom must be a map")
    timezone = f.opt_str("timezone")
    catch_up = f.opt_str("catch_up")
    return PutScheduleBody(
        name=f.text("name"),
        queue=f.text("queue"),
        job_type=f.text("job_type"),
        cron=f.opt_str("cron"),
        timezone="UTC" if timezone is None else timezone,
        every_ms=f.opt_int("every_ms"),
        payload_data=data,
        payload_encoding=encoding,
        priority=f.opt_int("priority"),
        max_attempts=f.opt_int("max_attempts"),
        custom=custom,
        catch_up="one" if catch_up is None else catch_up,
        reason=f.opt_str("reason"),
    )


PARSERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    OP_HELLO: parse_hello,
    OP_ENQUEUE: parse_enqueue,
    OP_RESERVE: parse_reserve,
    OP_ACK: parse_ack,
    OP_NACK: parse_nack,
    OP_EXTEND: parse_extend,
    OP_DRAIN_DEAD_LETTERS: parse_drain,
    OP_QUEUE_STATS: parse_queue_stats,
    OP_RELEASE: parse_release,
    OP_WITHDRAW: parse_withdraw,
    OP_SETTLE: parse_settle,
    OP_SERVER_INFO: lambda body: None,
    OP_HEALTH: lambda body: None,
    OP_GET_JOB: parse_get_job,
    OP_LIST_JOBS: parse_list_jobs,
    OP_LIST_QUEUES: lambda body: None,
    OP_QUEUE_INFO: parse_queue,
    OP_DEAD_LETTER_JOBS: parse_job_ids,
    OP_CANCEL_JOBS: parse_job_ids,
    OP_REQUEUE_DEAD_LETTERS: parse_dead_letters,
    OP_DELETE_DEAD_LETTERS: parse_dead_letters,
    OP_PAUSE_QUEUE: parse_queue,
    OP_RESUME_QUEUE: parse_queue,
    OP_PURGE_QUEUE: parse_queue,
    OP_PUT_QUEUE: parse_put_queue,
    OP_DELETE_QUEUE: parse_queue,
    OP_LIST_SCHEDULES: lambda body: None,
    OP_PUT_SCHEDULE: parse_put_schedule,
    OP_PAUSE_SCHEDULE: parse_schedule,
    OP_RESUME_SCHEDULE: parse_schedule,
    OP_DELETE_SCHEDULE: parse_schedule,
}


def parse_body(request: Request) -> Any:
    """The typed body of a request; ProtocolError (with `.request_id`) if its
    fields have the wrong types."""
    try:
        return PARSERS[request.op](request.body)
    except ProtocolError as exc:
        exc.request_id = request.id  # type: ignore[attr-defined]
        raise


# -- response bodies (server side builds, client side reads) -------------------------


def job_body(
    job_id: str,
    queue: str,
    job_type: str,
    payload_data: bytes | None,
    payload_encoding: str | None,
    priority: int,
    attempt: int,
    max_attempts: int,
    enqueued_at_ms: int,
    scheduled_at_ms: int | None,
    lease_expires_at_ms: int | None,
    traceparent: str | None,
    tracestate: str | None,
    custom: dict[str, Any] | None,
) -> dict[str, Any]:
    """A delivered (or dead-lettered) job as the wire carries it."""
    return {
        "id": job_id,
        "queue": queue,
        "job_type": job_type,
        "payload": None
        if payload_data is None
        else {"data": payload_data, "encoding": payload_encoding},
        "priority": priority,
        "attempt": attempt,
        "max_attempts": max_attempts,
        "enqueued_at_ms": enqueued_at_ms,
        "scheduled_at_ms": scheduled_at_ms,
        "lease_expires_at_ms": lease_expires_at_ms,
        "trace_context": None
        if traceparent is None
        else {"traceparent": traceparent, "tracestate": tracestate},
        "custom": custom or {},
    }
