"""The sepp server: the process (recovery, listener, shutdown) and the native TCP
front end.

Owns: `SeppServer` (start, serve, shut down; it builds the `SeppService` and the
commit pipeline), `ClientConnection` (one socket: frames in, responses out, hello,
per-connection limits and flow control) and `NativeReserveSink` (a reserve's
answer on a connection). Each protocol operation is decoded into a call of the
service layer (service.py: commands, reads, long polls, auth decisions, the sweep)
and its result rendered into a frame (wire.py); nothing here builds a command's
events, touches storage or keeps its own copy of a rule.

Promises:
- The only layer that reads the clock and does network I/O. Commands run on the
  event-loop thread, in arrival order; a response is written only once its
  barrier is durable (`CommitPipeline`), so nothing is acknowledged early.
- A misbehaving client (garbage, oversized frames, a request flood, a slow reader)
  is answered with an error or disconnected; no other connection notices.
- Connections cannot starve storage or each other (admission.py): descriptors are
  kept in reserve for storage, connections without hello (TLS handshakes
  included) are capped and the oldest of them makes room for a newcomer, frames
  before hello are small, and a connection silent after hello is closed.
- Parked reserves are woken by the command that made jobs ready, one waiter at a
  time per queue while jobs remain (no thundering herd); they answer empty on
  their deadline, at shutdown, when withdrawn, and when their client half-closes
  (a peer that stopped sending gains nothing from a long poll). A reserve whose
  client has gone is never given jobs; jobs whose reserve answer could not be
  written at all are released (Ready again at once, no attempt counted).
- Lease expiries and scheduled jobs are handled by a logged Sweep command on a
  timer set for the next deadline (never later than sweep_interval_ms; service.py).

Must not import: another front end (the admin HTTP API, gRPC).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any, cast

from log_format._compiled import running_build
from sepp._version import __version__ as SEPP_VERSION
from sepp.cluster.logengine import NotLeader
from sepp.core.commands import (
    RETRY_DEAD_LETTER,
    RETRY_DELAY,
    Ack,
    Extend,
    Nack,
    NewJob,
)
from sepp.core.config import ConfigError, CoreConfig
from sepp.core.decide import Decision
from sepp.core.results import (
    AckResult,
    CommandError,
    DrainResult,
    ExtendResult,
    JobView,
    NackResult,
    ReleaseResult,
)
from sepp.protocol import errors as perr
from sepp.protocol import messages as pm
from sepp.protocol.framing import FrameReader, encode_frame
from sepp.server import admission, gcpolicy, native_admin
from sepp.server.admission import RateLimitedLog
from sepp.server.cluster_mode import ClusterBackend, ClusterMode, connect_backend
from sepp.server.config import ClusterSettings, ServerConfig, load_tls_context
from sepp.server.faults import crash_hook_from_env, hold_recovery_from_env
from sepp.server.loops import loop_kind
from sepp.server.metrics import REQUEST_TIMED_MASK, RequestMetrics
from sepp.server.pipeline import (
    CommitPipeline,
    Overloaded,
    ReleaseCork,
    resolve_sync_method,
    wall_clock_ms,
)
from sepp.server.reload import ConfigReloader
from sepp.server.service import (
    AUTH_LET_IN,
    AUTH_MISSING_KEY,
    LOCAL_ADMIN,
    NOT_SERVING_SHUTTING_DOWN,
    NOT_SERVING_STORAGE_FAILED,
    InvalidRequest,
    ParkedReserve,
    Principal,
    SeppService,
    ShuttingDown,
)
from sepp.server.wire import (
    command_error,
    dead_letter_body,
    enqueue_body,
    job_view_body,
    job_view_row,
    new_job,
)
from sepp.storage import Engine, FileSystem, StorageFailed
from sepp.storage.fs import RealFileSystem

log = logging.getLogger("sepp.server")
# Builds a NamedTuple from a tuple of its fields, without its Python-level __new__.
_new_tuple = tuple.__new__


# Transport write-buffer marks: above HIGH the server stops reading requests from
# that client until its responses drain below LOW (flow control for slow readers).
WRITE_BUFFER_HIGH = 1024 * 1024
WRITE_BUFFER_LOW = 256 * 1024

# Room kept in a reserve or drain answer for its envelope is
# config.ANSWER_ENVELOPE_BYTES_MAX; the core counts every byte of every job and
# record against the rest (decide.job_answer_bytes), so an answer always fits one
# frame, and the config refuses limits under which one job alone would not.

EXIT_OK = 0
EXIT_STORAGE_FAILED = 3

REASON_TOO_MANY_CONNECTIONS = "too_many_connections"


# Health reasons of the service, as the protocol names them.
_NOT_SERVING_REASONS = {
    NOT_SERVING_STORAGE_FAILED: perr.REASON_STORAGE_FAILED,
    NOT_SERVING_SHUTTING_DOWN: perr.REASON_SHUTTING_DOWN,
}


class NativeReserveSink:
    """The answer of one reserve request on a connection (service.ReserveSink).
    Not alive once the connection is closed, closing or half-closed; a parked
    one is in its connection's `parked` set until it is answered."""

    __slots__ = ("arrays", "conn", "handle", "request_id")

    def __init__(self, conn: ClientConnection, request_id: int, arrays: bool = False) -> None:
        self.conn = conn
        self.request_id = request_id
        # The reserve asked for its jobs as arrays (`job_layout`, PROTOCOL.md 5.2).
        self.arrays = arrays
        # The service's handle while parked (withdraw, abandon).
        self.handle: ParkedReserve | None = None

    @property
    def peer(self) -> str:
        return self.conn.peer

    def alive(self) -> bool:
        conn = self.conn
        transport = conn.transport
        return not (conn.closed or conn.eof or transport is None or transport.is_closing())

    def finish(self, jobs: tuple[JobView, ...]) -> bool:
        conn = self.conn
        if self.handle is not None:
            conn.parked.discard(self)
        transport = conn.transport
        if conn.closed or transport is None or transport.is_closing():
            conn.in_flight -= 1
            return False
        shape = job_view_row if self.arrays else job_view_body
        body = {"jobs": [shape(j) for j in jobs]}
        conn.send_frame(_ok_frame(self.request_id, body, _payloads_to_splice(jobs)))
        return True

    def refused(self, error: CommandError) -> None:
        code, body = command_error(error)
        self.conn.reply(self.request_id, code, body)

    def failed(self, error: BaseException) -> None:
        self.conn.send_after(error, b"", self.request_id)


class SeppServer:
    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        fs: FileSystem | None = None,
        cluster_backend: ClusterBackend | None = None,
    ) -> None:
        self.config = config
        # Cluster mode (issue 19): [cluster] nats_urls, or a backend a test passes
        # (in-memory log and lease); None = a single node with its own log.
        self._cluster_backend = cluster_backend
        self.cluster: ClusterMode | None = None
        # The file system seam (tests pass a FaultyFileSystem); None = the real one.
        self.fs = fs
        self.clock = clock
        # Every operation the fronts offer (service.py); this class runs the
        # process around it and the native front end.
        self.service = SeppService(config, clock=clock)
        self.engine: Engine | None = None
        self.pipeline: CommitPipeline | None = None
        # Shared by every pipeline this server runs (a cluster node builds one each
        # time it leads) and read by every connection (send_frame).
        self.release_cork = ReleaseCork()
        self.sync_method = "thread"  # resolved in start()
        self.connections: set[ClientConnection] = set()
        self.address: tuple[str, int] | None = None
        # The admin HTTP listener (sepp/admin) and its bound address; None when
        # [admin] listen_addr is "off".
        self.admin: Any = None
        self.admin_address: tuple[str, int] | None = None
        # The metrics-only listener ([metrics] listen_addr), same shape.
        self.metrics_listener: Any = None
        self.metrics_address: tuple[str, int] | None = None
        # The gRPC sepp.v1 front (sepp/grpc) and its bound address; None when
        # [grpc] listen_addr is "off" (the default).
        self.grpc: Any = None
        self.grpc_address: tuple[str, int] | None = None
        if config.admin_listen is not None or config.metrics_listen is not None:
            # Counted only when a listener serves /metrics (the native front's hot
            # path skips them otherwise).
            self.service.metrics.requests = RequestMetrics()
        # Hot reload (reload.py), once `watch_config` started it.
        self.reloader: ConfigReloader | None = None
        self.exit_code = EXIT_OK
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The periodic refreeze (gcpolicy): which ones are full, and the release of
        # free pages running on the executor, if one is.
        self._refreezes: gcpolicy.RefreezeSchedule | None = None
        self._releasing: asyncio.Future[bool] | None = None
        self._stopped = asyncio.Event()
        self._shutdown_task: asyncio.Task[None] | None = None
        server = config.values["server"]
        self.handshake_timeout_s = server["handshake_timeout_ms"] / 1000
        self.tls_handshake_timeout_s = server["tls_handshake_timeout_ms"] / 1000
        self.max_connections = server["max_connections"]
        self.max_unauthenticated = server["max_unauthenticated_connections"]
        self.idle_timeout_s = server["idle_timeout_ms"] / 1000
        self.descriptors_reserved = server["descriptors_reserved"]
        # Connections the descriptor table holds with the reserve kept free (set
        # by start() once it has counted what storage and the listener hold).
        self.descriptor_connections = 2**62
        # Connections whose hello has not succeeded yet, oldest first (TLS
        # handshakes included): the first to go when room is needed.
        self.unauthenticated: OrderedDict[ClientConnection, None] = OrderedDict()
        self.tls: ssl.SSLContext | None = None
        # Warnings any peer can trigger at will: at most one a second per kind.
        self.warn = RateLimitedLog(log)
        self.max_in_flight = server["max_in_flight_per_connection"]
        self.output_buffer_max = server["output_buffer_bytes_max"]
        self.frame_bytes_max = config.get("limits", "max_message_bytes")
        self.frame_bytes_max_before_hello = min(
            server["frame_bytes_max_before_hello"], self.frame_bytes_max
        )

    # The service's state, read (and set, by tests) through the server.

    @property
    def stopping(self) -> bool:
        return self.service.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.service.stopping = value

    @property
    def storage_failure(self) -> BaseException | None:
        return self.service.storage_failure

    @storage_failure.setter
    def storage_failure(self, value: BaseException | None) -> None:
        self.service.storage_failure = value

    @property
    def damaged_history(self) -> list[dict[str, object]]:
        return self.service.damaged_history

    @property
    def core_config(self) -> CoreConfig:
        """The core's settings now (a hot reload replaces them: reload.py)."""
        return self.service.core_config

    @property
    def _sweep_target(self) -> int | None:
        return self.service._sweep_target

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Start the admin and metrics listeners, recover storage (in a thread, so
        they answer meanwhile: /livez 200, /readyz 503 "recovering"), start the
        commit pipeline and listen. Returns the bound (host, port)."""
        self._loop = asyncio.get_running_loop()
        await self._start_admin_listeners()
        try:
            await self._start_grpc_listener()
            if self._cluster_backend is not None or self.config.cluster is not None:
                return await self._start_cluster()
            return await self._start_serving()
        except BaseException:
            # A refused start leaves nothing listening behind.
            await self._stop_grpc_listener()
            await self._stop_admin_listeners()
            raise

    async def _start_admin_listeners(self) -> None:
        """Before recovery (issue 15 item 6): a probe sees the process alive and
        not ready while a long recovery runs. A taken address refuses the start
        before storage is opened."""
        admin_listen = self.config.admin_listen
        metrics_listen = self.config.metrics_listen
        if admin_listen is None and metrics_listen is None:
            return
        from sepp.admin.app import AdminListener

        if admin_listen is not None:
            self.admin = AdminListener(
                self.service, ssl_context=load_tls_context(self.config, "admin")
            )
            self.admin_address = await self._start_listener(self.admin, admin_listen)
        if metrics_listen is not None:
            self.metrics_listener = AdminListener(self.service, "metrics")
            self.metrics_address = await self._start_listener(self.metrics_listener, metrics_listen)

    async def _stop_admin_listeners(self) -> None:
        for listener in (self.admin, self.metrics_listener):
            if listener is not None:
                await listener.stop()

    async def _start_grpc_listener(self) -> None:
        """Bound before recovery like the admin listener (a taken address refuses
        the start before storage opens); until recovery is done its calls answer
        UNAVAILABLE and its health check NOT_SERVING."""
        address = self.config.grpc_listen
        if address is None:
            return
        try:
            from sepp.grpc.front import GrpcListener
        except ImportError as exc:
            raise ConfigError(
                "grpc.listen_addr",
                f"the gRPC front needs the optional extra sepp[grpc] ({exc})",
            ) from None
        self.grpc = GrpcListener(self.service)
        self.grpc_address = await self._start_listener(self.grpc, address)

    async def _stop_grpc_listener(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop()

    async def _start_serving(self) -> tuple[str, int]:
        assert self._loop is not None
        data_dir = self.config.get("server", "data_dir")
        options = self.config.storage_options()
        # Before storage opens anything: every connection costs a descriptor, and
        # the default soft limit (often 1024) is below what max_connections and
        # storage need together (issue 13 §2).
        descriptor_limit = admission.raise_descriptor_limit()
        log.info("%s", descriptor_limit.describe())
        # A bad sync_method is refused before recovery, like any other setting.
        self.sync_method = resolve_sync_method(
            self.config.get("storage", "sync_method"),
            options.persist_mode,
            real_fs=self.fs is None or isinstance(self.fs, RealFileSystem),
        )
        crash_hook = crash_hook_from_env()  # test-only: SEPP_FAULT_CRASH_AT (faults.py)
        hold = hold_recovery_from_env()  # test-only: SEPP_FAULT_HOLD_RECOVERY

        def recover() -> Engine:
            if hold is not None:
                hold()
            return Engine.open(data_dir, self.core_config, options, fs=self.fs, hook=crash_hook)

        # In a thread: the loop keeps answering /livez and /readyz meanwhile. Nothing
        # else runs on the loop yet (no native listener, no pipeline).
        self.engine = engine = await asyncio.to_thread(recover)
        report = engine.recovery_report
        log.info(
            "recovered %s: snapshot seq %d (%.2fs), %d records / %d events replayed (%.2fs), "
            "%d live jobs, %d dead letters%s",
            data_dir,
            report.snapshot_seq,
            report.snapshot_load_s,
            report.records_replayed,
            report.events_replayed,
            report.replay_s,
            len(engine.state.jobs),
            len(engine.state.dead),
            f", truncated torn tail of {report.truncated[0]} at {report.truncated[1]} ({report.truncated[2]} bytes)"
            if report.truncated
            else f", released {report.zero_tail[2]} preallocated bytes after the last record"
            if report.zero_tail
            else "",
        )
        for path, reason in report.skipped_snapshots:
            log.warning("skipped damaged snapshot %s: %s", path, reason)
        for damage in report.damaged_history:
            # Started past (recovery table rows 15, 16): the state is whole, but a
            # disk that flips bits is failing, and audits lose these records.
            log.error(
                "%s: serving every job; `sepp-log verify %s` reports it, and "
                "`sepp-log repair %s --set-aside-history` moves it aside",
                damage.describe(),
                data_dir,
                data_dir,
            )
        self.service.damaged_history = [
            {
                "file": damage.path,
                "offset": damage.offset,
                "seq": damage.seq,
                "reason": damage.reason,
                "first_seq": damage.first_seq,
                "last_seq": damage.last_seq,
                "snapshot_seq": damage.snapshot_seq,
            }
            for damage in report.damaged_history
        ]
        if report.unsynced_hole:
            log.warning(
                "a power loss left a hole in the unsynced tail of %s at offset %d: cut it and "
                "the %d record(s) after it (%d bytes), none of them acknowledged through a sync",
                *report.unsynced_hole[:2],
                report.unsynced_hole[3],
                report.unsynced_hole[2],
            )
        if engine.options.persist_mode == "buffer":
            log.warning(
                "persist_mode = buffer: acknowledged writes survive a process crash but up to "
                "%d ms of them can be lost on an OS crash or power loss",
                engine.options.buffer_flush_interval_ms,
            )
        if self.core_config.dead_letter_retention_ms == 0:
            log.warning(
                "dead_letter_retention_ms = 0: dead-lettered jobs are dropped, not kept "
                "(drain_dead_letters will always be empty)"
            )
        # Recovered state is long-lived: keep the cyclic GC from rescanning it, and
        # make full collections rare (the state holds millions of objects).
        gcpolicy.configure()
        self._schedule_refreeze()
        self.pipeline = CommitPipeline(
            engine,
            backlog_max=self.config.get("storage", "command_queue_capacity"),
            clock=self.clock,
            on_failure=self._storage_failed,
            release_cork=self.release_cork,
        )
        self.pipeline.start(self.sync_method)
        # Ready before the listener: a connection may arrive while it starts.
        self.service.open(engine, self.pipeline, self._loop)
        host, port = self.config.listen
        # TLS is started per connection (ClientConnection._start_tls), not by the
        # listener: a connection then counts from its accept, its handshake
        # included, and one over the caps is closed before any handshake work.
        self.tls = tls = self._tls_context()
        self._server = await self._loop.create_server(
            lambda: ClientConnection(self),
            host,
            port,
            reuse_address=True,
            backlog=1024,
        )
        self.descriptor_connections = admission.connections_for_descriptors(
            descriptor_limit.soft, admission.open_descriptors(), self.descriptors_reserved
        )
        if self.descriptor_connections < self.max_connections:
            log.warning(
                "the descriptor limit (soft RLIMIT_NOFILE %s, hard %s) holds only %d "
                "connections with %d descriptors reserved for storage, not max_connections "
                "= %d: raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower "
                "max_connections",
                descriptor_limit.soft,
                descriptor_limit.hard,
                self.descriptor_connections,
                self.descriptors_reserved,
                self.max_connections,
            )
        sock = self._server.sockets[0]
        bound = sock.getsockname()
        self.address = (bound[0], bound[1])
        api_keys = self.config.api_keys
        log.info(
            "listening on %s:%d (%s, persist_mode=%s, sync=%s, auth=%s, build=%s, loop=%s)",
            self.address[0],
            self.address[1],
            "TLS" if tls else "plain TCP",
            engine.options.persist_mode,
            self.sync_method,
            "off" if api_keys is None else f"{len(api_keys)} key(s)",
            running_build(),
            loop_kind(self._loop),
        )
        return self.address

    async def _start_cluster(self) -> tuple[str, int]:
        """Cluster mode: listen at once (a follower redirects), and run the node;
        the service opens when it leads (cluster_mode.py)."""
        assert self._loop is not None
        settings = self.config.cluster
        if settings is None:  # a test's backend without [cluster]: defaults
            host, port = self.config.listen
            settings = ClusterSettings(
                nats_urls=[],
                monitor_urls=[],
                node_id=self.config.get("cluster", "node_id") or f"{host}:{port}",
                advertise_addr=self.config.get("cluster", "advertise_addr") or f"{host}:{port}",
                lease_ttl_ms=self.config.get("cluster", "lease_ttl_ms"),
                lease_renew_ms=self.config.get("cluster", "lease_renew_ms"),
                snapshot_every_messages=self.config.get("cluster", "snapshot_every_messages"),
                appends_in_flight=self.config.get("cluster", "appends_in_flight"),
            )
        backend = self._cluster_backend
        if backend is None:
            backend = await connect_backend(settings)
        gcpolicy.configure()
        self.tls = self._tls_context()
        host, port = self.config.listen
        self._server = await self._loop.create_server(
            lambda: ClusterClientConnection(self), host, port, reuse_address=True, backlog=1024
        )
        bound = self._server.sockets[0].getsockname()
        self.address = (bound[0], bound[1])
        if settings.advertise_addr.endswith(":0"):  # tests: the port bound
            settings = dataclasses.replace(
                settings, advertise_addr=f"{settings.advertise_addr[:-2]}:{bound[1]}"
            )
        self.cluster = ClusterMode(self, settings, backend)
        self.cluster.node.start()
        log.info(
            "listening on %s:%d (cluster node %s, advertised as %s)",
            self.address[0],
            self.address[1],
            settings.node_id,
            settings.advertise_addr,
        )
        return self.address

    @property
    def shutting_down(self) -> bool:
        return self._shutdown_task is not None

    async def _start_listener(self, listener: Any, address: tuple[str, int]) -> tuple[str, int]:
        try:
            bound: tuple[str, int] = await listener.start(*address)
        except OSError as exc:
            raise OSError(
                exc.errno, f"{listener.name} listener on {address[0]}:{address[1]}: {exc}"
            ) from exc
        return bound

    def watch_config(self, load: Callable[[], ServerConfig]) -> ConfigReloader:
        """Start hot reload (issue 15 item 7): `load` reads the configuration as
        at start (file, environment, command line); the returned reloader's
        `reload` is what SIGHUP calls. Stopped by shutdown."""
        assert self._loop is not None
        reloader = ConfigReloader(self.service.config, load, self.reconfigure)
        reloader.start(self._loop)
        self.reloader = reloader
        return reloader

    def reconfigure(self, config: ServerConfig) -> None:
        """Switch to a reloaded configuration (between two commands): the service
        takes the live settings; a connection let in with an API key the reload
        removed (or without one, when keys are now required) is closed -- the
        others keep going."""
        self.service.reconfigure(config)
        revoked = [
            conn
            for conn in self.connections
            if conn.hello_done and not conn.closed and not self.check_api_key(conn.api_key)
        ]
        for conn in revoked:
            conn.close()
        if revoked:
            log.warning(
                "config reload: closed %d connection(s) whose API key is no longer accepted",
                len(revoked),
            )

    def _tls_context(self) -> ssl.SSLContext | None:
        return load_tls_context(self.config)

    async def wait_stopped(self) -> int:
        await self._stopped.wait()
        return self.exit_code

    def request_shutdown(self) -> None:
        if self._shutdown_task is None and self._loop is not None:
            self._shutdown_task = self._loop.create_task(self.shutdown())

    async def shutdown(self) -> None:
        """Stop accepting, answer parked reserves (empty) and in-flight work, final
        sync and snapshot, close connections."""
        if self.stopping:
            await self._stopped.wait()
            return
        log.info("shutting down")
        if self.reloader is not None:
            self.reloader.stop()
        if self._server is not None:
            self._server.close()
        # No new commands; parked reserves answered empty; no more sweeps.
        self.service.stop()
        # Enqueues being stored in parts were taken before the stop: they finish.
        grace_s = self.config.get("server", "shutdown_grace_ms") / 1000
        if not await self.service.parts_finished(grace_s):
            log.warning("shutdown: an enqueue stored in parts did not finish within the grace")
        if self.cluster is not None:
            # A planned handover: the node steps down (answering what waits) and
            # releases its lease, so another node takes over at once.
            await self.cluster.stop()
        pipeline, engine = self.pipeline, self.engine
        if pipeline is not None:
            try:
                await asyncio.wait_for(
                    pipeline.stop(), self.config.get("server", "shutdown_grace_ms") / 1000 + 5
                )
            except (TimeoutError, StorageFailed) as exc:
                log.error("shutdown: flushing the log failed: %s", exc)
                self.exit_code = EXIT_STORAGE_FAILED
        if engine is not None:
            try:
                if self.storage_failure is None:
                    await asyncio.to_thread(engine.close, snapshot=True)
                    log.info("final snapshot at seq %d", engine.snapshot_seq)
                flushes = engine.stats["flushes"]
                log.info(
                    "log writes since start: %d records, %d bytes in %d group commits "
                    "(%.1f records per commit)",
                    engine.stats["records"],
                    engine.stats["bytes"],
                    flushes,
                    engine.stats["records"] / max(flushes, 1),
                )
            except (StorageFailed, OSError) as exc:
                log.error("shutdown: final snapshot failed: %s", exc)
                self.exit_code = EXIT_STORAGE_FAILED
        # Calls still in flight have their answers (durable or refused) by now.
        await self._stop_grpc_listener()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
        # Last: /readyz answered 503 while shutdown ran.
        await self._stop_admin_listeners()
        if self.storage_failure is not None:
            self.exit_code = EXIT_STORAGE_FAILED
        log.info("stopped (exit code %d)", self.exit_code)
        self._stopped.set()

    def _storage_failed(self, exc: BaseException) -> None:
        if self.storage_failure is None:
            self.storage_failure = exc
            log.critical("storage failed, stopping: %s", exc)
        self.exit_code = EXIT_STORAGE_FAILED
        self.request_shutdown()

    # -- helpers -------------------------------------------------------------------

    def check_api_key(self, key: str | None) -> bool:
        return self.service.check_api_key(key)

    @property
    def auth_required(self) -> bool:
        return self.service.auth_required

    def _schedule_refreeze(self) -> None:
        if self.stopping or self._loop is None:
            return
        now = time.monotonic()
        activity = self._activity()
        if self._refreezes is None:
            self._refreezes = gcpolicy.RefreezeSchedule(now, activity)
        full = self._refreezes.full(now, activity)
        gcpolicy.refreeze(full=full, release=self._release_free_memory)
        self._loop.call_later(gcpolicy.FREEZE_INTERVAL_S, self._schedule_refreeze)

    def _activity(self) -> int:
        """A running count of what the server did: requests answered on the native
        front (when request metrics are on), and events logged (what the other fronts
        and the clock did)."""
        engine = self.service.engine
        requests = self.service.metrics.requests  # None: request metrics are off
        answered = 0 if requests is None else sum(requests.counts.values())
        return answered + (0 if engine is None else engine.appended_seq)

    def _release_free_memory(self) -> None:
        """Give the heap's free pages back on the loop's executor: a purge after a
        burst took ~100 ms, and the C call lets go of the GIL, so the loop answers
        meanwhile. One at a time."""
        if self._loop is None or (self._releasing is not None and not self._releasing.done()):
            return
        self._releasing = self._loop.run_in_executor(None, gcpolicy.release_free_memory)


# A durable release writes a connection's answers in twos (ReleaseCork): half the
# writes, and the client's wake-ups, of one write per answer. Not all of them at
# once: a Worker with max_jobs=1 has ~50 single-job reserves answered per release,
# and one write of all of them made the client and the server take turns (no
# overlap): 6-7k jobs/s against 10-13k. bench_client's worker / worker_mj1 phases,
# interleaved, medians: 1 (no cork) 20.3k / 10.4k, 2 25.5k / 12.1k, 4 22.3k / 10.3k
# jobs/s (benchmarks/README.md, "Clients: fewer calls per enqueue").
CORKED_ANSWERS_MAX = 2


class ClientConnection(asyncio.Protocol):
    """One client: frames in, responses out."""

    # op -> handler (the table at the end of this module; cluster mode gates it).
    _handlers: dict[str, Callable[[ClientConnection, int, Any], None]]

    def __init__(self, server: SeppServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        # Until hello succeeds only a small frame is taken, one frame at a time
        # (issue 13 §4: 171 silent peers each buffering 16 MiB took 2.8 GiB).
        self.reader = FrameReader(server.frame_bytes_max_before_hello)
        self.peer = "?"
        self.hello_done = False
        # Who this connection's admin operations act as (set by hello).
        self.principal: Principal = LOCAL_ADMIN
        # The API key its hello was let in with: a reload that removes it closes
        # the connection (SeppServer.reconfigure).
        self.api_key: str | None = None
        self.closed = False
        self.in_flight = 0
        # Answers kept during a durable release (send_frame), and how many.
        self._cork = server.release_cork
        self._corked: list[bytes] | None = None
        self._corked_answers = 0
        # Reserves of this connection parked in the service, until answered.
        self.parked: set[NativeReserveSink] = set()
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        # time.monotonic() of the last bytes received or answer sent (idle timeout).
        self.last_activity = 0.0
        self._tls_task: asyncio.Task[None] | None = None
        # The TLS handshake is done, or there is none: until then nothing is read
        # as frames nor written in clear.
        self._tls_ready = server.tls is None
        # TLS only: bytes read before the handshake took over the socket (uvloop
        # starts reading after connection_made whatever it asked), handed to it.
        self._early: bytearray | None = None
        # TLS only: bytes the handshake decrypted before _start_tls switched
        # self.transport over (they arrive in the same turn as its completion).
        self._pending: bytearray | None = None
        self._reading_paused = False
        # While a large enqueue is stored in parts (op_enqueue), the requests read
        # after it wait here, unread ones in the socket (reading paused).
        self._held: deque[bytes] | None = None
        # The client half-closed: answer what is in flight, then close.
        self.eof = False
        # Request metrics (RequestMetrics, None when no listener serves /metrics):
        # the op of the frame being handled and the code its answer got.
        self.requests = server.service.metrics.requests
        self.method: str | None = None
        self.outcome = perr.OK

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports behave like
        # asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self.server
        # Admission (admission.admit's table): TLS handshakes count, for the
        # connection is admitted at its accept, before any handshake work.
        unauthenticated = server.unauthenticated
        outcome = admission.admit(
            stopping=server.stopping,
            connections=len(server.connections),
            unauthenticated=len(unauthenticated),
            max_connections=server.max_connections,
            max_unauthenticated=server.max_unauthenticated,
            descriptor_connections=server.descriptor_connections,
        )
        if outcome == admission.REFUSE_SHUTTING_DOWN:
            self._refuse(perr.UNAVAILABLE, perr.REASON_SHUTTING_DOWN, "the server is shutting down")
            return
        if outcome == admission.REFUSE_CONNECTIONS or outcome == admission.REFUSE_DESCRIPTORS:
            descriptors = outcome == admission.REFUSE_DESCRIPTORS
            server.warn.warning(
                outcome,
                "refused connection from %s: %d connections open, all authenticated (%s)",
                self.peer,
                len(server.connections),
                "the descriptors left are reserved for storage"
                if descriptors
                else "max_connections",
            )
            self._refuse(
                perr.RESOURCE_EXHAUSTED,
                REASON_TOO_MANY_CONNECTIONS,
                "too many connections" + (" for the descriptor limit" if descriptors else ""),
            )
            return
        if outcome == admission.ADMIT_EVICTING_OLDEST:
            oldest = next(iter(unauthenticated))
            server.warn.warning(
                outcome,
                "closing %s, the oldest of %d connections without hello, to make room for %s",
                oldest.peer,
                len(unauthenticated),
                self.peer,
            )
            oldest._refuse(
                perr.RESOURCE_EXHAUSTED,
                REASON_TOO_MANY_CONNECTIONS,
                "too many connections without hello: closed to make room",
            )
        server.connections.add(self)
        unauthenticated[self] = None
        self.last_activity = time.monotonic()
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(server.handshake_timeout_s, self._handshake_expired)
        if server.tls is not None:
            # Nothing should be read until the handshake starts (start_tls
            # resumes); what is read anyway is kept for it (data_received).
            self._early = bytearray()
            self.transport.pause_reading()
            self._tls_task = loop.create_task(self._start_tls(self.transport, server.tls))
            return
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)

    async def _start_tls(self, plain: asyncio.Transport, context: ssl.SSLContext) -> None:
        """The TLS handshake of an admitted connection, at most
        tls_handshake_timeout_ms long; on failure the connection ends here
        (asyncio tells the protocol nothing of a handshake that failed)."""
        loop = asyncio.get_running_loop()
        handshake = asyncio.ensure_future(
            loop.start_tls(
                plain,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.server.tls_handshake_timeout_s,
            )
        )
        # Bytes read before start_tls took the socket go to the TLS protocol once
        # it is set up: start_tls's first step (the step just scheduled) queues
        # its connection_made and the resumed reading; one more hop queues the
        # hand-over behind them, before any byte read later.
        loop.call_soon(loop.call_soon, self._hand_over_early, plain)
        try:
            transport = await handshake
        except asyncio.CancelledError:
            # The task keeps this error, whose traceback holds this frame and so
            # this connection: forget the task or the three make a cycle.
            self._tls_task = None
            # Closed by the server during the handshake (room made, shutdown).
            plain.abort()
            self.connection_lost(None)
            raise
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            self.server.warn.warning(
                "tls_handshake_failed",
                "closing %s: TLS handshake failed: %s",
                self.peer,
                exc or type(exc).__name__,
            )
            plain.abort()
            self.connection_lost(exc)
            self._tls_task = None
            return
        self._tls_task = None
        if transport is None:  # pragma: no cover - closed during the handshake
            plain.abort()
            self.connection_lost(None)
            return
        self.transport = transport
        self._tls_ready = True
        pending, self._pending = self._pending, None
        if self.closed:  # closed while the handshake ran (shutdown, hello timeout)
            self.transport.abort()
            return
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        if pending:
            self.data_received(bytes(pending))

    def _hand_over_early(self, plain: asyncio.Transport) -> None:
        early, self._early = self._early, None
        self._pending = bytearray()
        if not early or plain.is_closing():
            return
        # A buffered protocol by its methods: uvloop's SSLProtocol does not
        # subclass asyncio.BufferedProtocol.
        tls = cast(asyncio.BufferedProtocol, plain.get_protocol())
        view = memoryview(early)
        while view:
            buffer = memoryview(tls.get_buffer(len(view))).cast("B")
            size = min(len(buffer), len(view))
            buffer[:size] = view[:size]
            tls.buffer_updated(size)
            view = view[size:]

    def _refuse(self, code: str, reason: str, message: str) -> None:
        transport = self.transport
        assert transport is not None
        self.closed = True
        self._end_tls_handshake()
        if not self._tls_ready:
            # Refused at accept or during the handshake on a TLS listener: the
            # peer expects handshake records, not a frame in clear. Close at once.
            transport.abort()
            return
        transport.write(
            encode_frame(pm.encode_response(0, code, pm.error_body(message, reason=reason)))
        )
        transport.close()

    def eof_received(self) -> bool | None:
        # A half-close means "no more requests", not "no more answers": commands
        # already read were applied, and dropping their answers would leave the
        # client not knowing their outcome. A partial frame can never complete.
        # Parked reserves are the exception: a peer that has stopped sending gains
        # nothing from a long poll (it is most often a process that exited), so
        # they end now, answered empty while the socket still takes writes, and
        # are never given jobs (issue 12: a dead client's parked reserve took the
        # next job and its lease lapsed into the dead-letter store).
        self.eof = True
        service = self.server.service
        for sink in sorted(self.parked, key=_by_request_id):
            if sink.handle is not None:
                service.withdraw(sink.handle)
        if self.reader.buffered or self.in_flight <= 0:
            return None  # the transport closes itself
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        # Also called by _start_tls for a failed handshake: must be idempotent.
        self.closed = True
        server = self.server
        server.connections.discard(self)
        server.unauthenticated.pop(self, None)
        # A timer handle holds its callback, a method of this connection: drop
        # both handles so the pair is freed by reference counting, not left as a
        # cycle for the collector (gcpolicy: a frozen cycle is never reclaimed).
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        service = server.service
        for sink in list(self.parked):
            if sink.handle is not None:
                service.abandon(sink.handle)
        self.parked.clear()

    def pause_writing(self) -> None:
        # The client is not reading its responses: stop reading its requests.
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and self._reading_paused and not self.closed:
            self._reading_paused = False
            if self._held is None:
                self.transport.resume_reading()

    def _hold(self) -> None:
        """Keep the requests that follow for later (`_unhold`)."""
        self._held = deque()
        if self.transport is not None and not self._reading_paused:
            self.transport.pause_reading()

    def _unhold(self) -> None:
        """Apply the requests held by `_hold`, in order, until one holds again."""
        held = self._held
        self._held = None
        while held and not self.closed:
            self._handle_frame(held.popleft())
            if self._held is not None:
                # Another large enqueue: what is left waits behind it.
                self._held.extendleft(reversed(held))
                return
        if self.closed:
            return
        if self.eof and self.in_flight <= 0:
            self.close()
            return
        if self.transport is not None and not self._reading_paused:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self._tls_ready:
            early = self._early
            if early is not None:
                # Read before the TLS handshake took over: kept for it.
                early += data
                if self.transport is not None:
                    self.transport.pause_reading()
            elif self._pending is not None:
                # Decrypted before _start_tls switched transports: kept for it.
                self._pending += data
            return
        self.last_activity = time.monotonic()
        if not self.hello_done:
            self._data_before_hello(data)
            return
        try:
            frames = self.reader.feed(data)
        except perr.FrameTooLarge as exc:
            log.warning("closing %s: %s", self.peer, str(exc))
            self._refuse(perr.RESOURCE_EXHAUSTED, perr.REASON_FRAME_TOO_LARGE, str(exc))
            return
        except perr.FramingError as exc:
            log.warning("closing %s: %s", self.peer, str(exc))
            self.close()
            return
        held = self._held
        for frame in frames:
            if self.closed:
                return
            if held is not None:
                held.append(frame)
                continue
            self._handle_frame(frame)
            held = self._held
        try:
            self.reader.raise_pending()
        except perr.FrameTooLarge as exc:
            log.warning("closing %s: %s", self.peer, str(exc))
            self._refuse(perr.RESOURCE_EXHAUSTED, perr.REASON_FRAME_TOO_LARGE, str(exc))
        except perr.FramingError as exc:
            log.warning("closing %s: %s", self.peer, str(exc))
            self.close()

    def _data_before_hello(self, data: bytes) -> None:
        """Frames before a successful hello: one at a time, each within
        frame_bytes_max_before_hello (checked from its length prefix, before its
        body is buffered or decoded); once hello succeeds the rest goes the
        usual way under the full frame limit."""
        reader = self.reader
        chunk: bytes = data
        while True:
            try:
                frames = reader.feed(chunk, 1)
            except perr.FrameTooLarge as exc:
                self.server.warn.warning(
                    "frame_before_hello", "closing %s before hello: %s", self.peer, str(exc)
                )
                self._refuse(perr.RESOURCE_EXHAUSTED, perr.REASON_FRAME_TOO_LARGE, str(exc))
                return
            except perr.FramingError as exc:
                self.server.warn.warning(
                    "framing_before_hello", "closing %s before hello: %s", self.peer, str(exc)
                )
                self.close()
                return
            if not frames:
                return
            chunk = b""
            self._handle_frame(frames[0])
            if self.closed:
                return
            if self.hello_done:
                reader.frame_bytes_max = self.server.frame_bytes_max
                if reader.buffered:
                    self.data_received(b"")
                return

    def _idle_check(self) -> None:
        """Close an authenticated connection that has sent nothing for
        idle_timeout_ms and is owed nothing (no request in flight, no parked
        reserve: a worker's long poll is not idleness)."""
        self._idle_timer = None
        if self.closed:
            return
        idle_s = self.server.idle_timeout_s
        now = time.monotonic()
        if self.parked or self.in_flight > 0:
            due = now + idle_s
        else:
            due = self.last_activity + idle_s
            if due <= now:
                self.server.warn.warning(
                    "idle_timeout",
                    "closing %s: idle for %.0fs (idle_timeout_ms)",
                    self.peer,
                    now - self.last_activity,
                )
                self.close()
                return
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(due - now, self._idle_check)

    # -- output --------------------------------------------------------------------------

    def send_frame(self, frame: bytes | list[bytes]) -> None:
        """Write one answer: a frame, or a frame as parts (`_ok_frame`). Inside a
        durable release (`ReleaseCork`) the answer is kept, and written with the
        others that release sends this connection when it ends (`uncork`)."""
        cork = self._cork
        if cork.active and not self.closed:
            corked = self._corked
            if corked is None:
                corked = self._corked = []
                cork.hold(self)
            if isinstance(frame, list):
                corked.extend(frame)
            else:
                corked.append(frame)
            self._corked_answers += 1
            if self._corked_answers >= CORKED_ANSWERS_MAX:
                self.uncork()
            return
        self._write(frame, 1)

    def uncork(self) -> None:
        frames, self._corked = self._corked, None
        answers, self._corked_answers = self._corked_answers, 0
        if frames is not None:
            self._write(frames[0] if len(frames) == 1 else frames, answers)

    def _write(self, frame: bytes | list[bytes], answers: int) -> None:
        self.in_flight -= answers
        transport = self.transport
        if self.closed or transport is None:
            return
        self.last_activity = time.monotonic()
        # Judge the client by what it left unread before this response: a single
        # legal response can be larger than the cap (a reserve of 256 jobs of
        # 1 MiB each), and a client that reads must not be cut off for it.
        unread = transport.get_write_buffer_size()
        if isinstance(frame, list):
            transport.writelines(frame)
        else:
            transport.write(frame)
        if self.eof and self.in_flight <= 0 and self._held is None:
            self.close()
            return
        if unread > self.server.output_buffer_max:
            log.warning(
                "closing %s: it stopped reading (%d bytes of responses buffered)",
                self.peer,
                transport.get_write_buffer_size(),
            )
            self.abort()

    def send_after(
        self, error: BaseException | None, frame: bytes | list[bytes], request_id: int
    ) -> None:
        if error is not None:
            if isinstance(error, NotLeader):
                # Cluster mode: this node stopped leading with the request in flight.
                cluster = self.server.cluster
                self.error(
                    request_id,
                    perr.UNAVAILABLE,
                    f"this node stopped leading: {error}",
                    reason=perr.REASON_NOT_LEADER,
                    outcome_unknown=error.outcome_unknown,
                    leader=None if cluster is None else cluster.leader_address(),
                )
                return
            # The command's outcome is unknown: it was applied in memory but its
            # record may not be on disk. Answer this request (by its id, so the
            # client knows which one); shutdown closes the connection.
            self.error(
                request_id,
                perr.INTERNAL,
                "storage failed; the outcome of this command is unknown",
                reason=perr.REASON_STORAGE_FAILED,
            )
            return
        self.send_frame(frame)

    def send_drain_after(
        self,
        error: BaseException | None,
        frame: bytes | list[bytes],
        request_id: int,
        reply: DrainResult,
    ) -> None:
        """Write a drain answer once it is durable. Its records are deleted by then:
        if the connection is already gone the answer cannot be written, and
        nothing brings dead letters back (PROTOCOL.md 5.6), so they are logged
        in full at ERROR -- the last copy -- rather than vanish without a trace."""
        transport = self.transport
        if error is None and (self.closed or transport is None or transport.is_closing()):
            self.in_flight -= 1
            log.error(
                "a drain answer to %s could not be written (the connection was gone): "
                "%d dead letter(s) deleted undelivered; last copy: %r",
                self.peer,
                len(reply.records),
                _drain_body(reply)["records"],
            )
            return
        self.send_after(error, frame, request_id)

    def reply(self, request_id: int, status: str, body: dict[str, Any]) -> None:
        self.outcome = status
        self.send_frame(encode_frame(pm.encode_response(request_id, status, body)))

    def error(self, request_id: int, code: str, message: str, **details: Any) -> None:
        self.reply(request_id, code, pm.error_body(message, **details))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._end_tls_handshake()
            if self.transport is not None:
                self.transport.close()

    def abort(self) -> None:
        self.closed = True
        self._end_tls_handshake()
        if self.transport is not None:
            self.transport.abort()

    def _end_tls_handshake(self) -> None:
        """Called as the server closes the connection. It is no longer a
        candidate to make room (its descriptor stays counted until
        connection_lost). A TLS handshake still running is ended by its task
        (uvloop does not fail a handshake whose transport the server closed),
        which then counts the connection gone."""
        self.server.unauthenticated.pop(self, None)
        task = self._tls_task
        if task is not None and not self._tls_ready:
            task.cancel()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if not self.hello_done and not self.closed:
            self.server.warn.warning(
                "no_hello",
                "closing %s: no hello within %.1fs",
                self.peer,
                self.server.handshake_timeout_s,
            )
            self.close()

    # -- dispatch ------------------------------------------------------------------------

    def _handle_frame(self, frame: bytes) -> None:
        requests = self.requests
        if requests is None:
            self._dispatch_frame(frame)
            return
        # sepp_requests_total / sepp_request_duration_seconds: the dispatch leaves
        # the op in self.method (None: no request, the connection was closed) and
        # the answer's code in self.outcome (reply(), _finish, native_admin).
        self.method = None
        self.outcome = perr.OK
        tick = requests.tick
        requests.tick = tick + 1
        if tick & REQUEST_TIMED_MASK:  # counted, not timed (metrics.REQUEST_TIMED_EVERY)
            self._dispatch_frame(frame)
            method = self.method
            if method is not None:
                # RequestMetrics.count, inlined: seven requests in eight pass here.
                counts = requests.counts
                counts[method] = counts.get(method, 0) + 1
                outcome = self.outcome
                if outcome != perr.OK:
                    requests.refuse(method, outcome)
            return
        started = perf_counter()
        self._dispatch_frame(frame)
        if self.method is not None:
            requests.observe(self.method, self.outcome, perf_counter() - started)

    def _dispatch_frame(self, frame: bytes) -> None:
        # Errors are logged by their text, never as objects: a log record that is
        # kept (a queueing or buffering handler) would keep the exception, its
        # traceback's frames and through them this connection.
        try:
            request = pm.decode_request(frame)
        except perr.ProtocolViolation as exc:
            log.warning("closing %s: %s", self.peer, str(exc))
            self.close()
            return
        except perr.ProtocolError as exc:
            self.method = "unknown"
            self.in_flight += 1
            self.error(getattr(exc, "request_id", 0), exc.code, exc.message)
            return
        self.method = request.op
        self.in_flight += 1
        if self.in_flight > self.server.max_in_flight:
            self.error(
                request.id,
                perr.RESOURCE_EXHAUSTED,
                f"more than {self.server.max_in_flight} requests in flight on this connection",
                reason="too_many_requests",
            )
            return
        op = request.op
        if not self.hello_done and op not in (pm.OP_HELLO, pm.OP_HEALTH):
            self.server.warn.warning(
                "request_before_hello", "closing %s: %s before hello", self.peer, op
            )
            self.error(request.id, perr.INVALID_ARGUMENT, "the first request must be hello")
            self.close()
            return
        try:
            body = pm.parse_body(request)
        except perr.ProtocolError as exc:
            self.error(request.id, exc.code, exc.message)
            if not self.hello_done and op == pm.OP_HELLO:
                # A malformed hello is a failed hello: close, as for a bad key.
                self.close()
            return
        handler = self._handlers[op]
        try:
            handler(self, request.id, body)
        except ShuttingDown:
            self._shutting_down(request.id)
        except InvalidRequest as exc:
            self.error(request.id, perr.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            self.error(request.id, perr.RESOURCE_EXHAUSTED, str(exc), reason=perr.REASON_OVERLOADED)
        except StorageFailed as exc:
            self.error(
                request.id,
                perr.INTERNAL,
                f"storage failed: {exc}",
                reason=perr.REASON_STORAGE_FAILED,
            )

    def _shutting_down(self, request_id: int) -> None:
        self.error(
            request_id,
            perr.UNAVAILABLE,
            "the server is shutting down",
            reason=perr.REASON_SHUTTING_DOWN,
        )

    def _finish(
        self,
        request_id: int,
        decision: Decision | CommandError,
        barrier: int,
        body_of: Callable[[Any], dict[str, Any]],
    ) -> None:
        if type(decision) is not Decision:
            code, body = command_error(decision)  # type: ignore[arg-type]
            self.outcome = code
            frame = encode_frame(pm.encode_response(request_id, code, body))
        else:
            frame = encode_frame(pm.encode_response(request_id, perr.OK, body_of(decision.reply)))
        self.server.service.after_durable(barrier, self.send_after, frame, request_id)

    # -- operations ------------------------------------------------------------------------

    def op_hello(self, request_id: int, body: pm.HelloBody) -> None:
        server = self.server
        if body.protocol not in pm.SUPPORTED_PROTOCOL_VERSIONS:
            self.error(
                request_id,
                perr.INVALID_ARGUMENT,
                f"protocol version {body.protocol} is not supported",
                supported_protocol_versions=list(pm.SUPPORTED_PROTOCOL_VERSIONS),
            )
            self.close()
            return
        outcome = server.service.authenticate(body.api_key)
        if outcome not in AUTH_LET_IN:
            # Rate-limited: a peer can fail hellos as fast as it can connect.
            server.warn.warning(
                "hello_failed",
                "closing %s: %s",
                self.peer,
                "missing API key" if outcome == AUTH_MISSING_KEY else "unknown API key",
            )
            self.error(request_id, perr.UNAUTHENTICATED, "missing or unknown API key")
            self.close()
            return
        self.hello_done = True
        self.api_key = body.api_key
        self.principal = native_admin.native_principal(body.api_key, server.auth_required)
        server.unauthenticated.pop(self, None)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if server.idle_timeout_s > 0:
            self._idle_timer = asyncio.get_running_loop().call_later(
                server.idle_timeout_s, self._idle_check
            )
        self.reply(
            request_id,
            perr.OK,
            {
                "protocol": pm.PROTOCOL_VERSION,
                "server_version": SEPP_VERSION,
                "server_time_ms": server.clock(),
                "max_message_bytes": server.frame_bytes_max,
                "auth_required": server.auth_required,
                "max_enqueue_batch": server.core_config.limits.max_enqueue_batch,
                "max_settle_batch": pm.MAX_SETTLE_BATCH,
                **({} if server.cluster is None else {"cluster": server.cluster.info()}),
            },
        )

    def op_health(self, request_id: int, body: None) -> None:
        health = self.server.service.health()
        answer: dict[str, object]
        if health.serving:
            answer = {"status": "serving"}
        else:
            answer = {"status": "not_serving", "reason": _NOT_SERVING_REASONS[health.reason or ""]}
        if health.damaged_history:
            answer["damaged_history"] = health.damaged_history
        self.reply(request_id, perr.OK, answer)

    def op_enqueue(self, request_id: int, body: pm.EnqueueBody) -> None:
        service = self.server.service
        wire_jobs = body.jobs
        if len(wire_jobs) == 1:  # the usual enqueue: one job, no batch machinery
            jobs: tuple[NewJob, ...] = (new_job(service.new_job_id(), wire_jobs[0]),)
        else:
            jobs = tuple(map(new_job, service.new_job_ids(len(wire_jobs)), wire_jobs))
        parts = service.enqueue_parts(jobs, body.atomic)
        if parts is None:
            decision, barrier = service.enqueue(jobs, body.atomic)
            self._finish(request_id, decision, barrier, enqueue_body)
            return
        # A large batch, stored part by part (sepp/server/parts.py): this
        # connection's later requests wait for its answer, to be applied in the
        # order they were sent.
        self._hold()
        try:
            service.enqueue_in_parts(parts, lambda e, o: self._parts_done(e, o, request_id))
        except BaseException:
            self._unhold()
            raise

    def _parts_done(
        self,
        error: BaseException | None,
        outcome: Decision | CommandError | None,
        request_id: int,
    ) -> None:
        if isinstance(error, ShuttingDown):
            self.error(request_id, perr.UNAVAILABLE, str(error), reason=perr.REASON_SHUTTING_DOWN)
        elif error is not None:  # storage failed (cluster mode never stores in parts)
            self.error(
                request_id,
                perr.INTERNAL,
                f"storage failed: {error}",
                reason=perr.REASON_STORAGE_FAILED,
            )
        else:
            assert outcome is not None
            self._finish(request_id, outcome, 0, enqueue_body)
        self._unhold()

    def op_reserve(self, request_id: int, body: pm.ReserveBody) -> None:
        sink = NativeReserveSink(self, request_id, body.job_layout == pm.JOB_LAYOUT_ARRAY)
        handle = self.server.service.reserve(
            tuple(body.queues),
            body.lease_ms,
            body.max_jobs,
            body.worker_id,
            body.wait_ms,
            sink,
            order=body.order,
        )
        if handle is not None:
            sink.handle = handle
            self.parked.add(sink)

    def op_withdraw(self, request_id: int, body: pm.WithdrawBody) -> None:
        """End a parked reserve of this connection early (PROTOCOL.md 5.12): it is
        answered empty before this answer. `withdrawn` false: no reserve with that
        id is parked here (never sent, or its answer has already left -- any jobs
        in it are the client's, to release)."""
        target = body.request_id
        for sink in self.parked:
            # A sink stays in `parked` until its answer is written: one the service
            # has already answered (durable soon) is not withdrawn.
            if (
                sink.request_id == target
                and sink.handle is not None
                and self.server.service.withdraw(sink.handle)
            ):
                self.reply(request_id, perr.OK, {"withdrawn": True})
                return
        self.reply(request_id, perr.OK, {"withdrawn": False})

    def op_release(self, request_id: int, body: pm.ReleaseBody) -> None:
        decision, barrier = self.server.service.release(body.job_id, body.attempt, body.worker_id)
        self._finish(request_id, decision, barrier, _release_body)

    def op_ack(self, request_id: int, body: pm.AckBody) -> None:
        decision, barrier = self.server.service.ack(
            body.job_id, body.attempt, body.worker_id, body.enqueued_at_ms
        )
        self._finish(request_id, decision, barrier, _ack_body)

    def op_nack(self, request_id: int, body: pm.NackBody) -> None:
        decision, barrier = self.server.service.nack(_nack_command(body))
        self._finish(request_id, decision, barrier, _nack_body)

    def op_extend(self, request_id: int, body: pm.ExtendBody) -> None:
        decision, barrier = self.server.service.extend(_extend_command(body))
        self._finish(request_id, decision, barrier, _extend_body)

    def op_settle(self, request_id: int, body: pm.SettleBody) -> None:
        """A batch of acks, nacks and extends (PROTOCOL.md 5.13): each item runs as
        the command its single operation runs, in order, in this one loop turn (so
        they share a group commit); one answer with a result per item, sent once
        the last of them is durable. An item the server is too busy to take gets
        its own ``resource_exhausted`` (the items before it stand)."""
        service = self.server.service
        commands: list[Ack | Nack | Extend | None] = []
        renderers: list[Callable[[Any], dict[str, Any]] | str] = []
        for item in body.items:
            if type(item) is pm.AckBody:
                commands.append(
                    _new_tuple(
                        Ack, (item.job_id, item.attempt, item.worker_id, item.enqueued_at_ms)
                    )
                )
                renderers.append(_ack_body)
            elif type(item) is pm.NackBody:
                commands.append(_nack_command(item))
                renderers.append(_nack_body)
            elif type(item) is pm.ExtendBody:
                commands.append(_extend_command(item))
                renderers.append(_extend_body)
            else:
                commands.append(None)
                renderers.append(
                    item.message if isinstance(item, perr.ProtocolError) else "malformed"
                )
        outcomes, last = service.settle(commands)
        results: list[dict[str, Any]] = []
        for outcome, render in zip(outcomes, renderers, strict=True):
            if outcome is None:
                assert isinstance(render, str)
                results.append({"status": perr.INVALID_ARGUMENT, "message": render})
            elif type(outcome) is Decision:
                assert not isinstance(render, str)
                result = render(outcome.reply)
                result["status"] = perr.OK
                results.append(result)
            elif isinstance(outcome, Overloaded):
                results.append(
                    {
                        "status": perr.RESOURCE_EXHAUSTED,
                        "message": str(outcome),
                        "reason": perr.REASON_OVERLOADED,
                    }
                )
            else:
                code, result = command_error(outcome)  # type: ignore[arg-type]
                result["status"] = code
                results.append(result)
        frame = encode_frame(pm.encode_response(request_id, perr.OK, {"results": results}))
        service.after_durable(last, self.send_after, frame, request_id)

    def op_drain_dead_letters(self, request_id: int, body: pm.DrainBody) -> None:
        service = self.server.service
        decision, barrier = service.drain_dead_letters(body.queue, body.max_records, self.peer)
        if type(decision) is Decision and decision.events:
            reply = decision.reply
            assert isinstance(reply, DrainResult)
            large = _payloads_to_splice([record.job for record in reply.records])
            frame = _ok_frame(request_id, _drain_body(reply), large)
            service.after_durable(barrier, self.send_drain_after, frame, request_id, reply)
            return
        self._finish(request_id, decision, barrier, _drain_body)

    def op_server_info(self, request_id: int, body: None) -> None:
        service = self.server.service
        cluster = self.server.cluster
        info = service.server_info()
        info["supported_protocol_versions"] = [f"v{v}" for v in pm.SUPPORTED_PROTOCOL_VERSIONS]
        info["max_settle_batch"] = pm.MAX_SETTLE_BATCH
        if cluster is not None:
            info["cluster"] = {**cluster.info(), **cluster.state_view()}
            if not cluster.serving:
                # A follower or candidate answers at once: the limits (from its
                # configuration), who it is and where the leader is.
                self.reply(request_id, perr.OK, info)
                return
        service.after_durable(
            service.read_barrier(),
            self.send_after,
            encode_frame(pm.encode_response(request_id, perr.OK, info)),
            request_id,
        )

    def op_queue_stats(self, request_id: int, body: pm.QueueStatsBody) -> None:
        service = self.server.service
        now, stats = service.queue_stats(body.queues)
        queues = [
            {
                "name": q.name,
                "ready": q.ready,
                "scheduled": q.scheduled,
                "in_flight": q.in_flight,
                "dead_lettered": q.dead_lettered,
                "oldest_ready_age_ms": q.oldest_ready_age_ms,
            }
            for q in stats
        ]
        service.after_durable(
            service.read_barrier(),
            self.send_after,
            encode_frame(
                pm.encode_response(request_id, perr.OK, {"server_time_ms": now, "queues": queues})
            ),
            request_id,
        )


def _ack_body(reply: AckResult) -> dict[str, Any]:
    return {"job_id": reply.job_id}


def _release_body(reply: ReleaseResult) -> dict[str, Any]:
    return {"job_id": reply.job_id}


def _by_request_id(sink: NativeReserveSink) -> int:
    return sink.request_id


def _nack_command(body: pm.NackBody) -> Nack:
    retry = {pm.RETRY_DELAY: RETRY_DELAY, pm.RETRY_DEAD_LETTER: RETRY_DEAD_LETTER}.get(
        body.retry, "default"
    )
    return Nack(
        job_id=body.job_id,
        attempt=body.attempt,
        retry=retry,
        delay_ms=body.delay_ms,
        reason=body.reason,
        worker_id=body.worker_id,
        enqueued_at=body.enqueued_at_ms,
    )


def _extend_command(body: pm.ExtendBody) -> Extend:
    return Extend(
        job_id=body.job_id,
        attempt=body.attempt,
        lease_ms=body.lease_ms,
        worker_id=body.worker_id,
        enqueued_at=body.enqueued_at_ms,
    )


def _nack_body(reply: NackResult) -> dict[str, Any]:
    return {"job_id": reply.job_id, "dead_lettered": reply.dead_lettered}


def _extend_body(reply: ExtendResult) -> dict[str, Any]:
    return {"job_id": reply.job_id, "lease_expires_at_ms": reply.lease_expires_at}


def _payloads_to_splice(jobs: Iterable[JobView]) -> bool:
    """Whether an answer carrying these jobs has a payload worth writing uncopied."""
    least = pm.SPLICE_BYTES_MIN
    for job in jobs:
        data = job.payload_data
        if data is not None and len(data) >= least:
            return True
    return False


def _ok_frame(request_id: int, body: dict[str, Any], large: bool) -> bytes | list[bytes]:
    """An OK answer's frame: whole, or, when it carries `large` payloads, as parts
    that leave them uncopied (messages.response_frame_parts)."""
    if large:
        return pm.response_frame_parts(request_id, perr.OK, body)
    return encode_frame(pm.encode_response(request_id, perr.OK, body))


def _drain_body(reply: DrainResult) -> dict[str, Any]:
    body: dict[str, Any] = {"records": [dead_letter_body(r) for r in reply.records]}
    if reply.too_large:
        body["too_large"] = [{"job_id": job_id, "bytes": size} for job_id, size in reply.too_large]
    return body


_HANDLERS: dict[str, Callable[[ClientConnection, int, Any], None]] = {
    pm.OP_HELLO: ClientConnection.op_hello,
    pm.OP_HEALTH: ClientConnection.op_health,
    pm.OP_ENQUEUE: ClientConnection.op_enqueue,
    pm.OP_RESERVE: ClientConnection.op_reserve,
    pm.OP_ACK: ClientConnection.op_ack,
    pm.OP_NACK: ClientConnection.op_nack,
    pm.OP_EXTEND: ClientConnection.op_extend,
    pm.OP_DRAIN_DEAD_LETTERS: ClientConnection.op_drain_dead_letters,
    pm.OP_SERVER_INFO: ClientConnection.op_server_info,
    pm.OP_QUEUE_STATS: ClientConnection.op_queue_stats,
    pm.OP_RELEASE: ClientConnection.op_release,
    pm.OP_WITHDRAW: ClientConnection.op_withdraw,
    pm.OP_SETTLE: ClientConnection.op_settle,
    **native_admin.HANDLERS,
}
ClientConnection._handlers = _HANDLERS

# Cluster mode: the operations every node answers; the others only the serving
# leader (a follower refuses them before doing anything: I19's wire contract).
CLUSTER_ANY_NODE_OPS = frozenset({pm.OP_HELLO, pm.OP_HEALTH, pm.OP_SERVER_INFO})


def _leader_only(
    handler: Callable[[ClientConnection, int, Any], None],
) -> Callable[[ClientConnection, int, Any], None]:
    def gated(conn: ClientConnection, request_id: int, body: Any) -> None:
        cluster = conn.server.cluster
        if cluster is None or cluster.serving:
            handler(conn, request_id, body)
            return
        conn.error(
            request_id,
            perr.UNAVAILABLE,
            "this node is not the leader",
            reason=perr.REASON_NOT_LEADER,
            leader=cluster.leader_address(),
        )

    return gated


class ClusterClientConnection(ClientConnection):
    """A client of a cluster node: operations other than hello, health and
    server_info are refused (unavailable / not_leader + the leader's address)
    unless this node is the serving leader."""

    _handlers = {
        op: handler if op in CLUSTER_ANY_NODE_OPS else _leader_only(handler)
        for op, handler in _HANDLERS.items()
    }
