"""The sans-I/O protocol layer: framing, envelopes and body validation, with no
sockets. The one rule of its fuzzing: garbage raises the typed error, nothing else."""

from __future__ import annotations

import contextlib
import random
import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sepp.protocol import (
    FrameReader,
    FrameTooLarge,
    ProtocolError,
    ProtocolViolation,
    decode_request,
    decode_response,
    encode_frame,
    encode_request,
    encode_response,
)
from sepp.protocol import messages as pm
from sepp.protocol.framing import PARTS_FRAME_BYTES_MIN


def frame_of(value: object) -> bytes:
    return encode_frame(msgpack.packb(value, use_bin_type=True))


# -- framing ---------------------------------------------------------------------


def test_frames_split_at_every_byte_boundary_are_reassembled() -> None:
    stream = b"".join(encode_frame(bytes([i]) * (i + 1)) for i in range(20))
    reader = FrameReader(1024)
    frames = []
    for i in range(len(stream)):
        frames += reader.feed(stream[i : i + 1])
    assert frames == [bytes([i]) * (i + 1) for i in range(20)]
    assert reader.buffered == 0


def test_many_frames_in_one_read_come_out_in_order() -> None:
    reader = FrameReader(1024)
    assert reader.feed(encode_frame(b"a") + encode_frame(b"bb") + encode_frame(b"ccc")[:3]) == [
        b"a",
        b"bb",
    ]
    assert reader.feed(encode_frame(b"ccc")[3:]) == [b"ccc"]


def test_an_oversized_length_is_refused_from_the_prefix_alone() -> None:
    reader = FrameReader(100)
    with pytest.raises(FrameTooLarge) as info:
        reader.feed(struct.pack(">I", 101))  # no body sent, nothing allocated
    assert info.value.length == 101 and info.value.limit == 100
    assert reader.buffered == 0


def test_frames_max_leaves_the_rest_buffered_and_judged_by_the_limit_at_the_next_feed() -> None:
    # A server's reader before hello: small frames, one at a time; the frame
    # behind the hello is judged by the limit raised once the hello succeeded.
    reader = FrameReader(16)
    big = b"x" * 100
    stream = encode_frame(b"hello") + encode_frame(big) + encode_frame(b"next")
    assert reader.feed(stream, 1) == [b"hello"]
    assert reader.buffered == len(stream) - len(encode_frame(b"hello"))
    reader.frame_bytes_max = 1024
    assert reader.feed(b"", 1) == [big]
    assert reader.feed(b"") == [b"next"]
    assert reader.buffered == 0


def test_frames_max_does_not_lift_the_limit_for_the_next_frame() -> None:
    reader = FrameReader(16)
    assert reader.feed(encode_frame(b"hello") + struct.pack(">I", 17), 1) == [b"hello"]
    with pytest.raises(FrameTooLarge):
        reader.feed(b"", 1)


def test_a_zero_length_frame_breaks_framing() -> None:
    with pytest.raises(ProtocolViolation):
        FrameReader().feed(b"\x00\x00\x00\x00")


def test_frames_before_a_broken_prefix_are_returned_then_the_error_is_raised() -> None:
    reader = FrameReader(100)
    frames = reader.feed(encode_frame(b"ok") + struct.pack(">I", 10_000))
    assert frames == [b"ok"]
    with pytest.raises(FrameTooLarge):
        reader.raise_pending()
    with pytest.raises(FrameTooLarge):
        reader.feed(b"")


def test_large_frames_split_into_reads_of_any_size_come_out_whole_and_in_order(
    rng: random.Random,
) -> None:
    size = PARTS_FRAME_BYTES_MIN * 3 + 5
    bodies = [bytes([i]) * (size if i % 2 else rng.randint(1, 50)) for i in range(1, 12)]
    stream = b"".join(encode_frame(body) for body in bodies)
    for frames_max in (0, 1, 2):
        reader = FrameReader(size)
        frames: list[bytes] = []
        pos = 0
        while pos < len(stream):
            step = rng.choice((1, 3, 1000, PARTS_FRAME_BYTES_MIN, size + 7))
            # Reads arrive as bytes, bytearray or memoryview.
            chunk = rng.choice((bytes, bytearray, memoryview))(stream[pos : pos + step])
            pos += step
            frames += reader.feed(chunk, frames_max)
        while reader.buffered and (more := reader.feed(b"", frames_max)):
            frames += more
        assert frames == bodies
        assert all(type(frame) is bytes for frame in frames)
        assert reader.buffered == 0


def test_a_large_frame_is_kept_as_its_reads_and_copied_once() -> None:
    # 8 MiB in 256 KiB reads: growing a buffer, slicing it and converting the slice
    # allocated three times the body; kept as parts, only the joined frame is new.
    body = bytes(range(256)) * (8 * 4096)
    stream = encode_frame(body)
    reads = [stream[i : i + 256 * 1024] for i in range(0, len(stream), 256 * 1024)]
    reader = FrameReader()
    tracemalloc.start()
    try:
        frames = []
        for read in reads:
            frames += reader.feed(read)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert frames == [body]
    assert peak < len(body) + 2 * 256 * 1024


def test_a_reused_read_buffer_does_not_change_a_large_frame_being_gathered() -> None:
    body = b"x" * (PARTS_FRAME_BYTES_MIN * 2)
    stream = encode_frame(body)
    reader = FrameReader()
    scratch = bytearray(PARTS_FRAME_BYTES_MIN)
    frames = []
    for pos in range(0, len(stream), len(scratch)):
        piece = stream[pos : pos + len(scratch)]
        scratch[: len(piece)] = piece
        frames += reader.feed(memoryview(scratch)[: len(piece)])
        scratch[:] = bytes(len(scratch))  # the caller reuses its buffer
    assert frames == [body]


def test_a_broken_prefix_behind_a_large_frame_waits_until_the_frame_is_returned() -> None:
    body = b"y" * PARTS_FRAME_BYTES_MIN
    reader = FrameReader(PARTS_FRAME_BYTES_MIN)
    assert reader.feed(encode_frame(body)[:100]) == []
    assert reader.buffered == 96
    assert reader.feed(encode_frame(body)[100:] + struct.pack(">I", 0)) == [body]
    with pytest.raises(ProtocolViolation):
        reader.raise_pending()


def test_a_frame_of_exactly_the_limit_is_accepted() -> None:
    assert FrameReader(10).feed(encode_frame(b"x" * 10)) == [b"x" * 10]


# -- envelopes -------------------------------------------------------------------


def test_request_and_response_round_trip() -> None:
    request = decode_request(encode_request(7, "ack", {"job_id": "j", "attempt": 1}))
    assert request == (7, "ack", {"job_id": "j", "attempt": 1})
    response = decode_response(encode_response(7, "not_found", {"message": "gone"}))
    assert response == (7, "not_found", {"message": "gone"})


@pytest.mark.parametrize(
    "value",
    [
        [],
        [1, "ack"],
        "hello",
        [-1, "ack", {}],
        [True, "ack", {}],
        ["1", "ack", {}],
        [1.0, "ack", {}],
    ],
    ids=[
        "empty",
        "two-elements",
        "not-array",
        "negative-id",
        "bool-id",
        "string-id",
        "float-id",
    ],
)
def test_a_request_without_a_usable_id_is_a_violation(value: object) -> None:
    with pytest.raises(ProtocolViolation):
        decode_request(msgpack.packb(value))


def test_the_wire_decode_keeps_msgpacks_strict_defaults() -> None:
    # The decoder passes no options (msgpack >= 1.0's defaults, for speed): a map
    # key that is not a string is still a violation, text stays str, bin stays
    # bytes, arrays stay lists.
    with pytest.raises(ProtocolViolation):
        decode_request(msgpack.packb([1, "ack", {1: "job"}]))
    request = decode_request(msgpack.packb([1, "ack", {"job_id": "j", "b": b"\x00", "l": [1]}]))
    body = request.body
    assert isinstance(body, dict)
    assert (type(body["job_id"]), type(body["b"]), type(body["l"])) == (str, bytes, list)


def test_an_unknown_op_is_an_error_for_that_request_only() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_request(msgpack.packb([9, "explode", {}]))
    assert info.value.request_id == 9  # type: ignore[attr-defined]
    assert info.value.code == "invalid_argument"


def test_an_error_response_needs_a_message() -> None:
    with pytest.raises(ProtocolViolation):
        decode_response(msgpack.packb([1, "internal", {}]))


# -- bodies ----------------------------------------------------------------------


def test_a_job_with_wrong_types_is_reported_per_job() -> None:
    body = pm.parse_enqueue(
        {"jobs": [{"queue": "q", "job_type": "t"}, {"queue": 5, "job_type": "t"}, "nope"]}
    )
    assert isinstance(body.jobs[0], pm.WireJob)
    assert isinstance(body.jobs[1], ProtocolError) and "job.queue" in body.jobs[1].message
    assert isinstance(body.jobs[2], ProtocolError)


def test_payload_data_must_be_binary_not_text() -> None:
    with pytest.raises(ProtocolError, match=r"payload\.data"):
        pm.parse_job({"queue": "q", "job_type": "t", "payload": {"data": "text", "encoding": "e"}})


def test_custom_values_must_be_primitives_within_64_bits() -> None:
    with pytest.raises(ProtocolError):
        pm.parse_job({"queue": "q", "job_type": "t", "custom": {"k": [1]}})
    with pytest.raises(ProtocolError):
        pm.parse_job({"queue": "q", "job_type": "t", "custom": {"k": 2**63}})
    job = pm.parse_job(
        {"queue": "q", "job_type": "t", "custom": {"a": 1, "b": 1.5, "c": True, "d": "x"}}
    )
    assert job.custom == {"a": 1, "b": 1.5, "c": True, "d": "x"}


def test_a_boolean_is_not_an_integer() -> None:
    with pytest.raises(ProtocolError):
        pm.parse_ack({"job_id": "x", "attempt": True})


def test_nack_delay_needs_delay_ms_and_a_known_directive() -> None:
    with pytest.raises(ProtocolError):
        pm.parse_nack({"job_id": "x", "attempt": 1, "retry": "delay"})
    with pytest.raises(ProtocolError):
        pm.parse_nack({"job_id": "x", "attempt": 1, "retry": "later"})
    body = pm.parse_nack({"job_id": "x", "attempt": 1})
    assert body.retry == "default" and body.delay_ms is None


def test_reserve_defaults() -> None:
    body = pm.parse_reserve({"queues": ["a"], "lease_ms": 5})
    assert (body.wait_ms, body.max_jobs, body.worker_id) == (0, 1, None)
    assert body.job_layout == pm.JOB_LAYOUT_MAP


def test_reserve_job_layout_is_map_or_array() -> None:
    for layout in (pm.JOB_LAYOUT_MAP, pm.JOB_LAYOUT_ARRAY):
        body = pm.parse_reserve({"queues": ["a"], "lease_ms": 5, "job_layout": layout})
        assert body.job_layout == layout
    for wrong in ("rows", "", 1):
        with pytest.raises(ProtocolError, match="job_layout"):
            pm.parse_reserve({"queues": ["a"], "lease_ms": 5, "job_layout": wrong})


def test_settle_parses_each_item_as_its_single_operations_body() -> None:
    body = pm.parse_settle(
        {
            "items": [
                {"kind": "ack", "job_id": "a", "attempt": 1},
                {"kind": "nack", "job_id": "b", "attempt": 2, "retry": "delay", "delay_ms": 5},
                {"kind": "extend", "job_id": "c", "attempt": 3, "lease_ms": 100, "worker_id": "w"},
            ]
        }
    )
    assert body.items == [
        pm.AckBody("a", 1, None, None),
        pm.NackBody("b", 2, "delay", 5, None, None, None),
        pm.ExtendBody("c", 3, 100, "w", None),
    ]


def test_a_malformed_settle_item_is_reported_for_that_item_only() -> None:
    body = pm.parse_settle(
        {
            "items": [
                {"kind": "ack", "job_id": "a", "attempt": 1},
                {"kind": "release", "job_id": "b", "attempt": 1},
                {"kind": "ack", "job_id": "c", "attempt": "1"},
                "nope",
                {"job_id": "d", "attempt": 1},
            ]
        }
    )
    assert body.items[0] == pm.AckBody("a", 1, None, None)
    assert isinstance(body.items[1], ProtocolError) and "kind" in body.items[1].message
    assert isinstance(body.items[2], ProtocolError) and "attempt" in body.items[2].message
    assert isinstance(body.items[3], ProtocolError) and "map" in body.items[3].message
    assert isinstance(body.items[4], ProtocolError) and "kind" in body.items[4].message


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (None, "items must be an array"),
        ([], "at least one item"),
        ([{"kind": "ack", "job_id": "a", "attempt": 1}] * (pm.MAX_SETTLE_BATCH + 1), "at most 256"),
    ],
)
def test_a_settle_without_items_or_over_max_settle_batch_is_refused_whole(
    items: object, words: str
) -> None:
    request = decode_request(
        msgpack.packb([7, pm.OP_SETTLE, {} if items is None else {"items": items}])
    )
    with pytest.raises(ProtocolError, match=words) as caught:
        pm.parse_body(request)
    assert caught.value.request_id == 7  # type: ignore[attr-defined]


def test_a_settle_of_exactly_max_settle_batch_items_is_accepted() -> None:
    items = [{"kind": "ack", "job_id": str(i), "attempt": 1} for i in range(pm.MAX_SETTLE_BATCH)]
    assert len(pm.parse_settle({"items": items}).items) == pm.MAX_SETTLE_BATCH


def test_settle_request_and_answer_round_trip_through_the_envelopes() -> None:
    body = {"items": [{"kind": "ack", "job_id": "a", "attempt": 1}]}
    assert decode_request(encode_request(9, pm.OP_SETTLE, body)) == (9, pm.OP_SETTLE, body)
    answer = {"results": [{"status": "not_found", "message": "gone"}, {"status": "ok"}]}
    assert decode_response(encode_response(9, "ok", answer)) == (9, "ok", answer)


# -- fuzzing: only typed errors ------------------------------------------------------

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.binary(max_size=200))
def test_garbage_bytes_only_ever_give_frames_or_framing_errors(data: bytes) -> None:
    reader = FrameReader(64)
    try:
        frames = reader.feed(data)
    except (FrameTooLarge, ProtocolViolation):
        return
    for frame in frames:
        with contextlib.suppress(ProtocolError, ProtocolViolation):
            decode_request(frame)


@given(st.integers(0, 2**64 - 1), st.sampled_from(pm.OPS), _values)
def test_any_body_parses_or_raises_protocol_error(request_id: int, op: str, body: object) -> None:
    with contextlib.suppress(ProtocolError, ProtocolViolation):
        pm.parse_body(decode_request(msgpack.packb([request_id, op, body], use_bin_type=True)))


@given(_values)
def test_any_response_decodes_or_raises_violation(value: object) -> None:
    with contextlib.suppress(ProtocolViolation):
        decode_response(msgpack.packb(value, use_bin_type=True))


# -- the hot parsers' fast paths agree with the field-by-field checks ----------------


def _field_by_field_reserve(body: dict) -> pm.ReserveBody:
    f = pm.Fields(body)
    wait_ms = f.opt_int("wait_ms")
    max_jobs = f.opt_int("max_jobs")
    order = f.opt_str("order")
    layout = f.opt_str("job_layout")
    if layout not in (None, "map", "array"):
        raise ProtocolError('job_layout must be "map" or "array", not ' + f"{layout!r:.40}")
    return pm.ReserveBody(
        f.str_list("queues"),
        f.integer("lease_ms"),
        0 if wait_ms is None else wait_ms,
        1 if max_jobs is None else max_jobs,
        f.opt_str("worker_id"),
        "strict" if order is None else order,
        "map" if layout is None else layout,
    )


def _field_by_field_ack(body: dict) -> pm.AckBody:
    f = pm.Fields(body)
    return pm.AckBody(
        f.text("job_id"), f.integer("attempt"), f.opt_str("worker_id"), f.opt_int("enqueued_at_ms")
    )


def _outcome(parse, body: dict) -> object:
    try:
        return ("ok", parse(body), [type(v) for v in parse(body)])
    except ProtocolError as exc:
        return ("error", exc.message)


# Values near each field's type: well-typed ones (so the fast path is taken) mixed
# with the wrong types and out-of-range integers that must fall back to the checks.
_near_int = st.integers(-(2**63), 2**63 - 1) | st.integers(2**63, 2**64 - 1) | st.booleans()
_near = _near_int | st.none() | st.text(max_size=4) | st.floats(allow_nan=False)
_near_strs = st.lists(st.text(max_size=4), max_size=3) | st.lists(_near, max_size=3)


def _body(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=fields)


@given(
    _body(
        {
            "queues": _near_strs | _near,
            "lease_ms": _near,
            "wait_ms": _near,
            "max_jobs": _near,
            "worker_id": _near,
            "order": _near,
            "job_layout": _near | st.sampled_from(["map", "array"]),
        }
    )
)
def test_parse_reserve_equals_the_field_by_field_checks(body: dict) -> None:
    assert _outcome(pm.parse_reserve, body) == _outcome(_field_by_field_reserve, body)


@given(_body({"job_id": _near, "attempt": _near, "worker_id": _near, "enqueued_at_ms": _near}))
def test_parse_ack_equals_the_field_by_field_checks(body: dict) -> None:
    assert _outcome(pm.parse_ack, body) == _outcome(_field_by_field_ack, body)
