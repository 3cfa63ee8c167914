"""Snapshot files: the same record framing, snapshot kinds, and a structure that
makes a snapshot usable only when it ends with its END record."""

from __future__ import annotations

from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    RECORD_KIND_SNAPSHOT_BEGIN,
    RECORD_KIND_SNAPSHOT_DEAD_LETTERS,
    RECORD_KIND_SNAPSHOT_DEDUP,
    RECORD_KIND_SNAPSHOT_END,
    RECORD_KIND_SNAPSHOT_JOBS,
    CleanEnd,
    Corruption,
    Record,
    TornTail,
    scan_snapshot_records,
)

BEGIN, JOBS, DEDUP, DEAD, END = (
    RECORD_KIND_SNAPSHOT_BEGIN,
    RECORD_KIND_SNAPSHOT_JOBS,
    RECORD_KIND_SNAPSHOT_DEDUP,
    RECORD_KIND_SNAPSHOT_DEAD_LETTERS,
    RECORD_KIND_SNAPSHOT_END,
)


def snapshot(kit: Any, kinds: list[int]) -> Any:
    return kit.segment(kit.bodies(len(kinds)), kinds=kinds, snapshot=True)


def scan(data: bytes) -> list[Any]:
    return list(scan_snapshot_records(data))


def test_complete_snapshot_scans_to_records_then_clean_end(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, JOBS, JOBS, DEDUP, DEAD, END])
    items = scan(built.data)
    assert [type(item) for item in items] == [Record] * 6 + [CleanEnd]
    assert [item.kind for item in items[:-1]] == [BEGIN, JOBS, JOBS, DEDUP, DEAD, END]
    assert [item.seq for item in items[:-1]] == [1, 2, 3, 4, 5, 6]
    assert items[-1] == CleanEnd(built.end)


def test_minimal_snapshot_is_begin_then_end(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, END])
    assert type(scan(built.data)[-1]) is CleanEnd


def test_snapshot_without_end_record_is_incomplete(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, JOBS, DEDUP])
    assert scan(built.data)[-1] == TornTail(built.end, "incomplete snapshot: no end record")


def test_snapshot_without_records_is_incomplete(kit: Any) -> None:
    built = snapshot(kit, [])
    assert scan(built.data) == [TornTail(FILE_HEADER_BYTES, "incomplete snapshot: no end record")]


def test_truncated_snapshot_is_torn_tail(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, JOBS, END])
    assert scan(built.data[:-2])[-1] == TornTail(built.offsets[2], "truncated record body")


def test_snapshot_not_starting_with_begin_is_corruption(kit: Any) -> None:
    built = snapshot(kit, [JOBS, END])
    assert scan(built.data) == [
        Corruption(FILE_HEADER_BYTES, 1, "snapshot does not start with a begin record")
    ]


def test_second_begin_record_is_corruption(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, JOBS, BEGIN, END])
    assert scan(built.data)[-1] == Corruption(built.offsets[2], 3, "second snapshot begin record")


def test_record_after_end_record_is_corruption(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, END, JOBS])
    assert scan(built.data)[-1] == Corruption(
        built.offsets[2], 3, "record after snapshot end record"
    )


def test_trailing_bytes_after_end_record_are_corruption(kit: Any) -> None:
    # A snapshot is synced before it is renamed: no crash leaves bytes after END.
    built = snapshot(kit, [BEGIN, END])
    assert scan(built.data + bytes(10))[-1] == Corruption(
        built.end, None, "trailing data after snapshot end record"
    )


def test_command_record_in_a_snapshot_is_corruption(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, RECORD_KIND_COMMAND, END])
    assert scan(built.data)[-1] == Corruption(built.offsets[1], 2, "unexpected record kind 1")


def test_flipped_bit_in_middle_snapshot_record_is_corruption(kit: Any) -> None:
    built = snapshot(kit, [BEGIN, JOBS, END])
    damaged = kit.flip_bit(built.data, built.offsets[1] + 30)
    assert scan(damaged)[-1] == Corruption(built.offsets[1], 2, "bad body checksum")


def test_stale_log_records_in_a_torn_snapshot_tail_do_not_count(kit: Any) -> None:
    # Command records are not snapshot kinds, so the search ignores them.
    built = snapshot(kit, [BEGIN, JOBS])
    stale = kit.segment(kit.bodies(3)).data[FILE_HEADER_BYTES:]
    assert scan(built.data + b"\x99" * 5 + stale)[-1] == TornTail(built.end, "bad header checksum")
