"""A cluster node: follower, candidate or leader over a replicated log and a
lease (cluster mode, issue 19).

Owns: `ClusterNode` (the role loop), the roles, `Serving` (what the node tells
whoever answers clients: lead with this engine, step down) and `LocalServing`
(a minimal one with `submit`, for tests and tools).

The roles:
- **follower**: applies the log as it grows (`LogApplier`, the replay path) and
  reads the lease 4 times per `renew_ms` to know the leader; when the lease has lapsed
  it becomes a candidate.
- **candidate**: catches up to the log's tail, acquires the lease for epoch =
  the last logged epoch + 1, appends a `ChangeLeader` record fenced on the
  tail it applied (`append_if`), and only then serves. A lease taken by another
  node, or a refused append, sends it back to follower (after rebuilding its
  state: the refused record was applied in memory).
- **leader**: serves; renews the lease every `renew_ms`; steps down when a
  renewal fails or the committer fails (a refused append, an outcome that
  stayed unknown). Stepping down: stop answering (`Serving.step_down` answers
  what is in flight), rebuild the state from the log as a follower (the
  leader's memory may hold effects the log never got).

Safety never rests on the lease: every append expects the last sequence the
node applied, so a deposed leader's append is refused. A log the node cannot
apply (`LogMismatch`) stops it for good (`failure`, role "stopped").

Time: the lease's clock is the lease's own (`MemoryLease` takes one; JetStream
keeps its TTL); `sleep` is injected so tests drive a manual clock. Decided times
come from `clock_ms`, clamped by decide to never go below the last logged time.

Must not import: sepp.server, sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sepp.cluster.logengine import (
    APPENDS_IN_FLIGHT,
    LogApplier,
    LogCommitter,
    LogMismatch,
    NotLeader,
    catch_up,
    new_cluster_engine,
)
from sepp.cluster.metrics import NodeMetrics
from sepp.cluster.replog import (
    BlobStore,
    HeldLease,
    Lease,
    LeaseRecord,
    Purged,
    ReplicatedLog,
    ReplicatedLogError,
)
from sepp.cluster.snapshots import (
    SnapshotBlobError,
    encode_snapshot_blob,
    load_newest_snapshot,
    publish_snapshot,
)
from sepp.core.commands import ChangeLeader, Command
from sepp.core.config import CoreConfig
from sepp.core.decide import Decision
from sepp.core.results import CommandError
from sepp.storage import Engine, StorageFailed

log = logging.getLogger("sepp.cluster")

ROLE_FOLLOWER = "follower"
ROLE_CANDIDATE = "candidate"
ROLE_LEADER = "leader"
ROLE_STOPPED = "stopped"

# The lease (issue 19): lapses this long after its last renewal; renewed (and, by
# followers, read) this often.
LEASE_TTL_MS = 3_000
LEASE_RENEW_MS = 1_000
# A stopping leader waits this long for its lease's release (a planned handover
# is then taken at once); a lease out of reach is left to lapse.
STOP_RELEASE_WAIT_MS = 2_000
# A follower reads the lease this many times per renewal period: a released lease
# (a planned handover) is taken within a fraction of it.
FOLLOWER_READS_PER_RENEWAL = 4


class Serving(Protocol):
    def lead(self, node: ClusterNode, engine: Engine, committer: LogCommitter) -> None:
        """Start answering clients with `engine`: bind the committer's callbacks
        (`committer.bind`) and start it."""

    def step_down(self, node: ClusterNode, error: BaseException) -> None:
        """Stop answering: everything waiting for durability gets `error` (a
        `NotLeader`); nothing of `engine` is read any more."""


class ClusterNode:
    def __init__(
        self,
        *,
        node_id: str,
        address: str,
        log_: ReplicatedLog,
        lease: Lease,
        config: CoreConfig,
        clock_ms: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        renew_ms: int = LEASE_RENEW_MS,
        lease_ttl_ms: int = LEASE_TTL_MS,
        serving: Serving | None = None,
        on_role: Callable[[ClusterNode], None] | None = None,
        blobs: BlobStore | None = None,
        snapshot_every: int = 0,
        appends_in_flight: int = APPENDS_IN_FLIGHT,
    ) -> None:
        self.node_id = node_id
        self.address = address
        self.log = log_
        self.lease = lease
        self.config = config
        self.clock_ms = clock_ms
        self._sleep = sleep
        self.renew_ms = renew_ms
        self.lease_ttl_ms = lease_ttl_ms
        self._renewed_at_ms = 0
        # Snapshots (issue 19 item 4): a follower stores one in `blobs` every
        # `snapshot_every` log messages (0: never); every node boots from the newest.
        self.blobs = blobs
        self.snapshot_every = snapshot_every
        self.snapshot_seq = 0  # the log message the newest snapshot known covers
        # The leader's appends outstanding at once (LogCommitter).
        self.appends_in_flight = appends_in_flight
        self.serving: Serving = serving or LocalServing()
        self._on_role = on_role
        self.role = ROLE_FOLLOWER
        # The epoch of the last batch applied or appended, and the leader's address
        # as the lease says (None while no leader is known; self.address when leading).
        self.epoch = 0
        self.leader: str | None = None
        self.failure: BaseException | None = None
        self.engine, self.applier = self._fresh()
        self.committer: LogCommitter | None = None
        self._held: HeldLease | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._release: asyncio.Future[None] | None = None
        self.step_downs = 0
        # /metrics: leader changes, the follower's apply lag, the append latency.
        self.metrics = NodeMetrics()

    # -- lifecycle -----------------------------------------------------------------

    def _fresh(self) -> tuple[Engine, LogApplier]:
        engine = new_cluster_engine(self.config)
        return engine, LogApplier(engine)

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"sepp-node-{self.node_id}"
        )
        return self._task

    async def stop(self) -> None:
        """A planned stop: step down (releasing the lease, so another node takes
        over at once) and end the loop. Nothing here waits on the backend for
        long: a stopping leader is not rebuilt as a follower (that reads the
        snapshot store and the log, and a JetStream out of reach held SIGTERM
        up for good), and the lease's release is waited for at most
        STOP_RELEASE_WAIT_MS (then it is left to lapse, as after a crash)."""
        self._stopping = True
        if self.role == ROLE_LEADER:
            await self._step_down(
                NotLeader("the leader is stopping", outcome_unknown=True), rebuild=False
            )
        await self._cancel_task()
        release = self._release
        if release is not None and not release.done():
            pause = asyncio.ensure_future(self._sleep(STOP_RELEASE_WAIT_MS / 1000))
            try:
                await asyncio.wait([release, pause], return_when=asyncio.FIRST_COMPLETED)
            finally:
                pause.cancel()
                release.cancel()
        self.role = ROLE_STOPPED

    async def kill(self) -> None:
        """Vanish (tests: as a crash would): tasks cancelled, the lease left to lapse."""
        self._stopping = True
        if self.committer is not None:
            self.committer.cancel()
        await self._cancel_task()
        self.role = ROLE_STOPPED

    async def _cancel_task(self) -> None:
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _set_role(self, role: str) -> None:
        if role != self.role:
            log.info("node %s: %s -> %s (epoch %d)", self.node_id, self.role, role, self.epoch)
        self.role = role
        if self._on_role is not None:
            self._on_role(self)

    def _advance_epoch(self, epoch: int) -> None:
        """This node learned of (or took) `epoch`: a leader change when it is
        past an epoch it knew (metrics)."""
        if epoch > self.epoch:
            if self.epoch > 0:
                self.metrics.leader_changes += 1
            self.epoch = epoch

    @property
    def appends_in_flight_now(self) -> int:
        """The leader's appends sent and not yet settled (0 unless leading)."""
        committer = self.committer
        return committer.outstanding if committer is not None else 0

    @property
    def log_seq(self) -> int:
        """The last log message this node applied or appended."""
        if self.role == ROLE_LEADER and self.committer is not None:
            return self.committer.log_seq
        return self.applier.log_seq

    async def run(self) -> None:
        try:
            booted = False
            while not self._stopping:
                try:
                    if not booted:
                        await self._boot()
                        booted = True
                    elif self.role == ROLE_FOLLOWER:
                        await self._follow()
                    elif self.role == ROLE_CANDIDATE:
                        await self._campaign()
                    elif self.role == ROLE_LEADER:
                        await self._lead()
                    else:
                        return
                except LogMismatch:
                    raise
                except ReplicatedLogError as exc:
                    # The backend out of reach while booting (a snapshot read),
                    # campaigning (the tail, the lease) or after a step-down: try
                    # again after a follower's poll. (It ended the loop silently:
                    # a node that never followed nor led again.)
                    log.warning("node %s (%s): %s; trying again", self.node_id, self.role, exc)
                    await self._sleep(self.renew_ms / FOLLOWER_READS_PER_RENEWAL / 1000)
        except LogMismatch as exc:
            self.failure = exc
            log.critical("node %s stops: %s", self.node_id, exc)
            if self.committer is not None:
                self.committer.cancel()
            self._set_role(ROLE_STOPPED)

    async def _pause(self, *tasks: asyncio.Task[Any]) -> None:
        """Sleep a follower's poll (a fraction of `renew_ms`), or less if one of
        `tasks` ends first (its exception is raised)."""
        poll_s = self.renew_ms / FOLLOWER_READS_PER_RENEWAL / 1000
        sleeper = asyncio.ensure_future(self._sleep(poll_s))
        try:
            await asyncio.wait([sleeper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
        for task in tasks:
            if task.done() and not task.cancelled():
                exc = task.exception()
                if exc is not None:
                    raise exc

    # -- follower -----------------------------------------------------------------

    async def _tail(self) -> None:
        applier = self.applier
        lag = self.metrics.apply_lag
        replication_lag = self.metrics.replication_lag
        async for entry in self.log.read_from(applier.log_seq + 1):
            skipped = applier.skipped
            applier.apply(entry)
            if applier.skipped == skipped:
                # Per message (a group commit), never per job: the decided time
                # is the leader's clock, the stored time the log's, the apply
                # time this node's.
                now_ms = self.clock_ms()
                lag.observe(max(0, now_ms - applier.tip.time_ms) / 1000)
                if entry.stored_ms:
                    replication_lag.observe(max(0, now_ms - entry.stored_ms) / 1000)
            self._advance_epoch(applier.tip.epoch)
            if self.snapshot_every and applier.log_seq - self.snapshot_seq >= self.snapshot_every:
                await self._snapshot()

    async def _snapshot(self) -> None:
        """Store the followed state in the blob store (the loop waits while it
        is encoded: a follower answers no commands)."""
        blobs, applier = self.blobs, self.applier
        if blobs is None:
            return
        log_seq = applier.log_seq
        blob = encode_snapshot_blob(
            self.engine.state, self.engine.appended_seq, log_seq, applier.tip
        )
        try:
            kept = await publish_snapshot(blobs, self.log, blob, log_seq)
        except ReplicatedLogError as exc:
            log.error("node %s: snapshot at log message %d failed: %s", self.node_id, log_seq, exc)
            return
        self.snapshot_seq = log_seq
        log.info("node %s: snapshot at log message %d (kept %s)", self.node_id, log_seq, kept)

    async def _boot(self) -> None:
        """A state rebuilt from the newest snapshot (if any) and, by the tail,
        the log after it."""
        self.engine, self.applier = self._fresh()
        if self.blobs is None:
            return
        try:
            loaded = await load_newest_snapshot(self.blobs, self.config)
        except SnapshotBlobError as exc:
            if await self.log.first() > 1:
                raise LogMismatch(0, f"no usable snapshot and the log is purged: {exc}") from exc
            log.error("node %s: %s; replaying the whole log", self.node_id, exc)
            loaded = None
        if loaded is None:
            return
        self.engine = new_cluster_engine(self.config, loaded.state, loaded.record_seq)
        self.applier = LogApplier(self.engine, tip=loaded.tip, log_seq=loaded.log_seq)
        self.snapshot_seq = loaded.log_seq
        self._advance_epoch(loaded.tip.epoch)
        log.info(
            "node %s: booted from the snapshot at log message %d (record %d)",
            self.node_id,
            loaded.log_seq,
            loaded.record_seq,
        )

    async def _follow(self) -> None:
        try:
            await self._following()
        except Purged as exc:
            # Left behind a purge: start again from the newest snapshot.
            log.warning("node %s: %s; booting from the newest snapshot", self.node_id, exc)
            await self._boot()

    async def _following(self) -> None:
        tail = asyncio.get_running_loop().create_task(self._tail())
        try:
            while self.role == ROLE_FOLLOWER and not self._stopping:
                try:
                    held = await self.lease.current()
                except ReplicatedLogError as exc:
                    log.warning("node %s: reading the lease failed: %s", self.node_id, exc)
                    held = self._held_unknown()
                if held is None:
                    self.leader = None
                    self._set_role(ROLE_CANDIDATE)
                    return
                if held is not _UNKNOWN:
                    record = held.record
                    self.leader = record.address if record.node_id != self.node_id else None
                await self._pause(tail)
        finally:
            await _cancel_until_done(tail, self._sleep)

    def _held_unknown(self) -> Any:
        return _UNKNOWN

    # -- candidate ----------------------------------------------------------------

    async def _campaign(self) -> None:
        applier = self.applier
        try:
            await catch_up(applier, self.log)
        except Purged:
            await self._boot()
            self._set_role(ROLE_FOLLOWER)
            return
        epoch = max(self.epoch, applier.tip.epoch) + 1
        try:
            acquired_at_ms = self.clock_ms()
            held = await self.lease.acquire(LeaseRecord(self.node_id, self.address, epoch))
        except ReplicatedLogError as exc:
            log.warning("node %s: acquiring the lease failed: %s", self.node_id, exc)
            held = None
        if held is None:
            self._set_role(ROLE_FOLLOWER)
            return
        committer = LogCommitter(
            self.engine,
            self.log,
            epoch=epoch,
            tip=applier.tip,
            log_seq=applier.log_seq,
            on_durable=lambda seq: None,
            on_failure=lambda exc: None,
            in_flight=self.appends_in_flight,
            append_duration=self.metrics.append_duration,
        )
        decision, _ = self.engine.execute(
            ChangeLeader(epoch=epoch, node_id=self.node_id, address=self.address),
            self.clock_ms(),
        )
        if not isinstance(decision, Decision):  # pragma: no cover - a bad node id
            raise LogMismatch(applier.log_seq, f"the leader-change record was refused: {decision}")
        try:
            await committer.commit_once()
        except NotLeader as exc:
            log.info("node %s: lost the race to lead epoch %d: %s", self.node_id, epoch, exc)
            with contextlib.suppress(ReplicatedLogError):
                await self.lease.release(held)
            await self._boot()
            self._set_role(ROLE_FOLLOWER)
            return
        self._held = held
        self._renewed_at_ms = acquired_at_ms
        self.committer = committer
        self._advance_epoch(epoch)
        self.leader = self.address
        self._set_role(ROLE_LEADER)
        self.serving.lead(self, self.engine, committer)

    # -- leader -------------------------------------------------------------------

    async def _lead(self) -> None:
        committer = self.committer
        assert committer is not None and committer.task is not None
        while self.role == ROLE_LEADER and not self._stopping:
            if not committer.task.done():
                await self._pause_leading(committer.task)
            if committer.task.done():
                failure = committer.failure or NotLeader(
                    "the committer stopped", outcome_unknown=True
                )
                await self._step_down(failure)
                return
            held = self._held
            assert held is not None
            # A renewal that hangs must not hide a failed committer.
            renewal = asyncio.ensure_future(self.lease.renew(held))
            await asyncio.wait([renewal, committer.task], return_when=asyncio.FIRST_COMPLETED)
            if not renewal.done():
                renewal.cancel()
                continue  # the committer ended: stepped down at the top of the loop
            try:
                renewed = renewal.result()
            except ReplicatedLogError as exc:
                # The backend is unreachable for now (not: the lease is another's).
                # Go on while the lease cannot have lapsed: appends stay fenced
                # whatever happens to it; past the TTL another node may lead.
                if self.clock_ms() - self._renewed_at_ms < self.lease_ttl_ms:
                    log.warning("node %s: renewing the lease failed: %s", self.node_id, exc)
                    continue
                renewed = None
            if renewed is None:
                await self._step_down(
                    NotLeader("the leader's lease could not be renewed", outcome_unknown=True)
                )
                return
            self._held = renewed
            self._renewed_at_ms = self.clock_ms()

    async def _pause_leading(self, committer_task: asyncio.Task[None]) -> None:
        sleeper = asyncio.ensure_future(self._sleep(self.renew_ms / 1000))
        try:
            await asyncio.wait([sleeper, committer_task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()

    async def _step_down(self, error: BaseException, *, rebuild: bool = True) -> None:
        """Stop serving, answer what waits, give up the lease, rebuild as a
        follower (not when the node is stopping: `rebuild` False)."""
        self.step_downs += 1
        log.warning("node %s steps down from epoch %d: %s", self.node_id, self.epoch, error)
        committer, self.committer = self.committer, None
        if committer is not None:
            committer.cancel()
        self.leader = None
        self._set_role(ROLE_FOLLOWER)
        self.serving.step_down(self, error)
        held, self._held = self._held, None
        if held is not None:
            # In the background: a lease out of reach must not hold up the step-down.
            self._release = asyncio.ensure_future(self._release_quietly(held))
        if rebuild:
            await self._boot()

    async def _release_quietly(self, held: HeldLease) -> None:
        with contextlib.suppress(ReplicatedLogError):
            await self.lease.release(held)


_UNKNOWN: Any = object()
# How often a task that ignored its cancellation is cancelled again.
RECANCEL_INTERVAL_S = 0.05


async def _cancel_until_done(
    task: asyncio.Task[Any], sleep: Callable[[float], Awaitable[None]]
) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again while it
    runs on: on Python 3.11 `asyncio.wait_for` (nats-py's `next_msg`) can lose a
    cancellation that lands as its inner wait completes, and a tail that lost
    it kept applying the log while the node waited for it forever (a candidate
    that never campaigned; found by tools/failover.py)."""
    while not task.done():
        task.cancel()
        pause = asyncio.ensure_future(sleep(RECANCEL_INTERVAL_S))
        try:
            await asyncio.wait([task, pause], return_when=asyncio.FIRST_COMPLETED)
        finally:
            pause.cancel()
    if not task.cancelled():
        exc = task.exception()
        if exc is not None:
            raise exc


class LocalServing:
    """Serving without a server: `submit` runs a command on the leader and waits
    for its append (tests, tools)."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.committer: LogCommitter | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def lead(self, node: ClusterNode, engine: Engine, committer: LogCommitter) -> None:
        self.engine = engine
        self.committer = committer
        committer.bind(self._durable, self._failed)
        committer.start()

    def step_down(self, node: ClusterNode, error: BaseException) -> None:
        self.engine = None
        self.committer = None
        self._failed(error)

    def _durable(self, seq: int) -> None:
        keep = []
        for barrier, future in self._waiters:
            if barrier <= seq:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((barrier, future))
        self._waiters = keep

    def _failed(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)

    async def submit(self, command: Command, now_ms: int) -> Decision | CommandError:
        engine, committer = self.engine, self.committer
        if engine is None or committer is None:
            raise NotLeader("this node is not the leader", outcome_unknown=False)
        try:
            decision, barrier = engine.execute(command, now_ms)
        except StorageFailed as exc:
            raise NotLeader(f"this node stopped leading: {exc}", outcome_unknown=False) from exc
        if barrier > engine.durable_seq:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((barrier, future))
            committer.wake()
            await future
        return decision
