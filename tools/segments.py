"""Reading the log for the tools: segment files in bounded memory, and a walk over
all segments in sequence order that reports damage as `Problem`s.

Owns: `scan_segment_file` (the records of one segment file, classified exactly as
`log_format.read_segment` classifies them, but read with `pread` in chunks),
`read_header`, `LogWalker` (every segment in order: headers, records, sequence
continuity across segments, the recovery table's read-only verdict on each kind
of damage) and `SegmentStart` / `Resync` / `Span` (items of the walk besides
records and problems).

Promises:
- Memory is bounded by the chunk size (8 MiB) plus the largest record, whatever the
  size of the log or of a segment: a multi-gigabyte log streams through. (An mmap
  would be as fast, but its pages count towards the resident set of the process
  until the mapping closes, and reading a mapping that recovery truncates under it
  is a SIGBUS; `pread` on a shrinking file just returns less.)
- The classification is `read_segment`'s, byte for byte: a chunk is scanned with
  `scan_records`, a record cut by the end of a chunk is read again from its start,
  and damage -- whose class depends on everything after it -- is classified over
  the whole file (an mmap, on the damage path only). Tests compare the two on
  damaged files with tiny chunks.
- Nothing is written. The size of a file is taken when it is opened: on a live
  directory the records appended later are simply not seen, and a record being
  appended reads as a torn tail of the last segment -- a warning, never an error.
- With `resync`, the walk goes on after damage (from the next valid record the
  format's search finds), so `verify` reports every problem, not only the first.
- With `spans` (replay and verify, which build the whole state anyway), each
  segment is read whole -- a sealed one mapped read-only (its pages are the page
  cache's, and only a recovery, which truncates the last segment, could shrink it
  under the mapping), the last one with one `pread` -- and handed to the consumer
  as `Span`s for the replay fast path (`log_format.ValidEnvelopes`,
  `sepp.storage.replay.replay_run`), which takes the valid records a run at a
  time. Wherever the consumer stops, the walk classifies what is there exactly
  as above: a valid record the fast path did not take is yielded as a `Record`,
  damage as a `Problem`. Memory: the last segment, read whole (64 MiB by default;
  a last segment over 256 MiB is mapped too), besides the state.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import NamedTuple, TypeAlias

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    RECORD_HEADER_BYTES,
    WAL_RECORD_KINDS,
    ZERO_FILLED_TAIL,
    BadHeader,
    CleanEnd,
    Corruption,
    Record,
    ScanItem,
    SegmentHeader,
    TornTail,
    find_next_valid_record,
    masked_crc32c,
    read_segment,
    scan_records,
    unsynced_hole,
)
from sepp.storage.recovery import half_created_mismatch

from .datadir import ERROR, INFO, WARNING, DataDir, Problem, SegmentFile

__all__ = [
    "CHUNK_BYTES",
    "LogWalker",
    "Resync",
    "SegmentStart",
    "Span",
    "WalkItem",
    "read_header",
    "record_end",
    "scan_segment_file",
    "scan_segment_spans",
]

# Big enough that the per-chunk work (one pread, one scan_records call) vanishes
# next to the per-record work; small enough to be a rounding error in memory.
CHUNK_BYTES = 8 << 20

_HEADER = struct.Struct("<IIIIQ")
_tuple_new = tuple.__new__


class Resync(NamedTuple):
    """After damage, the walk goes on at `offset` with the record `seq` (in the
    segment being read): every record from the damaged one to `seq - 1` is lost."""

    offset: int
    seq: int


class SegmentStart(NamedTuple):
    """The walk enters a segment whose header is good and says `first_seq`."""

    segment: SegmentFile
    first_seq: int
    is_last: bool


class Span:
    """A stretch of valid-looking records for a fast-path consumer (`LogWalker(spans=True)`):
    the record `seq` should start at `offset` of `buf`, the whole segment file
    (offsets are file offsets). The consumer reads on from there and sets `offset` /
    `seq` to the first record it did not take (leaving them unchanged takes none);
    the walk then goes on from there. `buf` is valid until the walk moves on."""

    __slots__ = ("buf", "offset", "seq")

    def __init__(self, buf: bytes | mmap.mmap, offset: int, seq: int) -> None:
        self.buf = buf
        self.offset = offset
        self.seq = seq

    def __repr__(self) -> str:
        return f"Span(offset={self.offset}, seq={self.seq})"


WalkItem: TypeAlias = SegmentStart | Record | Problem | Resync | Span

# The last segment (a live server's, growing; the one a recovery may truncate) is
# read with pread rather than mapped when it is no larger than this.
_READ_WHOLE_MAX = 256 << 20


def record_end(record: Record) -> int:
    """The offset right after `record` (where the next one starts)."""
    return record.offset + RECORD_HEADER_BYTES + len(record.body)


def read_header(path: str) -> SegmentHeader | BadHeader | TornTail:
    """The segment's header as `read_segment` classifies it (FORMAT.md 5.3,
    including the check against the file name). Raises OSError only."""
    items = read_segment(path)
    try:
        first = next(items)
    finally:
        items.close()
    if type(first) is SegmentHeader or type(first) is BadHeader or type(first) is TornTail:
        return first
    raise RuntimeError(f"read_segment yielded {first!r} before a header")  # a log_format bug


def _whole_record_bytes(buf: bytes) -> int | None:
    """The length of the record starting at buf[0] if its header is intact (so its
    body length can be trusted), else None."""
    if len(buf) < RECORD_HEADER_BYTES:
        return None
    header_crc, _body_crc, body_len, _kind, _seq = _HEADER.unpack_from(buf, 0)
    if body_len > RECORD_BODY_BYTES_MAX or masked_crc32c(buf[4:RECORD_HEADER_BYTES]) != header_crc:
        return None
    return RECORD_HEADER_BYTES + int(body_len)


class _WholeFile:
    """The file mapped read-only (or, with `buf`, a buffer holding all of it), for
    classifying damage and searching past it. On the chunked path it is used for
    damage only, and the mapping is closed as soon as the answer is in hand (a
    record found here is copied out of it)."""

    def __init__(self, buf: bytes | mmap.mmap, size: int) -> None:
        self._map = buf
        self.size = size

    @classmethod
    def mapped(cls, fd: int, size: int) -> _WholeFile:
        return cls(mmap.mmap(fd, size, access=mmap.ACCESS_READ), size)

    def first_item(self, offset: int, seq: int) -> ScanItem:
        # The generator is dropped at once, so its view of the mapping goes with it.
        item = next(scan_records(self._map, start_offset=offset, expected_seq=seq))
        if type(item) is Record:
            copied: Record = _tuple_new(
                Record, (item.offset, item.seq, item.kind, memoryview(bytes(item.body)))
            )
            return copied
        return item

    def next_valid(self, start: int, min_seq: int) -> tuple[int, int] | None:
        return find_next_valid_record(
            self._map, start=start, min_seq=min_seq, kinds=WAL_RECORD_KINDS
        )

    def close(self) -> None:
        if type(self._map) is mmap.mmap:
            with suppress(BufferError):  # a view still alive: released when it is collected
                self._map.close()


def scan_segment_file(
    path: str,
    *,
    start_offset: int = FILE_HEADER_BYTES,
    expected_seq: int,
    chunk_bytes: int = CHUNK_BYTES,
    resync: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[ScanItem | Resync]:
    """The records of a segment file from `start_offset` (where a record with
    `expected_seq` should start), classified as `log_format.scan_records` would
    classify the whole file: `Record`* then one terminal item. With `resync`, a
    `Corruption` is followed by `Resync(offset, seq)` and more items when a valid
    record follows the damage. Offsets are file offsets; a record's body is a view
    of the chunk it was read in (which it keeps alive: no copy is made).

    `on_bytes(n)` is told how many bytes were consumed, chunk by chunk (progress)."""
    if chunk_bytes < RECORD_HEADER_BYTES:
        raise ValueError("chunk_bytes must hold at least one record header")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        off = start_offset
        seq = expected_seq
        chunk = chunk_bytes
        new = _tuple_new
        record_cls = Record
        while True:
            want = max(min(chunk, size - off), 0)
            buf = os.pread(fd, want, off) if want else b""
            if len(buf) < want:  # the file shrank under us: it ends where the data ends
                size = off + len(buf)
            end = off + len(buf)
            terminal: ScanItem | None = None
            for item in scan_records(buf, start_offset=0, expected_seq=seq):
                if type(item) is record_cls:
                    seq = item.seq + 1
                    yield new(record_cls, (off + item.offset, item.seq, item.kind, item.body))
                else:
                    terminal = item
            if terminal is None:  # pragma: no cover - scan_records always ends with one
                raise RuntimeError("scan_records yielded no terminal item")
            rel = terminal.offset
            if on_bytes is not None and rel:
                on_bytes(rel)
            if end < size:
                if type(terminal) is CleanEnd or rel > 0:
                    # The chunk ended at, or cut, a record: read on from there.
                    off += rel
                    chunk = chunk_bytes
                    continue
                whole = _whole_record_bytes(buf)
                if whole is not None and whole > len(buf) and off + whole <= size:
                    chunk = whole  # one record larger than a chunk
                    continue
            # The last chunk (its classification is the file's), or damage that
            # only the rest of the file can classify.
            offset = off + rel
            if type(terminal) is CleanEnd:
                yield CleanEnd(offset)
                return
            nxt: tuple[int, int] | None = None
            if end == size and not (resync and type(terminal) is Corruption):
                final = _shifted(terminal, off)
            else:
                whole_file = _WholeFile.mapped(fd, size)
                try:
                    final = (
                        _shifted(terminal, off)
                        if end == size
                        else whole_file.first_item(offset, seq)
                    )
                    if type(final) is Corruption and resync:
                        nxt = _resync_point(whole_file, final, seq)
                finally:
                    whole_file.close()
                if type(final) is record_cls:
                    # Not damage after all: a record cut by the chunk's end.
                    seq = final.seq + 1
                    off = record_end(final)
                    chunk = chunk_bytes
                    if on_bytes is not None:
                        on_bytes(off - offset)
                    yield final
                    continue
            yield final
            if nxt is None:
                if on_bytes is not None:
                    on_bytes(size - offset)
                return
            if on_bytes is not None:
                on_bytes(nxt[0] - offset)
            yield Resync(nxt[0], nxt[1])
            off, seq = nxt
            chunk = chunk_bytes
    finally:
        os.close(fd)


def _shifted(item: ScanItem, base: int) -> ScanItem:
    if type(item) is TornTail:
        return TornTail(base + item.offset, item.reason)
    if type(item) is Corruption:
        return Corruption(base + item.offset, item.seq, item.reason)
    raise RuntimeError(f"not a damage item: {item!r}")  # pragma: no cover - caller's contract


def _resync_point(whole_file: _WholeFile, damage: Corruption, seq: int) -> tuple[int, int] | None:
    """Where reading can go on after `damage` (found where `seq` was expected)."""
    if damage.seq is not None and damage.reason.startswith("sequence gap"):
        # A good record with a later seq: the records before it are missing, the
        # record itself may be fine.
        return damage.offset, damage.seq
    return whole_file.next_valid(damage.offset + 1, seq)


def _read_whole(fd: int, size: int) -> bytes:
    parts = []
    done = 0
    while done < size:
        part = os.pread(fd, size - done, done)
        if not part:  # the file shrank under us: it ends where the data ends
            break
        parts.append(part)
        done += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def scan_segment_spans(
    path: str,
    *,
    expected_seq: int,
    read_whole: bool = False,
    resync: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[ScanItem | Resync | Span]:
    """`scan_segment_file` for a fast-path consumer: the file is mapped read-only
    (with `read_whole`, read with pread instead) and offered as `Span`s; wherever
    the consumer stops, what is there is classified as `scan_segment_file`
    classifies it -- a valid record yielded as a `Record` (its body copied out of
    the file), followed by a new `Span` after it, or the terminal item (with
    `resync`, `Resync` and a new `Span` after a corruption that valid records
    follow)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        buf: bytes | mmap.mmap | None = None
        if not read_whole and size > FILE_HEADER_BYTES:
            with suppress(ValueError):  # ValueError: the file is empty by now
                buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # 0: the file as it is now
        if buf is None:
            buf = _read_whole(fd, size)
        size = len(buf)
    finally:
        os.close(fd)  # a mapping keeps the file open for itself
    whole_file = _WholeFile(buf, size)
    off = FILE_HEADER_BYTES
    seq = expected_seq
    try:
        while True:
            span = Span(buf, off, seq)
            yield span
            if span.offset > off and on_bytes is not None:
                on_bytes(span.offset - off)
            off, seq = span.offset, span.seq
            item = whole_file.first_item(off, seq)  # a record is copied out
            if type(item) is Record:
                if on_bytes is not None:
                    on_bytes(record_end(item) - off)
                yield item
                off, seq = record_end(item), item.seq + 1
                continue
            if type(item) is CleanEnd:
                yield item
                return
            nxt = (
                _resync_point(whole_file, item, seq)
                if resync and type(item) is Corruption
                else None
            )
            yield item
            if on_bytes is not None:
                on_bytes((nxt[0] if nxt is not None else size) - off)
            if nxt is None:
                return
            yield Resync(nxt[0], nxt[1])
            off, seq = nxt
    finally:
        whole_file.close()


class LogWalker:
    """Every segment of a data directory in sequence order, as a stream of
    `SegmentStart`, `Record`, `Problem` and `Resync` items.

    Reports what `sepp.storage.recovery` would decide, without doing it: a torn tail
    of the last segment (or a last segment with a torn header and nothing else) is
    a *warning* -- recovery truncates (removes) it; any damage in a sealed segment,
    a bad header, a sequence gap or overlap between segments is an *error*.

    Without `resync` the walk stops at the first error (what dump, replay and stats
    want: nothing after a hole can be trusted to follow on); with it, the walk goes
    on after damage and reports every problem (verify).

    With `spans`, the records of each segment come as `Span`s for the consumer to
    take with the fast path (see the module docstring), and as `Record`s only where
    it stopped at a valid record; `chunk_bytes` is then unused.

    After the walk, `last_seq` is the seq of the last valid record read (None if
    none) and `first_seq` the first."""

    def __init__(
        self,
        data_dir: DataDir,
        *,
        resync: bool = False,
        chunk_bytes: int = CHUNK_BYTES,
        on_bytes: Callable[[int], None] | None = None,
        spans: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.resync = resync
        self.chunk_bytes = chunk_bytes
        self.on_bytes = on_bytes
        self.spans = spans
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.errors = 0
        self._end_known = False

    def walk(self, *, from_seq: int | None = None) -> Iterator[WalkItem]:
        """The items of every segment that may hold records >= `from_seq` (all by
        default). Segments wholly below `from_seq` are skipped unread, judged by the
        first_seq in the next segment's name."""
        segments = self.data_dir.segments
        expected: int | None = None
        for index, segment in enumerate(segments):
            is_last = index == len(segments) - 1
            if from_seq is not None and not is_last and segments[index + 1].first_seq <= from_seq:
                continue
            stop = False
            self._end_known = False
            for item in self._segment(segment, is_last, expected):
                if type(item) is Problem:
                    if item.severity == ERROR:
                        self.errors += 1
                        if not self.resync:
                            stop = True
                elif type(item) is Record:
                    if self.first_seq is None:
                        self.first_seq = item.seq
                    self.last_seq = item.seq
                elif type(item) is Span:
                    start = item.seq
                    try:
                        yield item
                    finally:  # also when the consumer stops the walk at this span
                        if item.seq > start:
                            if self.first_seq is None:
                                self.first_seq = start
                            self.last_seq = item.seq - 1
                    continue
                yield item
                if stop:
                    return
            # After a segment whose header could not be read, or that ends in
            # damage, where the next one should start is unknown (the damage may
            # have held any number of records): no second problem for one hole.
            expected = self.last_seq + 1 if self._end_known and self.last_seq is not None else None

    def _segment(
        self, segment: SegmentFile, is_last: bool, expected: int | None
    ) -> Iterator[WalkItem]:
        try:
            header = read_header(segment.path)
        except FileNotFoundError:
            yield Problem(
                ERROR,
                "io",
                segment.rel,
                None,
                expected,
                "segment file disappeared while reading (deleted by a live server's retention?): run again",
            )
            return
        if type(header) is TornTail:
            if is_last and expected is not None and segment.first_seq != expected:
                # Rotation names the new segment after the last record it synced
                # (recovery refuses this, rows 5 and 6).
                yield Problem(
                    ERROR,
                    "sequence-gap",
                    segment.rel,
                    0,
                    expected,
                    half_created_mismatch(expected, segment.first_seq),
                )
            elif is_last:
                yield Problem(
                    WARNING,
                    "torn-tail",
                    segment.rel,
                    0,
                    expected,
                    f"{header.reason}: recovery would remove this file "
                    "(a crash while the segment was being created)",
                )
            else:
                yield Problem(
                    ERROR,
                    "bad-header",
                    segment.rel,
                    0,
                    expected,
                    f"{header.reason} in a sealed segment",
                )
            return
        if type(header) is BadHeader:
            yield Problem(ERROR, "bad-header", segment.rel, 0, expected, header.reason)
            return
        if type(header) is not SegmentHeader:  # pragma: no cover - read_header's contract
            raise RuntimeError(f"unexpected header item {header!r}")
        first_seq = header.first_seq
        if expected is not None and first_seq != expected:
            what = "gap" if first_seq > expected else "overlap"
            yield Problem(
                ERROR,
                "sequence-gap",
                segment.rel,
                0,
                expected,
                f"sequence {what} between segments: expected seq {expected}, "
                f"segment starts at seq {first_seq}",
            )
        yield SegmentStart(segment, first_seq, is_last)
        expected_here = first_seq
        try:
            items: Iterator[ScanItem | Resync | Span]
            if self.spans:
                items = scan_segment_spans(
                    segment.path,
                    expected_seq=first_seq,
                    read_whole=is_last and segment.size <= _READ_WHOLE_MAX,
                    resync=self.resync,
                    on_bytes=self.on_bytes,
                )
            else:
                items = scan_segment_file(
                    segment.path,
                    expected_seq=first_seq,
                    chunk_bytes=self.chunk_bytes,
                    resync=self.resync,
                    on_bytes=self.on_bytes,
                )
            for item in items:
                if type(item) is Span:
                    yield item
                    expected_here = item.seq
                elif type(item) is Record:
                    expected_here = item.seq + 1
                    yield item
                elif type(item) is Resync:
                    expected_here = item.seq
                    yield item
                elif type(item) is CleanEnd:
                    self._end_known = True
                    return
                elif type(item) is TornTail:
                    self._end_known = False
                    yield self._torn(segment, is_last, item, expected_here)
                elif type(item) is Corruption:
                    self._end_known = False
                    seq = item.seq if item.seq is not None else expected_here
                    hole = self._hole(segment, is_last, item, expected_here)
                    if hole is not None:
                        # Recovery cuts the hole and everything after it (rows 19
                        # and 20 of its table): nothing after it is read on.
                        yield hole
                        return
                    kind = "sequence-gap" if item.reason.startswith("sequence ") else "corruption"
                    yield Problem(ERROR, kind, segment.rel, item.offset, seq, item.reason)
        except FileNotFoundError:
            yield Problem(
                ERROR,
                "io",
                segment.rel,
                None,
                expected_here,
                "segment file disappeared while reading (deleted by a live server's retention?): run again",
            )

    def _hole(
        self, segment: SegmentFile, is_last: bool, damage: Corruption, seq: int
    ) -> Problem | None:
        """A warning if `damage` is a hole in the unsynced tail that recovery would
        truncate (its rows 19, 20: the last segment, above every snapshot, and the
        valid records after the hole all say it was never synced), else None."""
        if not is_last or seq <= max((s.last_seq for s in self.data_dir.snapshots), default=0):
            return None
        try:
            with open(segment.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return None
        hole = unsynced_hole(data, offset=damage.offset, seq=seq)
        if hole is None:
            return None
        return Problem(
            WARNING,
            "torn-tail",
            segment.rel,
            damage.offset,
            seq,
            f"unsynced hole ({damage.reason}): recovery would truncate the last "
            f"{len(data) - damage.offset} bytes -- the {hole.records} valid record(s) after "
            f"it were written before seq {seq} was synced (claimed synced up to seq "
            f"{hole.synced_seq}): out-of-order writeback of the unsynced tail at a power loss",
        )

    @staticmethod
    def _torn(segment: SegmentFile, is_last: bool, torn: TornTail, seq: int) -> Problem:
        if is_last:
            try:
                size = os.stat(segment.path).st_size
            except FileNotFoundError:
                size = segment.size
            if torn.reason == ZERO_FILLED_TAIL:
                # What a running server's segment always ends with (its
                # preallocated space): worth a line, not a warning.
                return Problem(
                    INFO,
                    "torn-tail",
                    segment.rel,
                    torn.offset,
                    seq,
                    f"{torn.reason}: recovery would cut the last {size - torn.offset} bytes "
                    "(a running server's preallocated space, or a crash mid-append)",
                )
            return Problem(
                WARNING,
                "torn-tail",
                segment.rel,
                torn.offset,
                seq,
                f"{torn.reason}: recovery would truncate the last {size - torn.offset} bytes "
                "(a crash mid-append, or a live server's record in progress)",
            )
        return Problem(
            ERROR,
            "corruption",
            segment.rel,
            torn.offset,
            seq,
            f"{torn.reason} at the end of a sealed segment",
        )
