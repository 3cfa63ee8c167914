"""The client's translation tables, without sockets: wire errors to exception
classes, rejection maps to rejection values, wire jobs / records / server info
to domain types, and times and durations to and from milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sepp.client import _convert
from sepp.client.errors import (
    AttemptMismatchError,
    ClientError,
    CustomEntriesTooMany,
    CustomKeyTooLong,
    CustomMapTooLarge,
    EncodingNotAllowed,
    IdempotencyKeyTooLong,
    InvalidRequest,
    InvalidRequestError,
    JobConversionError,
    JobNotFoundError,
    JobTypeNameTooLong,
    JobTypeNotAllowed,
    LeaseError,
    MalformedResponseError,
    MessageTooLargeError,
    OverloadedError,
    PayloadTooLarge,
    QueueClosing,
    QueueFull,
    QueueNameTooLong,
    ReserveError,
    ScheduledTooFar,
    ServerInfoError,
    ServerInternalError,
    TransportError,
    UnauthenticatedError,
    UnexpectedStatusError,
    UnknownQueue,
    UnknownQueuesError,
    UnknownRejection,
    error_from_response,
    rejection_from_wire,
)
from sepp.client.types import (
    DeadLetterCause,
    EnqueueRequest,
    Payload,
    Priority,
    PriorityOutOfRangeError,
    ReserveOptions,
    TraceContext,
    TraceContextError,
)
from tests.client.fakeserver import SERVER_INFO, job_row, make_job

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# -- errors ---------------------------------------------------------------------------------

ERROR_TABLE = [
    # (op, code, extra body, expected class)
    ("enqueue", "invalid_argument", {}, InvalidRequestError),
    ("ack", "not_found", {}, JobNotFoundError),
    ("nack", "not_found", {}, JobNotFoundError),
    ("extend", "not_found", {}, JobNotFoundError),
    ("server_info", "not_found", {}, UnexpectedStatusError),
    ("ack", "failed_precondition", {"reason": "attempt_mismatch"}, AttemptMismatchError),
    ("extend", "failed_precondition", {}, AttemptMismatchError),
    ("reserve", "failed_precondition", {"reason": "unknown_queue"}, UnknownQueuesError),
    ("reserve", "failed_precondition", {}, UnknownQueuesError),
    ("enqueue", "failed_precondition", {}, UnexpectedStatusError),
    ("enqueue", "unauthenticated", {}, UnauthenticatedError),
    ("enqueue", "resource_exhausted", {"reason": "overloaded"}, OverloadedError),
    ("ack", "resource_exhausted", {"reason": "too_many_requests"}, OverloadedError),
    ("", "resource_exhausted", {"reason": "frame_too_large"}, MessageTooLargeError),
    ("enqueue", "unavailable", {"reason": "shutting_down"}, TransportError),
    ("enqueue", "internal", {"reason": "storage_failed"}, ServerInternalError),
]


@pytest.mark.parametrize(("op", "code", "extra", "expected"), ERROR_TABLE)
def test_each_error_code_maps_to_its_exception_class(
    op: str, code: str, extra: dict[str, object], expected: type
) -> None:
    body = {"message": "the server's words", **extra}
    error = error_from_response(op, code, body)
    assert type(error) is expected
    assert error.code == code
    assert error.reason == extra.get("reason")
    assert error.details == body
    assert "the server's words" in str(error)


def test_attempt_mismatch_carries_the_current_attempt() -> None:
    error = error_from_response(
        "nack",
        "failed_precondition",
        {"message": "m", "reason": "attempt_mismatch", "current_attempt": 4},
    )
    assert isinstance(error, AttemptMismatchError)
    assert isinstance(error, LeaseError)
    assert error.current_attempt == 4


def test_unknown_queues_error_lists_the_queues() -> None:
    error = error_from_response(
        "reserve",
        "failed_precondition",
        {"message": "m", "reason": "unknown_queue", "queues": ["a", "b"]},
    )
    assert isinstance(error, UnknownQueuesError)
    assert isinstance(error, ReserveError)
    assert error.queues == ["a", "b"]


def test_fencing_errors_are_not_client_errors_and_transport_ones_are() -> None:
    # As in sepp-py: lease errors are domain errors, not transport failures.
    assert not issubclass(JobNotFoundError, ClientError)
    assert not issubclass(AttemptMismatchError, ClientError)
    for cls in (TransportError, OverloadedError, UnauthenticatedError, ServerInternalError):
        assert issubclass(cls, ClientError)


# -- rejections -------------------------------------------------------------------------------

REJECTION_TABLE = [
    ({"reason": "unknown_queue", "queue": "q"}, UnknownQueue("q")),
    ({"reason": "payload_too_large", "limit": 10, "actual": 11}, PayloadTooLarge(10, 11)),
    (
        {"reason": "encoding_not_allowed", "encoding": "x", "allowed": ["a"]},
        EncodingNotAllowed("x", ["a"]),
    ),
    (
        {"reason": "job_type_not_allowed", "job_type": "t", "allowed": ["u"]},
        JobTypeNotAllowed("t", ["u"]),
    ),
    ({"reason": "custom_entries_too_many", "limit": 1, "actual": 2}, CustomEntriesTooMany(1, 2)),
    ({"reason": "custom_map_too_large", "limit": 3, "actual": 4}, CustomMapTooLarge(3, 4)),
    (
        {"reason": "custom_key_too_long", "key": "k", "limit": 5, "actual": 6},
        CustomKeyTooLong("k", 5, 6),
    ),
    ({"reason": "queue_name_too_long", "limit": 7, "actual": 8}, QueueNameTooLong(7, 8)),
    ({"reason": "job_type_name_too_long", "limit": 9, "actual": 10}, JobTypeNameTooLong(9, 10)),
    (
        {"reason": "idempotency_key_too_long", "limit": 11, "actual": 12},
        IdempotencyKeyTooLong(11, 12),
    ),
    (
        {"reason": "scheduled_too_far", "horizon_ms": 60_000, "actual": 1_764_500_000_000},
        ScheduledTooFar(timedelta(minutes=1), datetime(2025, 11, 30, 10, 53, 20, tzinfo=UTC)),
    ),
    ({"reason": "invalid_request", "message": "empty job_type"}, InvalidRequest("empty job_type")),
    ({"reason": "queue_full", "queue": "q", "limit": 100}, QueueFull("q", 100)),
    ({"reason": "queue_closing", "queue": "q"}, QueueClosing("q")),
]


@pytest.mark.parametrize(("raw", "expected"), REJECTION_TABLE, ids=lambda v: str(v)[:40])
def test_each_rejection_reason_becomes_its_value_class(raw: dict, expected: object) -> None:
    raw = {"message": "described", "transient": False, **raw}
    rejection = rejection_from_wire(raw)
    assert rejection == expected
    assert rejection.message
    assert str(rejection) == rejection.message


def test_only_queue_full_and_closing_are_transient() -> None:
    transient = {type(r) for _, r in REJECTION_TABLE if r.transient}
    assert transient == {QueueFull, QueueClosing}


def test_an_unknown_rejection_reason_is_kept_not_fatal() -> None:
    rejection = rejection_from_wire({"reason": "new_in_v2", "message": "later", "transient": True})
    assert isinstance(rejection, UnknownRejection)
    assert rejection.reason == "new_in_v2"
    assert rejection.detail == "later"
    assert rejection.transient


def test_a_known_rejection_with_missing_fields_is_a_malformed_response() -> None:
    with pytest.raises(MalformedResponseError):
        rejection_from_wire({"reason": "payload_too_large", "message": "m", "limit": 1})


# -- time --------------------------------------------------------------------------------------


def test_datetimes_convert_to_epoch_milliseconds_and_back() -> None:
    moment = datetime(2025, 11, 30, 12, 0, 0, 123_999, tzinfo=UTC)
    ms = _convert.datetime_to_ms(moment)
    assert ms == 1_764_504_000_123  # floored: sub-millisecond digits dropped
    assert _convert.ms_to_datetime(ms) == moment.replace(microsecond=123_000)
    assert _convert.ms_to_datetime(ms).tzinfo is UTC  # type: ignore[union-attr]


def test_naive_datetimes_are_utc_and_other_zones_are_converted() -> None:
    naive = datetime(2025, 1, 1, 0, 0)
    plus_two = datetime(2025, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2)))
    assert _convert.datetime_to_ms(naive) == _convert.datetime_to_ms(plus_two)


def test_negative_or_huge_milliseconds_are_not_datetimes() -> None:
    assert _convert.ms_to_datetime(-1) is None
    assert _convert.ms_to_datetime(2**62) is None


def test_timedeltas_become_whole_milliseconds_and_leases_round_up() -> None:
    assert _convert.timedelta_to_ms(timedelta(seconds=1.5)) == 1500
    assert _convert.timedelta_to_ms(timedelta(microseconds=1500)) == 1
    assert _convert.timedelta_to_ms(timedelta(microseconds=500), round_up=True) == 1
    assert _convert.timedelta_to_ms(timedelta(milliseconds=7), round_up=True) == 7


# -- domain values ---------------------------------------------------------------------------


def test_priority_accepts_0_to_9_only() -> None:
    assert Priority(9) == Priority.MAX == Priority.P9
    assert int(Priority.P3) == 3
    assert Priority.P1 < Priority.P2
    for bad in (-1, 10, True, 1.0):
        with pytest.raises(PriorityOutOfRangeError):
            Priority(bad)  # type: ignore[arg-type]


def test_trace_context_validates_traceparent() -> None:
    assert TraceContext(TRACEPARENT).tracestate is None
    for bad in (
        "",
        "00-abc",
        TRACEPARENT.replace("4bf9", "zzzz"),
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
    ):
        with pytest.raises(TraceContextError):
            TraceContext(bad)


def test_trace_context_otel_helpers_are_no_ops_without_opentelemetry() -> None:
    assert TraceContext.from_current_otel() is None
    assert TraceContext(TRACEPARENT).otel_span_context() is None
    with TraceContext(TRACEPARENT).attach_to_otel():
        pass


def test_enqueue_request_validates_and_coerces_priority() -> None:
    assert EnqueueRequest("q", "t", priority=5).priority == Priority.P5
    with pytest.raises(ValueError):
        EnqueueRequest("", "t")
    with pytest.raises(ValueError):
        EnqueueRequest("q", "")
    with pytest.raises(PriorityOutOfRangeError):
        EnqueueRequest("q", "t", priority=10)


def test_enqueue_request_becomes_the_wire_job_map() -> None:
    request = EnqueueRequest(
        "emails",
        "send",
        payload=Payload(b"\x00\x01", "application/octet-stream"),
        idempotency_key="k1",
        priority=Priority.P7,
        max_attempts=5,
        custom={"user": 42, "vip": True, "ratio": 0.5, "name": "x"},
        trace_context=TraceContext(TRACEPARENT, "a=b"),
        scheduled_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert _convert.enqueue_job_to_wire(request) == {
        "queue": "emails",
        "job_type": "send",
        "payload": {"data": b"\x00\x01", "encoding": "application/octet-stream"},
        "idempotency_key": "k1",
        "priority": 7,
        "max_attempts": 5,
        "scheduled_at_ms": 1_893_456_000_000,
        "trace_context": {"traceparent": TRACEPARENT, "tracestate": "a=b"},
        "custom": {"user": 42, "vip": True, "ratio": 0.5, "name": "x"},
    }


def test_unset_fields_are_left_out_so_queue_defaults_apply() -> None:
    wire = _convert.enqueue_job_to_wire(EnqueueRequest("q", "t"))
    assert wire == {"queue": "q", "job_type": "t"}


def test_pre_epoch_schedule_is_sent_as_ready_now() -> None:
    request = EnqueueRequest("q", "t", scheduled_at=datetime(1960, 1, 1, tzinfo=UTC))
    assert "scheduled_at_ms" not in _convert.enqueue_job_to_wire(request)


def test_custom_values_must_be_primitives() -> None:
    with pytest.raises(TypeError):
        _convert.enqueue_job_to_wire(EnqueueRequest("q", "t", custom={"a": [1]}))  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        _convert.enqueue_job_to_wire(EnqueueRequest("q", "t", custom={"a": 2**64}))


def test_reserve_options_validate_like_sepp_py() -> None:
    opts = ReserveOptions(("a", "b"), timedelta(seconds=30))
    assert opts.queues == ["a", "b"]
    assert opts.wait_timeout == timedelta(seconds=30)
    for kwargs in (
        {"queues": [], "lease_duration": timedelta(seconds=1)},
        {"queues": ["a", ""], "lease_duration": timedelta(seconds=1)},
        {"queues": ["a"], "lease_duration": timedelta(0)},
        {"queues": ["a"], "lease_duration": timedelta(seconds=1), "max_jobs": 0},
        {"queues": ["a"], "lease_duration": timedelta(seconds=1), "worker_id": ""},
        {"queues": "a", "lease_duration": timedelta(seconds=1)},
    ):
        with pytest.raises(ValueError):
            ReserveOptions(**kwargs)  # type: ignore[arg-type]


# -- decoding ----------------------------------------------------------------------------------


def test_a_delivered_job_decodes_with_datetimes_and_priority() -> None:
    raw = make_job(
        "send",
        queue="emails",
        job_id="0b6f1c5e-3f7a-4d2b-9b1e-8f0c2a9d4e11",
        priority=4,
        attempt=2,
        max_attempts=5,
        enqueued_at_ms=1_764_500_000_000,
        scheduled_at_ms=1_764_500_001_000,
        custom={"k": "v"},
        traceparent=TRACEPARENT,
    )
    raw["lease_expires_at_ms"] = 1_764_500_030_000
    job = _convert.job_from_wire(raw)
    assert job.payload == Payload(b"{}", "application/json")
    ctx = job.ctx
    assert (ctx.id, ctx.queue, ctx.job_type) == (raw["id"], "emails", "send")
    assert ctx.priority == Priority.P4
    assert (ctx.attempt, ctx.max_attempts) == (2, 5)
    assert ctx.enqueued_at == datetime(2025, 11, 30, 10, 53, 20, tzinfo=UTC)
    assert ctx.scheduled_at == datetime(2025, 11, 30, 10, 53, 21, tzinfo=UTC)
    assert ctx.lease_expires_at == datetime(2025, 11, 30, 10, 53, 50, tzinfo=UTC)
    assert ctx.custom == {"k": "v"}
    assert ctx.trace_context == TraceContext(TRACEPARENT)


def test_a_job_without_payload_or_schedule_decodes_to_none() -> None:
    raw = make_job(payload=None)
    raw["lease_expires_at_ms"] = 1
    job = _convert.job_from_wire(raw)
    assert job.payload is None
    assert job.ctx.scheduled_at is None


def test_a_bad_trace_context_is_dropped_not_the_job() -> None:
    raw = make_job(traceparent="garbage")
    raw["lease_expires_at_ms"] = 1
    assert _convert.job_from_wire(raw).ctx.trace_context is None


@pytest.mark.parametrize(
    "damage",
    [
        {"id": None},
        {"job_type": ""},
        {"priority": 12},
        {"attempt": "1"},
        {"attempt": True},
        {"enqueued_at_ms": -5},
        {"lease_expires_at_ms": None},
        {"payload": {"data": "not bytes", "encoding": "x"}},
        {"custom": {"k": [1]}},
    ],
)
def test_a_malformed_job_raises_job_conversion_error(damage: dict) -> None:
    raw = make_job()
    raw["lease_expires_at_ms"] = 1
    raw.update(damage)
    with pytest.raises(JobConversionError):
        _convert.job_from_wire(raw)


def test_a_dead_letter_record_decodes_and_replays() -> None:
    job = make_job("send", queue="emails", priority=3, max_attempts=4, custom={"a": 1})
    raw = {
        "job": job,
        "cause": "rejected",
        "failed_at_ms": 1_764_500_000_000,
        "final_attempt": 2,
        "last_reason": "boom",
    }
    record = _convert.dead_letter_from_wire(raw)
    assert record.cause is DeadLetterCause.REJECTED
    assert record.failed_at == datetime(2025, 11, 30, 10, 53, 20, tzinfo=UTC)
    assert (record.final_attempt, record.last_reason) == (2, "boom")
    replay = record.to_enqueue_request()
    assert (replay.queue, replay.job_type, replay.priority) == ("emails", "send", Priority.P3)
    assert replay.max_attempts == 4
    assert replay.custom == {"a": 1}
    assert replay.scheduled_at is None


def test_an_unknown_dead_letter_cause_is_unspecified() -> None:
    raw = {"job": make_job(), "cause": "cosmic_ray", "failed_at_ms": 0, "final_attempt": 1}
    assert _convert.dead_letter_from_wire(raw).cause is DeadLetterCause.UNSPECIFIED


def test_server_info_decodes_durations_and_times() -> None:
    info = _convert.server_info_from_wire(SERVER_INFO)
    assert info.version == "0.1.0"
    assert info.server_time == datetime(2025, 11, 30, 10, 53, 20, tzinfo=UTC)
    assert info.max_schedule_horizon == timedelta(days=30)
    assert info.max_wait_timeout == info.max_lease_duration == timedelta(minutes=5)
    assert info.dead_letter_retention == timedelta(days=1)
    assert info.persist_mode == "sync_data"
    assert info.max_message_bytes == 16_777_216


def test_server_info_missing_a_field_is_an_error() -> None:
    broken = dict(SERVER_INFO)
    del broken["max_reserve_batch"]
    with pytest.raises(ServerInfoError):
        _convert.server_info_from_wire(broken)


def test_queue_stats_decode_with_optional_age() -> None:
    stats = _convert.queue_stats_from_wire(
        {
            "server_time_ms": 1,
            "queues": [
                {
                    "name": "a",
                    "ready": 1,
                    "scheduled": 2,
                    "in_flight": 3,
                    "dead_lettered": 4,
                    "oldest_ready_age_ms": 1500,
                },
                {
                    "name": "b",
                    "ready": 0,
                    "scheduled": 0,
                    "in_flight": 0,
                    "dead_lettered": 0,
                    "oldest_ready_age_ms": None,
                },
            ],
        }
    )
    assert stats[0].oldest_ready_age == timedelta(seconds=1.5)
    assert (stats[0].ready, stats[0].scheduled, stats[0].in_flight, stats[0].dead_lettered) == (
        1,
        2,
        3,
        4,
    )
    assert stats[1].oldest_ready_age is None


class WireMap(dict):  # type: ignore[type-arg]
    """A map that is not exactly a dict: job_from_wire reads it field by field."""


def test_the_usual_delivered_job_decodes_like_the_field_by_field_reading() -> None:
    # No scheduled_at: the one-pass reading (job_from_wire's fast path), whose
    # payload is built without re-running Payload's checks. It must give what
    # the field-by-field reading gives, and a Payload like any other.
    raw = make_job("send", payload=b"\x00body", encoding="b", enqueued_at_ms=1_764_500_000_123)
    raw["lease_expires_at_ms"] = 1_764_500_030_456
    raw["attempt"] = 1
    fast = _convert.job_from_wire(raw)
    slow = _convert.job_from_wire(WireMap(raw))  # not exactly a dict: field by field
    assert fast.payload == slow.payload == Payload(b"\x00body", "b")
    assert hash(fast.payload) == hash(Payload(b"\x00body", "b"))
    with pytest.raises(AttributeError):
        fast.payload.data = b"other"  # type: ignore[misc,union-attr]
    assert (
        fast.ctx.enqueued_at
        == slow.ctx.enqueued_at
        == datetime(2025, 11, 30, 10, 53, 20, 123_000, tzinfo=UTC)
    )
    assert fast.ctx.lease_expires_at == datetime(2025, 11, 30, 10, 53, 50, 456_000, tzinfo=UTC)
    assert fast.ctx.scheduled_at is None


# -- the array layout of a reserve answer (PROTOCOL.md §5.2, `job_layout`) ----------------


def _delivered(**fields: object) -> dict:
    fields.setdefault("enqueued_at_ms", 1_764_500_000_123)
    job = make_job("send", queue="emails", **fields)  # type: ignore[arg-type]
    job["attempt"] = 2
    job["lease_expires_at_ms"] = 1_764_500_030_456
    return job


_DELIVERED = {
    "usual": _delivered(),
    "no payload": _delivered(payload=None),
    "custom and trace": _delivered(custom={"k": "v", "n": 3}, traceparent=TRACEPARENT),
    "a broken trace": _delivered(traceparent="garbage"),
    "scheduled": _delivered(scheduled_at_ms=1_764_500_000_999),
    "scheduled in the past": _delivered(scheduled_at_ms=5),
}


@pytest.mark.parametrize("name", list(_DELIVERED))
def test_a_job_row_decodes_as_the_map_it_stands_for(name: str) -> None:
    job = _DELIVERED[name]
    row = job_row(job)
    expected = dict(job, custom=job["custom"] or {})
    assert _convert.job_map_of_row(row) == expected
    from_row = _convert.job_from_wire(row)
    assert from_row == _convert.job_from_wire(job)
    assert from_row.ctx.lease_expires_at == datetime(2025, 11, 30, 10, 53, 50, 456_000, tzinfo=UTC)
    # A newer server may append fields: they are ignored.
    assert _convert.job_from_wire([*row, "a later field", 7]) == from_row


@pytest.mark.parametrize(
    "damage",
    [
        {"id": None},
        {"id": ""},
        {"job_type": 5},
        {"queue": None},
        {"priority": 12},
        {"attempt": "1"},
        {"attempt": True},
        {"max_attempts": None},
        {"enqueued_at_ms": -5},
        {"lease_expires_at_ms": None},
        {"scheduled_at_ms": "soon"},
        {"payload": {"data": "not bytes", "encoding": "x"}},
        {"payload": {"data": b"x", "encoding": None}},
        {"payload": {"data": None, "encoding": "x"}},
        {"custom": {"k": [1]}},
        {"custom": ["k"]},
    ],
)
def test_a_damaged_row_is_refused_as_its_map_is(damage: dict) -> None:
    job = dict(_delivered(), **damage)
    with pytest.raises(JobConversionError) as from_map:
        _convert.job_from_wire(job)
    with pytest.raises(JobConversionError) as from_row:
        _convert.job_from_wire(job_row(job))
    assert str(from_row.value) == str(from_map.value)


def test_a_row_too_short_is_refused_and_left_as_it_came() -> None:
    row = job_row(_delivered())[:-1]
    with pytest.raises(JobConversionError, match="a job row needs 14 fields, got 13"):
        _convert.job_from_wire(row)
    assert _convert.job_map_of_row(row) is row


def test_delivered_times_are_exact_past_the_remembered_ones() -> None:
    # More distinct times than _convert remembers (it forgets them all at once).
    base = 1_764_500_000_000
    for i in range(700):
        job = _delivered(enqueued_at_ms=base + i * 7)
        job["lease_expires_at_ms"] = base + 30_000 + i % 3
        ctx = _convert.job_from_wire(job_row(job) if i % 2 else job).ctx
        assert ctx.enqueued_at == datetime(2025, 11, 30, 10, 53, 20, tzinfo=UTC) + timedelta(
            milliseconds=i * 7
        )
        assert ctx.lease_expires_at == datetime(2025, 11, 30, 10, 53, 50, tzinfo=UTC) + timedelta(
            milliseconds=i % 3
        )
