"""Snapshot files: the whole state at one log sequence number.

Owns: encoding a state into a snapshot file (header + framed records of kinds
SNAPSHOT_BEGIN, SNAPSHOT_JOBS*, SNAPSHOT_DEDUP*, SNAPSHOT_DEAD_LETTERS*,
SNAPSHOT_END; bodies are msgpack, specified in log_format/FORMAT.md "Snapshot
record bodies"), writing it to a temporary file, and loading it back with every
checksum and count verified.

Promises: `load_snapshot` either returns a state equal (`canonical()`) to the one
that was written, or raises `SnapshotError` with the offset and reason; a file
without its END record is never used. A record is cut at 2,048 rows or 4 MiB
of body, whichever comes first; a larger row goes alone in its record (up to the
format's 64 MiB). Publication (rename, directory sync) is the
engine's job, after the log covering the snapshot is durable.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import msgpack

from log_format import (
    RECORD_BODY_BYTES_MAX,
    RECORD_KIND_SNAPSHOT_BEGIN,
    RECORD_KIND_SNAPSHOT_DEAD_LETTERS,
    RECORD_KIND_SNAPSHOT_DEDUP,
    RECORD_KIND_SNAPSHOT_END,
    RECORD_KIND_SNAPSHOT_JOBS,
    CleanEnd,
    FormatError,
    Record,
    decode_snapshot_header,
    encode_record,
    encode_snapshot_header,
    parse_snapshot_file_name,
    scan_snapshot_records,
)
from sepp.core.config import CoreConfig
from sepp.core.snapshot import (
    SnapshotContentError,
    StateBuilder,
    export_dead,
    export_dedup,
    export_jobs,
    export_meta,
)
from sepp.core.state import State
from sepp.storage.fs import FileSystem

# A snapshot record is cut by rows and by bytes, whichever comes first
# (FORMAT.md section 8). Rows: a reader never holds more than one chunk of raw
# rows as Python objects (2,048 rows of 256-byte jobs, ~0.5 MiB). Bytes: a record
# body may not pass RECORD_BODY_BYTES_MAX (64 MiB), and 2,048 rows of 32 KiB (or
# 64 of 1 MiB) would -- every snapshot failed with large jobs (issue 13 §3). The
# row that would take a body past the budget starts the next record; a row
# larger than the budget goes alone in its record, which holds any job the
# configured limits admit (one job's row is below 3 x limits.max_message_bytes
# plus a few hundred bytes: sepp.core.config.MESSAGE_BYTES_CEILING).
ROWS_PER_RECORD = 2048
RECORD_BYTES_BUDGET = 4 * 1024 * 1024
# Bytes gathered before one write() call (and one fdatasync, see below).
WRITE_CHUNK_BYTES = 1024 * 1024


class SnapshotError(ValueError):
    """A snapshot file that cannot be used, with where and why."""

    def __init__(self, path: str, reason: str, offset: int | None = None) -> None:
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"snapshot {path}{where}: {reason}")
        self.path = path
        self.reason = reason
        self.offset = offset


class SnapshotRowTooLarge(ValueError):
    """One row whose encoding does not fit in a record even alone: the limits
    that admitted the job are larger than the format allows (a bug; the
    configuration ceiling keeps it from happening)."""


def _record_bodies(
    rows: Iterator[list[Any]], rows_max: int, bytes_budget: int
) -> Iterator[tuple[int, bytes]]:
    """(row count, msgpack body) per record: an array of at most `rows_max` rows
    whose body stays within `bytes_budget`, unless a single row is larger (it
    then goes alone). Each row is packed once; the body is the array header and
    the packed rows joined, the same bytes as packing the list."""
    packer = msgpack.Packer(use_bin_type=True)
    pack = packer.pack
    pieces: list[bytes] = []
    size = 0
    for row in rows:
        packed = pack(row)
        if pieces and (len(pieces) == rows_max or size + len(packed) > bytes_budget):
            yield len(pieces), packer.pack_array_header(len(pieces)) + b"".join(pieces)
            pieces = []
            size = 5  # the largest array header
        elif not pieces:
            size = 5
        if size + len(packed) > RECORD_BODY_BYTES_MAX:
            raise SnapshotRowTooLarge(
                f"a snapshot row of {len(packed)} bytes does not fit in one record "
                f"({RECORD_BODY_BYTES_MAX} bytes)"
            )
        pieces.append(packed)
        size += len(packed)
    if pieces:
        yield len(pieces), packer.pack_array_header(len(pieces)) + b"".join(pieces)


def encode_snapshot(
    state: State,
    last_seq: int,
    *,
    rows_per_record: int = ROWS_PER_RECORD,
    record_bytes_budget: int = RECORD_BYTES_BUDGET,
) -> Iterator[bytes]:
    """The snapshot file as a stream of byte strings (header, then records)."""
    if rows_per_record < 1 or not 0 < record_bytes_budget <= RECORD_BODY_BYTES_MAX:
        raise ValueError("rows_per_record must be >= 1 and record_bytes_budget in 1..64 MiB")
    pack = msgpack.Packer(use_bin_type=True).pack
    yield encode_snapshot_header(last_seq)
    seq = 1
    meta = export_meta(state)
    meta["last_seq"] = last_seq
    yield encode_record(seq, RECORD_KIND_SNAPSHOT_BEGIN, pack(meta))
    counts = {"jobs": 0, "dedup": 0, "dead": 0}
    for kind, name, rows in (
        (RECORD_KIND_SNAPSHOT_JOBS, "jobs", export_jobs(state)),
        (RECORD_KIND_SNAPSHOT_DEDUP, "dedup", export_dedup(state)),
        (RECORD_KIND_SNAPSHOT_DEAD_LETTERS, "dead", export_dead(state)),
    ):
        for count, body in _record_bodies(rows, rows_per_record, record_bytes_budget):
            seq += 1
            counts[name] += count
            yield encode_record(seq, kind, body)
    seq += 1
    counts["records"] = seq
    yield encode_record(seq, RECORD_KIND_SNAPSHOT_END, pack(counts))


def write_snapshot_file(
    fs: FileSystem,
    path: str,
    state: State,
    last_seq: int,
    *,
    record_bytes_budget: int = RECORD_BYTES_BUDGET,
    yield_disk: bool = False,
) -> int:
    """Write the snapshot to `path` (a new file) and sync it. Returns its size.

    `yield_disk` (a snapshot written beside the running server, by its forked
    child): after each chunk's sync, wait as long as that sync took, so that the
    snapshot keeps the disk busy at most half the time and the log's syncs never
    queue behind a stream of its chunks (issue 13: with 1,000 live jobs of 1 MiB
    arriving, snapshots of up to 1 GiB ran back to back, and a well-behaved
    client's round trip p99 was 13-14 ms without snapshots, 39-40 ms with them,
    and 23-30 ms with this pause)."""
    handle = fs.create(path)
    size = 0
    try:
        buffer = bytearray()
        for piece in encode_snapshot(state, last_seq, record_bytes_budget=record_bytes_budget):
            buffer += piece
            if len(buffer) >= WRITE_CHUNK_BYTES:
                fs.write(handle, buffer)
                chunk_start, size = size, size + len(buffer)
                buffer = bytearray()
                # Sync as we go: a snapshot of a million jobs is ~400 MB, and one
                # fsync at the end would push it all to the disk at once, making
                # the log's own fdatasync wait behind it (measured: 50-70 ms
                # commit stalls). Chunk by chunk, a log sync waits at most for
                # one chunk. The synced chunk leaves the page cache, as the log's
                # records do (wal.py `_drop_synced_cache`): only recovery reads it.
                synced_from = time.monotonic()
                fs.fdatasync(handle)
                sync_took = time.monotonic() - synced_from
                fs.drop_cache(handle, chunk_start, size - chunk_start)
                if yield_disk:
                    time.sleep(sync_took)
        if buffer:
            fs.write(handle, buffer)
            size += len(buffer)
        fs.fsync(handle)
        fs.drop_cache(handle, 0, size)
    finally:
        fs.close(handle)
    return size


def _unpack(path: str, record: Record) -> Any:
    try:
        return msgpack.unpackb(record.body, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SnapshotError(
            path, f"record {record.seq} does not decode: {exc}", record.offset
        ) from exc


def load_snapshot(fs: FileSystem, path: str, config: CoreConfig) -> tuple[State, int]:
    """Read, verify and rebuild the state of a snapshot file: (state, last_seq)."""
    data = fs.read(path)
    try:
        header = decode_snapshot_header(data)
    except FormatError as exc:
        raise SnapshotError(path, f"bad header: {exc.reason}", 0) from exc
    # Recovery checks that the log reaches back to a snapshot by its file name: a
    # file whose header disagrees would let replay skip records silently.
    name_seq = parse_snapshot_file_name(os.path.basename(path))
    if name_seq is not None and name_seq != header.last_seq:
        raise SnapshotError(path, f"last_seq {header.last_seq} does not match file name", 0)
    builder: StateBuilder | None = None
    ended = False
    try:
        for item in scan_snapshot_records(data):
            if isinstance(item, Record):
                if ended:
                    raise SnapshotError(path, "record after SNAPSHOT_END", item.offset)
                body = _unpack(path, item)
                kind = item.kind
                if kind == RECORD_KIND_SNAPSHOT_BEGIN:
                    if builder is not None or not isinstance(body, dict):
                        raise SnapshotError(path, "misplaced SNAPSHOT_BEGIN", item.offset)
                    if body.get("last_seq") != header.last_seq:
                        raise SnapshotError(
                            path, "BEGIN last_seq disagrees with the header", item.offset
                        )
                    builder = StateBuilder(config, body)
                    continue
                if builder is None:
                    raise SnapshotError(path, "first record is not SNAPSHOT_BEGIN", item.offset)
                if kind == RECORD_KIND_SNAPSHOT_END:
                    if not isinstance(body, dict) or body.get("records") != item.seq:
                        raise SnapshotError(path, "SNAPSHOT_END record count is wrong", item.offset)
                    ended = True
                elif not isinstance(body, list):
                    raise SnapshotError(
                        path, f"record {item.seq} is not a list of rows", item.offset
                    )
                elif kind == RECORD_KIND_SNAPSHOT_JOBS:
                    builder.add_jobs(body)
                elif kind == RECORD_KIND_SNAPSHOT_DEDUP:
                    builder.add_dedup(body)
                elif kind == RECORD_KIND_SNAPSHOT_DEAD_LETTERS:
                    builder.add_dead(body)
            elif isinstance(item, CleanEnd):
                break
            else:
                raise SnapshotError(path, item.reason, item.offset)
    except SnapshotContentError as exc:
        raise SnapshotError(path, str(exc)) from exc
    except (TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(path, f"malformed rows: {exc}") from exc
    if builder is None or not ended:
        raise SnapshotError(path, "incomplete: no SNAPSHOT_END record")
    try:
        state = builder.finish()
    except SnapshotContentError as exc:
        raise SnapshotError(path, str(exc)) from exc
    return state, header.last_seq
