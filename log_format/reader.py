"""Reading whole segment and snapshot files from disk, classified.

Owns: `read_segment` and `read_snapshot`, which open a file read-only, map it
(so a multi-gigabyte segment is scanned in constant memory: the pages are the page
cache's, not the process's), classify its header and then its records.

Promises: for any file content whatsoever these generators yield only classified
items -- first the header (`SegmentHeader` / `SnapshotHeader`) or a header problem
(`BadHeader`, or `TornTail` at offset 0), and after a good header the items of
`scan_records` / `scan_snapshot_records`. They raise only what the operating system
raises (`OSError`: a missing file, no permission) -- never on damage.

Lifetime: `Record.body` is a memoryview into the mapping. The mapping is closed
when the generator finishes or is closed (`.close()`, e.g. after the caller stopped
at a terminal item) if no body is still referenced, otherwise when the last one is
garbage-collected. Do not scan a file that another process may truncate
while it is mapped (reading a truncated mapping is SIGBUS); sepp truncates only
during recovery, under its data-directory lock.

Must not import: anything but the standard library and `log_format`.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

from log_format._bytes import BytesLike, all_zero
from log_format.errors import FormatError
from log_format.files import (
    FILE_HEADER_BYTES,
    SEGMENT_MAGIC,
    SNAPSHOT_MAGIC,
    SegmentHeader,
    SnapshotHeader,
    decode_segment_header,
    decode_snapshot_header,
    parse_segment_file_name,
    parse_snapshot_file_name,
)
from log_format.records import (
    ScanItem,
    TornTail,
    scan_records,
    scan_snapshot_records,
)

__all__ = ["BadHeader", "SegmentItem", "SnapshotItem", "read_segment", "read_snapshot"]


@dataclass(frozen=True, slots=True)
class BadHeader:
    """Terminal: the file header is invalid for `reason` (the reasons of
    `decode_segment_header`, or a first_seq / last_seq that disagrees with the file
    name). Not something a crash leaves: a writer creates, writes and syncs the
    header before the first record."""

    reason: str


SegmentItem: TypeAlias = SegmentHeader | BadHeader | ScanItem
SnapshotItem: TypeAlias = SnapshotHeader | BadHeader | ScanItem

_H = TypeVar("_H", SegmentHeader, SnapshotHeader)


@contextmanager
def _mapped(path: str | os.PathLike[str]) -> Iterator[BytesLike]:
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            # mmap refuses empty files; an empty file is an ordinary case (a crash
            # right after creating a segment), so it gets the same treatment.
            yield b""
            return
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    # The mapping keeps its own reference to the file; the descriptor is closed.
    try:
        if hasattr(mapping, "madvise"):
            # Replay reads front to back once: let the kernel read ahead and drop
            # pages behind us.
            mapping.madvise(mmap.MADV_SEQUENTIAL)
        yield mapping
    finally:
        # BufferError: a caller still holds a Record body (a view into the mapping);
        # the mapping is then released when the last view is garbage-collected.
        with suppress(BufferError):
            mapping.close()


def _header_item(
    buf: BytesLike,
    decode: Callable[[BytesLike], _H],
    magic: bytes,
) -> _H | BadHeader | TornTail:
    try:
        return decode(buf)
    except FormatError as exc:
        size = len(buf)
        if size < FILE_HEADER_BYTES:
            # A crash while the header was being written leaves a prefix of it, or
            # zeros (size persisted, data not); anything else was never a header.
            head = bytes(buf[: len(magic)])
            if head == magic[: len(head)] or not any(bytes(buf)):
                return TornTail(0, "truncated header")
            return BadHeader("bad magic")
        if all_zero(memoryview(buf), 0, size):
            return TornTail(0, "zero-filled file")
        return BadHeader(exc.reason)


def read_segment(path: str | os.PathLike[str]) -> Generator[SegmentItem, None, None]:
    """Yield the segment's header (or `BadHeader` / `TornTail(0, ...)`, then stop),
    then its classified records: `Record`*, then `CleanEnd` | `TornTail` |
    `Corruption`.

    If the file name is a segment name, the header's first_seq must match it
    (`BadHeader("first_seq N does not match file name")`); a file with another name
    (a copy an operator made) is read on the header's word."""
    name_seq = parse_segment_file_name(os.path.basename(os.fspath(path)))
    with _mapped(path) as buf:
        header = _header_item(buf, decode_segment_header, SEGMENT_MAGIC)
        if type(header) is SegmentHeader and name_seq not in (None, header.first_seq):
            header = BadHeader(f"first_seq {header.first_seq} does not match file name")
        yield header
        if type(header) is SegmentHeader:
            yield from scan_records(
                buf, start_offset=FILE_HEADER_BYTES, expected_seq=header.first_seq
            )


def read_snapshot(path: str | os.PathLike[str]) -> Generator[SnapshotItem, None, None]:
    """Yield the snapshot's header (or `BadHeader` / `TornTail(0, ...)`, then stop),
    then the items of `scan_snapshot_records`. The snapshot is complete and usable
    only if the last item is `CleanEnd`. The file name's last_seq, if the name is a
    snapshot name, must match the header's."""
    name_seq = parse_snapshot_file_name(os.path.basename(os.fspath(path)))
    with _mapped(path) as buf:
        header = _header_item(buf, decode_snapshot_header, SNAPSHOT_MAGIC)
        if type(header) is SnapshotHeader and name_seq not in (None, header.last_seq):
            header = BadHeader(f"last_seq {header.last_seq} does not match file name")
        yield header
        if type(header) is SnapshotHeader:
            yield from scan_snapshot_records(buf, start_offset=FILE_HEADER_BYTES)
