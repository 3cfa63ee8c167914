"""The audit trail read from the log: the operators' actions, newest first.

Owns: `AuditTrail` (an index of the admin records of the durable log, kept by
tailing the segment files, and the pages read from it), `AuditPage`,
`entry_data` (an entry as the admin API answers it) and `AuditError`. The admin
API's `GET /admin/api/v1/audit` (sepp/admin/audit.py) is its front.

The log is the audit trail: every admin mutation is a record of command kind 12
whose first event, AdminAction, names the action, actor, role, reason, queue and
affected ids (FORMAT.md). Decoding one is `sepp.storage.audit.admin_record`, the
same function `sepp-log audit --admin` uses.

Promises:
- The event loop never waits for a file: segments are read with aiofiles, in
  chunks of AUDIT_READ_CHUNK_BYTES, and each chunk is scanned (checksums, the
  command kind peeked from the envelope's first bytes, only admin records
  decoded) between two awaits: one step is a few milliseconds of CPU at most.
  (On a fake file system -- the tests' in-memory one -- the bytes come from it.)
- Only the durable part of the log is indexed (records up to the engine's
  durable seq): an answer never shows an action a crash could still undo.
- The index holds, per admin record, its seq, where it is (segment, offset,
  length) and its actor and action (interned): a million admin actions cost tens
  of MB, not their ids. A page reads its few records again from the files.
- A page is newest first; `before` (exclusive) is the `next_before` of the
  previous page. At most AUDIT_SCAN_ENTRIES_MAX admin actions are examined per
  call: a short page whose `next_before` is not null was capped by the filters,
  it is not the end; `next_before` null means the oldest entry was reached.
- Segments deleted by retention (once snapshots cover them) take their admin
  records with them: `truncated_before_seq` is then the first seq still in the
  log (the actions before it are gone), else null. `[storage] log_retention_ms`
  keeps covered segments longer.
- The first call after a start indexes the whole log (a 1 GB log: seconds, in
  small steps); later calls only the records logged since.
- Nothing is written; files are only read.

Must not import: a front end (sepp.server.server, sepp.admin), tools.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
import logging
import struct
from array import array
from dataclasses import dataclass, field
from typing import Any

import aiofiles

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    FormatError,
    Record,
    decode_envelope,
    scan_records,
)
from sepp.server.service import SeppService
from sepp.storage import FileSystem
from sepp.storage.audit import ADMIN_COMMAND_KINDS, AdminRecord, admin_record, command_kind_of
from sepp.storage.fs import RealFileSystem

log = logging.getLogger("sepp.server")

__all__ = [
    "AUDIT_LIMIT_DEFAULT",
    "AUDIT_LIMIT_MAX",
    "AUDIT_READ_CHUNK_BYTES",
    "AUDIT_SCAN_ENTRIES_MAX",
    "AuditError",
    "AuditPage",
    "AuditTrail",
    "entry_data",
]

AUDIT_LIMIT_DEFAULT = 100
AUDIT_LIMIT_MAX = 1000
# Admin actions examined per call (the reference's cap of 1000 rows): a filter
# that matches nothing pages through the trail in bounded steps.
AUDIT_SCAN_ENTRIES_MAX = 1000
# Bytes read from a segment per step: scanning 256 KiB (about 2,000 records of
# 128 bytes) takes ~2 ms of the loop's time.
AUDIT_READ_CHUNK_BYTES = 256 * 1024

_HEADER = struct.Struct("<IIIIQ")  # header_crc, body_crc, body_len, kind, seq


class AuditError(Exception):
    """The log could not be read for the audit trail (damage in the durable part)."""


@dataclass
class AuditPage:
    entries: list[AdminRecord] = field(default_factory=list)
    next_before: int | None = None
    truncated_before_seq: int | None = None

    def data(self) -> dict[str, Any]:
        return {
            "entries": [entry_data(entry) for entry in self.entries],
            "next_before": self.next_before,
            "truncated_before_seq": self.truncated_before_seq,
        }


def entry_data(entry: AdminRecord) -> dict[str, Any]:
    time = datetime.datetime.fromtimestamp(entry.time_ms / 1000, tz=datetime.UTC)
    return {
        "seq": entry.seq,
        "time": time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "time_ms": entry.time_ms,
        "actor": entry.actor,
        "role": entry.role,
        "action": entry.action,
        "reason": entry.reason,
        "queue": entry.queue,
        "job_ids": list(entry.job_ids),
        "changes": entry.changes,
    }


class _SegmentFile:
    """A segment file open for reading: with aiofiles on the real file system (the
    reads run in aiofiles' thread pool, never on the loop); on a fake one (tests'
    in-memory FaultyFileSystem) a copy of its bytes, which is already in memory."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self._fs = fs
        self._path = path
        self._file: Any = None
        self._data = b""

    async def __aenter__(self) -> _SegmentFile:
        if isinstance(self._fs, RealFileSystem):
            self._file = await aiofiles.open(self._path, "rb")
        else:
            self._data = self._fs.read(self._path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._file is not None:
            await self._file.close()

    async def pread(self, offset: int, size: int) -> bytes:
        if self._file is None:
            return self._data[offset : offset + size]
        await self._file.seek(offset)
        data: bytes = await self._file.read(size)
        return data


class AuditTrail:
    """The admin records of one server's log (loop thread only)."""

    def __init__(self, service: SeppService) -> None:
        self.service = service
        # Parallel arrays, ordered by seq: where each admin record is and who did what.
        self._seqs = array("q")
        self._segments = array("q")  # the first_seq of its segment (its file name)
        self._offsets = array("q")
        self._lengths = array("q")  # header + body bytes
        self._actors = array("l")  # index into _names
        self._actions = array("l")
        self._names: list[str] = []
        self._name_ids: dict[str, int] = {}
        # Where the tail scan goes on: a segment (by first_seq), an offset in it and
        # the seq expected there; None before the first call.
        self._tail: tuple[int, int, int] | None = None
        self._first_seq = 1  # the first seq still in the log
        self._lock = asyncio.Lock()

    def _fs(self) -> FileSystem:
        engine = self.service.engine
        if engine is None:  # pragma: no cover - callers check
            raise AuditError("storage is not open")
        return engine.fs

    # -- the index ---------------------------------------------------------------------

    def _name_id(self, name: str) -> int:
        found = self._name_ids.get(name)
        if found is None:
            found = self._name_ids[name] = len(self._names)
            self._names.append(name)
        return found

    def _drop_before(self, seq: int) -> None:
        cut = bisect.bisect_left(self._seqs, seq)
        if cut:
            for column in (
                self._seqs,
                self._segments,
                self._offsets,
                self._lengths,
                self._actors,
                self._actions,
            ):
                del column[:cut]

    async def catch_up(self) -> None:
        """Index the admin records logged (and durable) since the last call."""
        async with self._lock:
            engine = self.service.engine
            if engine is None:
                return
            durable = engine.durable_seq
            # (first_seq, path, size): the sizes are what was written when asked
            # (a segment's records up to there are whole; the rest is not read).
            segments = [(s.first_seq, s.path, s.size) for s in engine.segments]
            if not segments:
                return
            self._first_seq = segments[0][0]
            self._drop_before(self._first_seq)
            tail = self._tail
            if tail is None or tail[0] < self._first_seq:
                # First call, or retention deleted the segment being read: start at
                # the oldest segment still there.
                tail = (segments[0][0], FILE_HEADER_BYTES, segments[0][0])
            for first_seq, path, size in segments:
                if first_seq < tail[0]:
                    continue
                if first_seq > tail[0]:  # the previous segment is done
                    tail = (first_seq, FILE_HEADER_BYTES, first_seq)
                try:
                    offset, seq = await self._scan_segment(
                        path, first_seq, tail[1], tail[2], size, durable
                    )
                except FileNotFoundError:
                    # Retention deleted it since the list was taken: its actions
                    # are gone (the next call drops what was indexed of them).
                    tail = (first_seq + 1, FILE_HEADER_BYTES, first_seq + 1)
                    continue
                tail = (first_seq, offset, seq)
                if offset < size or seq > durable:
                    break  # more of this segment next time (not written or durable yet)
            self._tail = tail

    async def _scan_segment(
        self, path: str, first_seq: int, offset: int, seq: int, size: int, durable: int
    ) -> tuple[int, int]:
        """Index the admin records of one segment from `offset` (record `seq`) up to
        `size` bytes or the first record past `durable`; returns where it stopped."""
        async with _SegmentFile(self._fs(), path) as file:
            while offset < size and seq <= durable:
                want = min(AUDIT_READ_CHUNK_BYTES, size - offset)
                buf = await file.pread(offset, want)
                if len(buf) >= RECORD_HEADER_BYTES:
                    whole = RECORD_HEADER_BYTES + _HEADER.unpack_from(buf, 0)[2]
                    if whole > len(buf) and offset + whole <= size:
                        buf = await file.pread(offset, whole)  # one record over a chunk
                used, seq = self._index_chunk(buf, first_seq, offset, seq, durable)
                if used == 0:
                    if seq <= durable and len(buf) == size - offset:
                        raise AuditError(
                            f"{path}: no valid record at offset {offset} (seq {seq} expected)"
                        )
                    break
                offset += used
        return offset, seq

    def _index_chunk(
        self, buf: bytes, first_seq: int, offset: int, seq: int, durable: int
    ) -> tuple[int, int]:
        """Index the whole records of `buf` (read at `offset`) up to `durable`;
        returns the bytes consumed and the next seq."""
        used = 0
        for item in scan_records(buf, start_offset=0, expected_seq=seq):
            if type(item) is not Record:
                break  # the end of the chunk (a record cut by it reads as a torn tail)
            if item.seq > durable:
                break
            body = item.body
            kind = command_kind_of(body)
            if kind is None or kind in ADMIN_COMMAND_KINDS:
                self._index_record(item, first_seq, offset)
            seq = item.seq + 1
            used = item.offset + RECORD_HEADER_BYTES + len(body)
        return used, seq

    def _index_record(self, item: Record, first_seq: int, offset: int) -> None:
        try:
            entry = admin_record(item.seq, decode_envelope(item.body))
        except FormatError as exc:
            log.warning("audit: record %d does not decode: %s", item.seq, exc.reason)
            return
        if entry is None:
            return
        self._seqs.append(item.seq)
        self._segments.append(first_seq)
        self._offsets.append(offset + item.offset)
        self._lengths.append(RECORD_HEADER_BYTES + len(item.body))
        self._actors.append(self._name_id(entry.actor))
        self._actions.append(self._name_id(entry.action))

    # -- pages ---------------------------------------------------------------------------

    async def page(
        self,
        *,
        limit: int = AUDIT_LIMIT_DEFAULT,
        before: int | None = None,
        actor: str | None = None,
        action_prefix: str | None = None,
    ) -> AuditPage:
        """Up to `limit` admin actions with seq < `before`, newest first."""
        await self.catch_up()
        seqs = self._seqs
        index = (len(seqs) if before is None else bisect.bisect_left(seqs, before)) - 1
        names = self._names
        actor_id = self._name_ids.get(actor, -1) if actor is not None else None
        picked: list[int] = []
        examined = 0
        while index >= 0 and len(picked) < limit and examined < AUDIT_SCAN_ENTRIES_MAX:
            examined += 1
            if (actor_id is None or self._actors[index] == actor_id) and (
                action_prefix is None or names[self._actions[index]].startswith(action_prefix)
            ):
                picked.append(index)
            index -= 1
        out = AuditPage(
            next_before=seqs[index + 1] if index >= 0 else None,
            truncated_before_seq=self._first_seq if self._first_seq > 1 else None,
        )
        out.entries = await self._read(picked)
        return out

    async def _read(self, picked: list[int]) -> list[AdminRecord]:
        """The admin records at the indexed positions, read again from their files
        (one open per segment). A segment deleted since (retention) is skipped."""
        engine = self.service.engine
        paths = {s.first_seq: s.path for s in engine.segments} if engine is not None else {}
        entries: list[AdminRecord] = []
        start = 0
        while start < len(picked):
            segment = self._segments[picked[start]]
            stop = start
            while stop < len(picked) and self._segments[picked[stop]] == segment:
                stop += 1
            path = paths.get(segment)
            if path is not None:
                # FileNotFoundError: retention deleted it after the index was read.
                with contextlib.suppress(FileNotFoundError):
                    entries.extend(await self._read_segment(path, picked[start:stop]))
            start = stop
        return entries

    async def _read_segment(self, path: str, picked: list[int]) -> list[AdminRecord]:
        out: list[AdminRecord] = []
        async with _SegmentFile(self._fs(), path) as file:
            for index in picked:
                seq = self._seqs[index]
                buf = await file.pread(self._offsets[index], self._lengths[index])
                item = next(scan_records(buf, start_offset=0, expected_seq=seq))
                if type(item) is not Record:
                    raise AuditError(f"{path}: record {seq} no longer reads: {item!r}")
                entry = admin_record(seq, decode_envelope(item.body))
                if entry is not None:
                    out.append(entry)
        return out
