"""The server's translation between protocol values and core commands."""

from __future__ import annotations

from sepp.core.commands import Ack, Enqueue, NewJob, Reserve
from sepp.core.results import JobView
from sepp.protocol.errors import ProtocolError
from sepp.protocol.messages import JOB_ARRAY_FIELDS, WireJob, parse_job
from sepp.server.wire import job_view_row, new_job


def test_a_wire_job_maps_field_by_field_onto_new_job() -> None:
    # new_job builds NewJob positionally from a WireJob: the field orders must agree.
    wire_fields = [name.removesuffix("_ms") for name in WireJob._fields]
    assert list(NewJob._fields) == ["job_id", *wire_fields, "invalid"]


def test_a_job_row_is_a_job_view_in_its_own_field_order() -> None:
    # job_view_row is list(view): JOB_ARRAY_FIELDS must name JobView's fields in order.
    wire_names = {"job_id": "id", "enqueued_at": "enqueued_at_ms"}
    wire_names |= {"scheduled_at": "scheduled_at_ms", "lease_expires_at": "lease_expires_at_ms"}
    assert tuple(wire_names.get(name, name) for name in JobView._fields) == JOB_ARRAY_FIELDS
    view = JobView("i", "q", "t", None, None, 3, 5, 2, 10, None, 40, None, None, {"k": 1})
    assert job_view_row(view) == [
        "i",
        "q",
        "t",
        None,
        None,
        3,
        5,
        2,
        10,
        None,
        40,
        None,
        None,
        {"k": 1},
    ]
    assert job_view_row(view._replace(custom={}))[13] is None


def test_every_field_of_a_job_map_reaches_the_command() -> None:
    wire = parse_job(
        {
            "queue": "q",
            "job_type": "t",
            "payload": {"data": b"d", "encoding": "e"},
            "idempotency_key": "k",
            "priority": 4,
            "max_attempts": 7,
            "scheduled_at_ms": 123,
            "trace_context": {"traceparent": "tp", "tracestate": "ts"},
            "custom": {"a": 1},
        }
    )
    job = new_job("00000000-0000-4000-8000-000000000000", wire)
    assert job == NewJob(
        job_id="00000000-0000-4000-8000-000000000000",
        queue="q",
        job_type="t",
        payload_data=b"d",
        payload_encoding="e",
        idempotency_key="k",
        priority=4,
        max_attempts=7,
        scheduled_at=123,
        traceparent="tp",
        tracestate="ts",
        custom={"a": 1},
    )


def test_a_malformed_job_becomes_an_invalid_command_in_its_place() -> None:
    job = new_job(
        "00000000-0000-4000-8000-000000000000", ProtocolError("job.queue must be a string")
    )
    assert job.invalid == "job.queue must be a string"


def test_the_commands_the_server_builds_positionally_keep_their_field_order() -> None:
    # op_enqueue / op_reserve / op_ack build these with tuple.__new__ (the hot path):
    # a reordered field would pass a value to the wrong name without an error.
    assert Enqueue._fields == ("jobs", "atomic")
    assert Reserve._fields == (
        "queues",
        "lease_ms",
        "max_jobs",
        "worker_id",
        "max_bytes",
        "order",
    )
    assert Ack._fields == ("job_id", "attempt", "worker_id", "enqueued_at")
