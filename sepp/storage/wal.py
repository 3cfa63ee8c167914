"""The write side of the log: segment files, appends, syncs and rotation.

Owns: `Segment` (what is known of one segment file), `SegmentWriter` (the active
segment: append a batch, sync it per the persist mode, rotate at a size limit) and
the persist modes.

Promises:
- A batch is written with one write (a pwritev when given as parts; plus, once
  per `PREALLOCATE_BYTES` of log and after a batch at least that long, one write
  of zeros after it) and made durable with one sync (`sync_all`: fsync;
  `sync_data`: fdatasync; `buffer`: none here, the group committer syncs on a
  timer). The caller releases replies only after `append` returns.
- A new segment's header is written and synced, and its directory synced, before
  any record goes into it: after a crash a segment either exists with a valid
  header or holds nothing that was ever acknowledged.
- The active segment's file is kept up to `PREALLOCATE_BYTES` of zeros longer
  than its records (written at offsets, not appended), so most syncs do not change
  its size; a sealed segment, and the last one after a clean close, end with their
  last record. The format is unchanged: a reader sees the zeros as the end of the
  records (a zero-filled tail), and recovery cuts them as it cuts a torn tail.
- Preallocation is an optimisation, never a reason to fail: when the zeros do not
  fit (ENOSPC or EDQUOT on a nearly full disk), whatever part of them was written
  is cut again and the segment goes on without them (logged once); the next
  segment tries again. Only a record that cannot be written fails the log.
- `synced_seq` is the highest seq whose record is known synced (set only after a
  sync returned; never ahead of the disk). Records carry it as their claim of what
  was durable when they were written (FORMAT.md 5.4): recovery tells a hole in the
  unsynced tail from lost synced data by it.
- Any OSError is passed up unchanged; the engine makes it a permanent failure. A
  failed sync is never retried (PostgreSQL "fsyncgate": after a failed fsync the
  kernel may have dropped the dirty pages, so a retry can report success falsely).

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from log_format import encode_segment_header, segment_file_name
from sepp.storage.fs import FileSystem

log = logging.getLogger("sepp.storage")

PERSIST_SYNC_ALL = "sync_all"
PERSIST_SYNC_DATA = "sync_data"
PERSIST_BUFFER = "buffer"
PERSIST_MODES = (PERSIST_SYNC_ALL, PERSIST_SYNC_DATA, PERSIST_BUFFER)

Hook = Callable[[str], None]

# Every point at which storage calls its hook (tests crash there), in data-path order.
HOOK_POINTS = (
    "wal.after_write",
    "wal.after_sync",
    "rotate.after_create",
    "rotate.after_header_sync",
    "rotate.after_dir_sync",
    "snapshot.before_rename",
    "snapshot.after_rename",
    "snapshot.published",
    "retention.before_delete",
    "retention.after_delete",
)


# The active segment's file runs ahead of its records by up to this many zeros.
PREALLOCATE_BYTES = 1 << 20
# ... except after a batch at least PREALLOCATE_BYTES long: its sync changes the
# file size anyway (one journal commit for a megabyte or more), and a full step of
# zeros after it doubled what a 1 MiB job wrote and synced (1 MiB enqueues, one per
# request, p50: 12.9-15.7 -> 6.2-8.0 ms; benchmarks/README.md, bench_large). A
# short run of zeros still takes the small records written between large ones.
LARGE_BATCH_AHEAD_BYTES = 64 * 1024
# Synced log bytes are dropped from the page cache in steps of at least this many
# (see `SegmentWriter._drop_synced_cache`); a sealed segment's rest at rotation.
CACHE_DROP_BYTES = 1 << 20
PAGE_BYTES = 4096
# A zero extension failing with one of these means "no room for the zeros": the
# records are written without them (a nearly full disk must not stop the log
# while each record still fits).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _no_hook(point: str) -> None:
    return None


@dataclass
class Segment:
    """One segment file. `last_seq` is first_seq - 1 while it holds no record."""

    first_seq: int
    path: str
    size: int
    last_seq: int
    # Time (ms) of the newest record, for log retention; 0 = unknown / empty.
    last_time_ms: int = 0


class SegmentWriter:
    """Appends batches of framed records to the active segment. Used by one
    flushing thread at a time; `segments` is shared with retention under `lock`."""

    def __init__(
        self,
        fs: FileSystem,
        wal_dir: str,
        segments: list[Segment],
        *,
        persist_mode: str,
        segment_bytes_max: int,
        next_seq: int,
        hook: Hook | None = None,
    ) -> None:
        if persist_mode not in PERSIST_MODES:
            raise ValueError(f"unknown persist mode {persist_mode!r}")
        self.fs = fs
        self.wal_dir = wal_dir
        self.segments = segments
        self.persist_mode = persist_mode
        self.segment_bytes_max = segment_bytes_max
        self.lock = threading.Lock()
        self._hook = hook or _no_hook
        self._handle: int | None = None
        self._unsynced = False
        # The highest seq known synced (see the module docstring): what recovery
        # found is synced below, before anything else is written.
        self.synced_seq = next_seq - 1
        # Where the active segment's file ends: past its records while it holds
        # preallocated zeros (see `append`).
        self._file_end = 0
        # False once the zeros did not fit in the active segment (until rotation).
        self._preallocate = True
        # The active segment's synced bytes from here on may still be cached.
        self._cache_from = 0
        self._preallocation_lost_logged = False
        if segments:
            # What recovery found may be only in the page cache: a process killed
            # between a write and its sync (or before a new segment's directory
            # sync) leaves records a restart replays and builds on. Sync them, and
            # the directory, before any reply can depend on them: else a later
            # power loss loses them, or -- once a newer segment is synced --
            # leaves a sequence gap that refuses to start.
            last = segments[-1]
            handle = fs.open_write(last.path)
            try:
                self._sync(handle)
                fs.fsync_dir(wal_dir)
            except BaseException:
                fs.close(handle)
                raise
            if last.size < segment_bytes_max:
                self._handle = handle
                # Recovery cut any zero-filled tail: the file ends with its records.
                self._file_end = last.size
                return
            fs.close(handle)
        self._open_new(next_seq)

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    def _open_new(self, first_seq: int) -> None:
        """Create the next segment: header written, file synced, directory synced."""
        path = os.path.join(self.wal_dir, segment_file_name(first_seq))
        handle = self.fs.create(path)
        try:
            self._hook("rotate.after_create")
            header = encode_segment_header(first_seq)
            self.fs.write_at(handle, header, 0)
            self.fs.fsync(handle)
            self._hook("rotate.after_header_sync")
            self.fs.fsync_dir(self.wal_dir)
            self._hook("rotate.after_dir_sync")
        except BaseException:
            self.fs.close(handle)
            raise
        with self.lock:
            self.segments.append(Segment(first_seq, path, len(header), first_seq - 1))
        log.info("log segment %s opened", os.path.basename(path))
        self._handle = handle
        self._unsynced = False
        self._file_end = len(header)
        self._preallocate = True  # space may be back (retention, an operator)
        self._cache_from = 0

    def _sync(self, handle: int) -> None:
        if self.persist_mode == PERSIST_SYNC_DATA:
            self.fs.fdatasync(handle)
        else:
            self.fs.fsync(handle)

    def rotate(self, next_seq: int) -> None:
        """Seal the active segment (synced, whatever the persist mode) and start a
        new one whose first record will be `next_seq`."""
        handle = self._handle
        if handle is not None:
            if self._unsynced:
                self._sync(handle)
                self._unsynced = False
            self.synced_seq = self.segments[-1].last_seq
            self._release_preallocated()
            self._drop_synced_cache(whole=True)
            self.fs.close(handle)
            self._handle = None
        self._open_new(next_seq)

    def _release_preallocated(self) -> None:
        """Cut the active segment's zero-filled tail (durably): a sealed segment,
        or a log closed cleanly, ends with its last record."""
        active = self.segments[-1]
        if self._file_end > active.size:
            self.fs.truncate(active.path, active.size)
            self._file_end = active.size

    @property
    def handle(self) -> int:
        """The active segment's open file (for a caller that syncs it itself)."""
        if self._handle is None:  # pragma: no cover - closed writer
            raise RuntimeError("segment writer is closed")
        return self._handle

    def append(
        self,
        data: bytes | list[bytes],
        first_seq: int,
        last_seq: int,
        last_time_ms: int,
        *,
        sync: bool = True,
    ) -> None:
        """Write a batch of framed records (seqs first_seq..last_seq) and make it
        durable per the persist mode. Rotates first if the active segment is full.
        `data` is the batch's bytes, or a list of parts whose concatenation they are
        (written by one pwritev, not joined first). `sync=False` (sync persist
        modes): only write; the caller syncs `handle` and then calls `mark_synced`."""
        active = self.segments[-1]
        if active.size >= self.segment_bytes_max and active.last_seq >= active.first_seq:
            self.rotate(first_seq)
            active = self.segments[-1]
        if first_seq != active.last_seq + 1:
            raise RuntimeError(
                f"batch starts at seq {first_seq}, segment ends at {active.last_seq}"
            )
        handle = self._handle
        if handle is None:  # pragma: no cover - closed writer
            raise RuntimeError("segment writer is closed")
        if isinstance(data, list):
            size = sum(map(len, data))
            self.fs.write_parts_at(handle, data, active.size)
        else:
            size = len(data)
            self.fs.write_at(handle, data, active.size)
        end = active.size + size
        if end > self._file_end:
            if self._preallocate:
                # Grow the file by PREALLOCATE_BYTES of zeros at a time: the syncs
                # of the batches written over them then change no file size, so
                # they need no file-system journal commit (a third of an
                # fdatasync's CPU on ext4; benchmarks/README.md finding 16).
                # Recovery cuts a zero tail like a torn one; rotation and close
                # cut it too. A large batch gets only a short run of them.
                ahead = PREALLOCATE_BYTES if size < PREALLOCATE_BYTES else LARGE_BATCH_AHEAD_BYTES
                self._preallocate_after(handle, active.path, end, ahead)
            else:
                self._file_end = end
        self._hook("wal.after_write")
        synced = sync and self.persist_mode != PERSIST_BUFFER
        if synced:
            self._sync(handle)
            self.synced_seq = last_seq
            self._hook("wal.after_sync")
        else:
            self._unsynced = True
        with self.lock:
            active.size += size
            active.last_seq = last_seq
            active.last_time_ms = last_time_ms
        if synced:
            self._drop_synced_cache()

    def _drop_synced_cache(self, *, whole: bool = False) -> None:
        """Let the page cache free the active segment's synced records, once at
        least CACHE_DROP_BYTES of them are still cached (all of them if `whole`).
        Nothing reads them back but recovery, backups and the log tools, which read
        from the disk anyway; kept cached they only grow the page cache, and every
        new log page then costs a fresh page: on these virtual machines a first
        touch of memory is slow (an 8 MiB write: ~24 ms into fresh pages, ~1.2 ms
        into reused ones; benchmarks/README.md). Call only when every record
        written is synced. The last partial page stays cached (it is written
        again)."""
        handle = self._handle
        end = self.segments[-1].size
        start = self._cache_from
        if handle is None or end - start < (1 if whole else CACHE_DROP_BYTES):
            return
        self.fs.drop_cache(handle, start, end - start)
        self._cache_from = end - end % PAGE_BYTES

    def _preallocate_after(self, handle: int, path: str, end: int, ahead: int) -> None:
        """Write the zeros after the data end `end`, or, when they do not fit, go on
        without them: the records before `end` are written already, and a failed
        optimisation must not fail them (a 1 MiB step on a disk with less than
        that free would otherwise stop the log on every restart)."""
        try:
            self.fs.write_zeros(handle, end, ahead)
        except OSError as exc:
            if exc.errno not in _NO_ROOM:
                raise
            # A short write may have placed some of the zeros: cut them (ftruncate
            # + fsync), so they hold no blocks the records need. A failure here is
            # a real one and goes up.
            self.fs.truncate(path, end)
            self._file_end = end
            self._preallocate = False
            if not self._preallocation_lost_logged:
                self._preallocation_lost_logged = True
                log.warning(
                    "no room to preallocate %d bytes after the records of %s (%s): writing "
                    "the log without preallocation (each sync also updates the file size) "
                    "until a new segment finds room; free disk space",
                    ahead,
                    os.path.basename(path),
                    exc,
                )
            return
        self._file_end = end + ahead

    def mark_synced(self, last_seq: int) -> None:
        """The caller synced the active segment after writing up to `last_seq`."""
        if self.segments[-1].last_seq == last_seq:
            self._unsynced = False
            self._drop_synced_cache()
        self.synced_seq = max(self.synced_seq, last_seq)

    def sync(self) -> bool:
        """Sync the active segment if a buffered write is pending (buffer mode's
        periodic flush). True if it synced."""
        if not self._unsynced or self._handle is None:
            return False
        last_seq = self.segments[-1].last_seq
        self._sync(self._handle)
        self._unsynced = False
        self.synced_seq = last_seq
        self._drop_synced_cache()
        return True

    def close(self) -> None:
        if self._handle is not None:
            try:
                if self._unsynced:
                    self._sync(self._handle)
                    self._unsynced = False
                self.synced_seq = self.segments[-1].last_seq
                self._release_preallocated()
            finally:
                self.fs.close(self._handle)
                self._handle = None
