"""Every per-job rejection arrives as its own variant of the JobRejection oneof,
with its fields (sepp-semantics.md §13): one row per variant, end to end through a
server with tight limits, and one row per rejection class through the
translation (QueueClosing has no trigger on this server yet: the translation row
covers it). Atomic failures list every failing job with its index.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from sepp.core import results as r
from sepp.grpc import convert
from sepp.grpc.v1 import queue_pb2 as pb
from sepp.server.config import load_config
from tests.grpc.conftest import grpc_address, job, stub_for
from tests.inprocess import DATA_DIR, in_process

pytestmark = pytest.mark.usefixtures("in_process_env")

TIGHT = """
[server]
strict_queues = true

[limits]
max_payload_bytes = 100
allowed_encodings = ["text/plain"]
max_custom_entries = 2
max_custom_total_bytes = 40
max_custom_key_bytes = 8
max_queue_name_bytes = 10
max_job_type_bytes = 10
max_idempotency_key_bytes = 10
max_schedule_horizon_ms = 60000

[[queues]]
name = "q"
allowed_job_types = ["t", "u", "tttttttttttt"]

[[queues]]
name = "full"
max_queue_depth = 0
"""


def tight_config(tmp_path):
    path = tmp_path / "tight.toml"
    path.write_text(TIGHT)
    return load_config(
        str(path),
        env={"SEPP_ADMIN__LISTEN_ADDR": "off", "SEPP_GRPC__LISTEN_ADDR": "127.0.0.1:0"},
        overrides={("server", "data_dir"): DATA_DIR, ("server", "listen_addr"): "127.0.0.1:0"},
    )


def far_future() -> Timestamp:
    ts = Timestamp()
    ts.GetCurrentTime()
    ts.FromSeconds(ts.seconds + 3600)
    return ts


def value(text: str) -> pb.PrimitiveValue:
    return pb.PrimitiveValue(string_value=text)


# (variant, the job that triggers it, the variant's fields as the client reads them)
ROWS = [
    ("unknown_queue", job("nowhere"), {"queue": "nowhere"}),
    (
        "payload_too_large",
        job("q", payload=pb.Payload(data=b"x" * 101, encoding="text/plain")),
        {"limit": 100, "actual": 101},
    ),
    (
        "encoding_not_allowed",
        job("q", payload=pb.Payload(data=b"x", encoding="image/png")),
        {"encoding": "image/png", "allowed": ["text/plain"]},
    ),
    (
        "job_type_not_allowed",
        job("q", "v"),
        {"job_type": "v", "allowed": ["t", "u", "tttttttttttt"]},
    ),
    (
        "custom_entries_too_many",
        job("q", custom={"a": value("1"), "b": value("2"), "c": value("3")}),
        {"limit": 2, "actual": 3},
    ),
    (
        "custom_map_too_large",
        job("q", custom={"a": value("x" * 50)}),
        {"limit": 40, "actual": 51},
    ),
    (
        "custom_key_too_long",
        job("q", custom={"k" * 9: value("1")}),
        {"key": "k" * 9, "limit": 8, "actual": 9},
    ),
    ("queue_name_too_long", job("qqqqqqqqqqqq"), {"limit": 10, "actual": 12}),
    ("job_type_name_too_long", job("q", "tttttttttttt"), {"limit": 10, "actual": 12}),
    (
        "idempotency_key_too_long",
        job("q", idempotency_key="k" * 11),
        {"limit": 10, "actual": 11},
    ),
    ("scheduled_too_far", job("q", scheduled_at=far_future()), None),
    ("invalid_request", job("q", ""), None),
    ("queue_full", job("full"), {"queue": "full", "limit": 0}),
]


@pytest.mark.parametrize(("variant", "request_", "fields"), ROWS, ids=[row[0] for row in ROWS])
async def test_each_rejection_arrives_as_its_own_oneof_variant(tmp_path, variant, request_, fields):
    async with (
        in_process(tight_config(tmp_path)) as server,
        stub_for(grpc_address(server)) as stub,
    ):
        response = await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q"), request_]))
    ok, refused = response.results
    assert ok.WhichOneof("outcome") == "success"  # the batch is best effort
    assert refused.WhichOneof("outcome") == "rejection"
    assert refused.rejection.WhichOneof("reason") == variant
    detail = getattr(refused.rejection, variant)
    if fields is not None:
        got = {name: getattr(detail, name) for name in fields}
        got = {k: list(v) if k == "allowed" else v for k, v in got.items()}
        assert got == fields
    if variant == "scheduled_too_far":
        assert detail.horizon.ToTimedelta() == timedelta(seconds=60)
        assert detail.actual == request_.scheduled_at
    if variant == "invalid_request":
        assert "job_type" in detail.message


async def test_an_atomic_failure_lists_every_failing_job_with_its_index(tmp_path):
    async with (
        in_process(tight_config(tmp_path)) as server,
        stub_for(grpc_address(server)) as stub,
    ):
        request = pb.EnqueueBatchRequest(jobs=[job("q"), job("nowhere"), job("q", "v")])
        response = await stub.EnqueueAtomic(request)
        assert response.WhichOneof("outcome") == "rejection"
        failures = [(e.index, e.rejection.WhichOneof("reason")) for e in response.rejection.errors]
        assert failures == [(1, "unknown_queue"), (2, "job_type_not_allowed")]
        # Nothing was stored: the valid job of the failed batch is not there.
        stats = server.service.queue_stats(["q"])[1][0]
        assert stats.ready == 0
        ok = await stub.EnqueueAtomic(pb.EnqueueBatchRequest(jobs=[job("q"), job("q")]))
    assert ok.WhichOneof("outcome") == "success"
    ids = [x.job_id for x in ok.success.responses]
    assert len(set(ids)) == 2


TRANSLATION_ROWS = [
    (r.UnknownQueue("q"), "unknown_queue", {"queue": "q"}),
    (r.PayloadTooLarge(10, 11), "payload_too_large", {"limit": 10, "actual": 11}),
    (
        r.EncodingNotAllowed("a", ("b", "c")),
        "encoding_not_allowed",
        {"encoding": "a", "allowed": ["b", "c"]},
    ),
    (
        r.JobTypeNotAllowed("a", ("b",)),
        "job_type_not_allowed",
        {"job_type": "a", "allowed": ["b"]},
    ),
    (r.CustomEntriesTooMany(2, 3), "custom_entries_too_many", {"limit": 2, "actual": 3}),
    (r.CustomMapTooLarge(2, 3), "custom_map_too_large", {"limit": 2, "actual": 3}),
    (r.CustomKeyTooLong("k", 2, 3), "custom_key_too_long", {"key": "k", "limit": 2, "actual": 3}),
    (r.QueueNameTooLong(2, 2**40), "queue_name_too_long", {"limit": 2, "actual": 2**40}),
    (r.JobTypeNameTooLong(2, 3), "job_type_name_too_long", {"limit": 2, "actual": 3}),
    (r.IdempotencyKeyTooLong(2, 3), "idempotency_key_too_long", {"limit": 2, "actual": 3}),
    (r.InvalidRequest("bad"), "invalid_request", {"message": "bad"}),
    (r.QueueFull("q", 5), "queue_full", {"queue": "q", "limit": 5}),
    (r.QueueClosing("q"), "queue_closing", {"queue": "q"}),
]


@pytest.mark.parametrize(
    ("rejection", "variant", "fields"), TRANSLATION_ROWS, ids=[row[1] for row in TRANSLATION_ROWS]
)
def test_each_rejection_class_translates_to_its_variant_with_its_fields(rejection, variant, fields):
    message = pb.JobRejection.FromString(convert.rejection_pb(rejection).SerializeToString())
    assert message.WhichOneof("reason") == variant
    detail = getattr(message, variant)
    got = {name: getattr(detail, name) for name in fields}
    assert {k: list(v) if k == "allowed" else v for k, v in got.items()} == fields


def test_scheduled_too_far_translates_its_horizon_and_time_to_the_millisecond():
    message = convert.rejection_pb(r.ScheduledTooFar(horizon_ms=90_061, actual=1_700_000_000_123))
    assert message.scheduled_too_far.horizon.ToMilliseconds() == 90_061
    assert message.scheduled_too_far.actual.ToMilliseconds() == 1_700_000_000_123


def test_every_rejection_class_of_the_catalogue_has_a_translation():
    covered = {type(row[0]) for row in TRANSLATION_ROWS} | {r.ScheduledTooFar}
    assert covered == set(r.REJECTION_CLASSES)
    assert len(pb.JobRejection.DESCRIPTOR.oneofs_by_name["reason"].fields) == len(covered)
