"""Record framing on the writer side: golden bytes, and a writer that checks what it
writes."""

from __future__ import annotations

import array

import pytest

from log_format import (
    COMMAND_ACK,
    RECORD_BODY_BYTES_MAX,
    RECORD_KIND_COMMAND,
    RECORD_KIND_SNAPSHOT_END,
    CleanEnd,
    Record,
    encode_envelope,
    encode_record,
    encode_record_header,
    encode_record_header_parts,
    encode_segment_header,
    masked_crc32c,
    masked_crc32c_parts,
    scan_records,
)

# The one-record segment of FORMAT.md section 10; the document's hex dump is checked
# against these bytes (test_format_md.py).
ONE_RECORD_SEGMENT_HEX = (
    "5345505057414c000100000000000000"
    "0100000000000000103eb16800000000"
    "7b47b15ca7768a434000000001000000"
    "01000000000000009401cf0000018bcf"
    "e568000491950301d924303139306131"
    "62322d633364342d376535662d386139"
    "622d30633164326533663461356201a8"
    "776f726b65722d31"
)


def one_record_segment() -> bytes:
    event = [3, 1, "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", 1, "worker-1"]
    body = encode_envelope(1_700_000_000_000, COMMAND_ACK, [event])
    return encode_segment_header(1) + encode_record(1, RECORD_KIND_COMMAND, body)


def test_record_golden_bytes() -> None:
    assert encode_record(1, RECORD_KIND_COMMAND, b"hello").hex() == (
        "65ddd46a"  # header_crc
        "bb1f1c19"  # body_crc
        "05000000"  # body_len 5
        "01000000"  # kind 1, reserved
        "0100000000000000"  # seq 1
        "68656c6c6f"  # body
    )


def test_empty_body_record_with_largest_seq_golden_bytes() -> None:
    assert encode_record(2**64 - 1, RECORD_KIND_SNAPSHOT_END, b"").hex() == (
        "5cd2856f"  # header_crc
        "d8ea82a2"  # body_crc (of nothing)
        "00000000"  # body_len 0
        "14000000"  # kind 20 (snapshot_end), reserved
        "ffffffffffffffff"  # seq 2**64 - 1
    )


def test_one_record_segment_golden_bytes() -> None:
    assert one_record_segment().hex() == ONE_RECORD_SEGMENT_HEX


def test_one_record_segment_scans_back() -> None:
    data = one_record_segment()
    items = list(scan_records(data, expected_seq=1))
    assert [type(item) for item in items] == [Record, CleanEnd]
    assert items[1] == CleanEnd(len(data))


def test_record_header_checksums_cover_the_documented_bytes() -> None:
    record = encode_record(7, RECORD_KIND_COMMAND, b"body")
    assert int.from_bytes(record[0:4], "little") == masked_crc32c(record[4:24])
    assert int.from_bytes(record[4:8], "little") == masked_crc32c(b"body")


def test_encode_record_is_header_then_body() -> None:
    body = b"payload bytes"
    assert encode_record(3, 1, body) == encode_record_header(3, 1, body) + body
    assert encode_record(3, 1, bytearray(body)) == encode_record(3, 1, body)
    assert encode_record(3, 1, memoryview(body)) == encode_record(3, 1, body)


def test_body_length_counts_bytes_not_items() -> None:
    body = array.array("I", [1, 2, 3])
    header = encode_record_header(1, 1, memoryview(body))
    assert int.from_bytes(header[8:12], "little") == 12


@pytest.mark.parametrize("kind", [0, 2, 15, 21, 255, 256, -1])
def test_writer_refuses_invalid_kind(kind: int) -> None:
    with pytest.raises(ValueError, match="invalid record kind"):
        encode_record(1, kind, b"")


@pytest.mark.parametrize("seq", [0, -1, 2**64, True])
def test_writer_refuses_invalid_seq(seq: int) -> None:
    with pytest.raises(ValueError, match="seq must be"):
        encode_record(seq, 1, b"")


def test_writer_refuses_body_over_the_maximum() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode_record_header(1, 1, bytes(RECORD_BODY_BYTES_MAX + 1))


def test_a_header_over_body_parts_is_the_header_over_their_concatenation() -> None:
    parts = [b"\x95\x02", bytes(range(256)) * 300, b"", b"tail"]
    body = b"".join(parts)
    assert masked_crc32c_parts(parts) == masked_crc32c(body)
    header = encode_record_header_parts(7, RECORD_KIND_COMMAND, parts)
    assert header + body == encode_record(7, RECORD_KIND_COMMAND, body)
    assert encode_record_header_parts(1, RECORD_KIND_COMMAND, []) == encode_record_header(
        1, RECORD_KIND_COMMAND, b""
    )


@pytest.mark.parametrize(
    ("seq", "kind", "parts", "match"),
    [
        (0, RECORD_KIND_COMMAND, [b"x"], "seq"),
        (1, 99, [b"x"], "record kind"),
        (1, RECORD_KIND_COMMAND, [b"x", bytearray(b"y")], "must be bytes"),
    ],
)
def test_a_header_over_parts_refuses_a_caller_bug(
    seq: int, kind: int, parts: list[bytes], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        encode_record_header_parts(seq, kind, parts)
