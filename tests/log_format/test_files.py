"""File names and the 32-byte segment and snapshot headers."""

from __future__ import annotations

import struct

import pytest

from log_format import (
    SEGMENT_MAGIC,
    SNAPSHOT_MAGIC,
    FormatError,
    SegmentHeader,
    SnapshotHeader,
    decode_segment_header,
    decode_snapshot_header,
    encode_segment_header,
    encode_snapshot_header,
    masked_crc32c,
    parse_segment_file_name,
    parse_snapshot_file_name,
    segment_file_name,
    snapshot_file_name,
)

U64_MAX = 2**64 - 1


def raw_header(
    magic: bytes = SEGMENT_MAGIC,
    version: int = 1,
    flags: int = 0,
    reserved: int = 0,
    number: int = 1,
    reserved2: int = 0,
    crc: int | None = None,
) -> bytes:
    covered = struct.pack("<8sHHIQ", magic, version, flags, reserved, number)
    crc = masked_crc32c(covered) if crc is None else crc
    return covered + struct.pack("<II", crc, reserved2)


# ---------------------------------------------------------------- golden bytes


def test_segment_header_golden_bytes() -> None:
    assert encode_segment_header(1).hex() == (
        "5345505057414c00"  # magic "SEPPWAL\0"
        "0100"  # format version 1
        "0000"  # flags
        "00000000"  # reserved
        "0100000000000000"  # first_seq 1
        "103eb168"  # header_crc
        "00000000"  # reserved
    )


def test_snapshot_header_golden_bytes() -> None:
    assert encode_snapshot_header(42).hex() == (
        "53455050534e4150"  # magic "SEPPSNAP"
        "0100"  # format version 1
        "0000"  # flags
        "00000000"  # reserved
        "2a00000000000000"  # last_seq 42
        "17ed81f1"  # header_crc
        "00000000"  # reserved
    )


# ---------------------------------------------------------------- names


def test_segment_file_name_is_twenty_digits_and_log() -> None:
    assert segment_file_name(1) == "00000000000000000001.log"
    assert segment_file_name(U64_MAX) == "18446744073709551615.log"


def test_snapshot_file_name_is_twenty_digits_and_snap() -> None:
    assert snapshot_file_name(42) == "00000000000000000042.snap"
    assert snapshot_file_name(0) == "00000000000000000000.snap"


@pytest.mark.parametrize("bad", [0, -1, 2**64, True, 1.0, "1"])
def test_segment_file_name_rejects_what_no_segment_has(bad: object) -> None:
    with pytest.raises(ValueError):
        segment_file_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 2**64, False])
def test_snapshot_file_name_rejects_out_of_range(bad: object) -> None:
    with pytest.raises(ValueError):
        snapshot_file_name(bad)  # type: ignore[arg-type]


def test_names_round_trip() -> None:
    for n in (1, 7, 10**12, U64_MAX):
        assert parse_segment_file_name(segment_file_name(n)) == n
        assert parse_snapshot_file_name(snapshot_file_name(n)) == n
    assert parse_snapshot_file_name(snapshot_file_name(0)) == 0


@pytest.mark.parametrize(
    "name",
    [
        "0000000000000000001.log",  # 19 digits
        "000000000000000000001.log",  # 21 digits
        "00000000000000000001.LOG",
        "00000000000000000001.log.tmp",
        "00000000000000000001.snap",
        "+0000000000000000001.log",
        " 0000000000000000001.log",
        "0000000000000000000\u0661.log",  # ARABIC-INDIC DIGIT ONE: isdigit() but not ours
        "00000000000000000000.log",  # a segment never starts at seq 0
        "99999999999999999999.log",  # above 2**64 - 1
        "",
        ".log",
    ],
)
def test_parse_segment_file_name_rejects_every_other_name(name: str) -> None:
    assert parse_segment_file_name(name) is None


@pytest.mark.parametrize(
    "name",
    ["0000000000000000042.snap", "00000000000000000042.log", "99999999999999999999.snap", "x.snap"],
)
def test_parse_snapshot_file_name_rejects_every_other_name(name: str) -> None:
    assert parse_snapshot_file_name(name) is None


def test_lexicographic_order_of_names_is_log_order() -> None:
    numbers = [1, 9, 10, 99, 100, 12345, 10**19, U64_MAX]
    assert sorted(segment_file_name(n) for n in numbers) == [segment_file_name(n) for n in numbers]


# ---------------------------------------------------------------- headers


def test_segment_header_round_trips() -> None:
    for first_seq in (1, 2**32, U64_MAX):
        header = decode_segment_header(encode_segment_header(first_seq))
        assert header == SegmentHeader(version=1, flags=0, first_seq=first_seq)


def test_snapshot_header_round_trips_including_empty_log() -> None:
    for last_seq in (0, 1, U64_MAX):
        header = decode_snapshot_header(encode_snapshot_header(last_seq))
        assert header == SnapshotHeader(version=1, flags=0, last_seq=last_seq)


def test_header_decoders_ignore_bytes_after_the_header() -> None:
    data = encode_segment_header(5) + b"records follow"
    assert decode_segment_header(data).first_seq == 5
    assert decode_segment_header(memoryview(data)).first_seq == 5
    assert decode_segment_header(bytearray(data)).first_seq == 5


@pytest.mark.parametrize("bad", [0, -1, 2**64, True])
def test_encode_segment_header_rejects_bad_first_seq(bad: int) -> None:
    with pytest.raises(ValueError):
        encode_segment_header(bad)


@pytest.mark.parametrize("bad", [-1, 2**64, True])
def test_encode_snapshot_header_rejects_bad_last_seq(bad: int) -> None:
    with pytest.raises(ValueError):
        encode_snapshot_header(bad)


BAD_SEGMENT_HEADERS = [
    ("short", encode_segment_header(1)[:31], "truncated header"),
    ("empty", b"", "truncated header"),
    ("bad magic", raw_header(magic=b"SEPPWAL\x01"), "bad magic"),
    ("snapshot magic", encode_snapshot_header(1), "bad magic"),
    ("bad crc", raw_header(crc=0), "bad header checksum"),
    (
        "flipped seq bit",
        raw_header(number=1, crc=masked_crc32c(raw_header(number=3)[:24])),
        "bad header checksum",
    ),
    ("version 2", raw_header(version=2), "unsupported format version 2"),
    ("version 0", raw_header(version=0), "unsupported format version 0"),
    ("flags", raw_header(flags=1), "nonzero flags"),
    ("reserved at 12", raw_header(reserved=1), "nonzero reserved bytes"),
    ("reserved at 28", raw_header(reserved2=1), "nonzero reserved bytes"),
    ("first_seq 0", raw_header(number=0), "first_seq is 0"),
]


@pytest.mark.parametrize(
    ("data", "reason"),
    [(data, reason) for _, data, reason in BAD_SEGMENT_HEADERS],
    ids=[name for name, _, _ in BAD_SEGMENT_HEADERS],
)
def test_bad_segment_header_raises_format_error_with_reason(data: bytes, reason: str) -> None:
    with pytest.raises(FormatError) as excinfo:
        decode_segment_header(data)
    assert excinfo.value.reason == reason
    assert excinfo.value.offset is not None


def test_checksum_is_checked_before_version() -> None:
    # A version field garbled in place reads as damage, not as another sepp's file.
    data = bytearray(encode_segment_header(1))
    data[8] = 2
    with pytest.raises(FormatError, match="bad header checksum"):
        decode_segment_header(bytes(data))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (encode_segment_header(1), "bad magic"),
        (raw_header(magic=SNAPSHOT_MAGIC, version=3), "unsupported format version 3"),
        (raw_header(magic=SNAPSHOT_MAGIC, reserved2=7), "nonzero reserved bytes"),
        (encode_snapshot_header(1)[:20], "truncated header"),
    ],
)
def test_bad_snapshot_header_raises_format_error_with_reason(data: bytes, reason: str) -> None:
    with pytest.raises(FormatError) as excinfo:
        decode_snapshot_header(data)
    assert excinfo.value.reason == reason


def test_format_error_is_a_value_error_with_reason_and_offset() -> None:
    error = FormatError("bad magic", offset=0)
    assert isinstance(error, ValueError)
    assert (error.reason, error.offset) == ("bad magic", 0)
    assert str(error) == "bad magic (at offset 0)"
    assert str(FormatError("x")) == "x"
