"""The record scanner classifies; these tests edit bytes and name the behaviour
(LevelDB's log_test style). Every test builds a real segment with the encoder,
damages it, and states what the reader must report."""

from __future__ import annotations

import mmap
import random
import struct
from typing import Any

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    RECORD_HEADER_BYTES,
    RECORD_KIND_SNAPSHOT_BEGIN,
    CleanEnd,
    Corruption,
    Record,
    TornTail,
    encode_record,
    find_next_valid_record,
    scan_records,
)


def scan(data: Any, expected_seq: int = 1, **kw: Any) -> list[Any]:
    return list(scan_records(data, expected_seq=expected_seq, **kw))


def records_then(built: Any, n: int, terminal: Any) -> list[Any]:
    """What a scan must yield: the first n records of `built`, then `terminal`."""
    data = built.data
    expected = []
    for i in range(n):
        off = built.offsets[i]
        body_len = struct.unpack_from("<I", data, off + 8)[0]
        body = data[off + RECORD_HEADER_BYTES : off + RECORD_HEADER_BYTES + body_len]
        expected.append(Record(off, i + 1, 1, memoryview(body)))
    return [*expected, terminal]


# ---------------------------------------------------------------- clean


def test_valid_segment_scans_to_records_then_clean_end(kit: Any) -> None:
    built = kit.segment(kit.bodies(5))
    items = scan(built.data)
    assert items == records_then(built, 5, CleanEnd(built.end))
    assert [item.seq for item in items[:-1]] == [1, 2, 3, 4, 5]
    assert bytes(items[2].body) == kit.bodies(5)[2]


def test_empty_segment_after_header_is_clean_end(kit: Any) -> None:
    built = kit.segment([])
    assert scan(built.data) == [CleanEnd(FILE_HEADER_BYTES)]


def test_records_continue_from_the_header_first_seq(kit: Any) -> None:
    built = kit.segment(kit.bodies(3), first_seq=1000)
    assert [item.seq for item in scan(built.data, expected_seq=1000)[:-1]] == [1000, 1001, 1002]


def test_empty_body_record_is_valid(kit: Any) -> None:
    built = kit.segment([b"", b"x", b""])
    assert [bytes(item.body) for item in scan(built.data)[:-1]] == [b"", b"x", b""]


def test_record_body_is_a_zero_copy_view_of_the_buffer(kit: Any) -> None:
    built = kit.segment([b"abc"])
    buf = bytearray(built.data)
    record = scan(buf)[0]
    assert isinstance(record.body, memoryview)
    buf[-1] = ord("z")  # the view sees the buffer, not a copy
    assert bytes(record.body) == b"abz"


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_scanner_accepts_any_bytes_like_buffer(kit: Any, wrap: Any) -> None:
    built = kit.segment(kit.bodies(3))
    assert scan(wrap(built.data)) == records_then(built, 3, CleanEnd(built.end))


def test_scanner_reads_an_mmap(kit: Any, tmp_path: Any) -> None:
    built = kit.segment(kit.bodies(3))
    path = tmp_path / "seg"
    path.write_bytes(built.data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        items = scan(mapped)
        assert items == records_then(built, 3, CleanEnd(built.end))
        del items  # release the views before the mapping closes


def test_scan_from_offset_zero_of_a_bare_record_buffer() -> None:
    data = encode_record(1, 1, b"a") + encode_record(2, 1, b"b")
    assert [bytes(r.body) for r in scan(data, start_offset=0)[:-1]] == [b"a", b"b"]


# ---------------------------------------------------------------- torn tails


def test_truncated_trailing_record_is_torn_tail(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    cut = built.data[: built.end - 5]
    assert scan(cut) == records_then(built, 2, TornTail(built.offsets[2], "truncated record body"))


def test_record_cut_right_after_its_header_is_torn_tail(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    cut = built.data[: built.offsets[2] + RECORD_HEADER_BYTES]
    assert scan(cut)[-1] == TornTail(built.offsets[2], "truncated record body")


@pytest.mark.parametrize("keep", [1, 10, 23])
def test_short_header_at_end_is_torn_tail(kit: Any, keep: int) -> None:
    built = kit.segment(kit.bodies(3))
    cut = built.data[: built.offsets[2] + keep]
    assert scan(cut) == records_then(
        built, 2, TornTail(built.offsets[2], "truncated record header")
    )


def test_flipped_bit_in_last_record_is_torn_tail(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.end - 1)
    assert scan(damaged) == records_then(built, 2, TornTail(built.offsets[2], "bad body checksum"))


def test_flipped_bit_in_last_record_header_is_torn_tail(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.offsets[2] + 17)  # inside seq
    assert scan(damaged)[-1] == TornTail(built.offsets[2], "bad header checksum")


def test_zero_filled_tail_is_torn_tail(kit: Any) -> None:
    # A crash that persisted the file size but not the data reads back as zeros.
    built = kit.segment(kit.bodies(3))
    assert scan(built.data + bytes(4096)) == records_then(
        built, 3, TornTail(built.end, "zero-filled tail")
    )


def test_zeroed_last_record_is_torn_tail(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    zeroed = built.data[: built.offsets[2]] + bytes(built.end - built.offsets[2])
    assert scan(zeroed)[-1] == TornTail(built.offsets[2], "zero-filled tail")


def test_zeroed_header_before_its_body_is_torn_tail(kit: Any) -> None:
    # Pages written back out of order: the body reached the disk, the header not.
    built = kit.segment(kit.bodies(3))
    off = built.offsets[2]
    damaged = (
        built.data[:off] + bytes(RECORD_HEADER_BYTES) + built.data[off + RECORD_HEADER_BYTES :]
    )
    assert scan(damaged)[-1] == TornTail(off, "bad header checksum")


def test_bad_header_followed_only_by_garbage_is_torn_tail(kit: Any, rng: random.Random) -> None:
    built = kit.segment(kit.bodies(3))
    garbage = rng.randbytes(8192)
    assert scan(built.data + garbage)[-1] == TornTail(built.end, "bad header checksum")


def test_stale_records_with_lower_seqs_after_damage_do_not_make_it_corruption(kit: Any) -> None:
    # A crash can expose stale blocks of a deleted older file in the tail: valid
    # records, but from the past. They must not turn a torn tail into corruption.
    built = kit.segment(kit.bodies(5))
    stale = kit.segment(kit.bodies(3)).data[FILE_HEADER_BYTES:]
    data = built.data + b"\x17" * 30 + stale
    assert scan(data)[-1] == TornTail(built.end, "bad header checksum")


def test_last_record_with_bad_body_then_zeros_is_torn_tail(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.end - 1) + bytes(100)
    assert scan(damaged)[-1] == TornTail(built.offsets[2], "bad body checksum")


# ---------------------------------------------------------------- corruption


def test_flipped_bit_in_middle_record_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.offsets[1] + RECORD_HEADER_BYTES + 3)
    assert scan(damaged) == records_then(
        built, 1, Corruption(built.offsets[1], 2, "bad body checksum")
    )


def test_flipped_bit_in_middle_record_header_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.offsets[1] + 9)  # inside body_len
    assert scan(damaged) == records_then(
        built, 1, Corruption(built.offsets[1], None, "bad header checksum")
    )


def test_bad_header_crc_followed_by_valid_record_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.offsets[1], bit=7)  # the checksum field itself
    assert scan(damaged)[-1] == Corruption(built.offsets[1], None, "bad header checksum")


def test_garbage_before_a_valid_record_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    off = built.offsets[1]
    damaged = built.data[:off] + b"\xee" * 7 + built.data[off:]
    assert scan(damaged)[-1] == Corruption(off, None, "bad header checksum")


def test_damage_followed_by_another_damaged_record_then_a_valid_one_is_corruption(
    kit: Any,
) -> None:
    built = kit.segment(kit.bodies(5))
    damaged = kit.flip_bit(built.data, built.offsets[1] + RECORD_HEADER_BYTES)  # body of 2
    damaged = kit.flip_bit(damaged, built.offsets[2] + 5)  # header of 3
    assert scan(damaged)[-1] == Corruption(built.offsets[1], 2, "bad body checksum")


def test_zeroed_page_in_the_middle_is_corruption_however_many_records_it_held(kit: Any) -> None:
    # 4 KiB of small records is far more than any fixed look-ahead window of
    # sequence numbers; the record after the hole must still be found.
    built = kit.segment([b"x" * 8 for _ in range(400)])
    hole = built.offsets[10]
    damaged = built.data[:hole] + bytes(4096) + built.data[hole + 4096 :]
    assert scan(damaged)[-1] == Corruption(hole, None, "bad header checksum")


def test_sequence_gap_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3), seqs=[1, 2, 4])
    assert scan(built.data) == records_then(
        built, 2, Corruption(built.offsets[2], 4, "sequence gap: expected 3, found 4")
    )


def test_repeated_sequence_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3), seqs=[1, 2, 2])
    assert scan(built.data)[-1] == Corruption(
        built.offsets[2], 2, "sequence repeat: expected 3, found 2"
    )


def test_first_record_other_than_expected_seq_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(2), first_seq=5)
    assert scan(built.data, expected_seq=4) == [
        Corruption(FILE_HEADER_BYTES, 5, "sequence gap: expected 4, found 5")
    ]


def test_sequence_gap_in_a_torn_last_record_is_still_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3), seqs=[1, 2, 9])
    cut = built.data[:-3]
    assert scan(cut)[-1] == Corruption(built.offsets[2], 9, "sequence gap: expected 3, found 9")


def test_oversized_length_field_followed_by_valid_record_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.patch_record_header(
        built.data, built.offsets[1], body_len=0xFFFFFFFF, fix_crc=False
    )
    assert scan(damaged)[-1] == Corruption(built.offsets[1], None, "bad header checksum")


def test_oversized_length_with_good_header_checksum_is_corruption_even_at_the_end(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.patch_record_header(
        built.data, built.offsets[2], body_len=RECORD_BODY_BYTES_MAX + 1
    )
    assert scan(damaged)[-1] == Corruption(
        built.offsets[2], 3, "record body length 67108865 exceeds maximum 67108864"
    )


def test_unknown_kind_with_good_header_checksum_is_corruption_even_at_the_end(kit: Any) -> None:
    # A checksummed header was written on purpose (perhaps by a newer sepp):
    # truncating it as a torn tail would drop data.
    built = kit.segment(kit.bodies(3))
    damaged = kit.patch_record_header(built.data, built.offsets[2], kind_word=2)
    assert scan(damaged)[-1] == Corruption(built.offsets[2], 3, "unknown record kind 2")


def test_kind_zero_is_never_valid(kit: Any) -> None:
    built = kit.segment(kit.bodies(2))
    damaged = kit.patch_record_header(built.data, built.offsets[0], kind_word=0)
    assert scan(damaged) == [Corruption(built.offsets[0], 1, "unknown record kind 0")]


def test_snapshot_record_in_a_segment_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(2), kinds=[1, RECORD_KIND_SNAPSHOT_BEGIN])
    assert scan(built.data)[-1] == Corruption(built.offsets[1], 2, "unexpected record kind 16")


def test_nonzero_reserved_bytes_is_corruption(kit: Any) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.patch_record_header(built.data, built.offsets[1], kind_word=0x0100_0001)
    assert scan(damaged)[-1] == Corruption(built.offsets[1], 2, "nonzero reserved bytes")


# ---------------------------------------------------------------- caller bugs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"expected_seq": 0},
        {"expected_seq": 2**64},
        {"expected_seq": 1, "start_offset": -1},
        {"expected_seq": 1, "start_offset": 10_000},
        {"expected_seq": 1, "kinds": []},
        {"expected_seq": 1, "kinds": [1, 2]},
    ],
)
def test_bad_arguments_raise_value_error_at_the_call(kit: Any, kwargs: Any) -> None:
    with pytest.raises(ValueError):
        scan_records(kit.segment([]).data, **kwargs)  # not iterated: eager check


# ---------------------------------------------------------------- resynchronising


def test_find_next_valid_record_finds_the_first_valid_record_after_damage(kit: Any) -> None:
    built = kit.segment(kit.bodies(4))
    damaged = kit.flip_bit(built.data, built.offsets[1] + 2)
    assert find_next_valid_record(damaged, start=built.offsets[1] + 1) == (built.offsets[2], 3)
    assert find_next_valid_record(damaged, start=built.offsets[1] + 1, min_seq=4) == (
        built.offsets[3],
        4,
    )
    assert find_next_valid_record(damaged, start=built.offsets[3] + 1) is None
    assert find_next_valid_record(damaged, start=built.end + 10) is None


@pytest.mark.parametrize("shift", range(-3, 4))
def test_find_next_valid_record_sees_records_across_search_chunk_edges(shift: int) -> None:
    # The search copies 1 MiB chunks starting at start + 12; put the kind word of the
    # only record right across a chunk edge.
    record = encode_record(9, 1, b"found me")
    pad = (1 << 20) + shift
    data = bytes(pad) + record + bytes(5)
    assert find_next_valid_record(data, start=0) == (pad, 9)
