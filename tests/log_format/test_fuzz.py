"""Properties over generated input (the h11 rule): garbage fed to any decoder yields
a value or the typed error, never anything else; damage to a valid segment is
classified the way the crash model says; encode -> scan gives back what went in.

Hypothesis runs under the seed of tests/conftest.py (SEPP_SEED), which a failure
report prints; the examples are kept small so the whole file runs in seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import tempfile
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    SNAPSHOT_RECORD_KINDS,
    BadHeader,
    CleanEnd,
    Corruption,
    Envelope,
    FormatError,
    Record,
    SegmentHeader,
    TornTail,
    decode_envelope,
    decode_segment_header,
    decode_snapshot_header,
    encode_envelope,
    encode_record,
    encode_segment_header,
    encode_snapshot_header,
    read_segment,
    scan_records,
    scan_snapshot_records,
    validate_event,
)

FAST = settings(max_examples=150)
TERMINALS = (CleanEnd, TornTail, Corruption)

bodies_st = st.lists(st.binary(max_size=60), max_size=12)

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=4) | st.integers(0, 9), children, max_size=4)
    ),
    max_leaves=20,
)


def build(bodies: list[bytes], first_seq: int = 1) -> tuple[bytes, list[int]]:
    parts, offsets, pos = [encode_segment_header(first_seq)], [], FILE_HEADER_BYTES
    for i, body in enumerate(bodies):
        offsets.append(pos)
        record = encode_record(first_seq + i, 1, body)
        parts.append(record)
        pos += len(record)
    return b"".join(parts), offsets


def check_shape(items: list[Any], end: int) -> None:
    """Records then exactly one terminal; records contiguous, in seq order."""
    assert items, "a scan always ends with a terminal item"
    *records, terminal = items
    assert isinstance(terminal, TERMINALS)
    assert all(type(r) is Record for r in records)
    for a, b in itertools.pairwise(records):
        assert b.offset == a.offset + RECORD_HEADER_BYTES + len(a.body)
        assert b.seq == a.seq + 1
    if records:
        last = records[-1]
        assert terminal.offset == last.offset + RECORD_HEADER_BYTES + len(last.body)
    assert terminal.offset <= end
    if type(terminal) is CleanEnd:
        assert terminal.offset == end


# ---------------------------------------------------------------- garbage in


@FAST
@given(data=st.binary(max_size=400), expected_seq=st.integers(1, 2**64 - 1))
def test_arbitrary_bytes_scan_to_classified_items_only(data: bytes, expected_seq: int) -> None:
    check_shape(list(scan_records(data, start_offset=0, expected_seq=expected_seq)), len(data))
    check_shape(list(scan_snapshot_records(data, start_offset=0)), len(data))


@FAST
@given(data=st.binary(max_size=80))
def test_arbitrary_bytes_to_header_decoders_raise_only_format_error(data: bytes) -> None:
    for decode in (decode_segment_header, decode_snapshot_header):
        with contextlib.suppress(FormatError):
            decode(data)


@FAST
@given(
    first_seq=st.integers(1, 2**64 - 1),
    pos=st.integers(0, 31),
    value=st.integers(0, 255),
)
def test_mutated_headers_decode_or_raise_format_error(first_seq: int, pos: int, value: int) -> None:
    for header, decode in (
        (encode_segment_header(first_seq), decode_segment_header),
        (encode_snapshot_header(first_seq), decode_snapshot_header),
    ):
        mutated = bytearray(header)
        mutated[pos] = value
        with contextlib.suppress(FormatError):
            decode(bytes(mutated))


@FAST
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_to_decode_envelope_raise_only_format_error(data: bytes) -> None:
    with contextlib.suppress(FormatError):
        assert type(decode_envelope(data)) is Envelope


@FAST
@given(value=msgpack_values)
def test_any_msgpack_value_to_decode_envelope_raises_only_format_error(value: Any) -> None:
    for candidate in (value, [1, 0, 1, value], [1, 0, 1, [value]], [1, 0, 1, [[1, 1, value]]]):
        with contextlib.suppress(FormatError):
            decode_envelope(msgpack.packb(candidate, use_bin_type=True))


@FAST
@given(
    events=st.lists(st.lists(msgpack_values, min_size=2, max_size=6), max_size=4),
    cut=st.integers(0, 10_000),
    pos=st.integers(0, 10_000),
    value=st.integers(0, 255),
)
def test_mutated_envelopes_decode_or_raise_format_error(
    events: list[Any], cut: int, pos: int, value: int
) -> None:
    body = encode_envelope(123, 1, events)
    mutated = bytearray(body[: max(cut % (len(body) + 1), 1)])
    mutated[pos % len(mutated)] = value
    for candidate in (bytes(mutated), body[: cut % (len(body) + 1)]):
        with contextlib.suppress(FormatError):
            decode_envelope(candidate)


@FAST
@given(
    event=st.one_of(
        msgpack_values,
        st.lists(msgpack_values, max_size=18),
        st.tuples(st.integers(0, 13), st.integers(0, 2)).flatmap(
            lambda head: st.lists(msgpack_values, max_size=16).map(lambda rest: [*head, *rest])
        ),
    )
)
def test_validate_event_raises_only_format_error(event: Any) -> None:
    with contextlib.suppress(FormatError):
        validate_event(event)


# ---------------------------------------------------------------- damage to valid data


@FAST
@given(bodies=bodies_st.filter(bool), data=st.data())
def test_one_flipped_bit_is_corruption_in_the_middle_and_torn_at_the_end(
    bodies: list[bytes], data: st.DataObject
) -> None:
    segment, offsets = build(bodies)
    pos = data.draw(st.integers(FILE_HEADER_BYTES, len(segment) - 1), label="pos")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(segment)
    damaged[pos] ^= 1 << bit
    index = max(i for i, off in enumerate(offsets) if off <= pos)
    items = list(scan_records(bytes(damaged), expected_seq=1))
    check_shape(items, len(segment))
    assert [r.seq for r in items[:-1]] == list(range(1, index + 1))
    terminal = items[-1]
    assert terminal.offset == offsets[index]
    # CRC32C detects every single-bit error; what decides the class is whether a
    # valid record follows.
    assert type(terminal) is (Corruption if index < len(bodies) - 1 else TornTail)


@FAST
@given(bodies=bodies_st, data=st.data())
def test_truncation_and_zero_fill_are_never_corruption(
    bodies: list[bytes], data: st.DataObject
) -> None:
    # What a crash leaves: a prefix of what was written, maybe followed by zeros
    # where the size was persisted but the data was not.
    segment, offsets = build(bodies)
    cut = data.draw(st.integers(FILE_HEADER_BYTES, len(segment)), label="cut")
    zeros = data.draw(st.integers(0, 300), label="zeros")
    crashed = segment[:cut] + bytes(zeros)
    items = list(scan_records(crashed, expected_seq=1))
    check_shape(items, len(crashed))
    assert type(items[-1]) is not Corruption
    record_ends = [*offsets[1:], len(segment)] if bodies else []
    written = sum(1 for end in record_ends if end <= cut)
    # Every record completely written before the cut is read back (and rarely one
    # more: zeros can happen to restore the cut-off zero bytes of a record).
    assert written <= len(items) - 1 <= len(bodies)


@FAST
@given(
    bodies=bodies_st,
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=8)), max_size=4
    ),
    cut=st.integers(0, 10_000),
)
def test_mutated_segments_scan_to_classified_items_only(
    bodies: list[bytes], edits: list[tuple[int, bytes]], cut: int
) -> None:
    segment = bytearray(build(bodies)[0])
    for pos, patch in edits:
        pos = FILE_HEADER_BYTES + pos % (len(segment) - FILE_HEADER_BYTES + 1)
        segment[pos : pos + len(patch)] = patch
    data = bytes(segment[: max(FILE_HEADER_BYTES, cut % (len(segment) + 1))])
    check_shape(list(scan_records(data, expected_seq=1)), len(data))
    check_shape(list(scan_snapshot_records(data)), len(data))


@settings(max_examples=40)
@given(data=st.binary(max_size=200) | bodies_st.map(lambda b: build(b)[0]))
def test_read_segment_of_any_file_yields_classified_items_only(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "00000000000000000001.log")
        with open(path, "wb") as f:
            f.write(data)
        items = list(read_segment(path))
    assert type(items[0]) in (SegmentHeader, BadHeader, TornTail)
    if type(items[0]) is SegmentHeader:
        check_shape(items[1:], len(data))
    else:
        assert len(items) == 1


# ---------------------------------------------------------------- round trips


@FAST
@given(bodies=bodies_st, first_seq=st.integers(1, 2**63))
def test_encode_then_scan_gives_back_the_records_and_a_clean_end(
    bodies: list[bytes], first_seq: int
) -> None:
    segment, offsets = build(bodies, first_seq)
    assert decode_segment_header(segment).first_seq == first_seq
    items = list(scan_records(segment, expected_seq=first_seq))
    assert items[-1] == CleanEnd(len(segment))
    assert [(r.offset, r.seq, r.kind, bytes(r.body)) for r in items[:-1]] == [
        (off, first_seq + i, 1, body) for i, (off, body) in enumerate(zip(offsets, bodies))
    ]


@FAST
@given(
    middle=st.lists(st.sampled_from(sorted(SNAPSHOT_RECORD_KINDS - {16, 20})), max_size=6),
    body=st.binary(max_size=30),
)
def test_snapshot_round_trip(middle: list[int], body: bytes) -> None:
    kinds = [16, *middle, 20]
    data = encode_snapshot_header(7) + b"".join(
        encode_record(i + 1, kind, body) for i, kind in enumerate(kinds)
    )
    items = list(scan_snapshot_records(data))
    assert [r.kind for r in items[:-1]] == kinds
    assert items[-1] == CleanEnd(len(data))


@FAST
@given(
    time_ms=st.integers(0, 2**64 - 1),
    command_kind=st.integers(1, 10),
    events=st.lists(
        st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 9)).flatmap(
            lambda head: st.lists(msgpack_values, max_size=6).map(lambda rest: [*head, *rest])
        ),
        max_size=5,
    ),
)
def test_envelope_round_trip(time_ms: int, command_kind: int, events: list[Any]) -> None:
    envelope = decode_envelope(encode_envelope(time_ms, command_kind, events))
    assert envelope == Envelope(time_ms, command_kind, events)
    # framed and scanned back, it is the same body
    record = encode_record(1, 1, encode_envelope(time_ms, command_kind, events))
    (item, end) = scan_records(record, start_offset=0, expected_seq=1)
    assert type(end) is CleanEnd
    assert decode_envelope(item.body) == envelope
    assert struct.unpack_from("<I", record, 8)[0] == len(item.body)
