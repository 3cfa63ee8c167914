"""The storage engine: state machine + write-ahead log + snapshots, with group
commit.

Owns: `Engine` (open = recover; `execute` = decide, encode, apply, buffer;
`flush` = one write and one sync for everything buffered; or the same split in two
for a caller that syncs itself — `write_unsynced`, then `synced` / `sync_failed`;
snapshots; retention), `GroupCommitter` (the flushing thread), `StorageOptions`,
`StorageFailed`.

Promises:
- Log order is apply order. `execute` returns the *barrier*: the sequence number
  that must be durable before its reply may be released (its own record, or for a
  command that logged nothing the last record it may have read). Replies are
  released in log order, so a later command may read state written by an earlier,
  not-yet-durable record: its reply waits for a later sync that covers both.
- One `flush` = one `write` + one sync for every record buffered since the last
  one; while it runs (GIL released in the syscalls) the writer thread keeps
  executing into the next batch.
- Any failed write or sync makes the engine fail permanently (`StorageFailed`):
  it is never retried; restart and recovery decide what survived.
- Snapshots never stall the write path for longer than a `fork()`: the child
  process writes a copy-on-write image of the state while the parent goes on; the
  snapshot is published (rename + directory sync) only once the log up to its
  sequence number is synced, then covered segments are deleted (subject to the
  configured log retention). A failure while writing or publishing a snapshot, or
  while deleting covered files, is reported and the snapshot abandoned but is not
  fatal: no acknowledged data depends on it — the log still holds everything.
- A pin (`pin_log`, taken by an online backup) names the newest published
  snapshot and the segments after it; retention deletes none of them until the
  pin is released, whatever snapshots are published meanwhile.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from log_format import (
    RECORD_KIND_COMMAND,
    encode_envelope_parts,
    encode_record,
    encode_record_header_parts,
    snapshot_file_name,
)
from sepp.core.apply import APPLY_TABLE, ApplyError
from sepp.core.commands import Command
from sepp.core.config import CoreConfig
from sepp.core.decide import Decision, decide
from sepp.core.results import CommandError, RecordTooLarge
from sepp.core.state import State
from sepp.storage.fs import FileSystem, RealFileSystem
from sepp.storage.iopriority import set_idle_io_priority
from sepp.storage.recovery import (
    SNAPSHOT_DIR,
    SNAPSHOT_TMP_SUFFIX,
    WAL_DIR,
    RecoveryReport,
    list_snapshots,
    recover,
)
from sepp.storage.snapshots import SnapshotRowTooLarge, write_snapshot_file
from sepp.storage.wal import (
    PERSIST_BUFFER,
    PERSIST_MODES,
    PERSIST_SYNC_ALL,
    Hook,
    Segment,
    SegmentWriter,
)

log = logging.getLogger("sepp.storage")

# StorageOptions.record_bytes_max = 0: no record is too large.
RECORD_BYTES_UNLIMITED = 1 << 62

# Pause between two segment deletions of the background retention, for a segment of
# RETENTION_PACE_BYTES or more; smaller segments pause in proportion to their size
# (deleting hundreds of tiny segments must not hold off the next snapshot for long).
RETENTION_PACE_S = 0.05
RETENTION_PACE_BYTES = 64 * 1024 * 1024

# A batch of at least this many bytes is written from its parts (pwritev), not
# joined into one buffer first.
WRITE_PARTS_BYTES_MIN = 1 << 20
LOCK_FILE = "LOCK"

SNAPSHOT_FORK = "fork"
SNAPSHOT_INLINE = "inline"
SNAPSHOT_AUTO = "auto"


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPin:
    """A consistent set of files retention leaves alone until `unpin_log`: the
    snapshot at `snapshot_seq` (None: no snapshot yet, the log starts at seq 1)
    and the segments holding the records after it up to `last_seq`, each to be
    read up to its `size` (the active segment grows past it)."""

    pin_id: int
    snapshot_seq: int
    snapshot_path: str | None
    segments: tuple[Segment, ...]
    last_seq: int


class StorageFailed(RuntimeError):
    """Storage failed for good (a write or sync error, or a bug while applying).
    Nothing more is accepted; the process should exit and restart."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageOptions:
    persist_mode: str = PERSIST_SYNC_ALL
    segment_bytes_max: int = 64 * 1024 * 1024
    # Take a snapshot once this many log bytes were written since the last one
    # (0 = only when asked, e.g. at shutdown).
    snapshot_every_bytes: int = 256 * 1024 * 1024
    # fork: a child process writes the snapshot (no stall beyond fork itself).
    # inline: serialize on the calling thread (tests with a fake file system).
    snapshot_mode: str = SNAPSHOT_AUTO
    # Keep covered segments at least this long (by the time of their newest
    # record) for auditing; 0 = delete as soon as a snapshot covers them.
    log_retention_ms: int = 0
    # Snapshots kept; segments are deleted only below the oldest kept snapshot, so
    # a damaged newest snapshot can fall back to an older one.
    snapshots_kept: int = 2
    # buffer mode: how often the group committer syncs buffered writes.
    buffer_flush_interval_ms: int = 1000
    # A command whose log record would be longer is refused (invalid_argument)
    # before it changes anything; 0 = no such limit (the segmented WAL takes any
    # record). Cluster mode sets it: a record travels in one replicated-log
    # message, whose size the log's backend caps (sepp/cluster/logengine.py).
    record_bytes_max: int = 0

    def validate(self) -> None:
        if self.persist_mode not in PERSIST_MODES:
            raise ValueError(f"persist_mode must be one of {', '.join(PERSIST_MODES)}")
        if self.segment_bytes_max < 4096:
            raise ValueError("segment_bytes_max must be at least 4096")
        if self.snapshot_every_bytes < 0:
            raise ValueError("snapshot_every_bytes must not be negative")
        if self.snapshot_mode not in (SNAPSHOT_FORK, SNAPSHOT_INLINE, SNAPSHOT_AUTO):
            raise ValueError("snapshot_mode must be fork, inline or auto")
        if self.log_retention_ms < 0:
            raise ValueError("log_retention_ms must not be negative")
        if self.snapshots_kept < 1:
            raise ValueError("snapshots_kept must be at least 1")
        if self.buffer_flush_interval_ms < 1:
            raise ValueError("buffer_flush_interval_ms must be at least 1")
        if self.record_bytes_max < 0:
            raise ValueError("record_bytes_max must not be negative")


class Engine:
    """Single-writer storage engine. `execute` is called from one thread (the
    writer); `flush` from one flushing thread at a time (or the writer itself)."""

    def __init__(
        self,
        fs: FileSystem,
        data_dir: str,
        state: State,
        writer: SegmentWriter,
        next_seq: int,
        options: StorageOptions,
        report: RecoveryReport,
        hook: Hook | None,
    ) -> None:
        self.fs = fs
        self.data_dir = data_dir
        self.state = state
        self.options = options
        self.recovery_report = report
        self._writer = writer
        self._hook = hook or (lambda point: None)
        self.snap_dir = os.path.join(data_dir, SNAPSHOT_DIR)
        self.wal_dir = os.path.join(data_dir, WAL_DIR)
        # Sequence numbers: appended (buffered, applied) and durable (written and
        # synced per the persist mode).
        self.appended_seq = next_seq - 1
        self.durable_seq = next_seq - 1
        # The records not yet written, each as one or more parts (in order).
        self._pending: list[bytes] = []
        self._pending_bytes = 0  # the length of the records in _pending
        self._pending_records = 0
        self._pending_time_ms = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._durable_cond = threading.Condition(threading.Lock())
        self.failure: BaseException | None = None
        self.closed = False
        self._bytes_since_snapshot = 0
        self._snapshot_thread: threading.Thread | None = None
        self._snapshot_started = 0.0
        # The snapshot recovery used (damaged newer ones were set aside).
        self.snapshot_seq = report.snapshot_seq
        self.snapshot_error: BaseException | None = None
        mode = options.snapshot_mode
        if mode == SNAPSHOT_AUTO:
            mode = SNAPSHOT_FORK if fs.supports_fork and hasattr(os, "fork") else SNAPSHOT_INLINE
        self.snapshot_mode = mode
        self.stats = {"flushes": 0, "records": 0, "bytes": 0, "snapshots": 0}
        self._record_bytes_max = options.record_bytes_max or RECORD_BYTES_UNLIMITED
        # How long the last published snapshot took, start to publish (0: none yet).
        self.snapshot_duration_s = 0.0
        # Called with (state, events) of each decided command just before they
        # are applied, on the live path only (never on replay): the server's
        # metrics count there (sepp/server/metrics.py).
        self.observer: Callable[[State, tuple[Any, ...]], None] | None = None
        self._dir_lock: int | None = None
        # Retention pins (online backup, sepp/admin/backup.py): pin id -> the
        # snapshot seq a reader copies from. Retention deletes no pinned snapshot
        # and no segment holding a record above the lowest pinned seq. Every
        # retention delete happens under _retention_lock, so a pin taken under it
        # sees files that stay until it is released.
        self._retention_lock = threading.Lock()
        self._pins: dict[int, int] = {}
        self._next_pin = 1

    # -- opening -------------------------------------------------------------

    @classmethod
    def open(
        cls,
        data_dir: str,
        config: CoreConfig | None = None,
        options: StorageOptions | None = None,
        *,
        fs: FileSystem | None = None,
        hook: Hook | None = None,
    ) -> Engine:
        """Recover the data directory (creating it if needed) and open the log for
        appending. Raises RecoveryError if the directory needs an operator."""
        options = options or StorageOptions()
        options.validate()
        fs = fs or RealFileSystem()
        config = config or CoreConfig()
        fs.makedirs(data_dir)
        # One process per data directory: a second server (or a repair) on the
        # same log would interleave writes and corrupt it.
        lock = fs.lock(os.path.join(data_dir, LOCK_FILE))
        # Recovery builds millions of long-lived objects; the cyclic garbage
        # collector would rescan them all again and again (it halves replay speed).
        # Off while recovering, then the recovered heap is frozen out of its reach.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            recovered = recover(fs, data_dir, config)
            writer = SegmentWriter(
                fs,
                os.path.join(data_dir, WAL_DIR),
                recovered.segments,
                persist_mode=options.persist_mode,
                segment_bytes_max=options.segment_bytes_max,
                next_seq=recovered.next_seq,
                hook=hook,
            )
        except BaseException:
            fs.unlock(lock)
            raise
        finally:
            gc.freeze()
            if gc_was_enabled:
                gc.enable()
        engine = cls(
            fs,
            data_dir,
            recovered.state,
            writer,
            recovered.next_seq,
            options,
            recovered.report,
            hook,
        )
        engine._dir_lock = lock
        return engine

    @property
    def segments(self) -> list[Any]:
        with self._writer.lock:
            return list(self._writer.segments)

    # -- the write path ------------------------------------------------------

    def execute(self, command: Command, now_ms: int) -> tuple[Decision | CommandError, int]:
        """Decide and apply `command`, buffering its record. Returns the decision
        and the barrier sequence number its reply must wait for."""
        if self.failure is not None:
            raise StorageFailed(f"storage has failed: {self.failure}") from self.failure
        state = self.state
        decision = decide(state, command, now_ms)
        if type(decision) is not Decision or not decision.events:
            return decision, self.appended_seq
        events = decision.events
        time_ms = decision.time_ms
        # Encode before applying: if a value cannot be encoded, nothing changed.
        seq = self.appended_seq + 1
        # [type, version, *fields]: events.to_fields, inlined (hot path). The
        # writer's synced seq (read now, so at most what was synced when the record
        # is written) is the record's claim of what was durable before it:
        # recovery tells an unsynced hole from lost synced data by it.
        body = encode_envelope_parts(
            time_ms,
            command.kind,
            [[e.TYPE, e.VERSION, *e] for e in events],
            self._writer.synced_seq,
        )
        parts: list[bytes] | None = None
        if len(body) == 1:
            record = encode_record(seq, RECORD_KIND_COMMAND, body[0])
            record_bytes = len(record)
        else:
            # Large bytes fields (payloads) are kept as the objects they are, not
            # copied on the event loop: the batch's write takes them as parts.
            parts = [encode_record_header_parts(seq, RECORD_KIND_COMMAND, body), *body]
            record_bytes = sum(map(len, parts))
        if record_bytes > self._record_bytes_max:
            # Refused before anything changed (decide changes nothing): a record
            # the log could not take would fail its whole group commit.
            return (
                RecordTooLarge(
                    f"this request's log record would be {record_bytes} bytes, over the "
                    f"{self._record_bytes_max} bytes one log message holds: send fewer "
                    "or smaller jobs per request"
                ),
                self.appended_seq,
            )
        observer = self.observer
        if observer is not None:
            observer(state, events)
        try:
            if time_ms > state.clock_ms:
                state.clock_ms = time_ms
            table = APPLY_TABLE
            for event in events:
                table[event.TYPE](state, event)  # type: ignore[misc]
        except ApplyError as exc:
            # The state may be half-changed: stop everything; recovery from the
            # log (which does not hold this record) rebuilds a consistent state.
            self._fail(exc)
            raise StorageFailed(f"apply failed: {exc}") from exc
        with self._lock:
            if parts is None:
                self._pending.append(record)
            else:
                self._pending += parts
            self._pending_bytes += record_bytes
            self._pending_records += 1
            self._pending_time_ms = time_ms
            self.appended_seq = seq
        self._bytes_since_snapshot += record_bytes
        return decision, seq

    def has_pending(self) -> bool:
        return bool(self._pending)

    def pending_bytes(self) -> int:
        """How many bytes of records are buffered, not yet written."""
        return self._pending_bytes

    def flush(self) -> int:
        """Write and sync everything buffered (one write, one sync). Returns the
        durable sequence number. Thread-safe against `execute`."""
        with self._flush_lock:
            last_seq = self._write_pending(sync=True)
            if last_seq is None:
                return self.durable_seq
            self._set_durable(last_seq)
            return last_seq

    def write_unsynced(self) -> tuple[int, int] | None:
        """Write everything buffered without syncing it: the caller syncs the
        returned file descriptor itself, then calls `synced` (or `sync_failed`).
        Returns (last sequence number written, log file descriptor), or None if
        nothing was buffered. Only for the sync persist modes, one at a time:
        nothing else may write the log until `synced` or `sync_failed`."""
        with self._flush_lock:
            last_seq = self._write_pending(sync=False)
            if last_seq is None:
                return None
            return last_seq, self._writer.handle

    def synced(self, last_seq: int) -> None:
        """The sync of `write_unsynced`'s write up to `last_seq` succeeded."""
        self._writer.mark_synced(last_seq)
        self._hook("wal.after_sync")
        self._set_durable(last_seq)

    def sync_failed(self, exc: BaseException) -> StorageFailed:
        """The sync of `write_unsynced`'s write failed: the engine fails for good
        (never retried). Returns the error to report."""
        self._fail(exc)
        return StorageFailed(f"log sync failed: {exc}")

    def _take(self) -> tuple[list[bytes], int, int, int, int] | None:
        """Everything buffered, handed over: (parts, records, bytes, last seq, time)."""
        with self._lock:
            batch = self._pending
            if not batch:
                return None
            taken = (batch, self._pending_records, self._pending_bytes, self.appended_seq)
            self._pending = []
            self._pending_bytes = 0
            self._pending_records = 0
            return (*taken, self._pending_time_ms)

    def take_pending(self) -> tuple[bytes, int, int, int] | None:
        """Cluster mode's group commit (sepp/cluster): hand over everything
        buffered -- exactly the bytes `flush` would write to the segment -- as
        (records, first seq, last seq, time of the newest), or None. The caller
        makes them durable elsewhere, then calls `synced(last_seq)` (or
        `sync_failed`); one batch at a time, in order."""
        if self.failure is not None:
            raise StorageFailed(f"storage has failed: {self.failure}") from self.failure
        taken = self._take()
        if taken is None:
            return None
        batch, records, size, last_seq, time_ms = taken
        self.stats["flushes"] += 1
        self.stats["records"] += records
        self.stats["bytes"] += size
        return b"".join(batch), last_seq - records + 1, last_seq, time_ms

    def applied_from_log(self, last_seq: int) -> None:
        """Cluster mode (a follower): the records up to `last_seq` were applied to
        `state` from the replicated log, where they are durable. Nothing may be
        buffered."""
        with self._lock:
            if self._pending:
                raise StorageFailed("records applied from the log over buffered ones")
            self.appended_seq = last_seq
        self.synced(last_seq)

    def _write_pending(self, *, sync: bool) -> int | None:
        if self.failure is not None:
            raise StorageFailed(f"storage has failed: {self.failure}") from self.failure
        taken = self._take()
        if taken is None:
            return None
        batch, records, size, last_seq, time_ms = taken
        first_seq = last_seq - records + 1
        # A large batch goes to the writer as its parts: one pwritev, which releases
        # the GIL for the copy (b"".join would hold it, stalling the event loop).
        data: bytes | list[bytes] = batch if size >= WRITE_PARTS_BYTES_MIN else b"".join(batch)
        try:
            self._writer.append(data, first_seq, last_seq, time_ms, sync=sync)
        except OSError as exc:
            self._fail(exc)
            raise StorageFailed(f"log write failed: {exc}") from exc
        stats = self.stats
        stats["flushes"] += 1
        stats["records"] += records
        stats["bytes"] += size
        return last_seq

    def _set_durable(self, last_seq: int) -> None:
        with self._durable_cond:
            if last_seq > self.durable_seq:  # never backwards
                self.durable_seq = last_seq
            self._durable_cond.notify_all()

    def sync(self) -> None:
        """buffer mode: make written records durable (the periodic flush)."""
        with self._flush_lock:
            if self.failure is not None:
                raise StorageFailed(f"storage has failed: {self.failure}") from self.failure
            try:
                self._writer.sync()
            except OSError as exc:
                self._fail(exc)
                raise StorageFailed(f"log sync failed: {exc}") from exc

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            log.error("storage failed permanently: %s", exc)
        with self._durable_cond:
            self._durable_cond.notify_all()

    def wait_durable(self, seq: int, timeout: float | None = None) -> bool:
        """Block until `seq` is durable (or the engine failed/closed)."""
        with self._durable_cond:
            return (
                self._durable_cond.wait_for(
                    lambda: self.durable_seq >= seq or self.failure is not None or self.closed,
                    timeout,
                )
                and self.durable_seq >= seq
            )

    # -- snapshots -----------------------------------------------------------

    def snapshot_due(self) -> bool:
        every = self.options.snapshot_every_bytes
        return (
            every > 0
            and self._bytes_since_snapshot >= every
            and self._snapshot_thread is None
            and self.failure is None
        )

    def snapshot_running(self) -> bool:
        return self._snapshot_thread is not None

    def start_snapshot(self) -> bool:
        """Begin a snapshot of the current state (call on the writer thread,
        between commands). False if one is running or nothing changed."""
        if self._snapshot_thread is not None or self.failure is not None:
            return False
        seq = self.appended_seq
        if seq == self.snapshot_seq:
            return False
        tmp = os.path.join(self.snap_dir, snapshot_file_name(seq) + SNAPSHOT_TMP_SUFFIX)
        self._bytes_since_snapshot = 0
        if self.snapshot_mode == SNAPSHOT_FORK:
            pid = self._fork_snapshot_writer(tmp, seq)
            target: Callable[[], None] = lambda: self._finish_snapshot(seq, tmp, pid)  # noqa: E731
        else:
            try:
                write_snapshot_file(self.fs, tmp, self.state, seq)
            except (OSError, SnapshotRowTooLarge) as exc:
                # A row too large for a record fails this snapshot, not storage:
                # the log still holds everything (the fork mode's child exits 1).
                self.snapshot_error = exc
                log.error("snapshot %d failed: %s", seq, exc)
                # A half-written temp file would make every retry at this seq fail
                # (create is exclusive) and hold space on a full disk.
                self._remove_quietly(tmp)
                return False
            target = lambda: self._finish_snapshot(seq, tmp, None)  # noqa: E731
        thread = threading.Thread(target=target, name=f"sepp-snapshot-{seq}", daemon=True)
        self._snapshot_thread = thread
        self._snapshot_started = time.monotonic()
        log.info(
            "snapshot at seq %d started (%s, %d live jobs)",
            seq,
            self.snapshot_mode,
            len(self.state.jobs),
        )
        thread.start()
        return True

    def _fork_snapshot_writer(self, tmp: str, seq: int) -> int:
        # The child disables its garbage collector first thing, so it never walks
        # (and copies, page by page) the parent's heap; it only reads the state and
        # writes one file. The parent's freeze/threshold settings are left alone.
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child process
            status = 1
            try:
                gc.disable()
                if self._dir_lock is not None:
                    # Only the parent holds the data directory: if it dies while
                    # this child still writes, a restart must not find it locked.
                    os.close(self._dir_lock)
                # The log writer comes first: the snapshot takes what CPU and
                # disk time are left (sepp/storage/iopriority.py).
                os.nice(19)
                set_idle_io_priority()
                write_snapshot_file(self.fs, tmp, self.state, seq, yield_disk=True)
                status = 0
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        return pid

    def _finish_snapshot(self, seq: int, tmp: str, pid: int | None) -> None:
        try:
            if pid is not None:
                _, status = os.waitpid(pid, 0)
                if status != 0:
                    raise OSError(f"snapshot writer process exited with status {status}")
            # Publish only what the log can back: a snapshot newer than the durable
            # log would make recovery refuse to start after a crash.
            while not self.wait_durable(seq, timeout=1.0):
                if self.failure is not None or self.closed:
                    raise OSError("storage stopped before the snapshot's log was durable")
            if self.options.persist_mode == PERSIST_BUFFER:
                # In buffer mode durable_seq means written, not synced: without this
                # sync a crash could keep the snapshot but lose the log under it, and
                # recovery would refuse to start (snapshot newer than the log).
                try:
                    self.sync()
                except StorageFailed as exc:
                    raise OSError(f"log sync before publishing failed: {exc}") from exc
            final = tmp[: -len(SNAPSHOT_TMP_SUFFIX)]
            self._hook("snapshot.before_rename")
            self.fs.rename(tmp, final)
            self._hook("snapshot.after_rename")
            self.fs.fsync_dir(self.snap_dir)
            self._hook("snapshot.published")
            self.snapshot_seq = seq
            self.stats["snapshots"] += 1
            self.snapshot_duration_s = time.monotonic() - self._snapshot_started
            log.info(
                "snapshot at seq %d published in %.2fs",
                seq,
                time.monotonic() - self._snapshot_started,
            )
            removed = self.apply_retention(pace_s=RETENTION_PACE_S if pid is not None else 0.0)
            if removed:
                log.info("retention removed %d file(s) covered by snapshots", len(removed))
        except OSError as exc:
            self.snapshot_error = exc
            log.error("snapshot %d not published: %s", seq, exc)
            self._remove_quietly(tmp)
        finally:
            self._snapshot_thread = None

    def _remove_quietly(self, path: str) -> None:
        """Best-effort removal of a snapshot temp file (recovery deletes leftovers)."""
        try:
            if self.fs.exists(path):
                self.fs.remove(path)
        except OSError:
            pass

    def wait_snapshot(self, timeout: float | None = None) -> None:
        thread = self._snapshot_thread
        if thread is not None:
            thread.join(timeout)

    def snapshot_now(self) -> int:
        """Take and publish a snapshot synchronously (shutdown, tests)."""
        self.wait_snapshot()
        if self.start_snapshot():
            self.flush()
            self.wait_snapshot()
        if self.snapshot_error is not None:
            error, self.snapshot_error = self.snapshot_error, None
            raise StorageFailed(f"snapshot failed: {error}") from error
        return self.snapshot_seq

    # -- retention -----------------------------------------------------------

    def pin_log(self) -> LogPin:
        """Pin the newest published snapshot and the log after it against
        retention, and say what a copy of them holds (online backup): the
        snapshot, the segments with a record above it, and `last_seq`, the last
        record written (its end is the last segment's `size`; it may not be
        durable yet: the caller waits for it). Release with `unpin_log`. Takes
        the retention lock: it may wait for one file deletion (call off the
        event loop)."""
        with self._retention_lock:
            snapshot_seq = self.snapshot_seq
            with self._writer.lock:
                segments = [
                    Segment(s.first_seq, s.path, s.size, s.last_seq, s.last_time_ms)
                    for s in self._writer.segments
                ]
            # A segment holds a record above the snapshot unless the next one
            # starts at or below snapshot_seq + 1 (retention's rule); the last
            # one is always kept (the copy's writer appends to it).
            kept = [
                segment
                for index, segment in enumerate(segments)
                if index == len(segments) - 1 or segments[index + 1].first_seq - 1 > snapshot_seq
            ]
            pin_id = self._next_pin
            self._next_pin += 1
            self._pins[pin_id] = snapshot_seq
        snapshot_path = (
            os.path.join(self.snap_dir, snapshot_file_name(snapshot_seq))
            if snapshot_seq > 0
            else None
        )
        last_seq = segments[-1].last_seq if segments else snapshot_seq
        return LogPin(
            pin_id=pin_id,
            snapshot_seq=snapshot_seq,
            snapshot_path=snapshot_path,
            segments=tuple(kept),
            last_seq=max(last_seq, snapshot_seq),
        )

    def unpin_log(self, pin: LogPin) -> None:
        """Release a pin. What it held is deleted by the next retention pass
        (after the next snapshot), not now."""
        with self._retention_lock:
            self._pins.pop(pin.pin_id, None)

    def pinned_seqs(self) -> list[int]:
        """The snapshot seqs currently pinned (metrics, tests)."""
        with self._retention_lock:
            return sorted(self._pins.values())

    def apply_retention(self, pace_s: float = 0.0) -> list[str]:
        """Delete old snapshots beyond `snapshots_kept`, then segments wholly
        below the oldest kept snapshot (and older than the log retention),
        `pace_s` seconds apart (the snapshot thread paces; tests do not). A
        pinned snapshot (`pin_log`) and the segments above the lowest pin stay."""
        removed: list[str] = []
        snaps = list_snapshots(self.fs, self.snap_dir)
        keep = snaps[-self.options.snapshots_kept :]
        for seq, path in snaps[: len(snaps) - len(keep)]:
            with self._retention_lock:
                if seq in self._pins.values():
                    continue
                self._hook("retention.before_delete")
                self.fs.remove(path)
            removed.append(path)
        if removed:
            self.fs.fsync_dir(self.snap_dir)
        if not keep:
            return removed
        now_ms = self.state.clock_ms
        retention = self.options.log_retention_ms
        deleted_segments = False
        while True:
            with self._writer.lock:
                segments = self._writer.segments
                if len(segments) < 2:
                    break
                first = segments[0]
            if deleted_segments and pace_s > 0:
                # Unlinking a 64 MiB segment makes the file system journal free
                # its blocks, and the log's next fdatasync waits behind that: one
                # segment at a time, with a pause, keeps commit stalls short.
                time.sleep(pace_s * min(1.0, first.size / RETENTION_PACE_BYTES))
            with self._retention_lock:
                base = min([keep[0][0], *self._pins.values()])
                with self._writer.lock:
                    first, second = segments[0], segments[1]
                    covered = second.first_seq - 1 <= base
                    old_enough = retention == 0 or first.last_time_ms <= now_ms - retention
                if not (covered and old_enough):
                    break
                self._hook("retention.before_delete")
                self.fs.remove(first.path)
                self._hook("retention.after_delete")
                with self._writer.lock:
                    segments.pop(0)
            removed.append(first.path)
            deleted_segments = True
        if deleted_segments:
            self.fs.fsync_dir(self.wal_dir)
        return removed

    # -- shutdown ------------------------------------------------------------

    def close(self, *, snapshot: bool = False) -> None:
        """Flush, optionally snapshot, and close the log."""
        if self.closed:
            return
        try:
            if self.failure is None:
                self.flush()
                if snapshot:
                    self.snapshot_now()
            self.wait_snapshot()
        finally:
            self.closed = True
            with self._durable_cond:
                self._durable_cond.notify_all()
            try:
                if self.failure is None:
                    self._writer.close()
            finally:
                self.release_lock()

    def release_lock(self) -> None:
        """Give up the data directory (close does; a failed engine's owner may)."""
        if self._dir_lock is not None:
            self.fs.unlock(self._dir_lock)
            self._dir_lock = None


class GroupCommitter:
    """The flushing thread: whenever records are buffered, write and sync them in
    one go and report the new durable sequence number.

    `on_durable(seq)` and `on_failure(exc)` are called from this thread; an
    asyncio server passes `loop.call_soon_threadsafe` wrappers."""

    def __init__(
        self,
        engine: Engine,
        on_durable: Callable[[int], object],
        on_failure: Callable[[BaseException], object],
    ) -> None:
        self.engine = engine
        self.on_durable = on_durable
        self.on_failure = on_failure
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sepp-group-commit", daemon=True)
        buffered = engine.options.persist_mode == PERSIST_BUFFER
        self._sync_interval_s = engine.options.buffer_flush_interval_ms / 1000 if buffered else None

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Tell the flusher there is work. Cheap when it is already awake."""
        if not self._wake.is_set():
            self._wake.set()

    def stop(self) -> None:
        """Flush what is buffered and stop the thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        engine = self.engine
        interval = self._sync_interval_s
        last_sync = time.monotonic()
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            try:
                if engine.has_pending():
                    seq = engine.flush()
                    self.on_durable(seq)
                if interval is not None and time.monotonic() - last_sync >= interval:
                    # buffer mode's loss window: what was written since the last
                    # sync, at most `buffer_flush_interval_ms` old.
                    engine.sync()
                    last_sync = time.monotonic()
            except StorageFailed as exc:
                self.on_failure(exc)
                return
            except BaseException as exc:  # a bug in a callback: report, never hide
                engine._fail(exc)
                self.on_failure(exc)
                return
            if self._stopping and not engine.has_pending():
                if interval is not None:
                    try:
                        engine.sync()
                    except StorageFailed as exc:
                        self.on_failure(exc)
                return
