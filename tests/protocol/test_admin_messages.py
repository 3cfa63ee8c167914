"""The admin operations' bodies (PROTOCOL.md 5.14-5.27): each parses into typed
values or raises ProtocolError naming the field; each is a known operation."""

from __future__ import annotations

import pytest

from sepp.protocol import ProtocolError, decode_request, encode_request
from sepp.protocol import errors as perr
from sepp.protocol import messages as pm


def parse(op: str, body: dict) -> object:
    return pm.parse_body(decode_request(encode_request(7, op, body)))


def test_every_admin_op_is_a_known_operation_with_a_parser() -> None:
    for op in pm.ADMIN_OPS:
        assert op in pm.OPS and op in pm.PARSERS


def test_permission_denied_is_an_error_status() -> None:
    assert perr.PERMISSION_DENIED in perr.ERROR_CODES and perr.PERMISSION_DENIED in perr.STATUSES


def test_admin_bodies_parse_into_their_typed_fields() -> None:
    assert parse(pm.OP_GET_JOB, {"id": "j"}) == pm.GetJobBody("j")
    assert parse(pm.OP_LIST_JOBS, {"queue": "q", "state": "ready"}) == pm.ListJobsBody(
        "q", "ready", None, None, None
    )
    assert parse(
        pm.OP_LIST_JOBS,
        {"queue": "q", "state": "dead_letter", "cursor": "1.2", "limit": 5, "cause": "admin"},
    ) == pm.ListJobsBody("q", "dead_letter", "1.2", 5, "admin")
    assert parse(pm.OP_LIST_QUEUES, {}) is None
    assert parse(pm.OP_PAUSE_QUEUE, {"queue": "q", "reason": "r"}) == pm.QueueBody("q", "r")
    assert parse(pm.OP_CANCEL_JOBS, {"ids": ["a", "b"]}) == pm.JobIdsBody(["a", "b"], None)
    assert parse(pm.OP_REQUEUE_DEAD_LETTERS, {"queue": "q"}) == pm.DeadLettersBody(
        [], "q", None, None
    )
    assert parse(pm.OP_DELETE_DEAD_LETTERS, {"ids": ["a"], "cause": "admin"}) == (
        pm.DeadLettersBody(["a"], None, "admin", None)
    )
    assert parse(
        pm.OP_PUT_QUEUE, {"queue": "q", "overrides": {"default_priority": 3, "retry_backoff": "x"}}
    ) == pm.PutQueueBody("q", {"default_priority": 3, "retry_backoff": "x"}, None)
    assert parse(pm.OP_PUT_QUEUE, {"queue": "q"}) == pm.PutQueueBody("q", {}, None)


@pytest.mark.parametrize(
    ("op", "body", "field"),
    [
        (pm.OP_GET_JOB, {}, "id"),
        (pm.OP_LIST_JOBS, {"queue": "q", "state": 3}, "state"),
        (pm.OP_LIST_JOBS, {"queue": "q", "state": "ready", "limit": "10"}, "limit"),
        (pm.OP_QUEUE_INFO, {"queue": None}, "queue"),
        (pm.OP_DEAD_LETTER_JOBS, {"ids": "abc"}, "ids"),
        (pm.OP_REQUEUE_DEAD_LETTERS, {"ids": [1]}, "ids"),
        (pm.OP_PUT_QUEUE, {"queue": "q", "overrides": []}, "overrides"),
        (pm.OP_PUT_QUEUE, {"queue": "q", "overrides": {"k": 1.5}}, "overrides.k"),
        (pm.OP_PURGE_QUEUE, {"queue": "q", "reason": 5}, "reason"),
    ],
)
def test_a_malformed_admin_body_is_a_protocol_error_naming_the_field(op, body, field) -> None:
    with pytest.raises(ProtocolError, match=field):
        parse(op, body)
