"""Online backup (issue 15 item 8): a consistent copy of a live data directory,
streamed by the admin listener while the server keeps serving.

Owns: `POST /admin/api/v1/backup` (role admin; answers the stream of
backup_format.py), `stream_backup` (the transport-neutral producer: pin, wait,
read, write) and `add_backup_routes`.

What the copy holds: the newest published snapshot and every log segment from it
up to B, the last record written when the backup started; the segment holding B
is sent only up to B's end (its `size` then), so records appended meanwhile are
not in it. The stream starts once B is durable: the copy never holds a record
the server could still lose. Recovery on the copy (`sepp serve --data-dir`,
`sepp-log verify`) sees what it would see after a clean stop at B, without the
final snapshot.

Why it is consistent: `Engine.pin_log` (through `SeppService.pin_log`) takes the snapshot, the segment list and
B under the retention lock, and retention deletes nothing pinned until the
backup ends, so every file stays readable however many snapshots are published
meanwhile. Snapshot files never change once published; segments only grow past
the sizes taken (appends) or lose their preallocated zeros at rotation (beyond
those sizes too).

Promises: the event loop never reads a file: aiofiles reads in the default
executor, CHUNK_BYTES at a time, and the response's flow control paces the
reading (a slow reader holds one chunk in memory, not the copy). At most
BACKUPS_RUNNING_MAX backups run at once (another is answered 409). A failure
after the stream started is logged and the connection closed without a trailer,
which `sepp backup` reports as a cut stream; so is a shutdown (the app's
on_shutdown cuts running backups: the listener's cleanup never waits for one).

Must not import: sepp.server.server (the service is the seam).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiofiles
import crc32c
from aiohttp import web

from sepp.admin.auth import require
from sepp.admin.backup_format import (
    CONTENT_TYPE,
    SNAPSHOTS_PREFIX,
    WAL_PREFIX,
    FileEntry,
    Manifest,
    file_line,
    manifest_line,
    stream_length,
    trailer_line,
)
from sepp.server.service import LogPin, SeppService, StorageFailed

log = logging.getLogger("sepp.admin")

BACKUP_PATH = "/admin/api/v1/backup"
# One read (and one write to the response) at a time: large enough that a GB
# takes a thousand executor round trips, small enough to hold per backup.
CHUNK_BYTES = 1024 * 1024
# A second backup would double the disk reads for nothing: refused with 409.
BACKUPS_RUNNING_MAX = 1
# Written into the stream as the header X-Sepp-Backup-Seq as well.
SEQ_HEADER = "X-Sepp-Backup-Seq"


class BackupSourceError(OSError):
    """A pinned file was shorter than the pin said (it must not happen: a bug or
    someone else changing the data directory)."""


@dataclass(frozen=True, slots=True)
class BackupSummary:
    seq: int
    snapshot_seq: int
    files: int
    bytes: int
    seconds: float


def plan(pin: LogPin) -> tuple[Manifest, list[str]]:
    """The manifest of a pin and the path of each of its files, in stream order
    (the snapshot first, then the segments oldest first)."""
    entries: list[FileEntry] = []
    paths: list[str] = []
    if pin.snapshot_path is not None:
        size = os.stat(pin.snapshot_path).st_size
        entries.append(FileEntry(SNAPSHOTS_PREFIX + os.path.basename(pin.snapshot_path), size))
        paths.append(pin.snapshot_path)
    for segment in pin.segments:
        entries.append(FileEntry(WAL_PREFIX + os.path.basename(segment.path), segment.size))
        paths.append(segment.path)
    manifest = Manifest(
        seq=pin.last_seq,
        snapshot_seq=pin.snapshot_seq,
        bytes=sum(e.size for e in entries),
        files=tuple(entries),
    )
    return manifest, paths


async def stream_backup(
    pin_log: Callable[[], LogPin],
    unpin_log: Callable[[LogPin], None],
    durable: Callable[[int], Awaitable[None]],
    write: Callable[[bytes], Awaitable[None]],
    *,
    started: Callable[[Manifest, int], Awaitable[None]] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> BackupSummary:
    """Pin (`pin_log`, in a thread), wait until the pinned log is durable, then
    `write` the whole stream (manifest, files, trailer). `started(manifest,
    length)` runs before the first byte, with the stream's length in bytes (the
    HTTP front sends its headers there). The pin is
    released (`unpin_log`) however it ends. Raises StorageFailed (from
    `durable`), OSError, or what `write` raises."""
    begin = time.monotonic()
    pin = await asyncio.to_thread(pin_log)
    try:
        await durable(pin.last_seq)
        manifest, paths = await asyncio.to_thread(plan, pin)
        length = stream_length(manifest)
        if started is not None:
            await started(manifest, length)
        await write(manifest_line(manifest))
        crcs: list[int] = []
        for entry, path in zip(manifest.files, paths, strict=True):
            await write(file_line(entry))
            crcs.append(await _send_file(path, entry.size, write, chunk_bytes))
        trailer = trailer_line(manifest, crcs)
        if len(trailer) != len(trailer_line(manifest, [0] * len(crcs))):  # pragma: no cover
            raise RuntimeError("the trailer's length differs from the announced one")
        await write(trailer)
    finally:
        await asyncio.to_thread(unpin_log, pin)
    return BackupSummary(
        seq=manifest.seq,
        snapshot_seq=manifest.snapshot_seq,
        files=len(manifest.files),
        bytes=manifest.bytes,
        seconds=time.monotonic() - begin,
    )


async def _send_file(
    path: str, size: int, write: Callable[[bytes], Awaitable[None]], chunk_bytes: int
) -> int:
    """Write the first `size` bytes of `path`; returns their CRC-32C."""
    crc = 0
    remaining = size
    async with aiofiles.open(path, "rb") as source:
        while remaining:
            chunk = await source.read(min(chunk_bytes, remaining))
            if not chunk:
                raise BackupSourceError(f"{path} ended {remaining} bytes before its pinned size")
            remaining -= len(chunk)
            crc = crc32c.crc32c(chunk, crc)
            await write(chunk)
    return crc


# -- the HTTP front ----------------------------------------------------------------------


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def add_backup_routes(app: web.Application, service: SeppService) -> None:
    """Register `POST /admin/api/v1/backup` on the admin API's app (behind
    auth.py's middleware, which authenticates: 401; the role is checked here:
    403 below admin)."""
    running: set[asyncio.Task[object] | None] = set()
    stopping: list[bool] = []

    async def backup(request: web.Request) -> web.StreamResponse:
        require(request, "backup")
        if service.engine is None or not service.health().serving:
            return _error(503, "unavailable", "the server is not serving")
        if not service.backup_readable():
            return _error(501, "unimplemented", "backup needs the real file system")
        if len(running) >= BACKUPS_RUNNING_MAX:
            return _error(409, "backup_running", "a backup is already running")
        task = asyncio.current_task()
        running.add(task)
        response = web.StreamResponse()

        async def started(manifest: Manifest, length: int) -> None:
            response.content_type = CONTENT_TYPE
            response.headers[SEQ_HEADER] = str(manifest.seq)
            # A known length, not chunked: aiohttp would copy every chunk to frame
            # it, and a reader tells a cut stream by the length as well.
            response.content_length = length
            await response.prepare(request)

        try:
            summary = await stream_backup(
                service.pin_log, service.unpin_log, service.durable, response.write, started=started
            )
        except StorageFailed as exc:
            if not response.prepared:
                return _error(503, "storage_failed", str(exc))
            raise
        except ConnectionError as exc:
            # The reader went away (aiohttp ends such a response quietly).
            log.warning("backup not finished: the reader went away (%s)", exc)
            return response
        except (OSError, asyncio.CancelledError) as exc:
            if not response.prepared:
                raise
            # Headers are out: the only way left to say "failed" is to close the
            # connection before the trailer (the CLI reports a cut stream).
            if stopping:
                log.warning("backup cut: the server is shutting down")
            else:
                log.error("backup failed mid-stream, connection closed: %r", exc)
            if request.transport is not None:
                request.transport.close()
            raise
        finally:
            running.discard(task)
        await response.write_eof()
        log.info(
            "backup of seq %d (snapshot %d, %d files, %d bytes) sent in %.2fs",
            summary.seq,
            summary.snapshot_seq,
            summary.files,
            summary.bytes,
            summary.seconds,
        )
        return response

    async def on_shutdown(app: web.Application) -> None:
        # The listener's cleanup waits for running handlers (up to a minute): a
        # backup is cut instead, so shutdown never waits for a copy.
        stopping.append(True)
        for task in list(running):
            if task is not None:
                task.cancel()

    app.router.add_post(BACKUP_PATH, backup)
    app.on_shutdown.append(on_shutdown)
