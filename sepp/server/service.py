"""The service layer: every operation the server offers, transport-neutral.

Every front end (the native TCP protocol in server.py today; the admin HTTP API
and the gRPC front later) decodes its wire into calls of `SeppService` and renders
what they return. The service knows nothing of frames, sockets, status codes or
message encodings.

Owns:
- auth decisions: `authenticate(api_key)` (one of the AUTH_* outcomes, a decision table;
  keys compared in constant time);
- commands through the commit pipeline: `run(command)` (decide, apply, log, then
  the side effects: wake parked reserves, re-arm the sweep timer, start a due
  snapshot), the operations built on it (`enqueue`, `reserve`, `ack`, `nack`,
  `extend`, `release`, `settle`, `drain_dead_letters`) and `after_durable` /
  `durable` to answer only once a result's barrier is on disk; a large best-effort
  enqueue stored in parts (`enqueue_parts` / `enqueue_in_parts`, or
  `enqueue_durable` for fronts that await; sepp/server/parts.py);
- reads of the state: `health()`, `server_info()`, `queue_stats()`, answered
  after `read_barrier()` so a read never shows what is not yet durable;
- long polls: a reserve that finds nothing is parked with a `ReserveSink` (never a
  connection), woken by the command that made jobs ready (one waiter at a time per
  queue while jobs remain), answered empty on its deadline, at shutdown, on
  `withdraw`, or dropped by `abandon` when its front has nobody to answer;
  `reserve_wait` is the awaiting form (a `FutureSink`) for fronts that await;
- the sweep timer (a logged Sweep command at the next deadline, at most
  sweep_interval_ms apart) and the release of jobs whose answer was not written.

Promises (issue 12, kept here so every front has them):
- A sink that is no longer alive is never given jobs: it is answered empty.
- Jobs whose reserve answer the sink could not write are released at once (Ready
  again, the attempt not counted), fenced like any release; while the commit
  backlog is full the release is retried for about a second.
- A long poll that is withdrawn, abandoned or ends on its deadline costs no job
  an attempt: it leased nothing.
- Results are core result objects (`Decision`, `CommandError`, `JobView`,
  `QueueStats`, `Health`); refusals before the core are typed exceptions
  (`ShuttingDown`, `InvalidRequest`, `Overloaded`, `StorageFailed`) that each front
  maps to its own codes.

Must not import: any front end (sepp.server.server, a native/admin/grpc module),
the wire translation (sepp.server.wire), the protocol package, a wire or transport
library (socket, ssl, msgpack, aiohttp, grpc). Not in COMPILED_MODULES.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from sepp._version import __version__ as SEPP_VERSION
from sepp.core import reads
from sepp.core.commands import (
    Ack,
    AdminDeadLetterJobs,
    AdminRequeueDeadLetters,
    CancelJobs,
    Command,
    DeleteDeadLetters,
    DeleteQueue,
    DeleteSchedule,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Nack,
    NewJob,
    PauseQueue,
    PauseSchedule,
    PurgeQueue,
    PutQueue,
    PutSchedule,
    Release,
    Reserve,
    ResumeQueue,
    ResumeSchedule,
    Sweep,
)
from sepp.core.config import (
    ANSWER_ENVELOPE_BYTES_MAX,
    CUSTOM_ENTRY_FIXED_BYTES,
    JOB_ANSWER_FIXED_BYTES,
    ConfigError,
    validate_config,
)
from sepp.core.decide import Decision
from sepp.core.events import CAUSE_NAMES
from sepp.core.reads import JobInfo, JobPage, QueueInfo
from sepp.core.results import (
    CommandError,
    InvalidArgument,
    JobView,
    PermissionDenied,
    QueueNotFound,
    ReserveResult,
)
from sepp.core.schedules import CATCH_UP_DEFAULT
from sepp.core.state import rate_limited_until
from sepp.server.admission import WaitList
from sepp.server.config import ADMIN_ROLES, AdminKey, ServerConfig
from sepp.server.ids import JobIds
from sepp.server.metrics import ServerMetrics
from sepp.server.parts import EnqueueInParts, PartsDone, split_enqueue
from sepp.server.pipeline import CommitPipeline, Overloaded, wall_clock_ms
from sepp.server.timezones import UnknownTimeZone, zone_table
from sepp.storage import Engine, StorageFailed
from sepp.storage.engine import LogPin
from sepp.storage.fs import RealFileSystem

__all__ = [
    "AUTH_ACCEPTED",
    "AUTH_MISSING_KEY",
    "AUTH_OPEN",
    "AUTH_UNKNOWN_KEY",
    "LOCAL_ADMIN",
    "ROLE_REQUIRED",
    "CommandRefused",
    "FutureSink",
    "Health",
    "InvalidRequest",
    "LogPin",
    "Overloaded",
    "ParkedReserve",
    "Principal",
    "QueueStats",
    "ReserveSink",
    "SeppService",
    "ServiceError",
    "ShuttingDown",
    "StorageFailed",
]

log = logging.getLogger("sepp.server")
# Builds a NamedTuple from a tuple of its fields, without its Python-level __new__.
_new_tuple = tuple.__new__

# Releasing the jobs of an unwritable reserve answer while the commit backlog is
# full: try again every RELEASE_RETRY_S, at most RELEASE_TRIES_MAX times (~1 s),
# then leave them to their leases.
RELEASE_RETRY_S = 0.01
RELEASE_TRIES_MAX = 100

# Auth outcomes (`SeppService.authenticate`): the first two let the peer in.
AUTH_OPEN = "open"  # no keys configured: every peer is let in
AUTH_ACCEPTED = "accepted"  # the key is one of the configured keys
AUTH_MISSING_KEY = "missing_key"  # keys are configured and the peer sent none
AUTH_UNKNOWN_KEY = "unknown_key"  # keys are configured and this is not one of them
AUTH_LET_IN = frozenset({AUTH_OPEN, AUTH_ACCEPTED})

# Why the server is not serving (`Health.reason`).
NOT_SERVING_STORAGE_FAILED = "storage_failed"
NOT_SERVING_SHUTTING_DOWN = "shutting_down"


# -- admin principals and the role table ----------------------------------------------------


class Principal(NamedTuple):
    """Who asks for an admin operation: the front's auth decision. `actor` is
    recorded in the audit trail; `role` is one of ROLES."""

    actor: str
    role: str


# The roles, weakest first: each may do everything the ones before it may (the
# roles an [admin] keys entry may have).
ROLES = ADMIN_ROLES
_ROLE_RANK = {role: rank for rank, role in enumerate(ROLES)}

# The role check table: the weakest role each admin operation needs (one test
# per row, tests/server/test_service_admin.py). Viewers read; operators fix jobs,
# dead letters and the flow of a queue; only admins define or delete queues. The
# core refuses a viewer's change too (PermissionDenied): this table is checked
# first, by the service, for every front.
ROLE_REQUIRED: dict[str, str] = {
    "get_job": "viewer",
    "list_jobs": "viewer",
    "list_dead_letters": "viewer",
    "list_queues": "viewer",
    "queue_info": "viewer",
    "dead_letter_jobs": "operator",
    "cancel_jobs": "operator",
    "requeue_dead_letters": "operator",
    "delete_dead_letters": "operator",
    "pause_queue": "operator",
    "resume_queue": "operator",
    "purge_queue": "operator",
    "put_queue": "admin",
    "delete_queue": "admin",
    # Schedules (issue 17): defining or deleting one is an admin's, pausing and
    # resuming an operator's, like queues.
    "list_schedules": "viewer",
    "put_schedule": "admin",
    "pause_schedule": "operator",
    "resume_schedule": "operator",
    "delete_schedule": "admin",
    # Routes of the admin HTTP API that call no service method (sepp/admin/auth.py
    # `require`): the audit trail read from the log, the live event stream, an
    # enqueue through the admin API (operators enqueue; the native enqueue has no
    # roles), the server info.
    "enqueue_jobs": "operator",
    "server_info": "viewer",
    "audit": "admin",
    "events": "viewer",
    # A copy of the whole data directory (sepp/admin/backup.py): every payload.
    "backup": "admin",
}

# Who a front acts as when it has no finer identity: a server without API keys
# (or a loopback admin listener without keys) is open, and its peers act as this.
LOCAL_ADMIN = Principal("local", "admin")


def role_allows(role: str, operation: str) -> bool:
    """True when `role` may perform `operation` (a ROLE_REQUIRED key); an unknown
    role may do nothing."""
    rank = _ROLE_RANK.get(role)
    return rank is not None and rank >= _ROLE_RANK[ROLE_REQUIRED[operation]]


# -- typed refusals ----------------------------------------------------------------------


class ServiceError(Exception):
    """A request refused by the service before it reached the core."""


class ShuttingDown(ServiceError):
    """The server is shutting down: no new commands are taken."""

    def __init__(self, message: str = "the server is shutting down") -> None:
        super().__init__(message)


class InvalidRequest(ServiceError):
    """The request is malformed in a way only the service can see (a negative
    wait, too many queues asked for)."""


class CommandRefused(ServiceError):
    """The core refused the command (`error`: not found, attempt mismatch, an
    invalid argument...): raised by the awaiting forms only."""

    def __init__(self, error: CommandError) -> None:
        super().__init__(error.message)
        self.error = error


# -- results of reads ----------------------------------------------------------------------


class Health(NamedTuple):
    serving: bool
    # None while serving, else NOT_SERVING_STORAGE_FAILED / NOT_SERVING_SHUTTING_DOWN.
    reason: str | None
    # Damage wholly below the snapshot recovery started from (empty when none).
    damaged_history: list[dict[str, object]]


class QueueStats(NamedTuple):
    name: str
    ready: int
    scheduled: int
    in_flight: int
    dead_lettered: int
    oldest_ready_age_ms: int | None


# -- long polls ------------------------------------------------------------------------------


class ReserveSink(Protocol):
    """Where the answer of one reserve goes: a front end's reply channel.

    The service calls exactly one of `finish` / `refused` / `failed`, once, on the
    loop thread, after the answer's barrier is durable (never for an abandoned
    reserve)."""

    @property
    def peer(self) -> str:
        """Who is asking (for log lines)."""
        ...

    def alive(self) -> bool:
        """False once the answer can no longer reach anyone or nobody waits for
        it (a closed socket, a cancelled call, a half-closed peer)."""
        ...

    def finish(self, jobs: tuple[JobView, ...]) -> bool:
        """Deliver the answer (possibly empty). False if it could not be written
        at all: the service then releases `jobs`."""
        ...

    def refused(self, error: CommandError) -> None:
        """The core refused the reserve (an unknown queue, a bad lease...)."""
        ...

    def failed(self, error: BaseException) -> None:
        """Storage failed before the answer was durable: its outcome is unknown."""
        ...


class FutureSink:
    """A `ReserveSink` that resolves a future: what `reserve_wait` (and any front
    that awaits, like gRPC) uses. Not alive once the future is done or cancelled
    (the caller went away); jobs that arrive after that are released."""

    __slots__ = ("future", "peer")

    def __init__(self, future: asyncio.Future[tuple[JobView, ...]], peer: str) -> None:
        self.future = future
        self.peer = peer

    def alive(self) -> bool:
        return not self.future.done()

    def finish(self, jobs: tuple[JobView, ...]) -> bool:
        if self.future.done():
            return False
        self.future.set_result(jobs)
        return True

    def refused(self, error: CommandError) -> None:
        if not self.future.done():
            self.future.set_exception(CommandRefused(error))

    def failed(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class ParkedReserve:
    """A long-poll reserve waiting for jobs: the handle a front end keeps to
    `withdraw` or `abandon` it."""

    __slots__ = ("command", "done", "queues", "sink", "timer")

    def __init__(self, sink: ReserveSink, command: Reserve) -> None:
        self.sink = sink
        self.command = command
        self.queues = tuple(dict.fromkeys(command.queues))
        self.timer: asyncio.TimerHandle | None = None
        self.done = False


# -- the service -------------------------------------------------------------------------------


class SeppService:
    """Every operation of the server, for every front end. Runs on the event-loop
    thread; `open` attaches the recovered engine and the started pipeline."""

    def __init__(self, config: ServerConfig, *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.core_config = config.core_config()
        self.clock = clock
        self.ids = JobIds()
        # The live path's counters (metrics.py), rendered by the admin front.
        self.metrics = ServerMetrics()
        self.engine: Engine | None = None
        self.pipeline: CommitPipeline | None = None
        self.stopping = False
        self.storage_failure: BaseException | None = None
        # Damage wholly below the snapshot recovery started from (the health detail).
        self.damaged_history: list[dict[str, object]] = []
        # Cluster mode: the node's figures for /metrics, a
        # sepp.cluster.metrics.ClusterMetricsView (set by ClusterMode).
        self.cluster_metrics: Callable[[], Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        keys = config.api_keys
        self._api_keys: list[bytes] | None = (
            None if keys is None else [k.key.encode() for k in keys]
        )
        # The admin API's keys ([admin] keys), read on every admin request
        # (sepp/admin/auth.py): a tuple replaced whole, never changed in place, so a
        # reload swaps it atomically on the loop thread.
        self.admin_keys: tuple[AdminKey, ...] = tuple(config.admin_keys)
        # queue -> parked reserves in arrival order (O(1) removal: issue 13 §5)
        self._parked: dict[str, WaitList[ParkedReserve]] = {}
        self._wake_queued: set[str] = set()
        self._wake_scheduled = False
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._sweep_target: int | None = None
        # The timer that wakes long polls parked on a queue at its rate limit
        # when the queue's window frees (issue 17), and when it fires.
        self._rate_timer: asyncio.TimerHandle | None = None
        self._rate_target: int | None = None
        self.sweep_interval_ms = config.get("storage", "sweep_interval_ms")
        self.max_wait_ms = config.get("limits", "max_wait_timeout_ms")
        self.answer_items_bytes_max = (
            config.get("limits", "max_message_bytes") - ANSWER_ENVELOPE_BYTES_MAX
        )
        # Enqueues being stored in parts (sepp/server/parts.py), and who waits for
        # the last of them to end (shutdown).
        self._parted: set[EnqueueInParts] = set()
        self._parted_idle: asyncio.Event | None = None

    def reconfigure(self, config: ServerConfig) -> None:
        """Hot reload (sepp/server/reload.py): run with `config` from the next
        command on. Called on the loop thread between two commands, so every
        command decides under one config; connections, parked reserves and
        leases are untouched. `config` holds the running values of every
        restart-only setting (reload.plan_reload), so only live ones change."""
        core_config = config.core_config()
        if self.engine is not None:
            # The runtime queue definitions stay on top of the reloaded file: the
            # result must hold too (a runtime default_max_attempts above a
            # reloaded max_attempts_ceiling is refused, naming the queue).
            try:
                validate_config(self.engine.state.merged_config(core_config))
            except ConfigError as exc:
                raise ConfigError(
                    exc.key, f"{exc.problem} (with the queue's runtime definition)"
                ) from None
        previous_schedules = self.config.schedules
        self.config = config
        self.core_config = core_config
        keys = config.api_keys
        self._api_keys = None if keys is None else [k.key.encode() for k in keys]
        self.admin_keys = tuple(config.admin_keys)
        self.max_wait_ms = config.get("limits", "max_wait_timeout_ms")
        if self.engine is not None:
            self.engine.state.reconfigure(core_config)
            if previous_schedules != config.schedules:
                self.sync_config_schedules(previous_schedules)
            # A raised max_in_flight or a looser rate limit may let parked
            # reserves have jobs now, and nothing else would wake them: every
            # queue with a parked reserve is tried once (reloads are rare).
            self._wake(frozenset(self._parked))

    def open(
        self, engine: Engine, pipeline: CommitPipeline, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.engine = engine
        self.pipeline = pipeline
        self._loop = loop
        # Counted from here on: the live path, never recovery's replay.
        engine.observer = self.metrics.observe
        self._schedule_sweep()
        self.sync_config_schedules([])

    # -- [[schedules]] from the configuration (issue 17) ---------------------------------------

    def sync_config_schedules(self, previous: Sequence[dict[str, Any]]) -> None:
        """Put every [[schedules]] table as a schedule (actor `config`: an unchanged
        one logs nothing and keeps its anchor) and delete those `previous` had and
        the file no longer has. A refusal is logged (ERROR, naming the schedule);
        the others still apply."""
        commands: list[Command] = [config_schedule_command(e) for e in self.config.schedules]
        kept = {e["name"] for e in self.config.schedules}
        state = self.engine.state if self.engine is not None else None
        for entry in previous:
            name = entry["name"]
            if name not in kept and state is not None and name in state.schedules:
                commands.append(
                    DeleteSchedule(actor="config", role="admin", reason=CONFIG_REASON, name=name)
                )
        for command in commands:
            try:
                decision, _barrier = self.run(command)
            except (Overloaded, StorageFailed) as exc:
                log.error("schedules from the configuration not applied: %s", exc)
                return
            if isinstance(decision, CommandError):
                log.error(
                    "schedule %r from the configuration refused: %s",
                    getattr(command, "name", "?"),
                    decision.message,
                )

    def stop(self) -> None:
        """Shutdown began: take no new commands, stop the sweep timer, answer
        every parked reserve empty."""
        self.stopping = True
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None
        for waiters in list(self._parked.values()):
            for parked in list(waiters):
                self._finish_parked(parked, ())
        self._parked.clear()

    # -- auth --------------------------------------------------------------------------------

    @property
    def auth_required(self) -> bool:
        return self._api_keys is not None

    def authenticate(self, api_key: str | None) -> str:
        """One of the AUTH_* outcomes; the peer is let in iff it is in AUTH_LET_IN."""
        keys = self._api_keys
        if keys is None:
            return AUTH_OPEN
        if api_key is None:
            return AUTH_MISSING_KEY
        candidate = api_key.encode()
        # Compare against every key in constant time, so timing tells nothing about
        # which key (or how much of one) matched.
        matched = False
        for known in keys:
            matched |= hmac.compare_digest(candidate, known)
        return AUTH_ACCEPTED if matched else AUTH_UNKNOWN_KEY

    def check_api_key(self, api_key: str | None) -> bool:
        return self.authenticate(api_key) in AUTH_LET_IN

    # -- commands ------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.clock()

    def run(self, command: Command, admitted: bool = False) -> tuple[Decision | CommandError, int]:
        """Execute a command on the loop thread; side effects (wakes, sweep timer,
        snapshots) included. Returns the decision and the barrier its answer waits
        for. Raises Overloaded (never when `admitted`: the later parts of a request
        already taken) / StorageFailed."""
        pipeline = self.pipeline
        assert pipeline is not None
        decision, barrier = pipeline.execute(command, admitted)
        self.metrics.count_decision(pipeline.engine.state, command, decision)
        if type(decision) is Decision and decision.events:
            if decision.woken:
                self._wake(decision.woken)
            self._schedule_sweep()
            engine = pipeline.engine
            if engine.snapshot_due():
                engine.start_snapshot()
        return decision, barrier

    def after_durable(self, barrier: int, callback: Callable[..., None], *args: Any) -> None:
        """Call `callback(None, *args)` once `barrier` is durable (at once if it is),
        or `callback(error, *args)` if storage fails first; in barrier order."""
        pipeline = self.pipeline
        assert pipeline is not None
        pipeline.after_durable(barrier, callback, *args)

    async def durable(self, barrier: int) -> None:
        """Wait until `barrier` is durable (raises StorageFailed if it never is):
        the async form of `after_durable`, for fronts that await."""
        pipeline = self.pipeline
        assert pipeline is not None
        future = pipeline.durable(barrier)
        if future is not None:
            await future

    def read_barrier(self) -> int:
        """The barrier a read waits for: everything applied so far."""
        engine = self.engine
        assert engine is not None
        return engine.appended_seq

    def _command(self, command: Command) -> tuple[Decision | CommandError, int]:
        if self.stopping:
            raise ShuttingDown()
        return self.run(command)

    def enqueue(
        self, jobs: tuple[NewJob, ...], atomic: bool
    ) -> tuple[Decision | CommandError, int]:
        """Job ids come from `new_job_id` / `new_job_ids`, which the front uses
        while it decodes its jobs."""
        if self.stopping:
            raise ShuttingDown()
        return self.run(_new_tuple(Enqueue, (jobs, atomic)))

    def enqueue_parts(
        self, jobs: tuple[NewJob, ...], atomic: bool
    ) -> list[tuple[NewJob, ...]] | None:
        """The parts a large best-effort enqueue is stored in (`enqueue_in_parts`),
        or None when `enqueue` stores it whole (sepp/server/parts.py). Cluster mode
        stores every batch whole: its records are capped at one log message
        (~1 MiB), so none holds the others for long, and a batch over the cap is
        refused whole, up front (RecordTooLarge), never stored in part."""
        if atomic or len(jobs) < 2:
            return None
        engine = self.engine
        if engine is None or engine.options.record_bytes_max:
            return None
        return split_enqueue(jobs, self.core_config.limits.max_enqueue_batch)

    def enqueue_in_parts(self, parts: list[tuple[NewJob, ...]], done: PartsDone) -> None:
        """Store `parts` (from `enqueue_parts`) one after another, each once the one
        before is durable; `done(error, outcome)` once the last is (outcome: one
        Decision for the whole batch, or the CommandError of a part refused whole).
        Raises like `enqueue` when the first part cannot start."""
        if self.stopping:
            raise ShuttingDown()
        parted = EnqueueInParts(self, parts, done)
        self._parted.add(parted)
        try:
            parted.start()
        except BaseException:
            self._parted.discard(parted)
            raise

    async def enqueue_durable(
        self, jobs: tuple[NewJob, ...], atomic: bool
    ) -> Decision | CommandError:
        """`enqueue` for fronts that await: the outcome once it is durable, a large
        best-effort batch stored in parts (`enqueue_parts`) like on the native
        front. Raises what refused or ended it (ShuttingDown, Overloaded,
        StorageFailed, ...)."""
        parts = self.enqueue_parts(jobs, atomic)
        if parts is None:
            decision, barrier = self.enqueue(jobs, atomic)
            # Refusals too wait for the barrier: an answer never shows what is not
            # yet durable (a NOT_FOUND for an ack of a job whose enqueue is not).
            await self.durable(barrier)
            return decision
        future: asyncio.Future[Decision | CommandError] = asyncio.get_running_loop().create_future()

        def done(error: BaseException | None, outcome: Decision | CommandError | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                assert outcome is not None
                future.set_result(outcome)

        self.enqueue_in_parts(parts, done)
        return await future

    def parts_may_continue(self) -> BaseException | None:
        """None while the next part of a parted enqueue may run; else why not."""
        pipeline = self.pipeline
        if pipeline is None or not pipeline.accepting:
            return ShuttingDown("the server stopped while storing a batch in parts")
        return None

    def parts_ended(self, parted: EnqueueInParts) -> None:
        self._parted.discard(parted)
        if not self._parted and self._parted_idle is not None:
            self._parted_idle.set()

    async def parts_finished(self, timeout_s: float) -> bool:
        """Shutdown: wait (at most `timeout_s`) for the enqueues being stored in parts
        to end; True if none is left."""
        if not self._parted:
            return True
        self._parted_idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._parted_idle.wait(), timeout_s)
        except TimeoutError:
            return False
        finally:
            self._parted_idle = None
        return True

    def new_job_id(self) -> str:
        return self.ids.next()

    def new_job_ids(self, count: int) -> list[str]:
        return self.ids.take(count)

    def ack(
        self, job_id: str, attempt: int, worker_id: str | None, enqueued_at: int | None = None
    ) -> tuple[Decision | CommandError, int]:
        """`enqueued_at`: the fencing token the native protocol may carry (the
        delivery's enqueued_at_ms, PROTOCOL.md 5.3); None fences by attempt only."""
        if self.stopping:
            raise ShuttingDown()
        return self.run(_new_tuple(Ack, (job_id, attempt, worker_id, enqueued_at)))

    def nack(self, command: Nack) -> tuple[Decision | CommandError, int]:
        return self._command(command)

    def extend(self, command: Extend) -> tuple[Decision | CommandError, int]:
        return self._command(command)

    def release(
        self, job_id: str, attempt: int, worker_id: str | None
    ) -> tuple[Decision | CommandError, int]:
        if self.stopping:
            raise ShuttingDown()
        return self.run(_new_tuple(Release, (job_id, attempt, worker_id)))

    def settle(
        self, commands: Sequence[Ack | Nack | Extend | None]
    ) -> tuple[list[Decision | CommandError | Overloaded | None], int]:
        """Acks, nacks and extends run in order in this one loop turn (one group
        commit). One outcome per command: its decision or refusal, the Overloaded
        error of one the backlog refused (the ones before it stand), None where the
        front had no command (a malformed item). The barrier is the last of them."""
        if self.stopping:
            raise ShuttingDown()
        outcomes: list[Decision | CommandError | Overloaded | None] = []
        last = 0
        run = self.run
        for command in commands:
            if command is None:
                outcomes.append(None)
                continue
            try:
                decision, barrier = run(command)
            except Overloaded as exc:
                outcomes.append(exc)
                continue
            if barrier > last:
                last = barrier
            outcomes.append(decision)
        return outcomes, last

    def drain_dead_letters(
        self, queue: str | None, max_records: int, actor: str, max_bytes: int | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Delete and return dead letters. The answer must fit one frame (max_bytes),
        for the records it carries are deleted by the same record; a front whose
        clients take less than max_message_bytes passes its own `max_bytes`."""
        if self.stopping:
            raise ShuttingDown()
        budget = self.answer_items_bytes_max
        if max_bytes is not None and max_bytes < budget:
            budget = max_bytes
        decision, barrier = self.run(
            DrainDeadLetters(queue=queue, max_records=max_records, max_bytes=budget)
        )
        if type(decision) is Decision and decision.events:
            log.warning(
                "drain_dead_letters by %s removed %d record(s)", actor, len(decision.events)
            )
        return decision, barrier

    # -- admin operations (issue 15) -----------------------------------------------------------
    #
    # Each takes the `Principal` its front authenticated and returns (outcome, barrier):
    # the outcome is the result, or a CommandError (PermissionDenied by the role
    # table, or the core's refusal: InvalidArgument, TooManyIds, QueueNotFound,
    # QueueInUse); answer it once `barrier` is durable (`after_durable` / `durable`),
    # as for every command. Reads wait for the read barrier, so they never show what
    # is not yet durable. Commands go through `run`, which wakes parked reserves
    # (resume, requeue). Raise ShuttingDown / Overloaded / StorageFailed like `run`.

    def _denied(self, principal: Principal, operation: str) -> PermissionDenied | None:
        if role_allows(principal.role, operation):
            return None
        return PermissionDenied(
            f"{operation} needs role {ROLE_REQUIRED[operation]}; "
            f"{principal.actor} has role {principal.role}"
        )

    def _read(self, principal: Principal, operation: str) -> PermissionDenied | None:
        if self.stopping:
            raise ShuttingDown()
        return self._denied(principal, operation)

    def get_job(
        self, principal: Principal, job_id: str
    ) -> tuple[JobInfo | CommandError | None, int]:
        """The job `job_id` in any state, or None when unknown (never enqueued, or
        gone: acked, cancelled, deleted, drained, expired)."""
        denied = self._read(principal, "get_job")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        return reads.get_job(engine.state, job_id), self.read_barrier()

    def job_by_idempotency_key(
        self, principal: Principal, queue: str, key: str
    ) -> tuple[JobInfo | CommandError | None, int]:
        """The job `queue`'s idempotency `key` points at while its dedup window
        lasts (the console's search box), or None."""
        denied = self._read(principal, "get_job")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        job_id = engine.state.dedup_lookup(queue, key, self.now_ms())
        info = None if job_id is None else reads.get_job(engine.state, job_id)
        return info, self.read_barrier()

    def list_jobs(
        self,
        principal: Principal,
        queue: str,
        state: str,
        cursor: str | None = None,
        limit: int = reads.PAGE_JOBS_DEFAULT,
        cause: str | None = None,
    ) -> tuple[JobPage | CommandError, int]:
        """A page of the jobs of `queue` in `state` ("ready", "scheduled",
        "inflight", "dead_letter") after `cursor`; `cause` filters dead letters."""
        denied = self._read(principal, "list_jobs")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        state_ = engine.state
        page = self._fit_page(
            lambda n: reads.list_jobs(state_, queue, state, cursor, n, cause), limit
        )
        return page, self.read_barrier()

    def list_dead_letters(
        self,
        principal: Principal,
        queue: str,
        cause: str | None = None,
        cursor: str | None = None,
        limit: int = reads.PAGE_JOBS_DEFAULT,
    ) -> tuple[JobPage | CommandError, int]:
        """A page of the dead letters of `queue` (of `cause`, a cause name, when
        given), without consuming them."""
        denied = self._read(principal, "list_dead_letters")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        state_ = engine.state
        page = self._fit_page(
            lambda n: reads.list_jobs(state_, queue, "dead_letter", cursor, n, cause), limit
        )
        return page, self.read_barrier()

    def _fit_page(
        self, fetch: Callable[[int], JobPage | CommandError], limit: int
    ) -> JobPage | CommandError:
        """`fetch(limit)`, with fewer jobs while the page would not fit one answer
        frame (max_message_bytes): a page of 1,000 jobs of 1 MiB each would be a
        GiB. Halves the limit and reads again (the cursor then resumes after the
        last job given); a single job is always given."""
        page = fetch(limit)
        budget = self.answer_items_bytes_max
        while isinstance(page, JobPage) and len(page.jobs) > 1:
            if sum(map(job_info_answer_bytes, page.jobs)) <= budget:
                break
            page = fetch(len(page.jobs) // 2)
        return page

    def list_queues(self, principal: Principal) -> tuple[tuple[QueueInfo, ...] | CommandError, int]:
        """Every queue the state knows, by name, with counts and settings."""
        denied = self._read(principal, "list_queues")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        return reads.list_queues(engine.state), self.read_barrier()

    def queue_info(self, principal: Principal, queue: str) -> tuple[QueueInfo | CommandError, int]:
        """One queue's counts and settings; QueueNotFound when the server does
        not know it."""
        denied = self._read(principal, "queue_info")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        info = reads.queue_info(engine.state, queue)
        if info is None:
            return QueueNotFound(f"no queue {queue!r}", queue), 0
        return info, self.read_barrier()

    def _admin(
        self, principal: Principal, operation: str, command: Command
    ) -> tuple[Decision | CommandError, int]:
        if self.stopping:
            raise ShuttingDown()
        denied = self._denied(principal, operation)
        if denied is not None:
            return denied, 0
        decision, barrier = self.run(command)
        if type(decision) is Decision and decision.events:
            log.info("%s by %s (%s)", operation, principal.actor, principal.role)
        return decision, barrier

    def dead_letter_jobs(
        self, principal: Principal, job_ids: Sequence[str], reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Dead-letter live Ready or Scheduled jobs (cause `admin`): AdminOutcomes."""
        actor, role = principal
        return self._admin(
            principal,
            "dead_letter_jobs",
            AdminDeadLetterJobs(actor=actor, role=role, reason=reason, job_ids=tuple(job_ids)),
        )

    def cancel_jobs(
        self, principal: Principal, job_ids: Sequence[str], reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Delete live Ready or Scheduled jobs: AdminOutcomes."""
        actor, role = principal
        return self._admin(
            principal,
            "cancel_jobs",
            CancelJobs(actor=actor, role=role, reason=reason, job_ids=tuple(job_ids)),
        )

    def requeue_dead_letters(
        self,
        principal: Principal,
        *,
        job_ids: Sequence[str] = (),
        queue: str | None = None,
        cause: str | None = None,
        reason: str | None = None,
    ) -> tuple[Decision | CommandError, int]:
        """Dead letters back to Ready (same id, attempt 1), by `job_ids` or, when
        none are given, by `queue` and / or `cause` (a chunk; AdminOutcomes.remaining
        says how many more match)."""
        return self._dead_letters_by(
            principal,
            "requeue_dead_letters",
            AdminRequeueDeadLetters,
            job_ids,
            queue,
            cause,
            reason,
        )

    def delete_dead_letters(
        self,
        principal: Principal,
        *,
        job_ids: Sequence[str] = (),
        queue: str | None = None,
        cause: str | None = None,
        reason: str | None = None,
    ) -> tuple[Decision | CommandError, int]:
        """Delete dead letters, by ids or by filter like `requeue_dead_letters`."""
        return self._dead_letters_by(
            principal, "delete_dead_letters", DeleteDeadLetters, job_ids, queue, cause, reason
        )

    def _dead_letters_by(
        self,
        principal: Principal,
        operation: str,
        command: type[AdminRequeueDeadLetters] | type[DeleteDeadLetters],
        job_ids: Sequence[str],
        queue: str | None,
        cause: str | None,
        reason: str | None,
    ) -> tuple[Decision | CommandError, int]:
        """A command on dead letters chosen by ids or by queue and / or cause."""
        code = _cause_code(cause)
        if isinstance(code, CommandError):
            return code, 0
        actor, role = principal
        return self._admin(
            principal,
            operation,
            command(
                actor=actor,
                role=role,
                reason=reason,
                job_ids=tuple(job_ids),
                queue=queue,
                cause=code,
            ),
        )

    def pause_queue(
        self, principal: Principal, queue: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Stop delivering from `queue` (durable): QueueAdminResult."""
        actor, role = principal
        return self._admin(
            principal, "pause_queue", PauseQueue(actor=actor, role=role, reason=reason, queue=queue)
        )

    def resume_queue(
        self, principal: Principal, queue: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Deliver from `queue` again (wakes its parked reserves): QueueAdminResult."""
        actor, role = principal
        return self._admin(
            principal,
            "resume_queue",
            ResumeQueue(actor=actor, role=role, reason=reason, queue=queue),
        )

    def purge_queue(
        self, principal: Principal, queue: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Delete a chunk of the Ready and Scheduled jobs of `queue`: PurgeResult
        (repeat while `remaining` > 0)."""
        actor, role = principal
        return self._admin(
            principal, "purge_queue", PurgeQueue(actor=actor, role=role, reason=reason, queue=queue)
        )

    def put_queue(
        self,
        principal: Principal,
        queue: str,
        overrides: dict[str, int | str],
        reason: str | None = None,
    ) -> tuple[Decision | CommandError, int]:
        """Create or update a runtime queue definition: PutQueueResult."""
        actor, role = principal
        return self._admin(
            principal,
            "put_queue",
            PutQueue(actor=actor, role=role, reason=reason, queue=queue, overrides=dict(overrides)),
        )

    def delete_queue(
        self, principal: Principal, queue: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Remove a runtime queue definition (QueueInUse while jobs are in
        flight): DeleteQueueResult."""
        actor, role = principal
        return self._admin(
            principal,
            "delete_queue",
            DeleteQueue(actor=actor, role=role, reason=reason, queue=queue),
        )

    # -- schedules (issue 17) ------------------------------------------------------------------

    def put_schedule(
        self,
        principal: Principal,
        name: str,
        queue: str,
        job_type: str,
        *,
        cron: str | None = None,
        timezone: str = "UTC",
        every_ms: int | None = None,
        payload_data: bytes | None = None,
        payload_encoding: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: dict[str, Any] | None = None,
        catch_up: str = CATCH_UP_DEFAULT,
        reason: str | None = None,
    ) -> tuple[Decision | CommandError, int]:
        """Create or update a schedule (the time zone resolved here, at the edge):
        ScheduleResult; InvalidArgument for an unknown time zone."""
        actor, role = principal
        denied = self._denied(principal, "put_schedule")
        if denied is not None:
            return denied, 0
        try:
            zone = zone_table(timezone) if isinstance(timezone, str) else ()
        except UnknownTimeZone as exc:
            return InvalidArgument(str(exc)), 0
        command = PutSchedule(
            actor=actor, role=role, reason=reason, name=name, queue=queue, job_type=job_type,
            payload_data=payload_data, payload_encoding=payload_encoding, priority=priority,
            max_attempts=max_attempts, custom=custom, cron=cron, timezone=timezone, zone=zone,
            every_ms=every_ms, catch_up=catch_up,
        )  # fmt: skip
        return self._admin(principal, "put_schedule", command)

    def pause_schedule(
        self, principal: Principal, name: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Stop firing a schedule: ScheduleResult; ScheduleNotFound."""
        actor, role = principal
        command = PauseSchedule(actor=actor, role=role, reason=reason, name=name)
        return self._admin(principal, "pause_schedule", command)

    def resume_schedule(
        self, principal: Principal, name: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Fire a paused schedule again from its next tick: ScheduleResult."""
        actor, role = principal
        command = ResumeSchedule(actor=actor, role=role, reason=reason, name=name)
        return self._admin(principal, "resume_schedule", command)

    def delete_schedule(
        self, principal: Principal, name: str, reason: str | None = None
    ) -> tuple[Decision | CommandError, int]:
        """Remove a schedule (its fired jobs stay): ScheduleResult."""
        actor, role = principal
        command = DeleteSchedule(actor=actor, role=role, reason=reason, name=name)
        return self._admin(principal, "delete_schedule", command)

    def list_schedules(
        self, principal: Principal
    ) -> tuple[tuple[reads.ScheduleInfo, ...] | CommandError, int]:
        """Every schedule with its next fire time (`next_ms`)."""
        denied = self._read(principal, "list_schedules")
        if denied is not None:
            return denied, 0
        engine = self.engine
        assert engine is not None
        return reads.list_schedules(engine.state), self.read_barrier()

    # -- reads ---------------------------------------------------------------------------------

    # -- online backup (sepp/admin/backup.py) --------------------------------------------------

    def backup_readable(self) -> bool:
        """True when the data directory is real files a backup can read (not the
        tests' in-memory file system)."""
        engine = self.engine
        return engine is not None and isinstance(engine.fs, RealFileSystem)

    def pin_log(self) -> LogPin:
        """Pin the newest snapshot and the log after it against retention: what an
        online backup copies (Engine.pin_log). May wait for one file deletion of
        retention: call it in a thread. Release with `unpin_log`."""
        engine = self.engine
        assert engine is not None
        return engine.pin_log()

    def unpin_log(self, pin: LogPin) -> None:
        engine = self.engine
        assert engine is not None
        engine.unpin_log(pin)

    def health(self) -> Health:
        if self.storage_failure is not None:
            return Health(False, NOT_SERVING_STORAGE_FAILED, self.damaged_history)
        if self.stopping:
            return Health(False, NOT_SERVING_SHUTTING_DOWN, self.damaged_history)
        return Health(True, None, self.damaged_history)

    def server_info(self) -> dict[str, object]:
        """The server's version, limits and policies, by their documented names
        (PROTOCOL.md server_info; the same names on every front). A cluster
        follower answers it too, from the configuration (no engine of its own)."""
        engine = self.engine
        config = self.core_config
        policy = config.defaults
        limits = config.limits
        return {
            "server_version": SEPP_VERSION,
            "server_time_ms": self.now_ms(),
            "restricts_encodings": policy.allowed_encodings is not None,
            "allowed_encodings": list(policy.allowed_encodings or ()),
            "max_payload_bytes": policy.max_payload_bytes,
            "max_message_bytes": limits.max_message_bytes,
            "max_custom_entries": policy.max_custom_entries,
            "max_custom_total_bytes": policy.max_custom_total_bytes,
            "max_custom_key_bytes": policy.max_custom_key_bytes,
            "max_queue_name_bytes": limits.max_queue_name_bytes,
            "max_job_type_bytes": limits.max_job_type_bytes,
            "max_idempotency_key_bytes": limits.max_idempotency_key_bytes,
            "max_trace_context_bytes": limits.max_trace_context_bytes,
            "max_encoding_bytes": limits.max_encoding_bytes,
            "max_worker_id_bytes": limits.max_worker_id_bytes,
            "max_reason_bytes": limits.max_reason_bytes,
            "max_stats_queues": limits.max_stats_queues,
            "max_schedule_horizon_ms": policy.max_schedule_horizon_ms,
            "max_enqueue_batch": limits.max_enqueue_batch,
            "max_reserve_batch": limits.max_reserve_batch,
            "max_reserve_queues": limits.max_reserve_queues,
            "max_wait_timeout_ms": limits.max_wait_timeout_ms,
            "max_lease_duration_ms": policy.max_lease_duration_ms,
            "strict_queues": config.strict_queues,
            "dead_letter_retention_enabled": config.dead_letter_retention_ms > 0,
            "dead_letter_retention_ms": config.dead_letter_retention_ms,
            "persist_mode": self.config.get("storage", "persist_mode")
            if engine is None
            else engine.options.persist_mode,
        }

    def queue_stats(self, queues: Sequence[str] | None) -> tuple[int, list[QueueStats]]:
        """(now, the counts of `queues`, or of every queue when None). Repeats are
        answered once; past max_stats_queues distinct names InvalidRequest (4
        million repeated names once made a 278 MiB answer and a 7 s stall)."""
        engine = self.engine
        assert engine is not None
        state = engine.state
        now = self.now_ms()
        if queues is None:
            names = sorted(state.queues)
        else:
            names = list(dict.fromkeys(queues))
            limit = self.core_config.limits.max_stats_queues
            if len(names) > limit:
                raise InvalidRequest(
                    f"queue_stats lists at most {limit} distinct queues "
                    f"(max_stats_queues), got {len(names)}"
                )
        stats = []
        for name in names:
            q = state.queues.get(name)
            oldest = state.oldest_ready_enqueued_at(name)
            stats.append(
                QueueStats(
                    name,
                    q.ready_count if q else 0,
                    q.scheduled_count if q else 0,
                    q.in_flight_count if q else 0,
                    len(q.dead) if q else 0,
                    None if oldest is None else max(0, now - oldest),
                )
            )
        return now, stats

    # -- reserve and long polls ------------------------------------------------------------------

    def reserve(
        self,
        queues: tuple[str, ...],
        lease_ms: int,
        max_jobs: int,
        worker_id: str | None,
        wait_ms: int,
        sink: ReserveSink,
        answer_bytes_max: int | None = None,
        order: str = "strict",
    ) -> ParkedReserve | None:
        """Lease up to `max_jobs` jobs; the answer goes to `sink` once durable. If
        none is ready and `wait_ms` > 0 (capped at max_wait_timeout_ms) the reserve
        is parked and its handle returned (for `withdraw` / `abandon`). A front
        whose clients take less than max_message_bytes passes `answer_bytes_max`.
        `order`: "strict" (the queues in the order given) or "fair" (issue 17)."""
        if self.stopping:
            raise ShuttingDown()
        if wait_ms < 0:
            raise InvalidRequest("wait_ms must be >= 0")
        max_bytes = self.answer_items_bytes_max
        if answer_bytes_max is not None and answer_bytes_max < max_bytes:
            max_bytes = answer_bytes_max
        # Positional, in Reserve's field order: a reserve per request is the
        # worker's hot path. max_bytes keeps the answer within one frame of the
        # client's (= our) limit, leaving room for the envelope.
        command: Reserve = _new_tuple(
            Reserve, (queues, lease_ms, max_jobs, worker_id, max_bytes, order)
        )
        decision, barrier = self.run(command)
        if type(decision) is not Decision:
            assert isinstance(decision, CommandError)
            self.after_durable(barrier, _refuse_after, sink, decision)
            return None
        reply = decision.reply
        assert isinstance(reply, ReserveResult)
        jobs = reply.jobs
        if not jobs:
            wait_ms = min(wait_ms, self.max_wait_ms)
            if wait_ms > 0:
                parked = ParkedReserve(sink, command)
                self._park(parked, wait_ms, decision.time_ms)
                return parked
        self._answer(sink, jobs, barrier)
        return None

    async def reserve_wait(
        self,
        queues: tuple[str, ...],
        lease_ms: int,
        max_jobs: int,
        worker_id: str | None,
        wait_ms: int,
        peer: str,
        answer_bytes_max: int | None = None,
        order: str = "strict",
    ) -> tuple[JobView, ...]:
        """`reserve`, awaited: the jobs once durable (possibly none), or
        CommandRefused / StorageFailed. Cancelled while parked, it leases nothing;
        cancelled after jobs were leased, they are released."""
        future: asyncio.Future[tuple[JobView, ...]] = asyncio.get_running_loop().create_future()
        parked = self.reserve(
            queues,
            lease_ms,
            max_jobs,
            worker_id,
            wait_ms,
            FutureSink(future, peer),
            answer_bytes_max,
            order,
        )
        try:
            return await future
        except asyncio.CancelledError:
            if parked is not None:
                self.abandon(parked)
            raise

    def withdraw(self, parked: ParkedReserve) -> bool:
        """End a parked reserve early: answered empty now. False if it had already
        been answered."""
        if parked.done:
            return False
        self._finish_parked(parked, ())
        return True

    def abandon(self, parked: ParkedReserve) -> None:
        """Forget a parked reserve without answering it (its front has nobody left
        to answer). It leased nothing, so nothing is released."""
        if not parked.done:
            self._unpark(parked)

    def _park(self, parked: ParkedReserve, wait_ms: int, decided_ms: int) -> None:
        for queue in parked.queues:
            waiters = self._parked.get(queue)
            if waiters is None:
                waiters = self._parked[queue] = WaitList()
            waiters.append(parked)
        assert self._loop is not None
        parked.timer = self._loop.call_later(wait_ms / 1000, self._parked_timeout, parked)
        self._watch_rate_limits(parked.queues, decided_ms)

    def _parked_timeout(self, parked: ParkedReserve) -> None:
        self._finish_parked(parked, ())

    def _unpark(self, parked: ParkedReserve) -> None:
        parked.done = True
        if parked.timer is not None:
            parked.timer.cancel()
            parked.timer = None
        for queue in parked.queues:
            waiters = self._parked.get(queue)
            if waiters is not None:
                waiters.remove(parked)
                if not waiters:
                    del self._parked[queue]

    def _finish_parked(
        self, parked: ParkedReserve, jobs: tuple[JobView, ...], barrier: int = 0
    ) -> None:
        if parked.done:
            return
        self._unpark(parked)
        self._answer(parked.sink, jobs, barrier)

    def _answer(self, sink: ReserveSink, jobs: tuple[JobView, ...], barrier: int) -> None:
        if jobs or barrier:
            self.after_durable(barrier, self._deliver, sink, jobs)
        else:
            sink.finish(jobs)

    def _deliver(
        self, error: BaseException | None, sink: ReserveSink, jobs: tuple[JobView, ...]
    ) -> None:
        if error is not None:
            sink.failed(error)
            return
        if not sink.finish(jobs) and jobs:
            # Delivered to nobody: hand the jobs back rather than let their leases
            # lapse (which would count an attempt nobody made).
            self.release_undelivered(jobs, sink.peer)

    def release_undelivered(
        self, jobs: tuple[JobView, ...], peer: str, tries_left: int = RELEASE_TRIES_MAX
    ) -> None:
        """Hand back jobs leased by a reserve answer that could not be written:
        Ready again at once, the attempt not counted. Fenced like any release: a
        job whose lease has moved on since is left alone."""
        left: list[JobView] = []
        for job in jobs:
            if self.stopping or self.storage_failure is not None:
                left.append(job)
                continue
            try:
                decision, _barrier = self.run(_new_tuple(Release, (job.job_id, job.attempt, None)))
            except Overloaded:
                left.append(job)
                continue
            except StorageFailed:
                return
            if type(decision) is Decision:
                log.info(
                    "released job %s attempt %d: its reserve answer to %s could not be written",
                    job.job_id,
                    job.attempt,
                    peer,
                )
            else:
                log.debug("job %s needs no release: %s", job.job_id, decision)
        if not left:
            return
        if tries_left > 1 and not self.stopping and self._loop is not None:
            # The commit backlog is full: try again shortly rather than let the
            # leases lapse (which would count an attempt nobody made).
            self._loop.call_later(
                RELEASE_RETRY_S, self.release_undelivered, tuple(left), peer, tries_left - 1
            )
            return
        log.warning(
            "could not release %d job(s) whose reserve answer to %s was not written; "
            "their leases will expire",
            len(left),
            peer,
        )

    def _wake(self, queues: frozenset[str]) -> None:
        parked = self._parked
        if not parked:
            return
        for queue in queues:
            if queue in parked:
                self._wake_queued.add(queue)
        if self._wake_queued and not self._wake_scheduled:
            self._wake_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._wake_pass)

    def _wake_pass(self) -> None:
        """Serve parked reserves of the woken queues, oldest first, while their
        queue yields jobs: one reserve per waiter, stop at the first empty one."""
        self._wake_scheduled = False
        queues, self._wake_queued = self._wake_queued, set()
        for queue in queues:
            # When the last reserve tried found nothing: a rate window is judged
            # at that time, never at a later clock reading (see _watch_rate_limits).
            decided_ms = self.now_ms()
            while not self.stopping:
                waiters = self._parked.get(queue)
                if not waiters:
                    break
                parked = waiters.first()
                if not parked.sink.alive():
                    # Never lease jobs to a reserve whose answer cannot be
                    # delivered or is no longer awaited: answer it empty.
                    self._finish_parked(parked, ())
                    continue
                try:
                    decision, barrier = self.run(parked.command)
                except (Overloaded, StorageFailed):
                    break  # try again at the next wake; the deadline still holds
                if type(decision) is not Decision:
                    self._finish_parked(parked, ())
                    continue
                reply = decision.reply
                assert isinstance(reply, ReserveResult)
                if not reply.jobs:
                    decided_ms = decision.time_ms
                    break
                self._finish_parked(parked, reply.jobs, barrier)
            if queue in self._parked:
                self._watch_rate_limits((queue,), decided_ms)

    # -- rate limits (issue 17) ------------------------------------------------------------------
    #
    # A long poll parked on a queue at its rate limit waits for the queue's
    # window to free: no command makes that happen (nothing becomes Ready), so a
    # timer does. It fires when the first such window frees and wakes the parked
    # reserves of every rate-limited queue; the wake pass serves what it can and
    # arms the timer again for the queues still waiting (a timer that fired a
    # little early finds no room and re-arms). One timer, whatever the number of
    # queues.

    def _watch_rate_limits(self, queues: Sequence[str] | tuple[str, ...], decided_ms: int) -> None:
        """Arm the timer for the first of `queues`' rate windows to free, judged at
        `decided_ms`: the time of the reserve that found no room. A later clock
        reading could already see room (the window freed between the reserve and
        this call), arm nothing, and leave the reserve parked until its wait ends
        (CI, issue 17's long-poll test: answered empty after 30 s)."""
        engine = self.engine
        if engine is None or self._loop is None or self.stopping:
            return
        state = engine.state
        if not state.rate_windows:
            return  # no queue has counted a delivery under a rate limit
        best = self._rate_target
        for queue in queues:
            at = rate_limited_until(state, queue, decided_ms)
            if at is not None and (best is None or at < best):
                best = at
        if best is None or best == self._rate_target:
            return
        if self._rate_timer is not None:
            self._rate_timer.cancel()
        self._rate_target = best
        delay_ms = max(0, best - self.now_ms())
        self._rate_timer = self._loop.call_later(delay_ms / 1000, self._rate_wake)

    def _rate_wake(self) -> None:
        self._rate_timer = None
        self._rate_target = None
        engine = self.engine
        if self.stopping or engine is None:
            return
        config = engine.state.config
        limited = frozenset(
            queue for queue in self._parked if config.policy(queue).rate_limit_jobs is not None
        )
        if limited:
            self._wake(limited)

    # -- the sweep -------------------------------------------------------------------------------

    def _schedule_sweep(self) -> None:
        if self.stopping or self.engine is None or self._loop is None:
            return
        deadline = self.engine.state.next_deadline()
        current = self._sweep_target
        if current is not None and (deadline is None or deadline >= current):
            return  # the timer already fires early enough (the usual case)
        now = self.now_ms()
        target = now + self.sweep_interval_ms
        if deadline is not None and deadline < target:
            target = deadline
        if self._sweep_timer is not None and self._sweep_target is not None:
            if self._sweep_target <= target:
                return
            self._sweep_timer.cancel()
        self._sweep_target = target
        self._sweep_timer = self._loop.call_later(max(0, target - now) / 1000, self._sweep)

    def _sweep(self) -> None:
        self._sweep_timer = None
        self._sweep_target = None
        if self.stopping:
            return
        try:
            decision, _barrier = self.run(Sweep())
            if type(decision) is Decision and decision.events:
                log.debug("sweep: %s", decision.reply)
        except Overloaded:
            pass  # the backlog will drain; retry on the next timer
        except StorageFailed:
            return
        self._schedule_sweep()


CONFIG_REASON = "configuration file"


def config_schedule_command(entry: dict[str, Any]) -> PutSchedule:
    """The PutSchedule of one validated [[schedules]] table (sepp/server/config.py)."""
    timezone = entry.get("timezone", "UTC")
    payload = entry.get("payload")
    return PutSchedule(
        actor="config",
        role="admin",
        reason=CONFIG_REASON,
        name=entry["name"],
        queue=entry["queue"],
        job_type=entry["job_type"],
        payload_data=payload.encode() if payload is not None else None,
        payload_encoding=entry.get("encoding"),
        priority=entry.get("priority"),
        max_attempts=entry.get("max_attempts"),
        cron=entry.get("cron"),
        timezone=timezone,
        zone=zone_table(timezone),
        every_ms=entry.get("every_ms"),
        catch_up=entry.get("catch_up", CATCH_UP_DEFAULT),
    )


# A job info in an answer beyond its strings, payload and custom entries: the
# fields of a delivered job (JOB_ANSWER_FIXED_BYTES) plus 9 more keys with their
# integers and string headers.
JOB_INFO_EXTRA_FIXED_BYTES = 256


def _utf8_len(text: str | None) -> int:
    return 0 if text is None else len(text.encode("utf-8", "surrogatepass"))


def job_info_answer_bytes(info: JobInfo) -> int:
    """An upper bound of the encoded size of `info` in an answer (a list_jobs page)."""
    size = JOB_ANSWER_FIXED_BYTES + JOB_INFO_EXTRA_FIXED_BYTES
    size += len(info.payload_data or b"")
    for text in (
        info.job_id,
        info.queue,
        info.job_type,
        info.payload_encoding,
        info.idempotency_key,
        info.traceparent,
        info.tracestate,
        info.worker_id,
        info.last_reason,
        info.dead_letter_cause,
    ):
        size += _utf8_len(text)
    for key, value in (info.custom or {}).items():
        size += CUSTOM_ENTRY_FIXED_BYTES + _utf8_len(key)
        if isinstance(value, str):
            size += _utf8_len(value)
    return size


_CAUSE_CODES = {name: code for code, name in CAUSE_NAMES.items()}


def _cause_code(cause: str | None) -> int | CommandError | None:
    """The code of a dead-letter cause name (None: any cause)."""
    if cause is None:
        return None
    code = _CAUSE_CODES.get(cause)
    if code is None:
        return InvalidArgument(f"cause must be one of {sorted(_CAUSE_CODES)}")
    return code


def _refuse_after(error: BaseException | None, sink: ReserveSink, refusal: CommandError) -> None:
    if error is not None:
        sink.failed(error)
    else:
        sink.refused(refusal)
