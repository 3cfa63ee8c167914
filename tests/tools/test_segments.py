"""The tools' segment reader classifies exactly as `log_format.read_segment` does,
in bounded memory, and the walk over all segments reports the recovery table's
verdicts read-only.

The reader is compared with `read_segment` on segment files damaged at random
(bit flips, truncations, zeroed ranges, garbage, duplicated and removed records),
read in chunks as small as one record header, so that every record and every kind
of damage straddles a chunk boundary somewhere.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    CleanEnd,
    Corruption,
    Record,
    SegmentHeader,
    ValidEnvelopes,
    decode_segment_header,
    find_next_valid_record,
    read_segment,
    scan_records,
)
from tests.tools.helpers import (
    record_size,
    records_of,
    scripted_log,
    segment_paths,
)
from tools.segments import Resync, Span, scan_segment_file, scan_segment_spans


def _normal(item: Any) -> Any:
    if type(item) is Record:
        return ("record", item.offset, item.seq, item.kind, bytes(item.body))
    return item


def _reference(path: Path) -> list[Any]:
    items = list(read_segment(path))
    out = [_normal(item) for item in items]
    del items
    return out


def _tools(path: Path, chunk_bytes: int) -> list[Any]:
    reference_header = _reference(path)[0]
    if type(reference_header) is not SegmentHeader:
        return [reference_header]
    items = scan_segment_file(
        str(path), expected_seq=reference_header.first_seq, chunk_bytes=chunk_bytes
    )
    return [reference_header, *(_normal(item) for item in items)]


def _damage(data: bytes, rng: random.Random, record_offsets: list[int]) -> tuple[str, bytes]:
    size = len(data)
    choice = rng.randrange(7)
    if choice == 0:
        at = rng.randrange(FILE_HEADER_BYTES, size)
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        return f"flip byte {at}", bytes(flipped)
    if choice == 1:
        cut = rng.randrange(FILE_HEADER_BYTES, size)
        return f"truncate at {cut}", data[:cut]
    if choice == 2:
        start = rng.randrange(FILE_HEADER_BYTES, size)
        end = size if rng.random() < 0.5 else rng.randrange(start, size + 1)
        return f"zero {start}..{end}", data[:start] + bytes(end - start) + data[end:]
    if choice == 3:
        start = rng.randrange(FILE_HEADER_BYTES, size)
        end = rng.randrange(start, min(size, start + 64) + 1)
        return f"garbage {start}..{end}", data[:start] + rng.randbytes(end - start) + data[end:]
    if choice == 4:
        index = rng.randrange(len(record_offsets) - 1)
        start, end = record_offsets[index], record_offsets[index + 1]
        return f"remove record at {start}", data[:start] + data[end:]
    if choice == 5:
        index = rng.randrange(len(record_offsets) - 1)
        start, end = record_offsets[index], record_offsets[index + 1]
        return f"duplicate record at {start}", data[:end] + data[start:end] + data[end:]
    tail = rng.randbytes(rng.randrange(1, 40))
    return "append garbage", data + tail


def test_reader_classifies_damaged_segments_exactly_as_read_segment(
    tmp_path: Path, rng: random.Random
) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    sources = segment_paths(tmp_path / "data")
    for case in range(150):
        source = rng.choice(sources)
        data = source.read_bytes()
        offsets = [r.offset for r in records_of(source)] + [len(data)]
        what, damaged = _damage(data, rng, offsets)
        path = tmp_path / f"case{case}" / source.name
        path.parent.mkdir()
        path.write_bytes(damaged)
        expected = _reference(path)
        for chunk_bytes in (24, 100, rng.randrange(24, 2000), 1 << 20):
            assert _tools(path, chunk_bytes) == expected, (what, chunk_bytes)


def _reference_resync(data: bytes, first_seq: int) -> list[Any]:
    """The resync rule applied to whole-file scans: after a Corruption, go on at the
    record of a sequence gap, else at the next valid record the format's search
    finds (seq >= the one expected)."""
    out: list[Any] = []
    off, seq = FILE_HEADER_BYTES, first_seq
    while True:
        items = list(scan_records(data, start_offset=off, expected_seq=seq))
        for item in items:
            if type(item) is Record:
                seq = item.seq + 1
            out.append(_normal(item))
        last = items[-1]
        if type(last) is not Corruption:
            return out
        if last.seq is not None and last.reason.startswith("sequence gap"):
            nxt: tuple[int, int] | None = (last.offset, last.seq)
        else:
            nxt = find_next_valid_record(data, start=last.offset + 1, min_seq=seq)
        if nxt is None:
            return out
        out.append(Resync(*nxt))
        off, seq = nxt


def test_reader_resyncs_after_every_damage_as_the_format_search_does(
    tmp_path: Path, rng: random.Random
) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    sources = segment_paths(tmp_path / "data")
    for case in range(100):
        source = rng.choice(sources)
        damaged = source.read_bytes()
        for _ in range(rng.randrange(1, 4)):
            offsets = [r.offset for r in _valid_records(damaged)] + [len(damaged)]
            if len(offsets) < 2:
                break
            _what, damaged = _damage(damaged, rng, offsets)
        path = tmp_path / f"case{case}" / source.name
        path.parent.mkdir()
        path.write_bytes(damaged)
        first_seq = int(source.stem)
        expected = _reference_resync(damaged, first_seq)
        for chunk_bytes in (24, rng.randrange(24, 3000), 1 << 20):
            items = scan_segment_file(
                str(path), expected_seq=first_seq, chunk_bytes=chunk_bytes, resync=True
            )
            assert [_normal(item) for item in items] == expected, (case, chunk_bytes)


def _valid_records(data: bytes) -> list[Record]:
    first_seq = decode_segment_header(data).first_seq
    return [
        item
        for item in scan_records(data, start_offset=FILE_HEADER_BYTES, expected_seq=first_seq)
        if type(item) is Record
    ]


def test_reader_reads_a_record_larger_than_a_chunk(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    path = segment_paths(tmp_path / "data")[0]
    records = records_of(path)
    biggest = max(record_size(r) for r in records)
    items = list(scan_segment_file(str(path), expected_seq=1, chunk_bytes=biggest // 3))
    assert [_normal(i) for i in items] == _reference(path)[1:]


def test_reader_resyncs_after_damage_when_asked(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    path = segment_paths(tmp_path / "data")[0]
    records = records_of(path)
    damaged = bytearray(path.read_bytes())
    damaged[records[3].offset + 30] ^= 1  # body of seq 4
    damaged[records[8].offset + 2] ^= 1  # header of seq 9
    path.write_bytes(bytes(damaged))
    items = [
        _normal(item)
        for item in scan_segment_file(str(path), expected_seq=1, chunk_bytes=500, resync=True)
    ]
    kinds = [item[0] if type(item) is tuple else item for item in items]
    assert kinds == [
        "record",
        "record",
        "record",
        Corruption(records[3].offset, 4, "bad body checksum"),
        Resync(records[4].offset, 5),
        "record",
        "record",
        "record",
        "record",
        Corruption(records[8].offset, None, "bad header checksum"),
        Resync(records[9].offset, 10),
        "record",
        "record",
        "record",
        CleanEnd(path.stat().st_size),
    ]


@pytest.mark.parametrize("chunk_bytes", [24, 4096])
def test_reader_on_a_clean_segment_yields_every_record_then_a_clean_end(
    tmp_path: Path, chunk_bytes: int
) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    for path in segment_paths(tmp_path / "data"):
        assert _tools(path, chunk_bytes) == _reference(path)


def _take_with_the_fast_path(
    path: Path, first_seq: int, rng: random.Random, read_whole: bool
) -> list[Any]:
    """`scan_segment_spans` driven by a consumer that takes a random number of
    records from each span with `ValidEnvelopes` (noting them as records), as the
    items `scan_segment_file` would have yielded."""
    out: list[Any] = []
    items = scan_segment_spans(
        str(path), expected_seq=first_seq, read_whole=read_whole, resync=True
    )
    for item in items:
        if type(item) is not Span:
            out.append(_normal(item))
            continue
        run = ValidEnvelopes(
            item.buf,
            start_offset=item.offset,
            expected_seq=item.seq,
            until_seq=item.seq + rng.randrange(4) - 1 if rng.random() < 0.5 else None,
        )
        offset, seq = item.offset, item.seq
        for envelope in run:
            end = record_end_at(item.buf, offset)
            out.append(("record", offset, seq, 1, bytes(item.buf[offset + 24 : end])))
            assert envelope == list(msgpack.unpackb(item.buf[offset + 24 : end]))
            offset, seq = end, seq + 1
        assert (run.offset, run.seq) == (offset, seq)
        item.offset, item.seq = run.offset, run.seq
    return out


def record_end_at(buf: Any, offset: int) -> int:
    return offset + RECORD_HEADER_BYTES + int.from_bytes(buf[offset + 8 : offset + 12], "little")


def test_spans_classify_damaged_segments_as_the_chunked_reader_does(
    tmp_path: Path, rng: random.Random
) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    sources = segment_paths(tmp_path / "data")
    for case in range(100):
        source = rng.choice(sources)
        damaged = source.read_bytes()
        for _ in range(rng.randrange(0, 4)):
            offsets = [r.offset for r in _valid_records(damaged)] + [len(damaged)]
            if len(offsets) < 2:
                break
            _what, damaged = _damage(damaged, rng, offsets)
        path = tmp_path / f"case{case}" / source.name
        path.parent.mkdir()
        path.write_bytes(damaged)
        first_seq = int(source.stem)
        expected = [
            _normal(item)
            for item in scan_segment_file(str(path), expected_seq=first_seq, resync=True)
        ]
        for read_whole in (False, True):
            assert _take_with_the_fast_path(path, first_seq, rng, read_whole) == expected, case
