"""Whole files from disk: the header is classified too, and a file of any content
yields classified items, never an exception."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_KIND_SNAPSHOT_BEGIN,
    RECORD_KIND_SNAPSHOT_END,
    BadHeader,
    CleanEnd,
    Corruption,
    Record,
    SegmentHeader,
    SnapshotHeader,
    TornTail,
    encode_segment_header,
    read_segment,
    read_snapshot,
    segment_file_name,
    snapshot_file_name,
)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_read_segment_yields_header_records_and_clean_end(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(3), first_seq=7)
    items = list(read_segment(write(tmp_path, segment_file_name(7), built.data)))
    assert items[0] == SegmentHeader(version=1, flags=0, first_seq=7)
    assert [item.seq for item in items[1:-1]] == [7, 8, 9]
    assert [bytes(item.body) for item in items[1:-1]] == kit.bodies(3)
    assert items[-1] == CleanEnd(built.end)


def test_read_segment_reports_a_torn_tail(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(3))
    items = list(read_segment(write(tmp_path, segment_file_name(1), built.data[:-1])))
    assert items[-1] == TornTail(built.offsets[2], "truncated record body")


def test_read_segment_reports_corruption(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(3))
    damaged = kit.flip_bit(built.data, built.offsets[0] + 30)
    items = list(read_segment(write(tmp_path, segment_file_name(1), damaged)))
    assert items[-1] == Corruption(built.offsets[0], 1, "bad body checksum")


def test_empty_segment_file_is_a_torn_header(tmp_path: Path) -> None:
    # A crash right after the file was created.
    assert list(read_segment(write(tmp_path, segment_file_name(1), b""))) == [
        TornTail(0, "truncated header")
    ]


@pytest.mark.parametrize("keep", [1, 8, 20, 31])
def test_segment_file_with_a_header_prefix_is_a_torn_header(tmp_path: Path, keep: int) -> None:
    data = encode_segment_header(1)[:keep]
    assert list(read_segment(write(tmp_path, segment_file_name(1), data))) == [
        TornTail(0, "truncated header")
    ]


def test_short_zero_filled_segment_file_is_a_torn_header(tmp_path: Path) -> None:
    assert list(read_segment(write(tmp_path, segment_file_name(1), bytes(12)))) == [
        TornTail(0, "truncated header")
    ]


def test_short_file_that_is_no_header_prefix_is_a_bad_header(tmp_path: Path) -> None:
    assert list(read_segment(write(tmp_path, segment_file_name(1), b"hello"))) == [
        BadHeader("bad magic")
    ]


def test_short_file_of_zeros_then_garbage_is_a_bad_header(tmp_path: Path) -> None:
    data = bytes(8) + b"xyz"
    assert list(read_segment(write(tmp_path, segment_file_name(1), data))) == [
        BadHeader("bad magic")
    ]


def test_zero_filled_segment_file_is_torn(tmp_path: Path) -> None:
    assert list(read_segment(write(tmp_path, segment_file_name(1), bytes(5000)))) == [
        TornTail(0, "zero-filled file")
    ]


@pytest.mark.parametrize(
    ("pos", "reason"),
    [
        (0, "bad magic"),
        (17, "bad header checksum"),
        (24, "bad header checksum"),
        (29, "nonzero reserved bytes"),
    ],
)
def test_damaged_segment_header_is_a_bad_header(
    kit: Any, tmp_path: Path, pos: int, reason: str
) -> None:
    built = kit.segment(kit.bodies(2))
    damaged = kit.flip_bit(built.data, pos)
    assert list(read_segment(write(tmp_path, segment_file_name(1), damaged))) == [BadHeader(reason)]


def test_segment_whose_header_disagrees_with_its_name_is_a_bad_header(
    kit: Any, tmp_path: Path
) -> None:
    built = kit.segment(kit.bodies(2), first_seq=1)
    assert list(read_segment(write(tmp_path, segment_file_name(2), built.data))) == [
        BadHeader("first_seq 1 does not match file name")
    ]


def test_segment_under_another_name_is_read_on_its_header(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(2), first_seq=5)
    items = list(read_segment(write(tmp_path, "copy-for-inspection.bin", built.data)))
    assert items[0] == SegmentHeader(version=1, flags=0, first_seq=5)
    assert items[-1] == CleanEnd(built.end)


def test_record_bodies_outlive_the_generator(kit: Any, tmp_path: Path) -> None:
    # The mapping cannot close while a body views it; that must not raise, and the
    # body stays readable.
    built = kit.segment(kit.bodies(3))
    records = [
        item
        for item in read_segment(write(tmp_path, segment_file_name(1), built.data))
        if type(item) is Record
    ]
    gc.collect()
    assert [bytes(r.body) for r in records] == kit.bodies(3)


def test_abandoning_the_generator_early_closes_cleanly(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(3))
    items = read_segment(write(tmp_path, segment_file_name(1), built.data))
    assert type(next(items)) is SegmentHeader
    first = next(items)
    items.close()
    assert bytes(first.body) == kit.bodies(3)[0]


def test_missing_file_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list(read_segment(tmp_path / segment_file_name(1)))


def test_read_snapshot_yields_header_records_and_clean_end(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(
        kit.bodies(2), kinds=[RECORD_KIND_SNAPSHOT_BEGIN, RECORD_KIND_SNAPSHOT_END], snapshot=True
    )
    items = list(read_snapshot(write(tmp_path, snapshot_file_name(0), built.data)))
    assert items[0] == SnapshotHeader(version=1, flags=0, last_seq=0)
    assert [type(item) for item in items[1:]] == [Record, Record, CleanEnd]


def test_incomplete_snapshot_file_is_torn(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(1), kinds=[RECORD_KIND_SNAPSHOT_BEGIN], snapshot=True)
    items = list(read_snapshot(write(tmp_path, snapshot_file_name(0), built.data)))
    assert items[-1] == TornTail(built.end, "incomplete snapshot: no end record")


def test_snapshot_whose_header_disagrees_with_its_name_is_a_bad_header(
    kit: Any, tmp_path: Path
) -> None:
    built = kit.segment([], snapshot=True)
    assert list(read_snapshot(write(tmp_path, snapshot_file_name(3), built.data))) == [
        BadHeader("last_seq 0 does not match file name")
    ]


def test_segment_read_as_snapshot_is_a_bad_header(kit: Any, tmp_path: Path) -> None:
    built = kit.segment(kit.bodies(1))
    assert list(read_snapshot(write(tmp_path, "x.snap", built.data))) == [BadHeader("bad magic")]


def test_snapshot_header_prefix_is_a_torn_header(tmp_path: Path) -> None:
    assert list(read_snapshot(write(tmp_path, "x.snap", b"SEPPS"))) == [
        TornTail(0, "truncated header")
    ]


def test_header_offset_constant_is_where_records_start() -> None:
    assert FILE_HEADER_BYTES == len(encode_segment_header(1)) == 32
