"""The storage engine on a replicated log: the leader's write path and the
follower's apply path (cluster mode, issue 19).

Owns: `new_cluster_engine` (an `Engine` whose group commit goes to the
replicated log instead of a segment file: `ClusterLogWriter` is its writer
seam), `LogApplier` (a follower: verifies and applies batches through the
replay path), `LogCommitter` (the leader: each group commit becomes one fenced
`append_if`), the errors `NotLeader` and `LogMismatch`, and `state_hash`.

Promises:
- The leader's replies wait for the log: `Engine.durable_seq` (what
  `CommitPipeline` releases replies by) advances only when `append_if`
  acknowledged the batch holding the records. A refused append, or one whose
  outcome stays unknown after reading the tail, fails the committer with
  `NotLeader` and nothing more is released: the caller steps down and
  rebuilds its state from the log (the in-memory state may hold effects the
  log never got).
- An unknown outcome is resolved by reading the tail, never guessed: our batch
  found at the expected sequence counts as appended; the tail still at the
  expected sequence means it was not, and the append is tried again; anything
  else is a refusal.
- Up to `in_flight` appends are outstanding; replies are released only for
  acknowledged appends, in log order (LogCommitter).
- A follower applies only batches that pass `check_batch` (CRC, chain,
  record seq continuity, time never backwards) and whose records all replay;
  anything else raises `LogMismatch` naming the log sequence, and the node must
  stop. The one batch it skips (every reader alike) is one whose epoch is below
  the last applied batch's (`epoch_backwards`): a deposed leader's pipelined
  append that landed after its successor's batch, never acknowledged to anyone.

Must not import: sepp.server, sockets.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from log_format import RECORD_HEADER_BYTES, Corruption, Record, TornTail, scan_records
from sepp.cluster.batch import BATCH_EPOCH_BACKWARDS, ChainTip, check_batch, encode_batch
from sepp.cluster.replog import AppendOutcomeUnknown, AppendRefused, Entry, ReplicatedLog
from sepp.core.config import CoreConfig
from sepp.core.state import State
from sepp.storage import Engine, StorageFailed, StorageOptions
from sepp.storage.fs import RealFileSystem
from sepp.storage.histogram import Histogram
from sepp.storage.recovery import RecoveryReport
from sepp.storage.replay import ReplayError, replay_run
from sepp.storage.wal import SegmentWriter

log = logging.getLogger("sepp.cluster")

# A batch message at most this long (JetStream's default max payload is 1 MiB;
# the envelope adds under 64 bytes). A group commit over it is split at record
# boundaries; a single record cannot be over it (RECORD_BYTES_MAX: the engine
# refuses such a command up front).
BATCH_BYTES_MAX = 1024 * 1024 - 1024
# The longest record a leader takes: one record alone in a batch must fit in
# BATCH_BYTES_MAX with the batch's envelope (under 64 bytes) around it.
RECORD_BYTES_MAX = BATCH_BYTES_MAX - 256
# An append whose outcome is unknown: how often the tail is read before giving
# up (each read after RESOLVE_PAUSE_S).
RESOLVE_ATTEMPTS = 20
RESOLVE_PAUSE_S = 0.1
# A leader's appends outstanding at once ([cluster] appends_in_flight), at most
# APPENDS_IN_FLIGHT_MAX; after its leader-change record a leader appends one at a
# time for PIPELINE_WARMUP appends (LogCommitter's docstring says why).
APPENDS_IN_FLIGHT = 4
APPENDS_IN_FLIGHT_MAX = 16
PIPELINE_WARMUP = APPENDS_IN_FLIGHT_MAX + 1

_RECORD_LEN = struct.Struct("<I")


class NotLeader(StorageFailed):
    """This node stopped leading: nothing more is appended or released. A request
    whose record was in an append that failed has `outcome_unknown` (it may or may
    not be in the log); a refused append appended nothing."""

    def __init__(self, message: str, *, outcome_unknown: bool) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class LogMismatch(RuntimeError):
    """The replicated log holds something this node cannot apply: it stops."""

    def __init__(self, log_seq: int, reason: str) -> None:
        super().__init__(f"replicated log message {log_seq}: {reason}; the node stops")
        self.log_seq = log_seq
        self.reason = reason


class ClusterLogWriter:
    """The `SegmentWriter` seam of an engine whose log is replicated: nothing is
    written here (`Engine.take_pending` hands the records to `LogCommitter`); it
    only keeps what the engine reads of its writer."""

    def __init__(self, synced_seq: int = 0) -> None:
        self.lock = threading.Lock()
        self.segments: list[Any] = []
        self.synced_seq = synced_seq
        self.handle = -1

    def mark_synced(self, last_seq: int) -> None:
        self.synced_seq = max(self.synced_seq, last_seq)

    def append(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("a cluster engine's records go to the replicated log (take_pending)")

    def sync(self) -> bool:
        return False

    def close(self) -> None:
        pass


def new_cluster_engine(
    config: CoreConfig, state: State | None = None, record_seq: int = 0, data_dir: str = ""
) -> Engine:
    """An engine whose log is the replicated log (no local files: snapshots go to
    the blob store, sepp/cluster/snapshots.py): empty, or holding `state`, the
    records up to `record_seq` applied (a snapshot)."""
    # A record travels in one message: a larger one is refused up front (else its
    # append would fail and the leader step down, again at every leader the
    # client retries it with).
    options = StorageOptions(
        snapshot_every_bytes=0, snapshot_mode="inline", record_bytes_max=RECORD_BYTES_MAX
    )
    writer = cast(SegmentWriter, ClusterLogWriter(record_seq))
    return Engine(
        RealFileSystem(),
        data_dir,
        State(config) if state is None else state,
        writer,
        record_seq + 1,
        options,
        RecoveryReport(snapshot_seq=record_seq),
        None,
    )


def _ordered(value: Any) -> Any:
    """`value` with every dict as a list of its items sorted by key: equal values
    print equal whatever order their dicts were filled in (a state loaded from a
    snapshot creates its queues in another order than the live one did)."""
    if isinstance(value, dict):
        return sorted(((repr(k), _ordered(v)) for k, v in value.items()), key=lambda kv: kv[0])
    if isinstance(value, list | tuple):
        return [_ordered(v) for v in value]
    return value


def state_hash(state: State) -> str:
    """A digest of `State.canonical()`: equal states, equal hashes (the nodes of a
    cluster compare theirs at the same sequence)."""
    return hashlib.blake2b(repr(_ordered(state.canonical())).encode(), digest_size=16).hexdigest()


def _record_ends(records: bytes) -> list[tuple[int, int]]:
    """(end offset, seq) of each back-to-back record (headers only: the records
    were just encoded by the engine)."""
    ends = []
    offset = 0
    view = memoryview(records)
    while offset < len(view):
        (length,) = _RECORD_LEN.unpack_from(view, offset + 8)
        (seq,) = struct.unpack_from("<Q", view, offset + 16)
        offset += RECORD_HEADER_BYTES + length
        ends.append((offset, seq))
    return ends


def split_records(
    records: bytes, first_seq: int, last_seq: int, max_bytes: int
) -> list[tuple[bytes, int, int]]:
    """One group commit's records as chunks of at most `max_bytes` (a record
    longer than that alone), cut at record boundaries: (bytes, first, last)."""
    if len(records) <= max_bytes:
        return [(records, first_seq, last_seq)]
    chunks = []
    start = 0
    chunk_first = first_seq
    previous: tuple[int, int] | None = None
    for end, seq in _record_ends(records):
        if end - start > max_bytes and previous is not None:
            chunks.append((records[start : previous[0]], chunk_first, previous[1]))
            start, chunk_first = previous[0], previous[1] + 1
        previous = (end, seq)
    assert previous is not None
    chunks.append((records[start:], chunk_first, previous[1]))
    return chunks


class LogApplier:
    """A follower's apply path: each message of the log, in order, checked and
    applied to `engine.state` through `replay_run` (the replay path)."""

    def __init__(self, engine: Engine, *, tip: ChainTip | None = None, log_seq: int = 0) -> None:
        self.engine = engine
        self.tip = tip or ChainTip()
        # The last log sequence applied or skipped (the next append expects it).
        self.log_seq = log_seq
        self.skipped = 0

    def apply(self, entry: Entry) -> None:
        """Check and apply one message. Raises LogMismatch."""
        if entry.seq != self.log_seq + 1:
            raise LogMismatch(entry.seq, f"expected log message {self.log_seq + 1}")
        check = check_batch(entry.data, self.tip)
        if check.status == BATCH_EPOCH_BACKWARDS:
            # A deposed leader's late pipelined append (module docstring).
            log.warning("log message %d skipped: %s", entry.seq, check.reason)
            self.skipped += 1
            self.log_seq = entry.seq
            return
        if not check.ok or check.batch is None:
            raise LogMismatch(entry.seq, f"batch {check.status}: {check.reason}")
        batch = check.batch
        engine = self.engine
        expected = batch.last_seq - batch.first_seq + 1
        try:
            result = replay_run(
                engine.state,
                batch.records,
                start_offset=0,
                expected_seq=batch.first_seq,
                until_seq=batch.last_seq,
            )
        except ReplayError as exc:
            raise LogMismatch(
                entry.seq, f"record seq {getattr(exc, 'seq', '?')} does not apply: {exc}"
            ) from exc
        if result.records != expected or result.offset != len(batch.records):
            raise LogMismatch(
                entry.seq, _why_records_stop(batch.records, result.offset, result.seq)
            )
        engine.applied_from_log(batch.last_seq)
        self.tip = self.tip.after(batch)
        self.log_seq = entry.seq


def _why_records_stop(records: bytes, offset: int, seq: int) -> str:
    """Why a batch's records stop at `offset` / `seq`, before its last_seq."""
    if offset >= len(records):
        return f"the batch's records end before its last_seq (at record seq {seq})"
    for item in scan_records(records, start_offset=offset, expected_seq=seq):
        if isinstance(item, Record):
            continue
        if isinstance(item, Corruption | TornTail):
            return f"record seq {seq}: {item.reason} at offset {item.offset}"
        break
    return f"record seq {seq} ends the run: more records than the batch's last_seq"


async def catch_up(applier: LogApplier, log_: ReplicatedLog, *, until: int | None = None) -> int:
    """Apply every message up to `until` (default: the log's last now)."""
    last = await log_.last() if until is None else until
    while applier.log_seq < last:
        entries = await log_.read(applier.log_seq + 1, min(1024, last - applier.log_seq))
        if not entries:
            raise LogMismatch(applier.log_seq + 1, "the log ended before its last sequence")
        for entry in entries:
            applier.apply(entry)
    return applier.log_seq


@dataclass(slots=True)
class _Append:
    """One batch on its way to the log: the sequence it expects (its
    predecessor's), its last record, and the chain after it."""

    message: bytes
    expected: int
    last_record: int
    tip: ChainTip
    task: asyncio.Task[int] | None = None
    # When it was sent (time.monotonic()), for the append latency.
    sent_at: float = 0.0


class LogCommitter:
    """The leader's group commit: whenever records are buffered, append them to
    the replicated log as one batch (split at `BATCH_BYTES_MAX`), expecting the
    last sequence this node applied or appended; on its acknowledgement the
    records are durable (`engine.synced`).

    Up to `in_flight` appends are outstanding at once, each expecting the
    sequence its predecessor will get. Replies are released only for
    acknowledged appends, in log order. When the oldest outstanding append fails,
    every append behind it is waited for, then: a refusal stops the committer
    (`NotLeader`, nothing of it appended); an unknown outcome is resolved in
    order by reading the tail (never guessed), each later append counted only
    once the one before it is known to be ours.

    Why pipelining is safe with a fence on the sequence only: an append k + 1
    sent behind an append k that is refused (another leader appended at k) may
    land on top of that leader's message. Such a batch is never acknowledged to
    anyone here (k was not), and every reader skips it: its epoch is below the
    other leader's (`BATCH_EPOCH_BACKWARDS`, FORMAT.md "Cluster batch"). The
    mirror case, this leader's batch landing on a deposed leader's late append,
    could break the chain (same epoch, wrong prev_hash); it cannot happen because
    a new leader appends one at a time for its first `PIPELINE_WARMUP` appends
    (its leader-change record at sequence c, then `APPENDS_IN_FLIGHT_MAX` more),
    and a deposed leader's appends all expect sequences below c +
    `APPENDS_IN_FLIGHT_MAX` - 1: it appended nothing past c - 1 that the new
    leader did not apply, and has at most that many outstanding. (JetStream's `Nats-Expected-Last-Msg-Id` would fence
    on the predecessor's identity instead, but on a replicated stream a mismatch
    is a "critical write error" that halts the stream on every server:
    nats-server 2.15.1, measured.)

    The face of `GroupCommitter` (start / wake / stop; `on_durable(seq)` and
    `on_failure(exc)` called on the loop thread), so `CommitPipeline` can run it."""

    def __init__(
        self,
        engine: Engine,
        log_: ReplicatedLog,
        *,
        epoch: int,
        tip: ChainTip,
        log_seq: int,
        on_durable: Callable[[int], object],
        on_failure: Callable[[BaseException], object],
        max_bytes: int = BATCH_BYTES_MAX,
        resolve_pause_s: float = RESOLVE_PAUSE_S,
        in_flight: int = APPENDS_IN_FLIGHT,
        pipeline_warmup: int = PIPELINE_WARMUP,
        append_duration: Histogram | None = None,
    ) -> None:
        if not 1 <= in_flight <= APPENDS_IN_FLIGHT_MAX:
            raise ValueError(f"in_flight must be 1..{APPENDS_IN_FLIGHT_MAX}, not {in_flight}")
        self.engine = engine
        self.log = log_
        self.epoch = epoch
        # What was acknowledged: the chain after the last acknowledged batch, and
        # the last log sequence this node applied or appended.
        self.tip = tip
        self.log_seq = log_seq
        self.on_durable = on_durable
        self.on_failure = on_failure
        self.max_bytes = max_bytes
        self.resolve_pause_s = resolve_pause_s
        self.in_flight = in_flight
        # Appends one at a time until the log is past this sequence (the class
        # docstring): the first append is this epoch's leader-change record.
        self.pipeline_from = log_seq + pipeline_warmup
        self.failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        # Encoded: the chain and log sequence after the last batch taken.
        self._taken_tip = tip
        self._taken_seq = log_seq
        self._window: collections.deque[_Append] = collections.deque()
        self._unsent: collections.deque[_Append] = collections.deque()
        self.appends = 0
        # The most appends ever outstanding at once (tests, benchmarks).
        self.max_outstanding = 0
        # Seconds from an append's request to its acknowledgement (/metrics).
        self.append_duration = append_duration

    def bind(
        self, on_durable: Callable[[int], object], on_failure: Callable[[BaseException], object]
    ) -> None:
        """Report to someone else from now on (the server's commit pipeline)."""
        self.on_durable = on_durable
        self.on_failure = on_failure

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sepp-log-commit")

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The running committer (done once it failed or stopped)."""
        return self._task

    @property
    def outstanding(self) -> int:
        """Appends sent and not yet settled (/metrics: appends in flight)."""
        return len(self._window)

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Append what is buffered, then stop."""
        self._stopping = True
        self._wake.set()
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait([task])  # its failure was reported through on_failure

    def cancel(self) -> None:
        """Stop at once (stepping down): nothing more is appended."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        self._abandon()

    def _abandon(self) -> None:
        for item in self._window:
            if item.task is not None:
                item.task.cancel()
        self._window.clear()
        self._unsent.clear()

    async def _run(self) -> None:
        try:
            while True:
                # Cleared first: whatever happens after this (an answer, a wake)
                # sets it again, so nothing is missed.
                self._wake.clear()
                await self._settle()
                self._fill()
                if not self._window and self._stopping and not self.engine.has_pending():
                    return
                await self._wake.wait()
        except StorageFailed as exc:
            self.failure = exc
            self._abandon()
            self.on_failure(exc)
        finally:
            self._abandon()

    async def commit_once(self) -> int | None:
        """Append everything buffered and wait until it is acknowledged; returns
        its last record seq (None: nothing was buffered). Raises NotLeader (and
        the engine fails). Not while the committer runs (`start`)."""
        last = self._take()
        while self._window or self._unsent:
            self._fill(take=False)
            head = self._window[0].task
            assert head is not None
            await asyncio.wait([head])
            await self._settle()
        return last

    # -- the window ------------------------------------------------------------

    def _take(self) -> int | None:
        """Encode everything buffered as batches (after the last one taken);
        returns its last record seq."""
        taken = self.engine.take_pending()
        if taken is None:
            return None
        records, first_seq, last_seq, time_ms = taken
        for chunk, first, last in split_records(records, first_seq, last_seq, self.max_bytes):
            tip = self._taken_tip
            batch_time = max(time_ms, tip.time_ms)
            message, digest = encode_batch(
                epoch=self.epoch,
                first_seq=first,
                last_seq=last,
                time_ms=batch_time,
                prev_hash=tip.hash,
                records=chunk,
            )
            self._taken_tip = ChainTip(digest, last + 1, self.epoch, batch_time)
            self._unsent.append(_Append(message, self._taken_seq, last, self._taken_tip))
            self._taken_seq += 1
        return last_seq

    def _limit(self) -> int:
        return self.in_flight if self.log_seq >= self.pipeline_from else 1

    def _fill(self, *, take: bool = True) -> None:
        """Send batches while the window has room (taking what is buffered)."""
        while len(self._window) < self._limit():
            if not self._unsent and (not take or self._take() is None):
                return
            item = self._unsent.popleft()
            item.sent_at = time.monotonic()
            item.task = asyncio.ensure_future(self.log.append_if(item.expected, item.message))
            item.task.add_done_callback(functools.partial(self._answered, item))
            self._window.append(item)
            self.max_outstanding = max(self.max_outstanding, len(self._window))

    def _answered(self, item: _Append, task: asyncio.Task[int]) -> None:
        self._wake.set()
        durations = self.append_duration
        if durations is not None and not task.cancelled() and task.exception() is None:
            durations.observe(time.monotonic() - item.sent_at)

    def _acknowledged(self, item: _Append) -> None:
        self.tip = item.tip
        self.log_seq = item.expected + 1
        self.appends += 1
        # Durable batch by batch: a later batch's refusal must not hide it.
        self.engine.synced(item.last_record)
        self.on_durable(item.last_record)

    async def _settle(self) -> None:
        """Count the answered appends at the head of the window, in order."""
        window = self._window
        while window:
            head = window[0]
            assert head.task is not None
            if not head.task.done():
                return
            if not head.task.cancelled() and head.task.exception() is None:
                window.popleft()
                self._acknowledged(head)
                continue
            await self._recover()
            return

    async def _recover(self) -> None:
        """The oldest outstanding append failed: wait for those behind it, then
        settle them in order (reading the tail where an outcome is unknown)."""
        items = list(self._window)
        self._window.clear()
        await asyncio.wait([item.task for item in items if item.task is not None])
        head = items[0]
        error = _failure(head)
        if isinstance(error, AppendRefused):
            # A first try refused: nothing of it was appended, and each append
            # behind it expected it to be there: none of theirs counts.
            self._unsent.clear()
            raise self._lost(
                f"append after log message {head.expected} refused "
                f"(record seq {head.last_record}): {error}",
                outcome_unknown=False,
            ) from error
        if not isinstance(error, AppendOutcomeUnknown):
            self._unsent.clear()
            raise self._lost(
                f"append after log message {head.expected} failed: {error!r}",
                outcome_unknown=True,
            ) from error
        log.warning("append after log message %d: outcome unknown (%s)", head.expected, error)
        for item in items:
            if _failure(item) is not None:
                # Its predecessor is ours now: this one was either appended on
                # top of it, or not at all (then it is tried again).
                await self._append(item.expected, item.message, item.last_record, landed=True)
            self._acknowledged(item)

    async def _append(
        self, expected: int, message: bytes, last_record: int, *, landed: bool = False
    ) -> None:
        """Append one batch, resolving an unknown outcome by reading the tail.
        `landed`: an earlier try may have appended it."""
        outcome_unknown = landed
        for _ in range(RESOLVE_ATTEMPTS):
            if outcome_unknown:
                # Resolve by reading the tail, never guess.
                try:
                    if await self._landed(expected, message):
                        return
                    tail = await self.log.last()
                except Exception as exc:  # the backend's read failed too: try again
                    log.warning("reading the log's tail failed: %s", exc)
                    await asyncio.sleep(self.resolve_pause_s)
                    continue
                if tail != expected:
                    raise self._lost(
                        f"another writer appended after log message {expected}",
                        outcome_unknown=False,
                    )
                # Not there, nothing else there either: try the same append again.
            try:
                await self.log.append_if(expected, message)
                return
            except AppendRefused as exc:
                # An earlier try of this append may have landed: look first.
                if outcome_unknown and await self._landed(expected, message):
                    return
                raise self._lost(
                    f"append after log message {expected} refused (record seq {last_record}): "
                    f"{exc}",
                    outcome_unknown=False,
                ) from exc
            except AppendOutcomeUnknown as exc:
                outcome_unknown = True
                log.warning("append after log message %d: outcome unknown (%s)", expected, exc)
        raise self._lost(
            f"the outcome of the append after log message {expected} stayed unknown",
            outcome_unknown=True,
        )

    async def _landed(self, expected: int, message: bytes) -> bool:
        entries = await self.log.read(expected + 1, 1)
        return bool(entries) and entries[0].data == message

    def _lost(self, message: str, *, outcome_unknown: bool) -> NotLeader:
        error = NotLeader(message, outcome_unknown=outcome_unknown)
        self.engine.sync_failed(error)
        return error


def _failure(item: _Append) -> BaseException | None:
    task = item.task
    assert task is not None and task.done()
    if task.cancelled():
        return AppendOutcomeUnknown("the append was cancelled")
    return task.exception()
