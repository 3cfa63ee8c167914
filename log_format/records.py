"""Record framing, and the scanner that classifies what it finds.

Owns: the 24-byte record header (FORMAT.md "Records"), the record kinds, the writer
side (`encode_record`, `encode_record_header`), and the reader side: `scan_records`,
which walks a buffer of back-to-back records and *classifies* each thing it meets,
`scan_snapshot_records`, which adds the snapshot file's structure on top, and
`unsynced_hole`, which reads what the valid records after checksum damage say about
it (a hole in the unsynced tail, or corruption: FORMAT.md 5.4).

Promises (LevelDB's `log_reader`, adapted): the scanner never truncates, repairs or
raises on damage. It yields zero or more `Record`s and then exactly one terminal
item -- `CleanEnd`, `TornTail` or `Corruption` -- and the caller decides what to do
(the recovery decision table lives in the storage layer). It raises only for caller
bugs (a bad argument). `Record.body` is a zero-copy `memoryview` into the buffer
given to the scanner: valid as long as that buffer is; copy it (`bytes(body)`) to
keep it longer.

The classification in one paragraph (FORMAT.md "Reader classification" has the
table): damage that a crash in the middle of an append can leave -- a short header,
a body cut off by the end of the buffer, a bad checksum with nothing valid after it,
a zero-filled tail -- is a `TornTail`. Damage followed by at least one valid record,
a valid record with the wrong sequence number, or a record whose *checksummed*
header holds values no writer produces (unknown kind, reserved bits, oversized
length) is `Corruption`: no crash can produce those.

Performance: replay runs every record through `scan_records`; its loop does one
`struct` unpack, two CRC32C calls over memoryview slices and builds one NamedTuple
per record, and keeps all rarely-taken decisions out of line (`_classify_damage`).

Must not import: anything but the standard library, `crc32c` and `log_format`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from crc32c import crc32c

from log_format._bytes import BytesLike, all_zero, byte_view
from log_format.crc import CRC_MASK_DELTA, masked_crc32c, masked_crc32c_parts
from log_format.envelope import decode_envelope
from log_format.errors import FormatError
from log_format.files import FILE_HEADER_BYTES

# TornTail's reason for zeros from a record boundary to the end (rule 3): what a
# running writer's preallocated space, or an append whose data never reached the
# disk, reads as.
ZERO_FILLED_TAIL = "zero-filled tail"

__all__ = [
    "RECORD_BODY_BYTES_MAX",
    "RECORD_HEADER_BYTES",
    "RECORD_KINDS",
    "RECORD_KIND_COMMAND",
    "RECORD_KIND_NAMES",
    "RECORD_KIND_SNAPSHOT_BEGIN",
    "RECORD_KIND_SNAPSHOT_DEAD_LETTERS",
    "RECORD_KIND_SNAPSHOT_DEDUP",
    "RECORD_KIND_SNAPSHOT_END",
    "RECORD_KIND_SNAPSHOT_JOBS",
    "SNAPSHOT_RECORD_KINDS",
    "WAL_RECORD_KINDS",
    "ZERO_FILLED_TAIL",
    "CleanEnd",
    "Corruption",
    "Record",
    "ScanItem",
    "TornTail",
    "UnsyncedHole",
    "encode_record",
    "encode_record_header",
    "encode_record_header_parts",
    "find_next_valid_record",
    "scan_records",
    "scan_snapshot_records",
    "unsynced_hole",
]

RECORD_HEADER_BYTES = 24
# 64 MiB: far above any legal command (the protocol caps a message well below it),
# and low enough that a corrupted length can never make a reader allocate or
# checksum gigabytes.
RECORD_BODY_BYTES_MAX = 64 * 1024 * 1024

RECORD_KIND_COMMAND = 1
RECORD_KIND_SNAPSHOT_BEGIN = 16
RECORD_KIND_SNAPSHOT_JOBS = 17
RECORD_KIND_SNAPSHOT_DEDUP = 18
RECORD_KIND_SNAPSHOT_DEAD_LETTERS = 19
RECORD_KIND_SNAPSHOT_END = 20

WAL_RECORD_KINDS = frozenset({RECORD_KIND_COMMAND})
SNAPSHOT_RECORD_KINDS = frozenset(
    {
        RECORD_KIND_SNAPSHOT_BEGIN,
        RECORD_KIND_SNAPSHOT_JOBS,
        RECORD_KIND_SNAPSHOT_DEDUP,
        RECORD_KIND_SNAPSHOT_DEAD_LETTERS,
        RECORD_KIND_SNAPSHOT_END,
    }
)
RECORD_KINDS = WAL_RECORD_KINDS | SNAPSHOT_RECORD_KINDS
RECORD_KIND_NAMES = {
    RECORD_KIND_COMMAND: "command",
    RECORD_KIND_SNAPSHOT_BEGIN: "snapshot_begin",
    RECORD_KIND_SNAPSHOT_JOBS: "snapshot_jobs",
    RECORD_KIND_SNAPSHOT_DEDUP: "snapshot_dedup",
    RECORD_KIND_SNAPSHOT_DEAD_LETTERS: "snapshot_dead_letters",
    RECORD_KIND_SNAPSHOT_END: "snapshot_end",
}

_U32_MASK = 0xFFFFFFFF
_U64_MAX = 2**64 - 1
# header_crc, body_crc, body_len, kind word, seq. The kind byte and the three
# reserved bytes are read as one little-endian u32 ("kind word"): a valid header has
# kind word == kind, so one set lookup checks the kind and the reserved bytes at once.
_HEADER = struct.Struct("<IIIIQ")
# The 20 bytes the header checksum covers (everything after the checksum itself).
_COVERED = struct.Struct("<IIIQ")
_U32 = struct.Struct("<I")
_KIND_AT = 12  # offset of the kind word inside a record header
# The damage search copies the buffer a chunk at a time, so it works the same on
# bytes and on an mmap of a multi-gigabyte file, and stops at the first chunk that
# holds a valid record.
_SEARCH_CHUNK_BYTES = 1 << 20

_tuple_new = tuple.__new__


# ---------------------------------------------------------------- scan items


class Record(NamedTuple):
    """A valid record: both checksums good, an expected kind, the expected seq.

    `body` is a memoryview into the scanned buffer (zero-copy). A NamedTuple, not a
    frozen dataclass, because one is built per record on the replay path and a
    dataclass costs ~5x more to construct (the reasoning of sepp/core/events.py)."""

    offset: int
    seq: int
    kind: int
    body: memoryview


@dataclass(frozen=True, slots=True)
class CleanEnd:
    """Terminal: the buffer ends exactly at a record boundary, at `offset`."""

    offset: int


@dataclass(frozen=True, slots=True)
class TornTail:
    """Terminal: damage from `offset` to the end of the buffer with no valid record
    after it -- what a crash in the middle of an append leaves."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Corruption:
    """Terminal: damage no crash explains, at `offset`. `seq` is the sequence number
    stored in the damaged record when its header checksum is good, else None."""

    offset: int
    seq: int | None
    reason: str


ScanItem: TypeAlias = Record | CleanEnd | TornTail | Corruption


@dataclass(frozen=True, slots=True)
class UnsyncedHole:
    """What `unsynced_hole` found after checksum damage at `offset` (where the
    record with `seq` should start): `records` valid records after it, every one of
    which says that `seq` had not been synced when it was written -- the highest
    synced seq any of them claims is `synced_seq` (< `seq`)."""

    offset: int
    seq: int
    records: int
    synced_seq: int


# ---------------------------------------------------------------- writer


def encode_record_header(seq: int, kind: int, body: bytes | bytearray | memoryview) -> bytes:
    """The 24-byte header for `body`; for writers that write header and body
    separately (no copy of the body). Raises ValueError for a caller bug."""
    if kind not in RECORD_KINDS:
        raise ValueError(f"invalid record kind {kind!r}")
    if type(seq) is not int or not 1 <= seq <= _U64_MAX:
        raise ValueError(f"seq must be an int in 1..2**64-1, got {seq!r}")
    if type(body) is not bytes:
        # len() of a memoryview counts items, not bytes; casting makes them agree.
        body = memoryview(body).cast("B")
    body_len = len(body)
    if body_len > RECORD_BODY_BYTES_MAX:
        raise ValueError(f"record body of {body_len} bytes exceeds {RECORD_BODY_BYTES_MAX}")
    covered = _COVERED.pack(masked_crc32c(body), body_len, kind, seq)
    return _U32.pack(masked_crc32c(covered)) + covered


def encode_record_header_parts(seq: int, kind: int, parts: list[bytes]) -> bytes:
    """The 24-byte header for a body given as parts (their concatenation), for a
    writer that writes the header and then the parts as they are (no copy of
    them: `encode_envelope_parts`). Raises ValueError for a caller bug."""
    if kind not in RECORD_KINDS:
        raise ValueError(f"invalid record kind {kind!r}")
    if type(seq) is not int or not 1 <= seq <= _U64_MAX:
        raise ValueError(f"seq must be an int in 1..2**64-1, got {seq!r}")
    body_len = 0
    for part in parts:
        if type(part) is not bytes:
            raise ValueError(f"a body part must be bytes, got {type(part).__name__}")
        body_len += len(part)
    if body_len > RECORD_BODY_BYTES_MAX:
        raise ValueError(f"record body of {body_len} bytes exceeds {RECORD_BODY_BYTES_MAX}")
    covered = _COVERED.pack(masked_crc32c_parts(parts), body_len, kind, seq)
    return _U32.pack(masked_crc32c(covered)) + covered


def encode_record(seq: int, kind: int, body: bytes | bytearray | memoryview) -> bytes:
    """One framed record: header then body. Raises ValueError for a caller bug."""
    return encode_record_header(seq, kind, body) + body


# ---------------------------------------------------------------- reader


def _check_kinds(kinds: Iterable[int]) -> frozenset[int]:
    kind_set = frozenset(kinds)
    if not kind_set or not kind_set <= RECORD_KINDS:
        raise ValueError(f"kinds must be a non-empty subset of {sorted(RECORD_KINDS)}")
    return kind_set


def scan_records(
    buf: BytesLike,
    *,
    start_offset: int = FILE_HEADER_BYTES,
    expected_seq: int,
    kinds: Iterable[int] = WAL_RECORD_KINDS,
) -> Iterator[ScanItem]:
    """Classify the records of `buf` (bytes, bytearray, memoryview or mmap) from
    `start_offset`, the first of which must carry `expected_seq`.

    Yields `Record`s in order, then exactly one of `CleanEnd`, `TornTail`,
    `Corruption`. `kinds` is the set of record kinds this file may hold
    (`WAL_RECORD_KINDS` for segments); a valid record of another kind is corruption.
    Raises ValueError (eagerly, on the call) only for bad arguments."""
    view = byte_view(buf)
    if type(start_offset) is not int or not 0 <= start_offset <= len(view):
        raise ValueError(f"start_offset {start_offset!r} is outside the buffer")
    if type(expected_seq) is not int or not 1 <= expected_seq <= _U64_MAX:
        raise ValueError(f"expected_seq must be an int in 1..2**64-1, got {expected_seq!r}")
    return _scan(view, start_offset, expected_seq, _check_kinds(kinds))


def _scan(view: memoryview, off: int, seq: int, kinds: frozenset[int]) -> Iterator[ScanItem]:
    # The hot loop: everything a valid record needs, checked inline; anything else
    # leaves the loop for _classify_damage, which may take its time.
    end = len(view)
    unpack_from = _HEADER.unpack_from
    crc = crc32c
    delta = CRC_MASK_DELTA
    mask = _U32_MASK
    body_max = RECORD_BODY_BYTES_MAX
    new = _tuple_new
    record_cls = Record
    while off != end:
        body_off = off + RECORD_HEADER_BYTES
        if body_off > end:
            break
        header_crc, body_crc, body_len, kind, found_seq = unpack_from(view, off)
        c = crc(view[off + 4 : body_off])
        if (
            (((c >> 15) | (c << 17)) + delta) & mask != header_crc
            or kind not in kinds
            or found_seq != seq
            or body_len > body_max
        ):
            break
        body_end = body_off + body_len
        if body_end > end:
            break
        body = view[body_off:body_end]
        c = crc(body)
        if (((c >> 15) | (c << 17)) + delta) & mask != body_crc:
            break
        yield new(record_cls, (off, seq, kind, body))
        off = body_end
        seq += 1
    else:
        yield CleanEnd(off)
        return
    yield _classify_damage(view, off, seq, kinds)


def _classify_damage(
    view: memoryview, off: int, seq: int, kinds: frozenset[int]
) -> TornTail | Corruption:
    """What is wrong at `off`, where a record with `seq` should start, and is it a
    torn tail or corruption. Called once per scan, only when the fast path fails."""
    end = len(view)
    if all_zero(view, off, end):
        # A crash can leave a file whose size was persisted but whose data was not
        # (ext4 data=writeback, XFS): it reads back as zeros.
        return TornTail(off, ZERO_FILLED_TAIL)
    if end - off < RECORD_HEADER_BYTES:
        return TornTail(off, "truncated record header")
    header_crc, _body_crc, body_len, kind_word, found_seq = _HEADER.unpack_from(view, off)
    if masked_crc32c(view[off + 4 : off + RECORD_HEADER_BYTES]) != header_crc:
        # Nothing in this header can be trusted, not even its length: look for any
        # valid record after it.
        if find_next_valid_record(view, start=off + 1, min_seq=seq, kinds=kinds) is None:
            return TornTail(off, "bad header checksum")
        return Corruption(off, None, "bad header checksum")
    # The header checksum is good, so a writer wrote these values on purpose; no
    # crash produces them. Classifying them as a torn tail would let recovery
    # truncate records written by a newer sepp -- so they are corruption, always.
    problem = _header_problem(kind_word, body_len, kinds)
    if problem is not None:
        return Corruption(off, found_seq, problem)
    if found_seq != seq:
        what = "gap" if found_seq > seq else "repeat"
        return Corruption(off, found_seq, f"sequence {what}: expected {seq}, found {found_seq}")
    body_end = off + RECORD_HEADER_BYTES + body_len
    if body_end > end:
        return TornTail(off, "truncated record body")
    # Only the body checksum is left to fail. The header tells where the next record
    # starts; the search starts there (and also finds records further on, in case
    # the one right after is damaged too).
    if find_next_valid_record(view, start=body_end, min_seq=seq + 1, kinds=kinds) is None:
        return TornTail(off, "bad body checksum")
    return Corruption(off, found_seq, "bad body checksum")


def _header_problem(kind_word: int, body_len: int, kinds: frozenset[int]) -> str | None:
    kind = kind_word & 0xFF
    if kind not in RECORD_KINDS:
        return f"unknown record kind {kind}"
    if kind not in kinds:
        return f"unexpected record kind {kind}"
    if kind_word != kind:
        return "nonzero reserved bytes"
    if body_len > RECORD_BODY_BYTES_MAX:
        return f"record body length {body_len} exceeds maximum {RECORD_BODY_BYTES_MAX}"
    return None


def _valid_seq_at(view: memoryview, off: int, kinds: frozenset[int]) -> int | None:
    """The seq of a complete, valid record starting at `off`, else None."""
    end = len(view)
    body_off = off + RECORD_HEADER_BYTES
    if off < 0 or body_off > end:
        return None
    header_crc, body_crc, body_len, kind, found_seq = _HEADER.unpack_from(view, off)
    if kind not in kinds or body_len > RECORD_BODY_BYTES_MAX or body_off + body_len > end:
        return None
    if masked_crc32c(view[off + 4 : body_off]) != header_crc:
        return None
    if masked_crc32c(view[body_off : body_off + body_len]) != body_crc:
        return None
    seq: int = found_seq
    return seq


def find_next_valid_record(
    buf: BytesLike,
    *,
    start: int,
    min_seq: int = 1,
    kinds: Iterable[int] = WAL_RECORD_KINDS,
) -> tuple[int, int] | None:
    """(offset, seq) of the first complete, valid record (both checksums good, kind
    in `kinds`, seq >= `min_seq`) that starts at or after `start`, else None.

    How: every record header holds its kind word (kind, 0, 0, 0) at offset 12, so
    the search runs `bytes.find` for that 4-byte pattern and fully checks a record
    at each hit. Zero-filled and random tails almost never contain the pattern, so
    the search runs at memchr speed. `min_seq` keeps stale blocks of an older,
    deleted file -- which a crash can expose in a file's tail -- from counting: they
    hold valid records, but with lower sequence numbers. `sepp-log verify` uses this
    function to resynchronise after damage."""
    view = byte_view(buf)
    kind_set = _check_kinds(kinds)
    end = len(view)
    patterns = [_U32.pack(kind) for kind in sorted(kind_set)]
    pattern_bytes = 4
    chunk_start = max(start, 0) + _KIND_AT
    while chunk_start < end:
        chunk_end = min(chunk_start + _SEARCH_CHUNK_BYTES, end)
        # Three bytes of overlap so a pattern straddling the chunk end is seen here.
        data = bytes(view[chunk_start : min(chunk_end + pattern_bytes - 1, end)])
        best: tuple[int, int] | None = None
        for pattern in patterns:
            hit = data.find(pattern)
            while hit != -1 and hit < chunk_end - chunk_start:
                off = chunk_start + hit - _KIND_AT
                if best is not None and off >= best[0]:
                    break
                found_seq = _valid_seq_at(view, off, kind_set)
                if found_seq is not None and found_seq >= min_seq:
                    best = (off, found_seq)
                    break
                hit = data.find(pattern, hit + 1)
        if best is not None:
            return best
        chunk_start = chunk_end
    return None


# ---------------------------------------------------------------- holes


def _valid_record_at(view: memoryview, off: int, kinds: frozenset[int]) -> tuple[int, int] | None:
    """(seq, end offset) of a complete, valid record starting at `off`, else None."""
    found_seq = _valid_seq_at(view, off, kinds)
    if found_seq is None:
        return None
    body_len: int = _U32.unpack_from(view, off + 8)[0]
    return found_seq, off + RECORD_HEADER_BYTES + body_len


def _synced_claim(view: memoryview, off: int, end: int) -> int | None:
    """The synced_seq a valid command record at `off` claims (version 2 envelope),
    else None: a version 1 envelope, or a body that does not decode, says nothing."""
    try:
        return decode_envelope(view[off + RECORD_HEADER_BYTES : end]).synced_seq
    except FormatError:
        return None


def unsynced_hole(
    buf: BytesLike,
    *,
    offset: int,
    seq: int,
    kinds: Iterable[int] = WAL_RECORD_KINDS,
) -> UnsyncedHole | None:
    """Whether checksum damage at `offset` (where a record with `seq` should start;
    rules 5 and 14 of FORMAT.md 5.1: a bad header or body checksum *followed by a
    valid record*) is a hole in the unsynced tail, as out-of-order writeback leaves
    one at a power loss (FORMAT.md 5.4).

    It is, when every valid record after the damage (searched as in 5.2: seq >=
    `seq`, or `seq + 1` after a damaged body) is a command record whose version 2
    envelope claims a `synced_seq` below `seq`: each was written before the damaged
    record was ever synced, so none of them, nor the damaged one, can have been
    acknowledged through a sync. Returns the evidence, or None when any such record
    claims `seq` synced (synced data is gone: corruption), claims nothing (a version
    1 envelope, a body that does not decode), or when there is no checksum damage at
    `offset` or no valid record after it. The caller decides (sepp truncates such a
    hole only at the end of the last segment, above every snapshot). Cost: one pass
    over the rest of the buffer, on damage only."""
    view = byte_view(buf)
    kind_set = _check_kinds(kinds)
    if not kind_set <= WAL_RECORD_KINDS:
        return None  # only command records carry a claim
    end = len(view)
    if offset < 0 or end - offset < RECORD_HEADER_BYTES:
        return None
    header_crc, _body_crc, body_len, kind_word, found_seq = _HEADER.unpack_from(view, offset)
    if masked_crc32c(view[offset + 4 : offset + RECORD_HEADER_BYTES]) != header_crc:
        start, min_seq = offset + 1, seq  # rule 5
    else:
        body_end = offset + RECORD_HEADER_BYTES + body_len
        if (
            _header_problem(kind_word, body_len, kind_set) is not None
            or found_seq != seq
            or body_end > end
            or _valid_seq_at(view, offset, kind_set) is not None
        ):
            return None  # not checksum damage: rules 7..13, or no damage at all
        start, min_seq = body_end, seq + 1  # rule 14
    records = 0
    highest = -1
    while True:
        found = find_next_valid_record(view, start=start, min_seq=min_seq, kinds=kind_set)
        if found is None:
            break
        off = found[0]
        # The records that follow a found one back to back are read in place; the
        # search runs again only after more damage.
        while True:
            record = _valid_record_at(view, off, kind_set)
            if record is None or record[0] < min_seq:
                break
            claim = _synced_claim(view, off, record[1])
            if claim is None or claim >= seq:
                return None
            records += 1
            highest = max(highest, claim)
            off = record[1]
        start = off
    if records == 0:
        return None
    return UnsyncedHole(offset, seq, records, highest)


# ---------------------------------------------------------------- snapshots


def scan_snapshot_records(
    buf: BytesLike, *, start_offset: int = FILE_HEADER_BYTES
) -> Iterator[ScanItem]:
    """`scan_records` over a snapshot file's records (seq 1, 2, ...; snapshot kinds
    only), plus the snapshot's structure: the first record is SNAPSHOT_BEGIN, no
    other BEGIN follows, and the file ends right after SNAPSHOT_END.

    A snapshot is complete only if the scan ends in `CleanEnd`. A file that ends at
    a record boundary before SNAPSHOT_END yields `TornTail(offset, "incomplete
    snapshot: no end record")`: for a snapshot, the whole file is the unit that a
    crash can cut short."""
    items = scan_records(
        buf, start_offset=start_offset, expected_seq=1, kinds=SNAPSHOT_RECORD_KINDS
    )
    return _snapshot_structure(items)


def _snapshot_structure(items: Iterator[ScanItem]) -> Iterator[ScanItem]:
    last_kind: int | None = None
    for item in items:
        if type(item) is Record:
            problem = None
            if last_kind is None and item.kind != RECORD_KIND_SNAPSHOT_BEGIN:
                problem = "snapshot does not start with a begin record"
            elif last_kind == RECORD_KIND_SNAPSHOT_END:
                problem = "record after snapshot end record"
            elif last_kind is not None and item.kind == RECORD_KIND_SNAPSHOT_BEGIN:
                problem = "second snapshot begin record"
            if problem is not None:
                yield Corruption(item.offset, item.seq, problem)
                return
            last_kind = item.kind
            yield item
        elif last_kind == RECORD_KIND_SNAPSHOT_END:
            # A snapshot is fsynced before it is renamed into place, so nothing a
            # crash leaves can follow its END record.
            if type(item) is CleanEnd:
                yield item
            elif type(item) is TornTail:
                yield Corruption(item.offset, None, "trailing data after snapshot end record")
            else:
                yield item
        elif type(item) is CleanEnd:
            yield TornTail(item.offset, "incomplete snapshot: no end record")
        else:
            yield item
