"""A job's whole life read from the log: the timeline of the console's job page.

Owns: `job_timeline` (every event of one job in the durable log, oldest first),
`Timeline` and `TimelineEntry`.

Every transition of a job is an event in the log (FORMAT.md section 7): enqueued,
reserved (by which worker, with which lease), nacked (with its reason), lease
expired, promoted, dead-lettered (with its cause), requeued, and the operator's
AdminAction header naming it (by whom, why). `sepp-log audit JOB_ID` shows the
same events offline; both decode them with sepp.storage.events_view.

Promises:
- The event loop never waits for a file: segments are read with aiofiles (the
  audit trail's `_SegmentFile`) in chunks of TIMELINE_READ_CHUNK_BYTES; a record
  is decoded only when the job's id occurs in its bytes (a substring test at
  memory speed), and the loop gets a turn after every chunk.
- Only the durable part of the log is read (records up to the engine's durable
  seq): the timeline never shows what a crash could still undo.
- At most TIMELINE_ENTRIES_MAX entries (the oldest): `capped` says so.
- Segments deleted by retention take the job's early events with them:
  `complete` is False when the history does not start with the job's enqueue.
- Cost: one pass over the log per call (a 1 GB log: about a second of reading in
  small steps); nothing is kept between calls.

Must not import: a front end (sepp.server.server, sepp.admin), tools.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    FormatError,
    Record,
    decode_envelope,
    scan_records,
)
from sepp.server.audit_trail import _SegmentFile
from sepp.server.service import SeppService
from sepp.storage.events_view import event_fields, event_name, job_id_of

__all__ = [
    "TIMELINE_ENTRIES_MAX",
    "TIMELINE_READ_CHUNK_BYTES",
    "Timeline",
    "TimelineEntry",
    "job_timeline",
]

TIMELINE_ENTRIES_MAX = 1000
TIMELINE_READ_CHUNK_BYTES = 256 * 1024
_HEADER = struct.Struct("<IIIIQ")  # header_crc, body_crc, body_len, kind, seq
_ENQUEUED = 1
_ADMIN_ACTION = 14


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    seq: int
    time_ms: int
    name: str  # the catalogue's event name: JobEnqueued, JobReserved, AdminAction...
    fields: dict[str, Any]


@dataclass
class Timeline:
    job_id: str
    entries: list[TimelineEntry] = field(default_factory=list)
    capped: bool = False

    @property
    def complete(self) -> bool:
        """Whether the history starts with the job's enqueue (retention may have
        deleted the segments before)."""
        return bool(self.entries) and self.entries[0].name == event_name([_ENQUEUED, 0])


async def job_timeline(
    service: SeppService, job_id: str, *, max_entries: int = TIMELINE_ENTRIES_MAX
) -> Timeline:
    """The events of `job_id` in the durable log, oldest first."""
    out = Timeline(job_id)
    engine = service.engine
    if engine is None or not job_id:
        return out
    durable = engine.durable_seq
    needle = job_id.encode("utf-8", "surrogatepass")
    for segment in list(engine.segments):
        if segment.first_seq > durable:
            break
        try:
            async with _SegmentFile(engine.fs, segment.path) as file:
                await _scan(
                    file, segment.first_seq, segment.size, durable, needle, out, max_entries
                )
        except FileNotFoundError:
            continue  # retention deleted it since the list was taken
        if out.capped:
            break
    return out


async def _scan(
    file: _SegmentFile,
    seq: int,
    size: int,
    durable: int,
    needle: bytes,
    out: Timeline,
    max_entries: int,
) -> None:
    offset = FILE_HEADER_BYTES
    while offset < size and seq <= durable:
        buf = await file.pread(offset, min(TIMELINE_READ_CHUNK_BYTES, size - offset))
        if len(buf) >= RECORD_HEADER_BYTES:
            whole = RECORD_HEADER_BYTES + _HEADER.unpack_from(buf, 0)[2]
            if whole > len(buf) and offset + whole <= size:
                buf = await file.pread(offset, whole)  # one record over a chunk
        used = 0
        for item in scan_records(buf, start_offset=0, expected_seq=seq):
            if type(item) is not Record or item.seq > durable:
                break
            seq = item.seq + 1
            body_at = item.offset + RECORD_HEADER_BYTES
            used = body_at + len(item.body)
            if buf.find(needle, body_at, used) >= 0:
                _collect(item, out)
                if len(out.entries) >= max_entries:
                    del out.entries[max_entries:]
                    out.capped = True
                    return
        if used == 0:
            return  # a torn tail or damage: what follows is not read
        offset += used
        await asyncio.sleep(0)  # the loop's turn (a fake file system never yields)


def _collect(item: Record, out: Timeline) -> None:
    try:
        envelope = decode_envelope(bytes(item.body))
    except FormatError:
        return
    job_id = out.job_id
    for event in envelope.events:
        if event[0] == _ADMIN_ACTION:
            fields = event_fields(event)
            ids = fields.get("job_ids")
            if not (isinstance(ids, list) and job_id in ids):
                continue
            # The operator's header: the ids are this record's business, not the job's.
            fields = {k: v for k, v in fields.items() if k != "job_ids"}
        elif job_id_of(event) == job_id:
            fields = {k: v for k, v in event_fields(event).items() if k != "job_id"}
        else:
            continue
        out.entries.append(TimelineEntry(item.seq, envelope.time_ms, event_name(event), fields))
