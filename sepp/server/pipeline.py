"""The commit pipeline: the asyncio face of the storage engine's group commit.

Owns: `CommitPipeline`, which runs every command on the event-loop thread (decide,
apply, buffer its record), wakes the group committer, and resolves each
command's future once its barrier sequence number is durable — in log order.
Also the server's clock (read once per command, clamped to never go backwards)
and the bounded backlog of commands waiting for durability. The group committer
is one of two (`storage.sync_method`, `resolve_sync_method`): the storage
engine's flushing thread (`GroupCommitter`: writes and syncs), or `LoopCommitter`
(the loop thread writes each batch, Linux AIO syncs it: no Python thread, no GIL
hand-off per commit; benchmarks/README.md finding 15; a batch of at least
`WRITE_OFF_LOOP_BYTES_MIN` is written by a thread, as a large write would stall
every connection).

Promises: a reply is never released before its record (or, for a command that
logged nothing, every record it may have read) is durable per the persist mode;
when more than `backlog_max` commands already wait for a sync, new commands are
refused with `Overloaded` instead of queueing without limit; a storage failure
fails every waiting command and every later one with `StorageFailed`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from sepp.core.commands import Command
from sepp.core.decide import Decision
from sepp.core.errors import ConfigError
from sepp.core.results import CommandError
from sepp.storage import Engine, GroupCommitter, StorageFailed
from sepp.storage.aio import AioSync, aio_unavailable
from sepp.storage.histogram import Histogram
from sepp.storage.wal import PERSIST_BUFFER, PERSIST_SYNC_DATA


class Overloaded(RuntimeError):
    """Too many commands are waiting for the disk: retry later (resource_exhausted)."""


class Corked(Protocol):
    def uncork(self) -> None: ...


class ReleaseCork:
    """Holds the answers one durable release sends, so that a connection's answers
    leave together. A group commit often ends several requests of one connection (a
    client keeps a few batches in flight); each answer was its own write, a
    syscall that wakes the client once more. While `active` (inside
    `CommitPipeline._release` and `_fail`) a connection keeps its answers (up to
    server.CORKED_ANSWERS_MAX, then it writes them) and registers with `hold`;
    `end` has every held connection write what it kept, in the order answered."""

    __slots__ = ("_depth", "_held")

    def __init__(self) -> None:
        self._depth = 0
        self._held: list[Corked] = []

    @property
    def active(self) -> bool:
        return self._depth > 0

    def hold(self, corked: Corked) -> None:
        self._held.append(corked)

    def begin(self) -> None:
        self._depth += 1

    def end(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._held:
            held, self._held = self._held, []
            failed: BaseException | None = None
            for corked in held:
                # Every connection's answers are written, even after one write
                # raised (a bug): none is left holding answers nobody will send.
                try:
                    corked.uncork()
                except Exception as exc:
                    failed = failed or exc
            if failed is not None:
                raise failed


# storage.sync_method: who syncs the log after each group commit's write.
SYNC_METHODS = ("auto", "thread", "aio")

# Within one loop turn, wake the flusher at least every this many commands.
WAKE_EVERY = 64

# LoopCommitter: a batch at least this long is written by its writer thread, not
# the loop thread (an 8 MiB write held every connection for 3-16 ms).
WRITE_OFF_LOOP_BYTES_MIN = 1 << 20


# Upper bounds of the buckets of records per group commit (sepp_group_commit_records).
GROUP_COMMIT_RECORDS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# Upper bounds (seconds) of the buckets of sepp_commit_duration_seconds.
COMMIT_DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitPipeline:
    def __init__(
        self,
        engine: Engine,
        *,
        backlog_max: int = 4096,
        clock: Callable[[], int] = wall_clock_ms,
        on_failure: Callable[[BaseException], None] | None = None,
        release_cork: ReleaseCork | None = None,
    ) -> None:
        self.engine = engine
        self.backlog_max = backlog_max
        # Holds a connection's answers during a release: they leave together,
        # CORKED_ANSWERS_MAX (sepp/server/server.py) to a write.
        self.release_cork = release_cork or ReleaseCork()
        self._clock = clock
        self._last_now = engine.state.clock_ms
        # (barrier, callback, args): callback(None, *args) once durable,
        # callback(error, *args) if storage failed first. Plain callbacks, not
        # futures: the server answers a request straight from `_release`, with no
        # future, no closure and no extra loop turn.
        self._waiters: deque[tuple[int, Callable[..., None], tuple[Any, ...]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._committer: GroupCommitter | LoopCommitter | Any = None
        self._durable_callbacks: list[Callable[[int], None]] = []
        self._wake_scheduled = False
        self._unwoken = 0  # commands waiting since the flusher was last woken
        self.failure: BaseException | None = None
        self._on_failure = on_failure
        # Records per group commit since start, and how long the group commits
        # somebody waited for took (the metrics read them).
        self.group_commit_records = Histogram(GROUP_COMMIT_RECORDS_BUCKETS)
        self.commit_duration = Histogram(COMMIT_DURATION_BUCKETS)
        self._released_seq = engine.durable_seq
        # When the group commit now gathering began: its first waiter arrived
        # while the disk was idle, or the previous commit ended (None: nobody waits).
        self._commit_started: float | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(
        self, sync_method: str = "thread", aio_factory: Callable[[], AioSync] = AioSync
    ) -> None:
        """Start committing: `sync_method` "thread" (a flushing thread writes and
        syncs) or "aio" (the loop thread writes, Linux AIO syncs; see
        `resolve_sync_method`). `aio_factory`: a test seam."""
        self._loop = asyncio.get_running_loop()
        loop = self._loop
        self.sync_method = sync_method
        if sync_method == "aio":
            self._committer = LoopCommitter(
                self.engine, loop, self._release, self._fail, aio_factory
            )
            self._committer.start()
            return
        self._committer = GroupCommitter(
            self.engine,
            on_durable=lambda seq: loop.call_soon_threadsafe(self._release, seq),
            on_failure=lambda exc: loop.call_soon_threadsafe(self._fail, exc),
        )
        self._committer.start()

    def start_replicated(self, committer: Any) -> None:
        """Cluster mode (issue 19): commit through `committer`, a
        `sepp.cluster.logengine.LogCommitter` (each group commit one fenced append
        to the replicated log; same face as the others, on the loop thread)."""
        self._loop = asyncio.get_running_loop()
        self.sync_method = "replicated"
        committer.bind(self._release, self._fail)
        self._committer = committer
        committer.start()

    def abandon(self, error: BaseException) -> None:
        """Cluster mode, stepping down: nothing more is committed here; every
        waiter gets `error`."""
        self._committer = None
        self._fail(error)

    async def stop(self) -> None:
        """Flush what is buffered, release its waiters and stop the flusher."""
        committer = self._committer
        if committer is None:
            return
        self._committer = None
        if isinstance(committer, GroupCommitter):
            await asyncio.to_thread(committer.stop)
        else:
            await committer.stop()
        if self.failure is None:
            self._release(self.engine.durable_seq)

    def add_durable_callback(self, callback: Callable[[int], None]) -> None:
        """Called on the loop thread with each new durable sequence number, after
        the waiters up to it were released."""
        self._durable_callbacks.append(callback)

    # -- the clock -------------------------------------------------------------

    def now_ms(self) -> int:
        now = self._clock()
        if now < self._last_now:
            now = self._last_now  # never backwards, even if the wall clock is
        self._last_now = now
        return now

    # -- commands --------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        """False once `stop` (or `abandon`) began: a command executed now would
        never be committed. (A storage failure is `execute`'s StorageFailed.)"""
        return self._committer is not None

    def execute(
        self, command: Command, admitted: bool = False
    ) -> tuple[Decision | CommandError, int]:
        """Run `command` now (on the loop thread); returns the decision and the
        barrier to wait for. Raises Overloaded (unless `admitted`: the continuation
        of a request already taken) or StorageFailed."""
        if self.failure is not None:
            raise StorageFailed(f"storage has failed: {self.failure}")
        if not admitted and len(self._waiters) >= self.backlog_max:
            raise Overloaded(
                f"{len(self._waiters)} commands are waiting for the disk; retry shortly"
            )
        return self.engine.execute(command, self.now_ms())

    def after_durable(self, barrier: int, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(None, *args)` once `barrier` is durable (at once if it
        already is), or `callback(error, *args)` if storage fails first. Callbacks
        run on the loop thread, in barrier order."""
        if barrier <= self.engine.durable_seq:
            callback(None, *args)
            return
        self._waiters.append((barrier, callback, args))
        if self._commit_started is None:
            self._commit_started = time.perf_counter()
        # Wake the flusher once per loop turn, after the turn has run every request
        # that arrived with it: waking it per command made it write a record or two
        # at a time (1.5 records per write in buffer mode, where no fsync holds it
        # back), each write a syscall and a thread switch on the server's core. A
        # long turn (a burst of pipelined requests) wakes it every WAKE_EVERY
        # commands, so the disk keeps working while the turn goes on.
        committer = self._committer
        if committer is None:
            return
        self._unwoken += 1
        if self._unwoken >= WAKE_EVERY:
            self._unwoken = 0
            committer.wake()
        if not self._wake_scheduled:
            self._wake_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._wake_committer)

    def _wake_committer(self) -> None:
        self._wake_scheduled = False
        self._unwoken = 0
        committer = self._committer
        if committer is not None:
            committer.wake()

    def durable(self, barrier: int) -> asyncio.Future[None] | None:
        """None if `barrier` is already durable, else a future resolved when it is."""
        if barrier <= self.engine.durable_seq:
            return None
        loop = self._loop
        assert loop is not None, "pipeline not started"
        future: asyncio.Future[None] = loop.create_future()

        def resolve(error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        self.after_durable(barrier, resolve)
        return future

    async def submit(self, command: Command) -> Decision | CommandError:
        """Execute `command` and wait until its reply may be released."""
        decision, barrier = self.execute(command)
        future = self.durable(barrier)
        if future is not None:
            await future
        return decision

    # -- completions (loop thread) -------------------------------------------------

    def _release(self, seq: int) -> None:
        records = seq - self._released_seq
        started = self._commit_started
        if records > 0:
            self._released_seq = seq
            self.group_commit_records.observe(records)
            if started is not None:
                now = time.perf_counter()
                self.commit_duration.observe(now - started)
                # Whoever still waits joined while this commit was on its way:
                # their commit starts now.
                started = now
        waiters = self._waiters
        cork = self.release_cork
        cork.begin()
        try:
            while waiters and waiters[0][0] <= seq:
                _, callback, args = waiters.popleft()
                callback(None, *args)
            self._commit_started = started if waiters else None
            for durable_callback in self._durable_callbacks:
                durable_callback(seq)
        finally:
            cork.end()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        error = exc if isinstance(exc, StorageFailed) else StorageFailed(str(exc))
        cork = self.release_cork
        cork.begin()
        try:
            while self._waiters:
                _, callback, args = self._waiters.popleft()
                callback(error, *args)
        finally:
            cork.end()
        if self._on_failure is not None:
            self._on_failure(exc)

    @property
    def backlog(self) -> int:
        return len(self._waiters)


def resolve_sync_method(setting: str, persist_mode: str, real_fs: bool) -> str:
    """What `storage.sync_method` means here: "aio" or "thread".

    auto: aio for the sync persist modes on the real file system where Linux AIO
    works, else thread. aio where it cannot run is a configuration error, never a
    silent fallback."""
    if setting not in SYNC_METHODS:
        raise ConfigError("storage.sync_method", f"must be one of {', '.join(SYNC_METHODS)}")
    if setting == "thread":
        return setting
    why = None
    if persist_mode == PERSIST_BUFFER:
        why = "persist_mode = buffer syncs on a timer, not per commit"
    elif not real_fs:
        why = "it needs the real file system"
    else:
        why = aio_unavailable()
    if why is None:
        return "aio"
    if setting == "aio":
        raise ConfigError("storage.sync_method", f"aio cannot be used: {why} (set auto or thread)")
    return "thread"


class LoopCommitter:
    """Group commit without a flushing thread: the loop thread writes each batch
    itself and queues its sync through Linux AIO; the sync's completion (an
    eventfd the loop watches) releases the batch's waiters and writes the next
    batch, if one gathered meanwhile. One sync in flight at a time, so a batch is
    everything that arrived while the previous one was syncing. A batch of at
    least `WRITE_OFF_LOOP_BYTES_MIN` is written by a thread of its own instead (a
    large write would stall every connection), and its sync queued from the loop
    when the write returns: still one write or sync in flight at a time.

    Same face as `GroupCommitter` (start / wake / stop, the callbacks run on the
    loop thread), for the sync persist modes on the real file system."""

    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        on_durable: Callable[[int], None],
        on_failure: Callable[[BaseException], None],
        aio_factory: Callable[[], AioSync] = AioSync,
    ) -> None:
        self.engine = engine
        self._loop = loop
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._aio_factory = aio_factory
        self._datasync = engine.options.persist_mode == PERSIST_SYNC_DATA
        self._aio: AioSync | None = None
        self._syncing = False  # a sync is in flight
        self._failed = False
        self._stopping = False
        self._idle: asyncio.Future[None] | None = None  # stop() waits on it
        self._writer: ThreadPoolExecutor | None = None  # for large batches

    def start(self) -> None:
        self._aio = self._aio_factory()
        self._loop.add_reader(self._aio.eventfd, self._completed)

    def wake(self) -> None:
        """Write what is buffered and queue its sync, unless a sync is in flight
        (its completion comes back here) or there is nothing to write."""
        if self._syncing or self._failed or not self.engine.has_pending():
            return
        aio = self._aio
        if aio is None or self._stopping:  # stop() flushes what is left
            return
        engine = self.engine
        if engine.pending_bytes() >= WRITE_OFF_LOOP_BYTES_MIN:
            writer = self._writer
            if writer is None:
                writer = self._writer = ThreadPoolExecutor(1, thread_name_prefix="sepp-write")
            self._syncing = True  # the write, then its sync: nothing else meanwhile
            writer.submit(self._write_off_loop)
            return
        try:
            written = engine.write_unsynced()
        except BaseException as exc:
            self._written(None, exc)
            return
        self._written(written, None)

    def _write_off_loop(self) -> None:
        """On the writer thread: write the batch, then hand it to the loop."""
        try:
            written = self.engine.write_unsynced()
        except BaseException as exc:
            self._loop.call_soon_threadsafe(self._written, None, exc)
            return
        self._loop.call_soon_threadsafe(self._written, written, None)

    def _written(self, written: tuple[int, int] | None, error: BaseException | None) -> None:
        """On the loop thread: queue the sync of the batch just written (or fail)."""
        engine = self.engine
        aio = self._aio
        try:
            if error is not None:
                raise error
            if written is None:  # nothing was buffered after all
                self._syncing = False
                self._release_idle()
                self.wake()
                return
            last_seq, fd = written
            if aio is None:  # pragma: no cover - stop() waits for the write first
                raise engine.sync_failed(RuntimeError("AIO closed with a write in flight"))
            try:
                aio.submit(fd, self._datasync, last_seq)
            except OSError as exc:
                raise engine.sync_failed(exc) from exc
        except StorageFailed as exc:
            self._syncing = False
            self._release_idle()
            self._fail(exc)
            return
        except Exception as exc:  # a bug: report it, never leave the waiters hanging
            self._syncing = False
            self._release_idle()
            engine.sync_failed(exc)
            self._fail(exc)
            return
        self._syncing = True

    def _completed(self) -> None:
        aio = self._aio
        if aio is None:
            return
        try:
            done = aio.reap()
        except OSError as exc:
            self._fail(self.engine.sync_failed(exc))
            return
        for last_seq, result in done:
            self._finish(last_seq, result)
        self.wake()

    def _release_idle(self) -> None:
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def _finish(self, last_seq: int, result: int) -> None:
        self._syncing = False
        self._release_idle()
        if self._failed:
            return
        if result < 0:
            self._fail(self.engine.sync_failed(OSError(-result, os.strerror(-result))))
            return
        self.engine.synced(last_seq)
        self._on_durable(last_seq)

    def _fail(self, exc: BaseException) -> None:
        if not self._failed:
            self._failed = True
            self._on_failure(exc)

    async def stop(self) -> None:
        """Let the sync in flight finish, write and sync what is still buffered,
        and let go of AIO. On the loop thread."""
        aio = self._aio
        if aio is None:
            return
        self._stopping = True
        while self._syncing and not self._failed:
            self._idle = self._loop.create_future()
            await self._idle
        self._loop.remove_reader(aio.eventfd)
        self._aio = None
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=False)  # idle: its last write was synced above
        for last_seq, result in await asyncio.to_thread(aio.close):
            self._finish(last_seq, result)
        if self._failed or not self.engine.has_pending():
            return
        try:
            seq = await asyncio.to_thread(self.engine.flush)
        except StorageFailed as exc:
            self._fail(exc)
            return
        self._on_durable(seq)
