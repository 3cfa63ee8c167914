"""Every rejection reason and limit of sepp-semantics.md §12-§14, one row each:
per-job rejections as values (§13), whole-request errors (§15), clamps (§14),
atomic versus best-effort enqueue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sepp.core import (
    RETRY_DELAY,
    Ack,
    Command,
    CoreConfig,
    DeadLetterJobs,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Limits,
    Nack,
    QueuePolicy,
    Release,
    Reserve,
)
from sepp.core.results import (
    REJECTION_CLASSES,
    Accepted,
    AtomicRejected,
    AttemptMismatch,
    CommandError,
    CustomEntriesTooMany,
    CustomKeyTooLong,
    CustomMapTooLarge,
    EncodingNotAllowed,
    FailedPrecondition,
    IdempotencyKeyTooLong,
    InvalidArgument,
    InvalidRequest,
    JobTypeNameTooLong,
    JobTypeNotAllowed,
    NotFound,
    PayloadTooLarge,
    QueueClosing,
    QueueFull,
    QueueNameTooLong,
    ScheduledTooFar,
    UnknownQueue,
)
from sepp.core.state import TIME_MS_MAX
from tests.core.helpers import NOW, Harness, make_job, new_id

HORIZON = QueuePolicy().max_schedule_horizon_ms
STRICT = CoreConfig(strict_queues=True).with_queue("q")
SMALL_PAYLOAD = CoreConfig(defaults=QueuePolicy(max_payload_bytes=10))
JSON_ONLY = CoreConfig(defaults=QueuePolicy(allowed_encodings=("json",)))
NO_ENCODINGS = CoreConfig(defaults=QueuePolicy(allowed_encodings=()))
TYPED = CoreConfig().with_queue("q", allowed_job_types=("email", "sms"))
SHORT_NAMES = CoreConfig(
    limits=Limits(max_queue_name_bytes=5, max_job_type_bytes=4, max_idempotency_key_bytes=4)
)
SMALL_CUSTOM = CoreConfig().with_queue(
    "q", max_custom_entries=2, max_custom_key_bytes=3, max_custom_total_bytes=1_000
)
SHORT_FIELDS = CoreConfig(
    limits=Limits(
        max_trace_context_bytes=10,
        max_encoding_bytes=4,
        max_worker_id_bytes=4,
        max_reason_bytes=5,
        max_queue_name_bytes=5,
    ),
    dead_letter_retention_ms=60_000,
)
NEAR_HORIZON = CoreConfig().with_queue("q", max_schedule_horizon_ms=1_000)
ENDLESS_HORIZON = CoreConfig().with_queue("q", max_schedule_horizon_ms=2**62)
ACCEPT = None  # expected outcome of a row whose job must be accepted
# A 4 KiB frame: a delivered job takes 320 fixed bytes (id, attempt, times, keys)
# and its answer's envelope 128 more, so a job of queue "q", type "work" and
# encoding "e" fits with a payload of 4096 - 448 - 6 = 3642 bytes at most.
SMALL_FRAME = CoreConfig(
    limits=Limits(max_message_bytes=4096), defaults=QueuePolicy(max_payload_bytes=4096)
)


def enqueue_one(config: CoreConfig, fields: dict[str, Any], now: int = NOW) -> tuple[Harness, Any]:
    h = Harness(config)
    job = make_job(**fields)
    [result] = h.enqueue_results(job, now=now)
    if isinstance(result, Accepted):
        assert result == Accepted(job.job_id, False)
        assert job.job_id in h.state.jobs
    else:
        assert h.decisions[-1].events == ()  # a rejection stores nothing
        assert h.state.jobs == {}
    return h, result


def check_row(config: CoreConfig, fields: dict[str, Any], expected: Any) -> None:
    _, result = enqueue_one(config, fields)
    if expected is ACCEPT:
        assert isinstance(result, Accepted), result
    elif isinstance(expected, type):
        assert isinstance(result, expected), result
    else:
        assert result == expected


# ---------------------------------------------------------------------------
# §13 rows 1-11: deterministic per-job rejections with their fields

REJECTION_ROWS = [
    # UnknownQueue (strict mode)
    pytest.param(STRICT, {"queue": "other"}, UnknownQueue("other"), id="strict mode rejects an undeclared queue"),
    pytest.param(STRICT, {"queue": "q"}, ACCEPT, id="strict mode accepts a declared queue"),
    pytest.param(CoreConfig(), {"queue": "other"}, ACCEPT, id="auto-create mode accepts an unknown queue"),
    # PayloadTooLarge
    pytest.param(SMALL_PAYLOAD, {"payload_data": b"x" * 11, "payload_encoding": "e"}, PayloadTooLarge(10, 11), id="a payload over the global limit"),
    pytest.param(SMALL_PAYLOAD, {"payload_data": b"x" * 10, "payload_encoding": "e"}, ACCEPT, id="a payload at the global limit"),
    pytest.param(SMALL_PAYLOAD.with_queue("big", max_payload_bytes=100), {"queue": "big", "payload_data": b"x" * 100, "payload_encoding": "e"}, ACCEPT, id="a per-queue override raises the limit"),
    pytest.param(SMALL_PAYLOAD.with_queue("big", max_payload_bytes=100), {"queue": "big", "payload_data": b"x" * 101, "payload_encoding": "e"}, PayloadTooLarge(100, 101), id="a payload over the per-queue override"),
    pytest.param(SMALL_PAYLOAD.with_queue("big", max_payload_bytes=100), {"payload_data": b"x" * 11, "payload_encoding": "e"}, PayloadTooLarge(10, 11), id="other queues keep the global limit"),
    pytest.param(CoreConfig().with_queue("q", max_payload_bytes=5), {"payload_data": b"x" * 6, "payload_encoding": "e"}, PayloadTooLarge(5, 6), id="a per-queue override lowers the limit"),
    pytest.param(CoreConfig(), {"payload_data": b"x" * 1_048_577, "payload_encoding": "e"}, PayloadTooLarge(1_048_576, 1_048_577), id="the default payload limit is 1 MiB"),
    pytest.param(SMALL_FRAME, {"payload_data": b"x" * 3642, "payload_encoding": "e"}, ACCEPT, id="the largest payload whose delivery fits one answer"),
    pytest.param(SMALL_FRAME, {"payload_data": b"x" * 3643, "payload_encoding": "e"}, PayloadTooLarge(3642, 3643), id="a payload whose delivery would not fit one answer"),
    pytest.param(SMALL_FRAME, {"payload_data": b"x" * 3642, "payload_encoding": "e", "custom": {"k": "v"}}, PayloadTooLarge(3626, 3642), id="a custom map takes room from the payload that fits"),
    # EncodingNotAllowed
    pytest.param(CoreConfig(), {"payload_data": b"x", "payload_encoding": "x-anything"}, ACCEPT, id="unset allowed_encodings accepts any encoding"),
    pytest.param(NO_ENCODINGS, {"payload_data": b"x", "payload_encoding": "json"}, EncodingNotAllowed("json", ()), id="an empty allow-list rejects every payload"),
    pytest.param(NO_ENCODINGS, {}, ACCEPT, id="an empty allow-list still admits a job without payload"),
    pytest.param(JSON_ONLY, {"payload_data": b"x", "payload_encoding": "json"}, ACCEPT, id="a listed encoding is accepted"),
    pytest.param(JSON_ONLY, {"payload_data": b"x", "payload_encoding": "xml"}, EncodingNotAllowed("xml", ("json",)), id="an unlisted encoding is rejected"),
    pytest.param(JSON_ONLY.with_queue("q"), {"payload_data": b"x", "payload_encoding": "xml"}, EncodingNotAllowed("xml", ("json",)), id="a declared queue inherits the global list"),
    pytest.param(JSON_ONLY.with_queue("q", allowed_encodings=("xml",)), {"payload_data": b"x", "payload_encoding": "json"}, EncodingNotAllowed("json", ("xml",)), id="a per-queue list replaces the global list"),
    pytest.param(JSON_ONLY.with_queue("q", allowed_encodings=None), {"payload_data": b"x", "payload_encoding": "xml"}, ACCEPT, id="a per-queue unset list accepts any encoding"),
    # JobTypeNotAllowed (per queue only)
    pytest.param(TYPED, {"job_type": "push"}, JobTypeNotAllowed("push", ("email", "sms")), id="an unlisted job type is rejected"),
    pytest.param(TYPED, {"job_type": "sms"}, ACCEPT, id="a listed job type is accepted"),
    pytest.param(TYPED, {"queue": "other", "job_type": "push"}, ACCEPT, id="other queues accept any job type"),
    # CustomEntriesTooMany
    pytest.param(SMALL_CUSTOM, {"custom": {"a": 1, "b": 2, "c": 3}}, CustomEntriesTooMany(2, 3), id="too many custom entries"),
    pytest.param(SMALL_CUSTOM, {"custom": {"a": 1, "b": 2}}, ACCEPT, id="custom entries at the limit"),
    pytest.param(SMALL_CUSTOM, {"custom": {}}, ACCEPT, id="an empty custom map"),
    pytest.param(CoreConfig(), {"custom": {f"k{i}": i for i in range(65)}}, CustomEntriesTooMany(64, 65), id="the default limit is 64 entries"),
    # CustomKeyTooLong
    pytest.param(SMALL_CUSTOM, {"custom": {"abcd": 1}}, CustomKeyTooLong("abcd", 3, 4), id="a custom key over the byte limit"),
    pytest.param(SMALL_CUSTOM, {"custom": {"abc": 1}}, ACCEPT, id="a custom key at the byte limit"),
    pytest.param(SMALL_CUSTOM, {"custom": {"éé": 1}}, CustomKeyTooLong("éé", 3, 4), id="custom key length is counted in UTF-8 bytes"),
    # QueueNameTooLong, JobTypeNameTooLong, IdempotencyKeyTooLong
    pytest.param(SHORT_NAMES, {"queue": "abcdef"}, QueueNameTooLong(5, 6), id="a queue name over the byte limit"),
    pytest.param(SHORT_NAMES, {"queue": "abcde"}, ACCEPT, id="a queue name at the byte limit"),
    pytest.param(SHORT_NAMES, {"queue": "ééé"}, QueueNameTooLong(5, 6), id="queue name length is counted in UTF-8 bytes"),
    pytest.param(CoreConfig(), {"queue": "q" * 513}, QueueNameTooLong(512, 513), id="the default queue name limit is 512 bytes"),
    pytest.param(SHORT_NAMES, {"job_type": "abcde"}, JobTypeNameTooLong(4, 5), id="a job type over the byte limit"),
    pytest.param(SHORT_NAMES, {"job_type": "éé"}, ACCEPT, id="a job type at the byte limit"),
    pytest.param(SHORT_NAMES, {"job_type": "ééé"}, JobTypeNameTooLong(4, 6), id="job type length is counted in UTF-8 bytes"),
    pytest.param(CoreConfig(), {"job_type": "t" * 257}, JobTypeNameTooLong(256, 257), id="the default job type limit is 256 bytes"),
    pytest.param(SHORT_NAMES, {"idempotency_key": "abcde"}, IdempotencyKeyTooLong(4, 5), id="an idempotency key over the byte limit"),
    pytest.param(SHORT_NAMES, {"idempotency_key": "abcd"}, ACCEPT, id="an idempotency key at the byte limit"),
    pytest.param(CoreConfig(), {"idempotency_key": "k" * 257}, IdempotencyKeyTooLong(256, 257), id="the default idempotency key limit is 256 bytes"),
    # Trace context and encoding (issue 13): refused past their byte limits
    pytest.param(SHORT_FIELDS, {"traceparent": "t" * 11}, InvalidRequest, id="a traceparent over max_trace_context_bytes"),
    pytest.param(SHORT_FIELDS, {"traceparent": "t" * 6, "tracestate": "s" * 4}, ACCEPT, id="a trace context at the limit"),
    pytest.param(SHORT_FIELDS, {"traceparent": "t" * 6, "tracestate": "s" * 5}, InvalidRequest, id="the tracestate counts against the trace context limit"),
    pytest.param(SHORT_FIELDS, {"traceparent": "é" * 6}, InvalidRequest, id="trace context length is counted in UTF-8 bytes"),
    pytest.param(CoreConfig(), {"traceparent": "t" * 2049}, InvalidRequest, id="the default trace context limit is 2048 bytes"),
    pytest.param(CoreConfig(), {"traceparent": "t" * 15 * 1024 * 1024}, InvalidRequest, id="a 15 MiB traceparent is refused"),
    pytest.param(SHORT_FIELDS, {"payload_data": b"x", "payload_encoding": "abcde"}, InvalidRequest, id="a payload encoding over max_encoding_bytes"),
    pytest.param(SHORT_FIELDS, {"payload_data": b"x", "payload_encoding": "abcd"}, ACCEPT, id="a payload encoding at the limit"),
    pytest.param(CoreConfig(), {"payload_data": b"x", "payload_encoding": "e" * 257}, InvalidRequest, id="the default encoding limit is 256 bytes"),
    # ScheduledTooFar
    pytest.param(NEAR_HORIZON, {"scheduled_at": NOW + 1_001}, ScheduledTooFar(1_000, NOW + 1_001), id="scheduled beyond the per-queue horizon"),
    pytest.param(NEAR_HORIZON, {"scheduled_at": NOW + 1_000}, ACCEPT, id="scheduled exactly at the horizon"),
    pytest.param(CoreConfig(), {"scheduled_at": NOW + HORIZON + 1}, ScheduledTooFar(HORIZON, NOW + HORIZON + 1), id="the default horizon is 30 days"),
    # Times a client cannot represent (PROTOCOL.md conventions: 0 .. TIME_MS_MAX)
    pytest.param(ENDLESS_HORIZON, {"scheduled_at": TIME_MS_MAX + 1}, InvalidRequest, id="a scheduled_at after 9999-12-31 is an invalid request whatever the horizon"),
    pytest.param(ENDLESS_HORIZON, {"scheduled_at": TIME_MS_MAX}, ACCEPT, id="a scheduled_at at the last representable millisecond is accepted"),
    pytest.param(CoreConfig(), {"scheduled_at": 2**63 - 1}, InvalidRequest, id="the largest 64-bit scheduled_at is an invalid request not scheduled_too_far"),
    pytest.param(CoreConfig(), {"scheduled_at": 2**64 - 1}, InvalidRequest, id="an unsigned 64-bit scheduled_at is an invalid request"),
    pytest.param(CoreConfig(), {"scheduled_at": -1}, ACCEPT, id="a negative scheduled_at is accepted as ready now"),
    pytest.param(CoreConfig(), {"scheduled_at": -(2**63)}, ACCEPT, id="the smallest 64-bit scheduled_at is accepted as ready now"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "fields", "expected"), REJECTION_ROWS)
def test_a_job_that_breaks_a_limit_is_rejected_with_its_fields(
    config: CoreConfig, fields: dict[str, Any], expected: Any
) -> None:
    check_row(config, fields, expected)


# ---------------------------------------------------------------------------
# CustomMapTooLarge: value sizes (str = UTF-8 bytes, int/float = 8, bool = 1)

CUSTOM_SIZE_ROWS = [
    pytest.param({"k": "abc"}, 1 + 3, id="a string counts its bytes"),
    pytest.param({"k": "é"}, 1 + 2, id="a string counts UTF-8 bytes not characters"),
    pytest.param({"k": ""}, 1 + 0, id="an empty string counts nothing"),
    pytest.param({"k": 7}, 1 + 8, id="an integer counts 8"),
    pytest.param({"k": -(2**63)}, 1 + 8, id="the smallest 64-bit integer counts 8"),
    pytest.param({"k": 2.5}, 1 + 8, id="a float counts 8"),
    pytest.param({"k": True}, 1 + 1, id="true counts 1"),
    pytest.param({"k": False}, 1 + 1, id="false counts 1"),
    pytest.param({"key": 1}, 3 + 8, id="the key bytes are counted"),
    pytest.param(
        {"a": "xy", "bb": 1.0, "c": True}, 3 + 10 + 2, id="the sizes of all entries add up"
    ),
]


@pytest.mark.parametrize(("custom", "size"), CUSTOM_SIZE_ROWS)
def test_the_custom_map_total_counts_keys_and_values_by_the_documented_sizes(
    custom: dict[str, Any], size: int
) -> None:
    at_limit = CoreConfig().with_queue("q", max_custom_total_bytes=size)
    one_short = CoreConfig().with_queue("q", max_custom_total_bytes=size - 1)

    check_row(at_limit, {"custom": custom}, ACCEPT)
    check_row(one_short, {"custom": custom}, CustomMapTooLarge(size - 1, size))


# ---------------------------------------------------------------------------
# §13 row 12: InvalidRequest for every structural problem

INVALID_ROWS = [
    pytest.param({"queue": ""}, id="an empty queue name"),
    pytest.param({"queue": "."}, id="the queue name dot"),
    pytest.param({"queue": ".."}, id="the queue name dot dot"),
    pytest.param({"queue": "a/b"}, id="a queue name with a slash"),
    pytest.param({"queue": "/"}, id="a queue name that is a slash"),
    pytest.param({"queue": "a\x00b"}, id="a queue name with NUL"),
    pytest.param({"queue": "a\nb"}, id="a queue name with a newline"),
    pytest.param({"queue": "\t"}, id="a queue name that is a tab"),
    pytest.param({"queue": "a\x7fb"}, id="a queue name with DEL"),
    pytest.param({"queue": "a\x85b"}, id="a queue name with a C1 control character"),
    pytest.param({"job_type": ""}, id="an empty job type"),
    pytest.param({"payload_data": b"", "payload_encoding": "json"}, id="a payload with empty data"),
    pytest.param({"payload_data": b"x", "payload_encoding": ""}, id="a payload with an empty encoding"),
    pytest.param({"payload_data": b"x"}, id="payload data without an encoding"),
    pytest.param({"payload_encoding": "json"}, id="an encoding without payload data"),
    pytest.param({"idempotency_key": ""}, id="an empty idempotency key"),
    pytest.param({"priority": 10}, id="priority 10"),
    pytest.param({"priority": -1}, id="priority -1"),
    pytest.param({"priority": True}, id="a bool priority"),
    pytest.param({"max_attempts": 0}, id="max_attempts 0"),
    pytest.param({"max_attempts": -3}, id="negative max_attempts"),
    pytest.param({"traceparent": ""}, id="an empty traceparent"),
    pytest.param({"tracestate": "k=v"}, id="a tracestate without traceparent"),
    pytest.param({"custom": {"": 1}}, id="an empty custom key"),
    pytest.param({"custom": {"k": None}}, id="an unset custom value"),
    pytest.param({"custom": {"k": [1, 2]}}, id="a list custom value"),
    pytest.param({"custom": {"k": b"bytes"}}, id="a bytes custom value"),
    pytest.param({"custom": {"k": {"nested": 1}}}, id="a map custom value"),
    pytest.param({"custom": {"k": 2**63}}, id="an integer above 64 bits"),
    pytest.param({"custom": {"k": -(2**63) - 1}}, id="an integer below 64 bits"),
    pytest.param({"job_id": "not-a-uuid"}, id="a job id that is not a UUID"),
    pytest.param({"invalid": "priority is not an integer"}, id="a job the edge marked malformed"),
]  # fmt: skip


@pytest.mark.parametrize("fields", INVALID_ROWS)
def test_a_structurally_invalid_job_is_an_invalid_request(fields: dict[str, Any]) -> None:
    _, result = enqueue_one(CoreConfig(), fields)
    assert isinstance(result, InvalidRequest), result
    assert result.message


VALID_BOUNDARY_ROWS = [
    pytest.param({"priority": 0}, id="priority 0"),
    pytest.param({"priority": 9}, id="priority 9"),
    pytest.param({"max_attempts": 1}, id="max_attempts 1"),
    pytest.param({"custom": {"k": 2**63 - 1}}, id="the largest 64-bit integer"),
    pytest.param({"queue": "a.b-c_d:é"}, id="a queue name with dots and unicode"),
    pytest.param({"queue": "..."}, id="the queue name of three dots"),
    pytest.param({"traceparent": "00-x", "tracestate": ""}, id="an empty tracestate"),
    pytest.param({"job_id": "A" * 8 + "-" + "B" * 4 + "-" + "C" * 4 + "-" + "D" * 4 + "-" + "E" * 12}, id="an upper-case UUID"),
]  # fmt: skip


@pytest.mark.parametrize("fields", VALID_BOUNDARY_ROWS)
def test_a_job_at_a_structural_boundary_is_accepted(fields: dict[str, Any]) -> None:
    h = Harness()
    job = make_job(**fields)
    [result] = h.enqueue_results(job, now=NOW)
    assert result == Accepted(job.job_id.lower(), False)


def test_a_reused_job_id_is_refused_rather_than_aliased() -> None:
    h = Harness()
    job = make_job()
    h.enqueue(job, now=NOW)
    [result] = h.enqueue_results(make_job(job_id=job.job_id), now=NOW)
    assert isinstance(result, InvalidRequest)
    [upper] = h.enqueue_results(make_job(job_id=job.job_id.upper()), now=NOW)
    assert isinstance(upper, InvalidRequest)
    twin = new_id()
    first, second = h.enqueue_results(make_job(job_id=twin), make_job(job_id=twin), now=NOW)
    assert first == Accepted(twin, False)
    assert isinstance(second, InvalidRequest)


def test_the_horizon_is_checked_against_the_state_clock_not_a_stale_now() -> None:
    h = Harness(NEAR_HORIZON)
    h.enqueue(make_job(), now=NOW)  # the clock is now NOW
    # A command stamped in the past is decided at the clock: NOW + 1000 is in range.
    h.enqueue(make_job(scheduled_at=NOW + 1_000), now=0)
    [late] = h.enqueue_results(make_job(scheduled_at=NOW + 1_001), now=0)
    assert late == ScheduledTooFar(1_000, NOW + 1_001)


# ---------------------------------------------------------------------------
# §13 row 13: QueueFull


def depth(limit: int, retention: int = 0) -> CoreConfig:
    return CoreConfig(dead_letter_retention_ms=retention).with_queue("q", max_queue_depth=limit)


def test_best_effort_counts_earlier_jobs_of_the_same_batch_against_the_depth() -> None:
    h = Harness(depth(2))
    jobs = [make_job() for _ in range(3)]
    results = h.enqueue_results(*jobs, now=NOW)
    assert results == (
        Accepted(jobs[0].job_id, False),
        Accepted(jobs[1].job_id, False),
        QueueFull("q", 2),
    )
    assert h.counts("q") == (2, 0, 0, 0)


def test_rejected_jobs_of_a_batch_do_not_count_against_the_depth() -> None:
    h = Harness(depth(2))
    jobs = [make_job(priority=10), make_job(), make_job()]
    results = h.enqueue_results(*jobs, now=NOW)
    assert isinstance(results[0], InvalidRequest)
    assert results[1:] == (Accepted(jobs[1].job_id, False), Accepted(jobs[2].job_id, False))


@pytest.mark.parametrize(
    ("config", "queue"),
    [
        pytest.param(depth(0), "q", id="a declared queue with depth 0"),
        pytest.param(CoreConfig(defaults=QueuePolicy(max_queue_depth=0)), "auto", id="an auto-created queue under a global depth 0"),
    ],
)  # fmt: skip
def test_depth_zero_rejects_every_enqueue(config: CoreConfig, queue: str) -> None:
    h = Harness(config)
    [result] = h.enqueue_results(make_job(queue=queue), now=NOW)
    assert result == QueueFull(queue, 0)
    assert result.transient


@pytest.mark.parametrize(
    "occupant",
    [
        pytest.param("ready", id="a ready job"),
        pytest.param("scheduled", id="a scheduled job"),
        pytest.param("in_flight", id="an in-flight job"),
    ],
)
def test_every_live_job_counts_against_the_depth(occupant: str) -> None:
    h = Harness(depth(1))
    h.enqueue(make_job(scheduled_at=NOW + 100 if occupant == "scheduled" else None), now=NOW)
    if occupant == "in_flight":
        h.reserve_one("q", now=NOW)
    [result] = h.enqueue_results(make_job(), now=NOW)
    assert result == QueueFull("q", 1)


@pytest.mark.parametrize(
    "exit_path",
    [
        pytest.param("ack", id="an ack"),
        pytest.param("dead_letter_retained", id="a retained dead letter"),
        pytest.param("dead_letter_dropped", id="a dropped dead letter"),
    ],
)
def test_queue_full_clears_as_soon_as_the_depth_falls(exit_path: str) -> None:
    h = Harness(depth(1, retention=60_000 if exit_path == "dead_letter_retained" else 0))
    [job_id] = h.enqueue(make_job(), now=NOW)
    assert h.enqueue_results(make_job(), now=NOW) == (QueueFull("q", 1),)
    h.reserve_one("q", now=NOW)
    if exit_path == "ack":
        h.ack(job_id, 1, now=NOW)
    else:
        h.nack(job_id, 1, now=NOW, retry="dead_letter")

    h.enqueue(make_job(), now=NOW)


def test_the_depth_is_per_queue() -> None:
    h = Harness(depth(1))
    h.enqueue(make_job(), now=NOW)
    h.enqueue(make_job(queue="other"), make_job(queue="other"), now=NOW)


def test_a_dedup_hit_on_a_full_queue_is_still_answered() -> None:
    h = Harness(depth(1))
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    assert h.enqueue_results(make_job(idempotency_key="k"), now=NOW) == (Accepted(original, True),)


# ---------------------------------------------------------------------------
# The catalogue itself: stable labels and which reasons are transient

LABELS = [
    (UnknownQueue, "unknown_queue", False),
    (PayloadTooLarge, "payload_too_large", False),
    (EncodingNotAllowed, "encoding_not_allowed", False),
    (JobTypeNotAllowed, "job_type_not_allowed", False),
    (CustomEntriesTooMany, "custom_entries_too_many", False),
    (CustomMapTooLarge, "custom_map_too_large", False),
    (CustomKeyTooLong, "custom_key_too_long", False),
    (QueueNameTooLong, "queue_name_too_long", False),
    (JobTypeNameTooLong, "job_type_name_too_long", False),
    (IdempotencyKeyTooLong, "idempotency_key_too_long", False),
    (ScheduledTooFar, "scheduled_too_far", False),
    (InvalidRequest, "invalid_request", False),
    (QueueFull, "queue_full", True),
    (QueueClosing, "queue_closing", True),
]


@pytest.mark.parametrize(("cls", "label", "transient"), LABELS, ids=[r[1] for r in LABELS])
def test_each_rejection_has_its_stable_label_and_kind(
    cls: type[Any], label: str, transient: bool
) -> None:
    assert cls.reason == label
    assert cls.transient is transient


def test_the_catalogue_has_fourteen_reasons_in_the_documented_order() -> None:
    assert tuple(r[0] for r in LABELS) == REJECTION_CLASSES


def test_the_error_classes_carry_the_reference_codes() -> None:
    assert InvalidArgument("x").code == "invalid_argument"
    assert NotFound("x").code == "not_found"
    assert AttemptMismatch("x").code == "failed_precondition"
    assert FailedPrecondition("x").code == "failed_precondition"


# ---------------------------------------------------------------------------
# Whole-request errors (§14, §15): the command is refused, nothing is logged

LEASES = (
    CoreConfig()
    .with_queue("a", max_lease_duration_ms=1_000)
    .with_queue("b", max_lease_duration_ms=5_000)
)
CommandFactory = Callable[[str], Command]
UUID_NO_DASHES = "0" * 32


def jobs(n: int) -> tuple[Any, ...]:
    return tuple(make_job() for _ in range(n))


WHOLE_REQUEST_ROWS = [
    pytest.param(CoreConfig(), lambda j: Enqueue(jobs=()), InvalidArgument, id="an empty enqueue batch"),
    pytest.param(CoreConfig(), lambda j: Enqueue(jobs=(), atomic=True), InvalidArgument, id="an empty atomic batch"),
    pytest.param(CoreConfig(), lambda j: Enqueue(jobs=jobs(257)), InvalidArgument, id="257 jobs are more than the default batch limit"),
    pytest.param(CoreConfig(limits=Limits(max_enqueue_batch=2)), lambda j: Enqueue(jobs=jobs(3)), InvalidArgument, id="a batch over max_enqueue_batch"),
    pytest.param(CoreConfig(limits=Limits(max_enqueue_batch=2)), lambda j: Enqueue(jobs=jobs(3), atomic=True), InvalidArgument, id="an atomic batch over max_enqueue_batch"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=(), lease_ms=1), InvalidArgument, id="a reserve of no queue"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=tuple(f"q{i}" for i in range(33)), lease_ms=1), InvalidArgument, id="a reserve of 33 queues"),
    pytest.param(CoreConfig(limits=Limits(max_reserve_queues=2)), lambda j: Reserve(queues=("a", "b", "c"), lease_ms=1), InvalidArgument, id="a reserve over max_reserve_queues"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q",), lease_ms=0), InvalidArgument, id="a reserve lease of 0"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q",), lease_ms=-5), InvalidArgument, id="a negative reserve lease"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q",), lease_ms=1, max_jobs=0), InvalidArgument, id="max_jobs 0"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q",), lease_ms=1, max_jobs=-1), InvalidArgument, id="negative max_jobs"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q",), lease_ms=1, worker_id=""), InvalidArgument, id="an empty worker id on reserve"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q", "a/b"), lease_ms=1), InvalidArgument, id="a reserve naming an invalid queue"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("",), lease_ms=1), InvalidArgument, id="a reserve naming an empty queue"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q" * 513,), lease_ms=1), InvalidArgument, id="a reserve naming a too long queue"),
    pytest.param(CoreConfig(strict_queues=True).with_queue("q"), lambda j: Reserve(queues=("nope",), lease_ms=1), FailedPrecondition, id="strict mode reserve of an undeclared queue"),
    pytest.param(CoreConfig(strict_queues=True).with_queue("q"), lambda j: Reserve(queues=("q", "nope"), lease_ms=1), FailedPrecondition, id="strict mode reserve naming one undeclared queue among declared ones"),
    pytest.param(CoreConfig(), lambda j: Ack(job_id="nope", attempt=1), InvalidArgument, id="ack of a non-UUID id"),
    pytest.param(CoreConfig(), lambda j: Ack(job_id=UUID_NO_DASHES, attempt=1), InvalidArgument, id="ack of a UUID without dashes"),
    pytest.param(CoreConfig(), lambda j: Ack(job_id="{" + j + "}", attempt=1), InvalidArgument, id="ack of a braced UUID"),
    pytest.param(CoreConfig(), lambda j: Ack(job_id=j, attempt=0), InvalidArgument, id="ack of attempt 0"),
    pytest.param(CoreConfig(), lambda j: Ack(job_id=j, attempt=-1), InvalidArgument, id="ack of a negative attempt"),
    pytest.param(CoreConfig(), lambda j: Ack(job_id=j, attempt=1, worker_id=""), InvalidArgument, id="ack with an empty worker id"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id="nope", attempt=1), InvalidArgument, id="nack of a non-UUID id"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=0), InvalidArgument, id="nack of attempt 0"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, retry=RETRY_DELAY, delay_ms=-1), InvalidArgument, id="nack with a negative delay"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, retry=RETRY_DELAY), InvalidArgument, id="nack with a delay directive but no delay"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, retry="later"), InvalidArgument, id="nack with an unknown directive"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, worker_id=""), InvalidArgument, id="nack with an empty worker id"),
    pytest.param(CoreConfig(), lambda j: Extend(job_id="nope", attempt=1, lease_ms=1), InvalidArgument, id="extend of a non-UUID id"),
    pytest.param(CoreConfig(), lambda j: Extend(job_id=j, attempt=0, lease_ms=1), InvalidArgument, id="extend of attempt 0"),
    pytest.param(CoreConfig(), lambda j: Extend(job_id=j, attempt=1, lease_ms=0), InvalidArgument, id="extend with a lease of 0"),
    pytest.param(CoreConfig(), lambda j: Extend(job_id=j, attempt=1, lease_ms=-1), InvalidArgument, id="extend with a negative lease"),
    # Client-supplied strings past their byte limits (issue 13)
    pytest.param(SHORT_FIELDS, lambda j: Reserve(queues=("q",), lease_ms=1, worker_id="abcde"), InvalidArgument, id="a reserve worker id over max_worker_id_bytes"),
    pytest.param(SHORT_FIELDS, lambda j: Reserve(queues=("q",), lease_ms=1, worker_id="ééé"), InvalidArgument, id="worker id length is counted in UTF-8 bytes"),
    pytest.param(CoreConfig(), lambda j: Reserve(queues=("q",), lease_ms=1, worker_id="w" * 257), InvalidArgument, id="the default worker id limit is 256 bytes"),
    pytest.param(SHORT_FIELDS, lambda j: Ack(job_id=j, attempt=1, worker_id="abcde"), InvalidArgument, id="an ack worker id over the limit"),
    pytest.param(SHORT_FIELDS, lambda j: Nack(job_id=j, attempt=1, worker_id="abcde"), InvalidArgument, id="a nack worker id over the limit"),
    pytest.param(SHORT_FIELDS, lambda j: Extend(job_id=j, attempt=1, lease_ms=1, worker_id="abcde"), InvalidArgument, id="an extend worker id over the limit"),
    pytest.param(SHORT_FIELDS, lambda j: Release(job_id=j, attempt=1, worker_id="abcde"), InvalidArgument, id="a release worker id over the limit"),
    pytest.param(SHORT_FIELDS, lambda j: Nack(job_id=j, attempt=1, reason="abcdef"), InvalidArgument, id="a nack reason over max_reason_bytes"),
    pytest.param(SHORT_FIELDS, lambda j: Nack(job_id=j, attempt=1, reason="ééé"), InvalidArgument, id="reason length is counted in UTF-8 bytes"),
    pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, reason="r" * 4097), InvalidArgument, id="the default reason limit is 4096 bytes"),
    pytest.param(SHORT_FIELDS, lambda j: DeadLetterJobs(job_ids=(j,), reason="abcdef"), InvalidArgument, id="an operator dead-letter reason over the limit"),
    pytest.param(SHORT_FIELDS, lambda j: DrainDeadLetters(queue="abcdef"), InvalidArgument, id="a drain naming a queue over max_queue_name_bytes"),
    pytest.param(CoreConfig(), lambda j: DrainDeadLetters(max_bytes=-1), InvalidArgument, id="a drain with a negative byte cap"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "command", "error"), WHOLE_REQUEST_ROWS)
def test_a_malformed_request_is_refused_as_a_whole(
    config: CoreConfig, command: CommandFactory, error: type[CommandError]
) -> None:
    h = Harness(config)
    # An in-flight job, so that a well-formed ack/nack/extend of it would succeed.
    [job_id] = h.enqueue(make_job(queue=next(iter(config.queues), "q")), now=NOW)
    h.reserve_one(next(iter(config.queues), "q"), now=NOW)
    records = len(h.records)

    result = h.refuse(command(job_id), now=NOW + 1)

    assert type(result) is error
    assert result.message
    assert len(h.records) == records
    assert h.status(job_id) == "in_flight"


@pytest.mark.parametrize(
    ("config", "command"),
    [
        pytest.param(CoreConfig(), lambda j: Enqueue(jobs=jobs(256)), id="256 jobs in one batch"),
        pytest.param(CoreConfig(), lambda j: Reserve(queues=tuple(f"q{i}" for i in range(32)), lease_ms=1), id="a reserve of 32 queues"),
        pytest.param(CoreConfig(), lambda j: Ack(job_id=j.upper(), attempt=1), id="an ack of an upper-case id"),
        pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, retry=RETRY_DELAY, delay_ms=0), id="a nack with a zero delay"),
        pytest.param(CoreConfig(), lambda j: Extend(job_id=j, attempt=1, lease_ms=1), id="an extend of 1 ms"),
        pytest.param(SHORT_FIELDS, lambda j: Reserve(queues=("q",), lease_ms=1, worker_id="abcd"), id="a worker id at max_worker_id_bytes"),
        pytest.param(SHORT_FIELDS, lambda j: Ack(job_id=j, attempt=1, worker_id="éé"), id="a worker id of two-byte characters at the limit"),
        pytest.param(SHORT_FIELDS, lambda j: Nack(job_id=j, attempt=1, reason="abcde"), id="a nack reason at max_reason_bytes"),
        pytest.param(CoreConfig(), lambda j: Nack(job_id=j, attempt=1, reason="r" * 4096), id="a nack reason at the default limit"),
        pytest.param(SHORT_FIELDS, lambda j: DrainDeadLetters(queue="abcde"), id="a drain naming a queue at max_queue_name_bytes"),
    ],
)  # fmt: skip
def test_a_request_at_a_whole_request_boundary_is_accepted(
    config: CoreConfig, command: CommandFactory
) -> None:
    h = Harness(config)
    [job_id] = h.enqueue(make_job(), now=NOW)
    h.reserve_one("q", now=NOW)
    h.accept(command(job_id), now=NOW + 1)


# ---------------------------------------------------------------------------
# Clamps (§14): silent, visible only in the stored or returned values


def test_max_jobs_is_clamped_to_max_reserve_batch() -> None:
    h = Harness(CoreConfig(limits=Limits(max_reserve_batch=2)))
    h.enqueue(*jobs(5), now=NOW)
    assert len(h.reserve("q", now=NOW, max_jobs=10)) == 2
    assert len(h.reserve("q", now=NOW, max_jobs=1_000_000)) == 2


@pytest.mark.parametrize(
    ("job_queue", "listed", "lease_ms", "expected"),
    [
        pytest.param("b", ("b",), 4_000, 4_000, id="a lease under the queue maximum is kept"),
        pytest.param("b", ("b",), 9_000, 5_000, id="a lease over the queue maximum is clamped"),
        pytest.param("b", ("b", "a"), 4_000, 1_000, id="the smallest maximum of the listed queues applies to a job of another queue"),
        pytest.param("b", ("a", "b"), 4_000, 1_000, id="the clamp applies even when the strict queue is empty"),
        pytest.param("b", ("b", "undeclared"), 10**9, 5_000, id="an undeclared queue contributes the global maximum"),
        pytest.param("undeclared", ("undeclared",), 10**9, 300_000, id="the global maximum is 5 minutes"),
    ],
)  # fmt: skip
def test_the_reserve_lease_is_clamped_to_the_smallest_maximum_of_the_listed_queues(
    job_queue: str, listed: tuple[str, ...], lease_ms: int, expected: int
) -> None:
    h = Harness(LEASES)
    [job_id] = h.enqueue(make_job(queue=job_queue), now=NOW)

    [view] = h.reserve(*listed, now=NOW, lease_ms=lease_ms)

    assert view.job_id == job_id
    assert view.lease_expires_at == h.job(job_id).due_ms == NOW + expected


@pytest.mark.parametrize(
    ("reserved_via", "extend_at", "lease_ms", "expected"),
    [
        pytest.param(("b",), 600, 1_000, 1_600, id="extend sets now plus the duration, not the old deadline plus it"),
        pytest.param(("b",), 100, 10, 110, id="extend may shorten the lease"),
        pytest.param(("b",), 100, 9_000, 5_100, id="extend is clamped to the job's queue maximum"),
        pytest.param(("a", "b"), 100, 4_000, 4_100, id="extend uses the job's queue maximum, not the reserve's clamp"),
    ],
)  # fmt: skip
def test_extend_moves_the_deadline_to_now_plus_the_clamped_duration(
    reserved_via: tuple[str, ...], extend_at: int, lease_ms: int, expected: int
) -> None:
    h = Harness(LEASES)
    [job_id] = h.enqueue(make_job(queue="b"), now=NOW)
    h.reserve(*reserved_via, now=NOW, lease_ms=2_000)

    result = h.extend(job_id, 1, lease_ms, now=NOW + extend_at)

    assert result.lease_expires_at == h.job(job_id).due_ms == NOW + expected
    assert h.state.next_deadline() == NOW + expected
    h.sweep(now=NOW + expected - 1)
    assert h.status(job_id) == "in_flight"
    h.sweep(now=NOW + expected)
    assert (h.status(job_id), h.job(job_id).attempt) == ("ready", 2)


@pytest.mark.parametrize(
    ("policy", "requested", "stored"),
    [
        pytest.param({}, 150, 100, id="above the default ceiling of 100"),
        pytest.param({"max_attempts_ceiling": 5, "default_max_attempts": 2}, 6, 5, id="above a per-queue ceiling"),
        pytest.param({"max_attempts_ceiling": 5, "default_max_attempts": 2}, 5, 5, id="at the ceiling"),
        pytest.param({"max_attempts_ceiling": 5, "default_max_attempts": 2}, None, 2, id="unset takes the queue default"),
    ],
)  # fmt: skip
def test_max_attempts_is_clamped_silently_to_the_ceiling(
    policy: dict[str, int], requested: int | None, stored: int
) -> None:
    h, result = enqueue_one(CoreConfig().with_queue("q", **policy), {"max_attempts": requested})
    assert isinstance(result, Accepted)
    assert h.job(result.job_id).max_attempts == stored


# ---------------------------------------------------------------------------
# Atomic versus best-effort enqueue


def test_an_atomic_enqueue_lists_every_failing_job_and_stores_nothing() -> None:
    h = Harness(SMALL_PAYLOAD)
    batch = [
        make_job(),
        make_job(payload_data=b"x" * 11, payload_encoding="e"),
        make_job(),
        make_job(priority=10),
    ]

    reply = h.accept(Enqueue(jobs=tuple(batch), atomic=True), now=NOW)

    assert isinstance(reply, AtomicRejected)
    assert [index for index, _ in reply.failures] == [1, 3]
    assert reply.failures[0][1] == PayloadTooLarge(10, 11)
    assert isinstance(reply.failures[1][1], InvalidRequest)
    assert h.decisions[-1].events == ()
    assert h.decisions[-1].woken == frozenset()
    assert h.state.jobs == {}
    assert h.state.queues == {}


def test_the_same_batch_best_effort_stores_the_valid_jobs_in_request_order() -> None:
    h = Harness(SMALL_PAYLOAD)
    batch = [
        make_job(),
        make_job(payload_data=b"x" * 11, payload_encoding="e"),
        make_job(),
        make_job(priority=10),
    ]

    results = h.enqueue_results(*batch, now=NOW)

    assert results[0] == Accepted(batch[0].job_id, False)
    assert results[1] == PayloadTooLarge(10, 11)
    assert results[2] == Accepted(batch[2].job_id, False)
    assert isinstance(results[3], InvalidRequest)
    assert set(h.state.jobs) == {batch[0].job_id, batch[2].job_id}


def test_an_atomic_enqueue_that_passes_stores_every_job_in_order() -> None:
    h = Harness()
    batch = jobs(3)
    assert h.enqueue(*batch, now=NOW, atomic=True) == [j.job_id for j in batch]
    assert h.ready_order("q") == [j.job_id for j in batch]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"priority": 10}, InvalidRequest, id="an invalid job"),
        pytest.param({"queue": "q" * 513}, QueueNameTooLong(512, 513), id="a job over a limit"),
    ],
)
def test_an_atomic_enqueue_of_one_failing_job_is_rejected(
    fields: dict[str, Any], expected: Any
) -> None:
    h = Harness()
    reply = h.accept(Enqueue(jobs=(make_job(**fields),), atomic=True), now=NOW)
    assert isinstance(reply, AtomicRejected)
    [(index, rejection)] = reply.failures
    assert index == 0
    assert isinstance(rejection, expected) if isinstance(expected, type) else rejection == expected
    assert h.decisions[-1].events == ()
    assert h.state.jobs == {}


def test_an_atomic_enqueue_over_the_depth_is_rejected_as_a_whole() -> None:
    h = Harness(depth(2))
    h.enqueue(make_job(), now=NOW)
    batch = jobs(2)

    reply = h.accept(Enqueue(jobs=batch, atomic=True), now=NOW)

    assert reply == AtomicRejected(((1, QueueFull("q", 2)),))
    assert h.counts("q") == (1, 0, 0, 0)


def test_the_atomic_depth_check_does_not_count_dedup_hits() -> None:
    h = Harness(depth(2))
    [original] = h.enqueue(make_job(idempotency_key="k"), now=NOW)
    duplicate, fresh = make_job(idempotency_key="k"), make_job()

    results = h.enqueue_results(duplicate, fresh, now=NOW, atomic=True)

    assert results == (Accepted(original, True), Accepted(fresh.job_id, False))
    assert h.counts("q") == (2, 0, 0, 0)


def test_the_same_key_twice_in_an_atomic_batch_fills_one_slot() -> None:
    h = Harness(depth(1))
    first, second = make_job(idempotency_key="k"), make_job(idempotency_key="k")
    results = h.enqueue_results(first, second, now=NOW, atomic=True)
    assert results == (Accepted(first.job_id, False), Accepted(first.job_id, True))
