"""The public surface: sepp-py's names and signatures are all here, `sepp`
re-exports them lazily, and the optional OpenTelemetry glue works when the API
is present (checked with a stand-in, since opentelemetry is not a dependency)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

import sepp
import sepp.client
from sepp.client import _otel
from tests.client.fakeserver import FakeServer, make_job

# sepp-py 0.1.0's `sepp.__all__`, copied from its wheel.
SEPP_PY_NAMES = [
    "SeppClient",
    "RetryPolicy",
    "RetryDirective",
    "Worker",
    "HandlerError",
    "ShutdownHandle",
    "DuplicateHandlerError",
    "Payload",
    "Primitive",
    "Priority",
    "PriorityOutOfRangeError",
    "TraceContext",
    "TraceContextError",
    "EnqueueRequest",
    "EnqueueAck",
    "Job",
    "JobCtx",
    "ReserveOptions",
    "ServerInfo",
    "DeadLetterCause",
    "DeadLetterRecord",
    "SeppError",
    "ClientError",
    "ConnectError",
    "InvalidApiKeyError",
    "TransportError",
    "UnauthenticatedError",
    "OverloadedError",
    "InvalidRequestError",
    "ServerInternalError",
    "UnexpectedStatusError",
    "EmptyBatchError",
    "BatchResultCountMismatchError",
    "MalformedResponseError",
    "MalformedJobError",
    "MalformedServerInfoError",
    "JobConversionError",
    "ServerInfoError",
    "JobRejectedError",
    "BatchValidationError",
    "LeaseError",
    "JobNotFoundError",
    "AttemptMismatchError",
    "ReserveError",
    "UnknownQueuesError",
    "JobRejection",
    "JobValidationError",
    "UnknownQueue",
    "PayloadTooLarge",
    "EncodingNotAllowed",
    "JobTypeNotAllowed",
    "CustomEntriesTooMany",
    "CustomMapTooLarge",
    "CustomKeyTooLong",
    "QueueNameTooLong",
    "JobTypeNameTooLong",
    "IdempotencyKeyTooLong",
    "ScheduledTooFar",
    "InvalidRequest",
    "QueueFull",
    "QueueClosing",
    "UnknownRejection",
    "__version__",
]


def test_every_sepp_py_name_is_exported_from_sepp() -> None:
    missing = [name for name in SEPP_PY_NAMES if not hasattr(sepp, name)]
    assert missing == []
    assert set(SEPP_PY_NAMES) <= set(sepp.__all__)
    assert set(sepp.__all__) <= set(sepp.client.__all__)


def test_sepp_re_exports_are_the_client_objects() -> None:
    for name in sepp.__all__:
        assert getattr(sepp, name) == getattr(sepp.client, name)
    with pytest.raises(AttributeError):
        sepp.NoSuchThing  # noqa: B018


def test_importing_the_core_and_storage_does_not_load_the_client() -> None:
    code = (
        "import sys, sepp, sepp.core, sepp.storage; "
        "assert 'sepp.client' not in sys.modules; "
        "assert 'asyncio' not in sys.modules, 'asyncio was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _params(fn: Any) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]


@pytest.mark.parametrize(
    ("fn", "sepp_py_params"),
    [
        (
            sepp.SeppClient.connect,
            "addr api_key retry_policy tls tls_ca_cert tls_domain credentials connect_timeout "
            "rpc_timeout max_receive_message_bytes",
        ),
        (sepp.SeppClient.enqueue, "job"),
        (sepp.SeppClient.enqueue_batch, "jobs"),
        (sepp.SeppClient.enqueue_atomic, "jobs"),
        (sepp.SeppClient.reserve, "opts"),
        (sepp.SeppClient.ack, "ctx"),
        (sepp.SeppClient.nack, "ctx retry reason"),
        (sepp.SeppClient.extend, "ctx extension"),
        (sepp.SeppClient.get_server_info, ""),
        (sepp.SeppClient.drain_dead_letters, "queue max_records"),
        (
            sepp.Worker.__init__,
            "client queues lease_duration wait_timeout max_jobs max_in_flight "
            "reserve_error_backoff auto_extend auto_extend_interval worker_id",
        ),
        (sepp.Worker.handle, "job_type handler"),
        (sepp.HandlerError.retry_after, "reason delay"),
    ],
)
def test_signatures_start_with_sepp_pys_parameters(fn: Any, sepp_py_params: str) -> None:
    expected = sepp_py_params.split()
    assert _params(fn)[: len(expected)] == expected


def test_defaults_match_sepp_py() -> None:
    connect = inspect.signature(sepp.SeppClient.connect).parameters
    assert connect["connect_timeout"].default == timedelta(seconds=5)
    assert connect["rpc_timeout"].default == timedelta(seconds=30)
    worker = inspect.signature(sepp.Worker.__init__).parameters
    assert worker["max_in_flight"].default == 16
    assert worker["reserve_error_backoff"].default == timedelta(seconds=1)
    # sepp differs here: leases are renewed by default (issue 12), sepp-py's is False.
    assert worker["auto_extend"].default is True
    nack = inspect.signature(sepp.SeppClient.nack).parameters
    assert nack["retry"].default == sepp.RetryDirective.DEFAULT
    assert (
        inspect.signature(sepp.SeppClient.drain_dead_letters).parameters["max_records"].default == 1
    )
    policy = sepp.RetryPolicy()
    assert (policy.max_attempts, policy.multiplier, policy.jitter) == (1, 2.0, True)
    assert policy.initial_backoff == timedelta(milliseconds=100)
    assert policy.max_backoff == timedelta(seconds=10)


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (sepp.Payload, "data encoding"),
        (sepp.TraceContext, "traceparent tracestate"),
        (
            sepp.EnqueueRequest,
            "queue job_type payload idempotency_key priority max_attempts custom trace_context "
            "scheduled_at",
        ),
        (sepp.EnqueueAck, "job_id deduplicated"),
        (
            sepp.JobCtx,
            "id queue job_type priority attempt max_attempts enqueued_at custom trace_context "
            "lease_expires_at scheduled_at _lease",
        ),
        (sepp.Job, "payload ctx"),
        (sepp.ReserveOptions, "queues lease_duration wait_timeout worker_id max_jobs"),
        (
            sepp.DeadLetterRecord,
            "queue job_id job_type payload priority max_attempts custom trace_context "
            "enqueued_at scheduled_at cause failed_at final_attempt last_reason",
        ),
        (sepp.RetryDirective, "kind delay"),
        (sepp.ScheduledTooFar, "horizon actual"),
        (sepp.CustomKeyTooLong, "key limit actual"),
        (sepp.JobValidationError, "index rejection"),
    ],
)
def test_dataclass_fields_match_sepp_py(cls: type, fields: str) -> None:
    assert [f.name for f in dataclasses.fields(cls)] == fields.split()


def test_server_info_starts_with_sepp_pys_fields_in_order() -> None:
    expected = [
        "version",
        "supported_protocol_versions",
        "server_time",
        "restricts_encodings",
        "allowed_encodings",
        "max_payload_bytes",
        "max_custom_entries",
        "max_custom_total_bytes",
        "max_custom_key_bytes",
        "max_queue_name_bytes",
        "max_job_type_bytes",
        "max_idempotency_key_bytes",
        "max_schedule_horizon",
        "max_enqueue_batch",
        "max_reserve_batch",
        "max_reserve_queues",
        "max_wait_timeout",
        "max_lease_duration",
        "strict_queues",
        "dead_letter_retention_enabled",
    ]
    names = [f.name for f in dataclasses.fields(sepp.ServerInfo)]
    assert names[: len(expected)] == expected


def test_dead_letter_causes_match_sepp_py() -> None:
    assert [c.name for c in sepp.DeadLetterCause] == [
        "UNSPECIFIED",
        "ATTEMPTS_EXHAUSTED",
        "REJECTED",
        "LEASE_EXPIRED",
        "ADMIN",
    ]


def test_every_rejection_class_is_a_job_rejection() -> None:
    for name in [
        "UnknownQueue",
        "PayloadTooLarge",
        "EncodingNotAllowed",
        "JobTypeNotAllowed",
        "CustomEntriesTooMany",
        "CustomMapTooLarge",
        "CustomKeyTooLong",
        "QueueNameTooLong",
        "JobTypeNameTooLong",
        "IdempotencyKeyTooLong",
        "ScheduledTooFar",
        "InvalidRequest",
        "QueueFull",
        "QueueClosing",
        "UnknownRejection",
    ]:
        cls = getattr(sepp, name)
        assert issubclass(cls, sepp.JobRejection)
        assert not issubclass(cls, BaseException)


# -- OpenTelemetry, with a stand-in API ---------------------------------------------------------


class StandInOtel:
    """Just enough of the opentelemetry API for `sepp.client._otel`."""

    TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any, list[Any]]] = []
        self.counters: dict[str, list[tuple[int, Any]]] = {}
        outer = self

        class Propagator:
            def inject(self, carrier: dict[str, str]) -> None:
                carrier["traceparent"] = outer.TRACEPARENT

            def extract(self, carrier: dict[str, str]) -> dict[str, str]:
                return dict(carrier)

        class Tracer:
            @contextlib.contextmanager
            def start_as_current_span(
                self, name: str, kind: Any = None, links: Any = ()
            ) -> Iterator[None]:
                outer.spans.append((name, kind, list(links)))
                yield

        class Counter:
            def __init__(self, name: str) -> None:
                self.name = name

            def add(self, amount: int, attributes: Any = None) -> None:
                outer.counters.setdefault(self.name, []).append((amount, attributes))

        def span_of(ctx: dict[str, str]) -> Any:
            valid = ctx.get("traceparent") == outer.TRACEPARENT
            return SimpleNamespace(
                get_span_context=lambda: SimpleNamespace(is_valid=valid, carrier=ctx)
            )

        meter = SimpleNamespace(
            create_counter=lambda name, description="": Counter(name),
            create_up_down_counter=lambda name, description="": Counter(name),
        )
        self.propagator = Propagator()
        self.tracer = Tracer()
        self.trace = SimpleNamespace(
            SpanKind=SimpleNamespace(CLIENT="client", CONSUMER="consumer"),
            Link=lambda context: ("link", context.carrier["traceparent"]),
            get_current_span=span_of,
        )
        self.context = SimpleNamespace(attach=lambda ctx: "token", detach=lambda token: None)
        self.metrics = SimpleNamespace(get_meter=lambda name: meter)


@pytest.fixture
def otel() -> Iterator[StandInOtel]:
    stand_in = StandInOtel()
    _otel.reset_for_tests(stand_in)
    try:
        yield stand_in
    finally:
        _otel.reset_for_tests()


async def test_with_otel_enqueues_carry_the_current_trace_and_workers_link_it(
    otel: StandInOtel, fake: FakeServer
) -> None:
    assert sepp.TraceContext.from_current_otel() == sepp.TraceContext(otel.TRACEPARENT)
    assert sepp.TraceContext(otel.TRACEPARENT).otel_span_context() is not None
    with sepp.TraceContext(otel.TRACEPARENT).attach_to_otel():
        pass
    async with fake:
        fake.reply("enqueue", "ok", {"results": [{"job_id": "a", "deduplicated": False}]})
        client = await sepp.SeppClient.connect(fake.address)
        await client.enqueue(sepp.EnqueueRequest("q", "t"))
        wire = fake.ops("enqueue")[0].body["jobs"][0]
        assert wire["trace_context"] == {"traceparent": otel.TRACEPARENT}

        worker = sepp.Worker(
            client, ["q"], timedelta(seconds=30), wait_timeout=timedelta(seconds=5)
        )
        worker.handle("t", _noop)
        fake.queue.push(make_job("t", traceparent=otel.TRACEPARENT))

        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        worker.shutdown_handle().shutdown()
        await task
        await client.close()
    consumer = [s for s in otel.spans if s[1] == "consumer"]
    assert consumer == [("sepp.process", "consumer", [("link", otel.TRACEPARENT)])]
    assert ("sepp.enqueue", "client", []) in otel.spans
    assert otel.counters["sepp.jobs.processed"] == [(1, None)]
    assert sum(n for n, _ in otel.counters["sepp.jobs.in_flight"]) == 0


async def _noop(payload: Any, ctx: Any) -> None:
    return None
