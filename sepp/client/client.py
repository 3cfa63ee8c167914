"""The async client: enqueue, reserve, ack / nack / extend, dead letters, server
info, queue stats and health, over one pipelined connection.

Owns: `SeppClient` (the sepp-py API on the msgpack protocol), `RetryDirective`
(what a nack asks for), `Lease` (the handle in every reserved `JobCtx`),
reconnecting after a dropped connection, and applying the `RetryPolicy`.

Promises:

* one connection at a time; it is opened (with ``hello``) by `connect` and
  reopened lazily, with the same ``hello``, by the first call after it dropped;
* cluster mode (issue 19; several addresses, or a node whose ``hello`` answer
  carries ``cluster``): the connection goes to the leader -- a node that
  answers as follower or candidate is left for the leader it names, or for the
  next address, with backoff while no leader is known; a request refused with
  ``not_leader`` (nothing was done) is sent again at the leader, whatever the
  operation; after a dropped connection or an ``outcome_unknown`` refusal only
  what is safe to repeat is sent again (enqueues whose every job has an
  idempotency key, ack / nack / extend / release, reads), never a reserve or a
  keyless enqueue; all of it within the call's own deadline and without a
  `RetryPolicy` (see `SeppClient.connect`);
* every call has a deadline: `rpc_timeout`, or for a reserve its wait plus
  10 s, so the server's empty answer arrives first;
* retries (opt-in, see `RetryPolicy`) only of transient failures and only of
  calls that are safe to repeat: never a reserve or a drain, never an enqueue
  unless every job has an idempotency key;
* concurrent single-job `enqueue` calls made in the same event-loop moment go
  to the server as one best-effort ``enqueue`` batch, and acks, nacks and
  extends as one ``settle`` (PROTOCOL.md §5.13), when the server advertises its
  batch limits; each caller still gets its own result or its own typed error,
  is retried (per its `RetryPolicy`) on its own, and waits no longer than it
  would alone (the batch leaves at the loop's next turn; `enqueue_linger` is
  an opt-in wait for more);
* a reserve whose caller stopped waiting (cancelled, or its deadline passed)
  never consumes an attempt: it is withdrawn on the server at once (PROTOCOL.md
  §5.12), and if its answer had already left with jobs they are *released*
  (§5.11: ready again at once, the attempt not counted), never nacked;
  `close` does the same for reserves still waiting.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import random
import ssl
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from sepp._version import __version__
from sepp.client import _admin, _convert, _otel
from sepp.client._coalesce import (
    ENQUEUE_EAGER_CALLS,
    ENQUEUE_FRAMES_AHEAD,
    Call,
    Coalescer,
    Outcome,
)
from sepp.client._connection import Connection, Endpoint, OrphanHandler, Receiver, parse_address
from sepp.client._retry import RetryPolicy, backoff_delays, is_transient
from sepp.client.errors import (
    CONNECTION_LOST,
    DEADLINE_EXCEEDED,
    BatchResultCountMismatchError,
    BatchValidationError,
    ClientClosedError,
    ConnectError,
    EmptyBatchError,
    InvalidApiKeyError,
    JobConversionError,
    JobRejectedError,
    JobRejection,
    JobValidationError,
    MalformedResponseError,
    MalformedServerInfoError,
    MessageTooLargeError,
    NotLeaderError,
    SeppError,
    ServerInfoError,
    TransportError,
    UnauthenticatedError,
    UndecodableDeadLetterError,
    UndecodableJobError,
    error_from_response,
    rejection_from_wire,
)
from sepp.client.types import (
    RESERVE_ORDERS,
    AdminOutcomes,
    ClusterInfo,
    DeadLetterRecord,
    DeleteQueueResult,
    EnqueueAck,
    EnqueueRequest,
    HealthStatus,
    Job,
    JobCtx,
    JobInfo,
    JobPage,
    PurgeResult,
    PutQueueResult,
    QueueChange,
    QueueInfo,
    QueueStats,
    ReserveOptions,
    ScheduleChange,
    ScheduleInfo,
    ServerInfo,
    UndecodableDeadLetter,
    UndecodableJob,
)
from sepp.protocol import OK, PROTOCOL_VERSION, UNAVAILABLE, Response
from sepp.protocol import messages as _messages
from sepp.protocol.errors import REASON_NOT_LEADER
from sepp.protocol.messages import (
    INT64_MAX,
    INT64_MIN,
    OP_ACK,
    OP_DRAIN_DEAD_LETTERS,
    OP_ENQUEUE,
    OP_EXTEND,
    OP_HEALTH,
    OP_NACK,
    OP_QUEUE_STATS,
    OP_RELEASE,
    OP_RESERVE,
    OP_SERVER_INFO,
    OP_SETTLE,
    RETRY_DEAD_LETTER,
    RETRY_DEFAULT,
    RETRY_DELAY,
)

__all__ = ["Lease", "RetryDirective", "RetryPolicy", "SeppClient"]

logger = logging.getLogger("sepp.client")

CLIENT_VERSION = __version__
CLIENT_NAME = f"sepp-python/{CLIENT_VERSION}"

DEFAULT_CONNECT_TIMEOUT = timedelta(seconds=5)
DEFAULT_RPC_TIMEOUT = timedelta(seconds=30)
# A reserve's deadline is its wait plus this, so the server's own empty answer
# at the end of the wait comes back before the client gives up.
RESERVE_DEADLINE_SLACK = timedelta(seconds=10)
# The largest response frame accepted. A reserve answer can hold
# max_reserve_batch (256) jobs of max_payload_bytes (1 MiB) each; refusing one
# would strand the jobs it leased, so the default is generous. Nothing is
# allocated up front: the limit only stops a corrupt length prefix.
DEFAULT_RECEIVE_BYTES_MAX = 512 * 1024 * 1024

# How long `close` waits for the server to answer the reserves it withdraws, and
# then for the releases of any jobs those answers still carried.
CLOSE_WITHDRAW_TIMEOUT = timedelta(seconds=2)

# The longest `enqueue_linger` a client accepts: a linger only trades latency
# for larger batches, and past this it costs more than a batch saves.
ENQUEUE_LINGER_MAX = timedelta(milliseconds=100)
# Lower estimates of an encoded job map (beyond its payload) and lease item, and
# the room kept for a batch request's envelope, when coalesced calls are cut into
# frames; a batch the estimate let through that is still over the frame limit
# is halved until it fits (`MessageTooLargeError` only for a call that does not
# fit alone, as it would alone).
ENQUEUE_ITEM_BYTES_MIN = 64
SETTLE_ITEM_BYTES_MIN = 48
BATCH_ENVELOPE_BYTES = 64
# How many distinct reserve durations / worker ids the client keeps converted.
RESERVE_TIMINGS_KEPT = 64

# Cluster mode: while no node answers as leader (an election, ~3 s after a
# leader dies: the lease's TTL), the client asks the addresses again after
# waiting this long, doubling up to the maximum, times a random factor in
# [0.5, 1.0) so that many clients do not ask in step; within the call's deadline.
LEADER_SEARCH_BACKOFF_MIN = timedelta(milliseconds=50)
LEADER_SEARCH_BACKOFF_MAX = timedelta(seconds=1)
# Leader addresses learned from nodes (not among those given) that the client
# keeps as candidates; a replaced node's address is forgotten past this many.
LEARNED_ADDRESSES_MAX = 16


def _not_a_job_ctx(ctx: object, takes: str) -> TypeError:
    """The TypeError for a lease call given something other than a reserved job's
    JobCtx; the reserved `Job` itself (the easy slip) is named."""
    hint = " (pass job.ctx)" if isinstance(ctx, Job) else ""
    return TypeError(f"{takes}; got {type(ctx).__name__}{hint}")


@dataclass(frozen=True)
class RetryDirective:
    """What a `SeppClient.nack` asks the server to do with the job next.

    Job-level retry (the handler failed), as opposed to the connection-level
    `RetryPolicy` (the call failed). Use `DEFAULT` (the queue's retry policy),
    `DEAD_LETTER` (no more attempts) or ``RetryDirective.after(delay)``.
    """

    kind: str
    delay: timedelta | None = None

    DEFAULT: ClassVar[RetryDirective]
    DEAD_LETTER: ClassVar[RetryDirective]

    @classmethod
    def default(cls) -> RetryDirective:
        """Retry under the queue's policy (backoff and max attempts)."""
        return cls("default")

    @classmethod
    def after(cls, delay: timedelta) -> RetryDirective:
        """Retry once `delay` has passed (still counting toward max attempts)."""
        return cls("after", delay)

    @classmethod
    def dead_letter(cls) -> RetryDirective:
        """Do not retry: dead-letter the job now."""
        return cls("dead_letter")


RetryDirective.DEFAULT = RetryDirective.default()
RetryDirective.DEAD_LETTER = RetryDirective.dead_letter()


class Lease:
    """The lease of one reserved job, kept in its `JobCtx`; renews it. Not built
    by hand. `enqueued_at_ms` is the job's enqueued_at as the delivery carried
    it: with the attempt it fences this lease's ack, nack and extend
    (PROTOCOL.md §5.3), so they cannot settle a later delivery of the job after
    an operator requeue (which restarts the attempt at 1)."""

    def __init__(
        self,
        client: SeppClient,
        job_id: str,
        attempt: int,
        lease_expires_at_ms: int,
        worker_id: str | None,
        enqueued_at_ms: int,
    ) -> None:
        self._client = client
        self._job_id = job_id
        self._attempt = attempt
        self._worker_id = worker_id
        self._enqueued_at_ms = enqueued_at_ms
        self._known_expiry_ms = lease_expires_at_ms

    @property
    def enqueued_at_ms(self) -> int:
        return self._enqueued_at_ms

    @property
    def worker_id(self) -> str | None:
        return self._worker_id

    @property
    def known_expiry_ms(self) -> int:
        """The latest deadline the server confirmed, in ms since the epoch."""
        return self._known_expiry_ms

    async def extend(self, by: timedelta) -> datetime:
        expiry = await self._client._extend_inner(
            self._job_id, self._attempt, by, self._worker_id, self._enqueued_at_ms
        )
        self._known_expiry_ms = _convert.datetime_to_ms(expiry)
        return expiry


def _build_ssl(
    tls: bool | ssl.SSLContext,
    tls_ca_cert: bytes | None,
    tls_domain: str | None,
    credentials: ssl.SSLContext | None,
    scheme_tls: bool,
) -> ssl.SSLContext | None:
    if credentials is not None:
        return credentials
    if isinstance(tls, ssl.SSLContext):
        return tls
    if not (tls or scheme_tls or tls_ca_cert is not None or tls_domain is not None):
        return None
    if tls_ca_cert is None:
        return ssl.create_default_context()
    # PEM is text; anything else is taken as DER.
    pem = tls_ca_cert.lstrip().startswith(b"-----")
    return ssl.create_default_context(cadata=tls_ca_cert.decode("ascii") if pem else tls_ca_cert)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _SentReserve:
    """A reserve sent by `SeppClient._reserve_now`, its answer still to come."""

    __slots__ = ("connection", "future", "opts", "order", "release", "request_id")

    def __init__(
        self,
        connection: Connection,
        request_id: int,
        future: asyncio.Future[Response],
        release: OrphanHandler,
        opts: ReserveOptions,
        order: str,
    ) -> None:
        self.connection = connection
        self.request_id = request_id
        self.future = future
        self.release = release
        self.opts = opts
        self.order = order


class SeppClient:
    """An async handle to one sepp server.

    Make one with ``await SeppClient.connect(address, ...)``, which also checks
    the server and the API key; the constructor takes the same arguments and
    connects lazily on the first call instead. Use it from one event loop (from
    threads, use `sepp.client.sync.SyncSeppClient`); close it with `close`, or
    use it as an async context manager.
    """

    def __init__(
        self,
        addr: str | Sequence[str],
        *,
        api_key: str | None = None,
        retry_policy: RetryPolicy | None = None,
        tls: bool | ssl.SSLContext = False,
        tls_ca_cert: bytes | None = None,
        tls_domain: str | None = None,
        credentials: ssl.SSLContext | None = None,
        connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT,
        rpc_timeout: timedelta = DEFAULT_RPC_TIMEOUT,
        max_receive_message_bytes: int | None = None,
        client_name: str = CLIENT_NAME,
        enqueue_linger: timedelta = timedelta(0),
        follow_leader: bool = True,
    ) -> None:
        if not isinstance(enqueue_linger, timedelta) or not (
            timedelta(0) <= enqueue_linger <= ENQUEUE_LINGER_MAX
        ):
            raise ValueError(
                f"enqueue_linger must be a timedelta from 0 to {ENQUEUE_LINGER_MAX}, "
                f"got {enqueue_linger!r:.80}"
            )
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise InvalidApiKeyError()
        self._endpoints: list[Endpoint] = []
        for address in _split_addresses(addr):
            host, port, scheme_tls = parse_address(address)
            context = _build_ssl(tls, tls_ca_cert, tls_domain, credentials, scheme_tls)
            endpoint = Endpoint(address, host, port, context, tls_domain or host)
            if any((e.host, e.port) == (host, port) for e in self._endpoints):
                continue
            self._endpoints.append(endpoint)
            if api_key is not None and context is None and not _is_loopback(host):
                logger.warning(
                    "sending an API key to %s without TLS: it travels in plain text", address
                )
        self._addresses = tuple(e.address for e in self._endpoints)
        self._given = len(self._endpoints)
        # The node connected to (or last connected to); a leader a node named,
        # tried first by the next search.
        self._endpoint = self._endpoints[0]
        self._connected_once = False
        self._leader_hint: Endpoint | None = None
        # False: stay on the first node that answers, whatever its role.
        self._follow_leader = follow_leader
        # Cluster mode: several addresses, or a node's hello carried `cluster`.
        self._failover = len(self._endpoints) > 1
        # Connections left for the leader, closing once their requests are answered.
        self._retired: set[Connection] = set()
        self._search_rng = (
            retry_policy.rng
            if retry_policy is not None and retry_policy.rng is not None
            else random.Random()
        )
        self._hello: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "client": client_name}
        if api_key is not None:
            self._hello["api_key"] = api_key
        self._retry_policy = retry_policy or RetryPolicy()
        self._rpc_timeout = rpc_timeout.total_seconds()
        self._connect_timeout = connect_timeout.total_seconds()
        self._receive_bytes_max = max_receive_message_bytes or DEFAULT_RECEIVE_BYTES_MAX
        self._connection: Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()
        # How many connections this client opened (the first one included).
        self.connections_opened = 0
        self._enqueue_linger_s = enqueue_linger.total_seconds()
        # Made on first use, on the loop the client runs on.
        self._enqueues: Coalescer | None = None
        self._settles: Coalescer | None = None
        # The loop the coalesced calls run on (set by the first one).
        self._loop: asyncio.AbstractEventLoop | None = None
        # A reserve's converted durations by (lease, wait), and its orphan
        # handler by worker id: the same every time for a worker.
        self._reserve_timings: dict[tuple[timedelta, timedelta], tuple[int, int, float]] = {}
        self._release_handlers: dict[str | None, OrphanHandler] = {}

    @classmethod
    async def connect(
        cls,
        addr: str | Sequence[str],
        *,
        api_key: str | None = None,
        retry_policy: RetryPolicy | None = None,
        tls: bool | ssl.SSLContext = False,
        tls_ca_cert: bytes | None = None,
        tls_domain: str | None = None,
        credentials: ssl.SSLContext | None = None,
        connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT,
        rpc_timeout: timedelta = DEFAULT_RPC_TIMEOUT,
        max_receive_message_bytes: int | None = None,
        client_name: str = CLIENT_NAME,
        enqueue_linger: timedelta = timedelta(0),
        follow_leader: bool = True,
    ) -> SeppClient:
        """Connect to the server at `addr` and complete the handshake.

        `addr` is ``host:port`` (port 7463 if left out); an ``http://`` or
        ``https://`` prefix is accepted, the latter meaning TLS.

        Cluster mode (issue 19): `addr` may name several nodes, as
        ``"h1:7463,h2:7463,h3:7463"`` or a list. The client tries them in turn
        and keeps its one connection on the leader: a node whose ``hello``
        answer says it is a follower is left for the leader it names; while no
        leader is known it asks the addresses again with a short backoff, until
        `connect_timeout` (or, for a call, the call's deadline) has passed,
        then raises `NotLeaderError` (`ConnectError` if no node could be
        reached). Requests are handled across a failover without user code:

        * refused with ``not_leader`` (the node did nothing): sent again at the
          leader, whatever the operation, reserve included;
        * the connection dropped, or a deposed leader answered
          ``outcome_unknown``: the client reconnects to the new leader and sends
          again only what is safe -- an enqueue whose every job carries an
          idempotency key (the leader drops a repeat: its answer may say
          ``deduplicated``), ack, nack, extend and release (fenced by their
          attempt: a repeat of one that was done answers ``not_found``, raised
          as `JobNotFoundError` as always), and reads. An enqueue without keys
          is NOT sent again (it may have been done: the caller gets the
          `TransportError` / `NotLeaderError`, as from a single node), nor is a
          reserve (its jobs, if it leased any, come back when their leases
          expire: at-least-once); a long-polling reserve on a connection that
          drops fails with `TransportError` as before, and `Worker` simply
          reserves again on the new leader.

        All of this happens within the call's deadline and needs no
        `RetryPolicy`, which still governs the other transient failures. A
        single address of a single node behaves as before: one connection, no
        extra round trip (its ``hello`` answer has no ``cluster``).
        ``follow_leader=False`` keeps the client on the first node that answers,
        whatever its role (to ask a follower for its own `get_server_info` or
        `health`, as ``sepp info`` does): nothing is redirected or sent again,
        and operations a follower refuses raise `NotLeaderError`. TLS is also
        turned on by ``tls=True`` (system trust store), an `ssl.SSLContext` as
        `tls` or `credentials`, `tls_ca_cert` (PEM or DER bytes of a private
        CA) or `tls_domain` (the name to verify, when it differs from the host).

        `rpc_timeout` bounds every call but `reserve` (whose deadline is its
        wait plus 10 s); `connect_timeout` bounds connecting plus ``hello``.
        `max_receive_message_bytes` caps one response frame (512 MiB by
        default). `client_name` is sent in ``hello`` for the server's logs.

        Concurrent single-job `enqueue` calls are sent together at the loop's
        next turn; `enqueue_linger` (default 0, at most 100 ms) makes the client
        wait up to that long for more before sending (a batch that fills up
        leaves at once): more jobs per request, at that much latency.

        Raises `ConnectError` when the server cannot be reached or does not
        complete the handshake in time (in cluster mode: no node could be
        reached; `NotLeaderError` when nodes answered but none as leader),
        `UnsupportedProtocolError` when it
        speaks another protocol version, `UnauthenticatedError` when it refuses
        the API key, `InvalidApiKeyError` for an empty key.
        """
        client = cls(
            addr,
            api_key=api_key,
            retry_policy=retry_policy,
            tls=tls,
            tls_ca_cert=tls_ca_cert,
            tls_domain=tls_domain,
            credentials=credentials,
            connect_timeout=connect_timeout,
            rpc_timeout=rpc_timeout,
            max_receive_message_bytes=max_receive_message_bytes,
            client_name=client_name,
            enqueue_linger=enqueue_linger,
            follow_leader=follow_leader,
        )
        try:
            await client._ensure_connection()
        except BaseException:
            await client.close()
            raise
        logger.info(
            "connected to sepp server %s (tls=%s)", client.address, client._endpoint.ssl is not None
        )
        return client

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The address of the node connected to (in cluster mode, the leader),
        or last connected to; before the first connection the first address."""
        return self._endpoint.address

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses given to the client, in order."""
        return self._addresses

    @property
    def cluster(self) -> ClusterInfo | None:
        """What the connected node said of itself in its ``hello`` answer in
        cluster mode (role, node id, epoch, leader); None for a single node or
        without a live connection."""
        connection = self._connection
        if connection is None or connection.handshake is None:
            return None
        return connection.handshake.cluster

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Close the connection. Calls still waiting fail with
        `ClientClosedError`; later calls raise it. Closing twice is harmless.

        Long-polling reserves still waiting are withdrawn first (the server
        answers them empty), and jobs an answer was already carrying are
        released (no attempt counted), so nothing is left parked or leased to
        this client; this waits at most `CLOSE_WITHDRAW_TIMEOUT` (2 s) each."""
        self._closed = True
        connection = self._connection
        if connection is not None and not connection.closed:
            limit = CLOSE_WITHDRAW_TIMEOUT.total_seconds()
            await connection.withdraw_pending(limit)
            if self._background:
                await asyncio.wait(list(self._background), timeout=limit)
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
        retired, self._retired = self._retired, set()
        for old in retired:
            await old.close()

    async def __aenter__(self) -> SeppClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _ensure_connection(self, deadline: float | None = None) -> Connection:
        """The live connection, opened (to the leader, in cluster mode) if there
        is none. `deadline` (loop time) bounds the search for a leader; None:
        `connect_timeout` from now."""
        connection = self._connection
        if connection is not None and not connection.closed and not self._closed:
            return connection
        async with self._connect_lock:
            if self._closed:
                raise ClientClosedError()
            connection = self._connection
            if connection is None or connection.closed:
                if connection is not None:
                    logger.info("reconnecting to sepp server %s", self._endpoint.address)
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + self._connect_timeout
                connection = await self._open_leader(deadline)
                if self._closed:
                    await connection.close()
                    raise ClientClosedError()
                self._connection = connection
            return connection

    # -- cluster mode: finding the leader ---------------------------------------------------

    def _candidates(self) -> list[Endpoint]:
        """The order of one search: a leader some node named first, then the
        addresses from the one after the node last connected to (which goes
        last: it just failed or stopped being the leader)."""
        endpoints = self._endpoints
        start = 0
        if self._connected_once and self._endpoint in endpoints:
            start = (endpoints.index(self._endpoint) + 1) % len(endpoints)
        order = endpoints[start:] + endpoints[:start]
        hint = self._leader_hint
        if hint is not None:
            order = [hint, *(e for e in order if e is not hint)]
        return order

    def _endpoint_for(self, address: str) -> Endpoint | None:
        """The endpoint of a leader address a node named: one of those given,
        or a new one (with the client's TLS settings), kept as a candidate."""
        try:
            host, port, _ = parse_address(address)
        except ValueError:
            logger.warning("a sepp node named a leader with a malformed address %r", address)
            return None
        for endpoint in self._endpoints:
            if (endpoint.host, endpoint.port) == (host, port):
                return endpoint
        first = self._endpoints[0]
        server_hostname = host if first.server_hostname == first.host else first.server_hostname
        endpoint = Endpoint(address, host, port, first.ssl, server_hostname)
        if len(self._endpoints) - self._given >= LEARNED_ADDRESSES_MAX:
            del self._endpoints[self._given]
        self._endpoints.append(endpoint)
        return endpoint

    def _search_delays(self) -> Iterator[float]:
        delay = LEADER_SEARCH_BACKOFF_MIN.total_seconds()
        cap = LEADER_SEARCH_BACKOFF_MAX.total_seconds()
        while True:
            yield delay * (0.5 + 0.5 * self._search_rng.random())
            delay = min(delay * 2, cap)

    async def _open_leader(self, deadline: float) -> Connection:
        """Open a connection to the leader (a single node: to it) by `deadline`.

        Tries the candidates in turn; a node that answers ``hello`` as anything
        but leader is closed and its leader (if it names one) tried next. One
        address of a node without ``cluster`` fails at once, as a single node
        always did; in cluster mode the search repeats with backoff until the
        deadline, then raises `NotLeaderError` (nodes answered, none as leader)
        or `ConnectError` (none could be reached)."""
        loop = asyncio.get_running_loop()
        delays: Iterator[float] | None = None
        not_leader: NotLeaderError | None = None
        unreachable: ConnectError | None = None
        while True:
            tried: set[tuple[str, int]] = set()
            queue = deque(self._candidates())
            while queue:
                endpoint = queue.popleft()
                if (endpoint.host, endpoint.port) in tried:
                    continue
                tried.add((endpoint.host, endpoint.port))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    connection = await Connection.open(
                        endpoint,
                        hello=self._hello,
                        timeout=min(self._connect_timeout, remaining),
                        receive_bytes_max=self._receive_bytes_max,
                    )
                except UnauthenticatedError:
                    raise
                except ConnectError as exc:
                    if exc.__class__ is not ConnectError:  # UnsupportedProtocolError
                        raise
                    unreachable = exc
                    if endpoint is self._leader_hint:
                        self._leader_hint = None  # gone: not first in line any more
                    continue
                self.connections_opened += 1
                handshake = connection.handshake
                cluster = handshake.cluster if handshake is not None else None
                if cluster is not None:
                    self._failover = True
                if cluster is None or cluster.is_leader or not self._follow_leader:
                    self._endpoint = endpoint
                    self._connected_once = True
                    self._leader_hint = None
                    return connection
                await connection.close()
                logger.info(
                    "sepp node %s is a %s (leader: %s)",
                    endpoint.address,
                    cluster.role,
                    cluster.leader or "unknown",
                )
                not_leader = NotLeaderError(
                    f"sepp node {endpoint.address} is a {cluster.role}, not the leader",
                    leader=cluster.leader,
                )
                if cluster.leader is not None:
                    leader = self._endpoint_for(cluster.leader)
                    if leader is not None:
                        self._leader_hint = leader
                        queue.appendleft(leader)
            if not self._failover and unreachable is not None:
                raise unreachable  # one address, no cluster: as a single node always did
            remaining = deadline - loop.time()
            if remaining <= 0:
                if not_leader is not None:
                    raise NotLeaderError(
                        f"no sepp node answered as the leader in time (asked: "
                        f"{', '.join(self._addresses)}): {not_leader}",
                        leader=not_leader.leader,
                    )
                if unreachable is not None:
                    raise ConnectError(", ".join(self._addresses), str(unreachable.reason))
                raise ConnectError(", ".join(self._addresses), "no time left to connect")
            if delays is None:
                delays = self._search_delays()
            await asyncio.sleep(min(next(delays), remaining))

    def _leave(
        self, connection: Connection | None, leader: str | None, why: str = "not the leader"
    ) -> None:
        """`connection`'s node is not (or no longer) the leader, or did not
        answer in time: the next call looks for the leader (`leader`, if the
        node named one, first). Requests already on that connection get their
        own answers there (`retire`)."""
        if leader is not None:
            endpoint = self._endpoint_for(leader)
            if endpoint is not None:
                self._leader_hint = endpoint
        if connection is None or self._connection is not connection:
            return
        logger.info(
            "leaving sepp node %s (%s); looking for the leader (named: %s)",
            connection.endpoint.address,
            why,
            leader or "none",
        )
        self._connection = None
        connection.retire()
        self._retired = {c for c in self._retired if not c.closed}
        if not connection.closed:
            self._retired.add(connection)

    def _resend(self, error: SeppError, retry_safe: bool) -> bool:
        """Whether a request that failed with `error` goes to the leader again
        without the `RetryPolicy`: a ``not_leader`` refusal always (nothing was
        done); in cluster mode a dropped connection, a node shutting down or an
        ``outcome_unknown`` refusal when the request is safe to repeat."""
        if not self._follow_leader:
            return False
        if isinstance(error, NotLeaderError):
            return not error.outcome_unknown or (self._failover and retry_safe)
        if not self._failover or not retry_safe or not isinstance(error, TransportError):
            return False
        return error.code in (CONNECTION_LOST, UNAVAILABLE)

    def _before_resend(self, error: SeppError, connection: Connection | None) -> None:
        if isinstance(error, NotLeaderError):
            self._leave(connection, error.leader)
        elif isinstance(error, TransportError) and error.code == UNAVAILABLE:
            self._leave(connection, None, "shutting down")

    # -- the call path ------------------------------------------------------------------------

    async def _call(
        self,
        op: str,
        body: dict[str, Any],
        *,
        retry_safe: bool,
        timeout: float | None = None,
        on_orphan: OrphanHandler | None = None,
        withdrawable: bool = False,
        failed: SeppError | None = None,
    ) -> dict[str, Any]:
        """Send `op` and return the body of its ``ok`` answer, raising the
        mapped error otherwise; retry transient failures if `retry_safe` and
        the policy allows. `failed`: the first attempt was already made (as
        part of a coalesced request) and failed so."""
        policy = self._retry_policy
        delays = None
        attempt = 1
        loop = asyncio.get_running_loop()
        limit = self._rpc_timeout if timeout is None else timeout
        started = loop.time()
        deadline = started + limit
        sent = body
        failed_on: Connection | None = None
        # Resends of this call to the leader; from the second on they wait a
        # little (the search's backoff): nodes still disagreeing on who leads,
        # or a node that keeps dropping the connection, are not asked in a loop.
        resends = 0
        resend_delays: Iterator[float] | None = None
        while True:
            if failed is None:
                failed_on = None
                try:
                    connection = self._connection
                    if connection is None or connection.closed or self._closed:
                        connection = await self._ensure_connection(
                            deadline if self._failover else None
                        )
                    failed_on = connection
                    # The call's own deadline bounds the search and the resends
                    # (a single node: each try has the whole timeout, as always).
                    left = deadline - loop.time() if self._failover else limit
                    response = await connection.request(
                        op,
                        sent,
                        timeout=left,
                        on_orphan=on_orphan,
                        withdrawable=withdrawable,
                    )
                    if response.status == OK:
                        return response.body
                    raise error_from_response(op, response.status, response.body)
                except SeppError as error:
                    failed = error
            if self._failover and _timed_out(failed):
                # No answer in time: the node may be stopped (SIGSTOP, a
                # partition) while another leads. Look for the leader next time.
                self._leave(failed_on, None, "no answer in time")
            if self._resend(failed, retry_safe) and loop.time() < deadline:
                # Cluster mode, failover: to the leader, within this call's deadline.
                logger.info("%s: %s; sending it to the leader", op, failed)
                self._before_resend(failed, failed_on)
                if resends:
                    if resend_delays is None:
                        resend_delays = self._search_delays()
                    await asyncio.sleep(min(next(resend_delays), max(0.0, deadline - loop.time())))
                resends += 1
                sent = dict(body)
                if op == OP_RESERVE and type(body.get("wait_ms")) is int:
                    waited_ms = int((loop.time() - started) * 1000)
                    sent["wait_ms"] = max(0, body["wait_ms"] - waited_ms)
                failed = None
                continue
            if not retry_safe or attempt >= policy.max_attempts or not is_transient(failed):
                raise failed
            if delays is None:
                delays = backoff_delays(policy)
            delay = next(delays)
            logger.warning(
                "%s failed (%s: %s); retry %d of %d in %.3f s",
                op,
                type(failed).__name__,
                failed,
                attempt,
                policy.max_attempts - 1,
                delay,
            )
            failed = None
            await asyncio.sleep(delay)
            attempt += 1
            # A retry under the policy has the whole timeout again.
            started = loop.time()
            deadline = started + limit
            sent = body

    # -- coalescing ----------------------------------------------------------------------------

    def _coalescing(self, settle: bool) -> Connection | None:
        """The live connection, if calls of this kind can be coalesced on it (the
        server advertised the batch limit), else None (send them alone)."""
        connection = self._connection
        if connection is None or connection.closed or self._closed:
            return None
        handshake = connection.handshake
        if handshake is None:
            return None
        if (handshake.max_settle_batch if settle else handshake.max_enqueue_batch) is None:
            return None
        return connection

    def _coalescer(self, settle: bool) -> Coalescer:
        coalescer = self._settles if settle else self._enqueues
        if coalescer is None:
            loop = asyncio.get_running_loop()
            handshake = self._connection.handshake if self._connection is not None else None
            limit = (
                (handshake.max_settle_batch if settle else handshake.max_enqueue_batch)
                if handshake is not None
                else None
            )
            if settle:
                coalescer = self._settles = Coalescer(loop, self._send_coalesced, full=limit or 1)
            else:
                coalescer = self._enqueues = Coalescer(
                    loop,
                    self._send_coalesced,
                    linger_s=self._enqueue_linger_s,
                    full=limit or 1,
                    eager=ENQUEUE_EAGER_CALLS,
                    busy=self._enqueues_ahead,
                )
        return coalescer

    def _enqueues_ahead(self) -> bool:
        """Whether `ENQUEUE_FRAMES_AHEAD` enqueue requests are in flight on the
        connection: then new enqueues wait for an answer (`Coalescer`)."""
        connection = self._connection
        return connection is not None and connection.enqueues_in_flight >= ENQUEUE_FRAMES_AHEAD

    def _coalesced(
        self, op: str, wire: dict[str, Any], retry_safe: bool, size: int
    ) -> asyncio.Future[dict[str, Any]]:
        """Make the single call `op` (its job map or lease body `wire`) part of the
        batch leaving at the loop's next turn; the future of its own result (an
        enqueue's result map, or the ``ok`` body of an ack/nack/extend). The
        caller first waits for a congested connection (`Connection.congested`)."""
        future: asyncio.Future[dict[str, Any]] = self._loop_of_calls().create_future()
        self._coalescer(op != OP_ENQUEUE).submit(Call(op, wire, retry_safe, size, future))
        return future

    def _loop_of_calls(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _send_coalesced(self, calls: list[Call]) -> None:
        """Send coalesced calls of one kind, in order, in as few requests as the
        server's batch limit and frame limit allow."""
        if self._closed:
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(ClientClosedError())
            return
        connection = self._connection
        if connection is None or connection.closed:
            # Dropped since these calls were made: each goes alone, reconnecting.
            for call in calls:
                self._retry_alone(call, None)
            return
        handshake = connection.handshake
        assert handshake is not None
        settle = calls[0].op != OP_ENQUEUE
        limit = (handshake.max_settle_batch if settle else handshake.max_enqueue_batch) or 1
        self._coalescer(settle).full = limit
        budget = connection.max_message_bytes - BATCH_ENVELOPE_BYTES
        chunk: list[Call] = []
        size = 0
        for call in calls:
            if chunk and (len(chunk) >= limit or size + call.size > budget):
                self._send_chunk(connection, chunk)
                chunk, size = [], 0
            chunk.append(call)
            size += call.size
        self._send_chunk(connection, chunk)

    def _send_chunk(self, connection: Connection, chunk: list[Call]) -> None:
        first = chunk[0]
        if len(chunk) == 1:
            # Alone: the single operation itself, exactly as an uncoalesced call.
            op = first.op
            first.wire.pop("kind", None)
            body = {"jobs": [first.wire]} if op == OP_ENQUEUE else first.wire
        elif first.op == OP_ENQUEUE:
            op = OP_ENQUEUE
            body = {"jobs": [call.wire for call in chunk]}
        else:
            op = OP_SETTLE
            items = []
            for call in chunk:
                item = call.wire
                item["kind"] = call.op
                items.append(item)
            body = {"items": items}
        answered = functools.partial(self._chunk_answered, chunk, op, connection)
        try:
            connection.send_to(op, body, timeout=self._rpc_timeout, receiver=Receiver(answered))
            if op == OP_ENQUEUE:
                connection.enqueues_in_flight += 1
        except MessageTooLargeError as error:
            if len(chunk) == 1:
                self._fail(first, error)
                return
            half = len(chunk) // 2
            self._send_chunk(connection, chunk[:half])
            self._send_chunk(connection, chunk[half:])
            return
        except SeppError as error:
            for call in chunk:
                self._fail(call, error)
            return
        except Exception as error:  # e.g. a value msgpack cannot encode
            if len(chunk) == 1:
                # Its caller's error, as the call alone would have raised it.
                if not first.future.done():
                    first.future.set_exception(error)
                return
            half = len(chunk) // 2
            self._send_chunk(connection, chunk[:half])
            self._send_chunk(connection, chunk[half:])
            return

    def _chunk_answered(
        self,
        chunk: list[Call],
        op: str,
        connection: Connection,
        response: Response | None,
        error: SeppError | None,
    ) -> None:
        """Hand each caller of a coalesced request its own outcome."""
        if op == OP_ENQUEUE:
            connection.enqueues_in_flight -= 1
            held = self._enqueues
            if held is not None and held.held and not self._enqueues_ahead():
                held.flush()  # the enqueues held for this answer leave first
        if response is None:
            if self._failover and error is not None and _timed_out(error):
                self._leave(connection, None, "no answer in time")  # as in `_call`
            for call in chunk:
                self._fail(call, error or ClientClosedError())
            return
        status, body = response.status, response.body
        if status == UNAVAILABLE and body.get("reason") == REASON_NOT_LEADER:
            # Not the leader (any more): its callers' retries go to the leader.
            leader = body.get("leader")
            self._leave(connection, leader if isinstance(leader, str) and leader else None)
        if status != OK:
            for call in chunk:
                self._fail(call, error_from_response(call.op, status, body))
            return
        if op != OP_ENQUEUE and op != OP_SETTLE:
            _deliver(chunk[0], body)
            return
        results = body.get("results")
        if not isinstance(results, list) or len(results) != len(chunk):
            failure: SeppError = (
                MalformedResponseError(f"a {op} answer needs a 'results' array")
                if not isinstance(results, list)
                else BatchResultCountMismatchError(len(chunk), len(results))
            )
            for call in chunk:
                self._fail(call, failure)
            return
        if op == OP_ENQUEUE:
            for call, raw in zip(chunk, results, strict=True):
                _deliver(call, raw)
            return
        for call, raw in zip(chunk, results, strict=True):
            item_status = raw.get("status") if isinstance(raw, dict) else None
            if item_status == OK:
                _deliver(call, raw)
            elif isinstance(item_status, str):
                self._fail(call, error_from_response(call.op, item_status, raw))
            else:
                self._fail(call, MalformedResponseError("a settle result needs a 'status'"))

    def _fail(self, call: Call, error: SeppError) -> None:
        """A coalesced call failed with `error`: retried alone if it may be and
        the policy allows, else the caller gets the error."""
        if call.future.done():
            return
        if self._resend(error, call.retry_safe) or (
            call.retry_safe and self._retry_policy.max_attempts > 1 and is_transient(error)
        ):
            self._retry_alone(call, error)
            return
        call.future.set_exception(error)

    def _retry_alone(self, call: Call, failed: SeppError | None) -> None:
        task = asyncio.get_running_loop().create_task(self._call_alone(call, failed))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        # A task cancelled before it ran (by `close`) never reaches its handler.
        task.add_done_callback(functools.partial(_closed_if_unanswered, call))

    async def _call_alone(self, call: Call, failed: SeppError | None) -> None:
        """One coalesced call sent on its own (after its batch failed in a way
        worth retrying, or when there was no connection to batch on)."""
        call.wire.pop("kind", None)
        enqueue = call.op == OP_ENQUEUE
        body = {"jobs": [call.wire]} if enqueue else call.wire
        future = call.future
        try:
            answer = await self._call(call.op, body, retry_safe=call.retry_safe, failed=failed)
            result = self._results(answer, 1)[0] if enqueue else answer
        except SeppError as error:
            if not future.done():
                future.set_exception(error)
            return
        except asyncio.CancelledError:
            if not future.done():
                future.set_exception(ClientClosedError())
            raise
        if not future.done():
            future.set_result(result)

    # -- enqueue -------------------------------------------------------------------------------

    def _enqueue_body(
        self, jobs: Iterable[EnqueueRequest], atomic: bool
    ) -> tuple[dict[str, Any], bool]:
        if isinstance(jobs, EnqueueRequest):
            raise TypeError("expected a list of EnqueueRequest; for one job use enqueue(job)")
        requests = list(jobs)
        if not requests:
            raise EmptyBatchError()
        for index, request in enumerate(requests):
            if not isinstance(request, EnqueueRequest):
                raise TypeError(
                    f"job {index} must be an EnqueueRequest, e.g. EnqueueRequest('emails', "
                    f"'send_welcome'); got {type(request).__name__}"
                )
        trace = _otel.current_trace_headers()
        body: dict[str, Any] = {"jobs": [_convert.enqueue_job_to_wire(r, trace) for r in requests]}
        if atomic:
            body["atomic"] = True
        # Only the server's dedup makes a repeated enqueue harmless.
        retry_safe = all(r.idempotency_key is not None for r in requests)
        return body, retry_safe

    @staticmethod
    def _ack_from_wire(raw: Any) -> EnqueueAck:
        if not isinstance(raw, dict):
            raise MalformedResponseError("an enqueue result must be a map")
        job_id = raw.get("job_id")
        deduplicated = raw.get("deduplicated", False)
        if not isinstance(job_id, str) or not isinstance(deduplicated, bool):
            raise MalformedResponseError("an enqueue result needs job_id and deduplicated")
        return EnqueueAck(job_id, deduplicated)

    @staticmethod
    def _results(answer: dict[str, Any], expected: int) -> list[Any]:
        results = answer.get("results")
        if not isinstance(results, list):
            raise MalformedResponseError("an enqueue answer needs a 'results' array")
        if len(results) != expected:
            raise BatchResultCountMismatchError(expected, len(results))
        return results

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest]
    ) -> list[EnqueueAck | JobRejection]:
        """Enqueue jobs independently of each other (best effort).

        Returns one entry per job, in order: an `EnqueueAck`, or the
        `JobRejection` that refused it. A failure of the whole call (empty
        batch, transport, server error) raises. Retried per the `RetryPolicy`
        only if every job has an idempotency key. See `enqueue_atomic` for
        all-or-nothing.
        """
        body, retry_safe = self._enqueue_body(jobs, atomic=False)
        with _otel.client_span("sepp.enqueue"):
            answer = await self._call(OP_ENQUEUE, body, retry_safe=retry_safe)
        out: list[EnqueueAck | JobRejection] = []
        for raw in self._results(answer, len(body["jobs"])):
            if isinstance(raw, dict) and "rejection" in raw:
                out.append(rejection_from_wire(raw["rejection"]))
            else:
                out.append(self._ack_from_wire(raw))
        return out

    async def enqueue(self, job: EnqueueRequest) -> EnqueueAck:
        """Enqueue one job; raises `JobRejectedError` if the server refuses it."""
        if type(job) is not EnqueueRequest and not isinstance(job, EnqueueRequest):
            raise TypeError(
                "enqueue takes an EnqueueRequest, e.g. EnqueueRequest('emails', "
                f"'send_welcome'); got {type(job).__name__}"
            )
        connection = self._coalescing(settle=False)
        if connection is None:
            result = (await self.enqueue_batch([job]))[0]
            if isinstance(result, JobRejection):
                raise JobRejectedError(result)
            return result
        # Joins the jobs other callers enqueue in the same moment (one frame).
        if _otel.missing() and not connection.congested:
            # No OpenTelemetry: no span to open, no trace context to send.
            raw = await self._enqueue_future(job, None)
        else:
            with _otel.client_span("sepp.enqueue"):
                trace = _otel.current_trace_headers()
                if connection.congested:
                    await connection.wait_writable(self._rpc_timeout)
                raw = await self._enqueue_future(job, trace)
        # The usual result read here, not through `_enqueue_answer`: ~2 µs a call.
        if type(raw) is dict and "rejection" not in raw:
            job_id = raw.get("job_id")
            deduplicated = raw.get("deduplicated", False)
            if type(job_id) is str and type(deduplicated) is bool:
                return EnqueueAck(job_id, deduplicated)
        return self._enqueue_answer(raw)

    def _enqueue_future(
        self, job: EnqueueRequest, trace: tuple[str, str | None] | None
    ) -> asyncio.Future[dict[str, Any]]:
        """`job` joined to this moment's enqueue batch (`_coalesced` for one
        enqueue, with fewer calls); the future of its result map."""
        loop = self._loop
        if loop is None:
            loop = self._loop_of_calls()
        coalescer = self._enqueues
        if coalescer is None:
            coalescer = self._coalescer(False)
        payload = job.payload
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        coalescer.submit(
            Call(
                OP_ENQUEUE,
                _convert.enqueue_job_to_wire(job, trace),
                job.idempotency_key is not None,
                ENQUEUE_ITEM_BYTES_MIN + (0 if payload is None else len(payload.data)),
                future,
            )
        )
        return future

    @classmethod
    def _enqueue_answer(cls, raw: Any) -> EnqueueAck:
        """One job's result of an enqueue: its ack, or raise its rejection."""
        if type(raw) is dict and "rejection" in raw:
            raise JobRejectedError(rejection_from_wire(raw["rejection"]))
        return cls._ack_from_wire(raw)

    # -- calls started on the loop without a coroutine (the sync client's) -------------------

    def _enqueue_nowait(self, job: EnqueueRequest, outcome: Outcome) -> bool:
        """On the client's loop: `job` joined to this moment's enqueue batch, its
        result map (see `_enqueue_answer`) or error to go to `outcome`. False
        when the call cannot be coalesced now (no live connection with batch
        limits, a congested socket, OpenTelemetry on): make the ordinary call."""
        connection = self._coalescing(settle=False)
        if connection is None or connection.congested or _otel.api() is not None:
            return False
        payload = job.payload
        size = ENQUEUE_ITEM_BYTES_MIN + (0 if payload is None else len(payload.data))
        wire = _convert.enqueue_job_to_wire(job)
        self._coalescer(False).submit(
            Call(OP_ENQUEUE, wire, job.idempotency_key is not None, size, outcome)
        )
        return True

    def _settle_nowait(self, op: str, body: dict[str, Any], outcome: Outcome) -> bool:
        """On the client's loop: an ack, nack or extend joined to this moment's
        settle, its ``ok`` body or error to go to `outcome`; False as for
        `_enqueue_nowait`."""
        connection = self._coalescing(settle=True)
        if connection is None or connection.congested or _otel.api() is not None:
            return False
        self._coalescer(True).submit(Call(op, body, True, SETTLE_ITEM_BYTES_MIN, outcome))
        return True

    def _flush_coalesced(self) -> None:
        """Send what the coalescers hold now instead of at the loop's next turn
        (the sync client's loop, once it has started every call handed over)."""
        for coalescer in (self._enqueues, self._settles):
            if coalescer is not None and len(coalescer):
                coalescer.flush()

    async def enqueue_atomic(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck]:
        """Enqueue jobs all-or-nothing.

        Returns one `EnqueueAck` per job, in order. If any job is refused,
        nothing is stored and `BatchValidationError` lists every failing job
        with its index.
        """
        body, retry_safe = self._enqueue_body(jobs, atomic=True)
        with _otel.client_span("sepp.enqueue_atomic"):
            answer = await self._call(OP_ENQUEUE, body, retry_safe=retry_safe)
        failures = answer.get("failures")
        if failures is not None:
            if not isinstance(failures, list) or not failures:
                raise MalformedResponseError("'failures' must be a non-empty array")
            errors = []
            for failure in failures:
                index = failure.get("index") if isinstance(failure, dict) else None
                if type(index) is not int:
                    raise MalformedResponseError("an atomic failure needs an integer index")
                errors.append(
                    JobValidationError(index, rejection_from_wire(failure.get("rejection")))
                )
            raise BatchValidationError(errors)
        return [self._ack_from_wire(raw) for raw in self._results(answer, len(body["jobs"]))]

    # -- reserve and leases -------------------------------------------------------------------

    async def reserve(self, opts: ReserveOptions, *, order: str = "strict") -> list[Job] | None:
        """Long-poll for jobs.

        ``order="fair"`` (issue 17) takes them from ``opts.queues`` in weighted
        round robin (the queues' ``weight`` settings), so a busy queue cannot
        starve the others (PROTOCOL.md 5.2); ``"strict"`` (default) in the
        order given. Another value is a ValueError.

        Waits up to ``opts.wait_timeout`` for at least one job and returns the
        leased jobs (at most ``opts.max_jobs``), or ``None`` when the wait ended
        empty — the normal idle case: call again. Every job must be acked,
        nacked or extended before ``job.ctx.lease_expires_at``.

        Never retried after a failure that may have leased jobs (a dropped
        connection, a deadline, ``outcome_unknown``); in a cluster, a reserve a
        node refused as not the leader (nothing was done) is sent to the
        leader, with what is left of its wait. A job the client cannot decode
        is never skipped: the answer is handed over as `UndecodableJobError`,
        whose ``undecodable``
        lists such jobs raw (id, attempt, reason; leased to you: nack them, e.g.
        to the dead-letter store, or ack them) and whose ``jobs`` holds the
        jobs of the same answer that decoded. If the caller stops waiting
        (cancellation, deadline), the reserve is withdrawn on the server; if
        its answer had already left with jobs, they are released (ready at
        once, no attempt counted).
        """
        body, deadline, release = self._reserve_wire(opts, order)
        with _otel.client_span("sepp.reserve"):
            answer = await self._call(
                OP_RESERVE,
                body,
                retry_safe=False,
                timeout=deadline,
                on_orphan=release,
                withdrawable=True,
            )
        return self._reserved_jobs(answer, opts)

    def _reserve_wire(
        self, opts: ReserveOptions, order: str
    ) -> tuple[dict[str, Any], float, OrphanHandler]:
        """A reserve's request body, its deadline (seconds) and the handler of
        an answer that arrives after its caller stopped waiting."""
        if not isinstance(opts, ReserveOptions):
            raise TypeError(
                "reserve takes ReserveOptions(queues, lease_duration), e.g. "
                f"ReserveOptions(['emails'], timedelta(seconds=30)); got {type(opts).__name__}"
            )
        if order not in RESERVE_ORDERS:
            raise ValueError(f'order must be "strict" or "fair", not {order!r}')
        durations = (opts.lease_duration, opts.wait_timeout)
        timing = self._reserve_timings.get(durations)
        if timing is None:
            # A worker reserves with the same durations every time: convert once.
            timing = (
                _convert.timedelta_to_ms(opts.lease_duration, round_up=True),
                max(0, _convert.timedelta_to_ms(opts.wait_timeout)),
                (max(opts.wait_timeout, timedelta(0)) + RESERVE_DEADLINE_SLACK).total_seconds(),
            )
            if len(self._reserve_timings) >= RESERVE_TIMINGS_KEPT:
                self._reserve_timings.clear()
            self._reserve_timings[durations] = timing
        lease_ms, wait_ms, deadline = timing
        body: dict[str, Any] = {
            "queues": list(opts.queues),
            "lease_ms": lease_ms,
            "wait_ms": wait_ms,
        }
        if opts.max_jobs is not None:
            body["max_jobs"] = opts.max_jobs
        worker_id = opts.worker_id
        if worker_id is not None:
            body["worker_id"] = worker_id
        if order != "strict":  # sent only when asked: older servers never see it
            body["order"] = order
        # Jobs as rows: a third of the decoding of maps. Servers before it ignore
        # the field and send maps, which are read as well.
        body["job_layout"] = _messages.JOB_LAYOUT_ARRAY
        release = self._release_handlers.get(worker_id)
        if release is None:
            release = functools.partial(self._release_orphaned, worker_id)
            if len(self._release_handlers) >= RESERVE_TIMINGS_KEPT:
                self._release_handlers.clear()
            self._release_handlers[worker_id] = release
        return body, deadline, release

    def _reserved_jobs(self, answer: dict[str, Any], opts: ReserveOptions) -> list[Job] | None:
        """The jobs of a reserve's ``ok`` answer (`UndecodableJobError` if some
        cannot be decoded: they are leased all the same)."""
        raw_jobs = answer.get("jobs")
        if not isinstance(raw_jobs, list):
            raise MalformedResponseError("a reserve answer needs a 'jobs' array")

        def make_lease(job_id: str, attempt: int, expires_ms: int, enqueued_ms: int) -> Lease:
            return Lease(self, job_id, attempt, expires_ms, opts.worker_id, enqueued_ms)

        jobs: list[Job] = []
        undecodable: list[UndecodableJob] = []
        for raw in raw_jobs:
            try:
                jobs.append(_convert.job_from_wire(raw, make_lease))
            except JobConversionError as exc:
                undecodable.append(
                    _convert.undecodable_job(_convert.job_map_of_row(raw), exc, opts.worker_id)
                )
        if undecodable:
            # Never an empty-looking poll: the jobs are leased to this caller.
            error = UndecodableJobError(jobs, undecodable)
            logger.error("%s", error)
            raise error
        return jobs or None

    def _cork_for_turn(self) -> None:
        """Requests sent from now until this loop turn ends leave in one write
        (`Connection.cork_for_turn`)."""
        connection = self._connection
        if connection is not None and not connection.closed:
            connection.cork_for_turn()

    def _reserve_now(self, opts: ReserveOptions, order: str) -> _SentReserve | None:
        """The Worker's fast path: send a reserve during this very call (not at
        a task's first step), so that a worker whose handlers just freed slots
        has its next reserve on the wire before it runs the next handlers.
        None when it cannot be sent so (no live connection, a congested one,
        OpenTelemetry spans on): then `reserve` is the way."""
        connection = self._connection
        if (
            connection is None
            or connection.closed
            or self._closed
            or connection.congested
            or _otel.api() is not None
        ):
            return None
        body, deadline, release = self._reserve_wire(opts, order)
        try:
            request_id, future = connection.send(
                OP_RESERVE, body, timeout=deadline, on_orphan=release, withdrawable=True
            )
        except SeppError:
            return None  # nothing was sent: `reserve` reports it
        return _SentReserve(connection, request_id, future, release, opts, order)

    async def _reserve_answer(self, sent: _SentReserve) -> list[Job] | None:
        """The outcome of a `_reserve_now`, as `reserve` would return or raise it."""
        try:
            response = await sent.future
        except asyncio.CancelledError:
            sent.connection.abandon(sent.request_id, sent.future, sent.release)
            raise
        except SeppError as lost:
            if self._failover and _timed_out(lost):
                self._leave(sent.connection, None, "no answer in time")
            raise
        if response.status != OK:
            refused = error_from_response(OP_RESERVE, response.status, response.body)
            if self._resend(refused, False):
                # Refused by a node that is not the leader (nothing was done):
                # the whole path finds the leader and sends it there.
                self._before_resend(refused, sent.connection)
                return await self.reserve(sent.opts, order=sent.order)
            raise refused
        return self._reserved_jobs(response.body, sent.opts)

    def _release_orphaned(self, worker_id: str | None, response: Response) -> None:
        """The late answer of a reserve its caller abandoned: its jobs reached
        no handler, so they are released (ready again, no attempt counted) --
        never nacked, which would count a failure (issue 12)."""
        if response.status != OK:
            return
        raw_jobs = response.body.get("jobs")
        if not isinstance(raw_jobs, list):
            return
        for raw in map(_convert.job_map_of_row, raw_jobs):
            job_id = raw.get("id") if isinstance(raw, dict) else None
            attempt = raw.get("attempt") if isinstance(raw, dict) else None
            if not isinstance(job_id, str) or type(attempt) is not int:
                continue
            body: dict[str, Any] = {"job_id": job_id, "attempt": attempt}
            if worker_id is not None:
                body["worker_id"] = worker_id
            task = asyncio.get_running_loop().create_task(self._release_late(job_id, body))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _release_late(self, job_id: str, body: dict[str, Any]) -> None:
        # On the connection the answer came on, even while `close` is running
        # (it waits for these): a new connection would not help a job whose
        # lease belongs to this one's reserve anyway.
        connection = self._connection
        if connection is None or connection.closed:
            logger.info("could not release job %s (its lease will expire): no connection", job_id)
            return
        try:
            response = await connection.request(OP_RELEASE, body, timeout=self._rpc_timeout)
        except SeppError as exc:
            logger.info("could not release job %s (its lease will expire): %s", job_id, exc)
            return
        if response.status == OK:
            logger.info("released job %s leased by an abandoned reserve", job_id)
        else:
            error = error_from_response(OP_RELEASE, response.status, response.body)
            logger.info("could not release job %s: %s", job_id, error)

    async def release(self, ctx: JobCtx) -> None:
        """Hand a reserved job back unused: it is ready again at once and this
        attempt does not count against its max attempts (the next delivery
        carries the same attempt number). For a job that reached no handler --
        a worker that reserved more than it can start, or is shutting down.
        After a release this lease is gone: do not ack, nack or extend it. A
        handler that ran and failed must `nack` instead, so failures are
        counted. Fencing errors as for `ack`.
        """
        if not isinstance(ctx, JobCtx):
            raise _not_a_job_ctx(ctx, "release takes a JobCtx (job.ctx)")
        body = self._lease_body(ctx)
        body.pop("enqueued_at_ms", None)  # a release is fenced by its attempt (§5.11)
        with _otel.client_span("sepp.release"):
            await self._call(OP_RELEASE, body, retry_safe=True)

    @staticmethod
    def _lease_body(ctx: JobCtx | UndecodableJob) -> dict[str, Any]:
        """The fence of an ack / nack / extend: id, attempt and the delivery's
        enqueued_at_ms (PROTOCOL.md §5.3), plus the worker id. Anything but a
        JobCtx or an UndecodableJob is a TypeError that says what to pass."""
        if type(ctx) is not JobCtx and not isinstance(ctx, (JobCtx, UndecodableJob)):
            raise _not_a_job_ctx(ctx, "ack and nack take a JobCtx (job.ctx) or an UndecodableJob")
        if isinstance(ctx, UndecodableJob):
            if ctx.id is None or ctx.attempt is None:
                raise ValueError(
                    "this undecodable job has no readable id and attempt: it cannot be "
                    "acked or nacked (its lease will expire)"
                )
            body: dict[str, Any] = {"job_id": ctx.id, "attempt": ctx.attempt}
            raw = ctx.raw
            token = raw.get("enqueued_at_ms") if isinstance(raw, dict) else None
            if type(token) is int and INT64_MIN <= token <= INT64_MAX:
                body["enqueued_at_ms"] = token
            if ctx.worker_id is not None:
                body["worker_id"] = ctx.worker_id
            return body
        lease = ctx._lease
        if lease is not None:
            body = {
                "job_id": ctx.id,
                "attempt": ctx.attempt,
                "enqueued_at_ms": lease._enqueued_at_ms,
            }
            if lease._worker_id is not None:
                body["worker_id"] = lease._worker_id
            return body
        # A JobCtx built by hand (no lease): its enqueued_at is the token.
        body = {"job_id": ctx.id, "attempt": ctx.attempt}
        if isinstance(ctx.enqueued_at, datetime):
            body["enqueued_at_ms"] = _convert.datetime_to_ms(ctx.enqueued_at)
        return body

    async def ack(self, ctx: JobCtx | UndecodableJob) -> None:
        """Report success: the job is deleted.

        Raises `JobNotFoundError` or `AttemptMismatchError` if this attempt no
        longer holds the lease.
        """
        with _otel.client_span("sepp.ack"):
            await self._settle(OP_ACK, self._lease_body(ctx))

    async def _settle(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        """An ack, nack or extend: joined with the others made in the same moment
        into one ``settle`` (PROTOCOL.md 5.13) when the server has it; the same
        answer and the same typed errors as the single operation."""
        connection = self._coalescing(settle=True)
        if connection is None:
            return await self._call(op, body, retry_safe=True)
        if connection.congested:
            await connection.wait_writable(self._rpc_timeout)
        return await self._coalesced(op, body, True, SETTLE_ITEM_BYTES_MIN)

    async def nack(
        self,
        ctx: JobCtx | UndecodableJob,
        retry: RetryDirective = RetryDirective.DEFAULT,
        reason: str = "",
    ) -> bool:
        """Report failure. `retry` chooses what happens next; `reason` is kept
        as the job's last reason (cut to its first 4096 UTF-8 bytes, ending
        with " [cut]", when longer: servers refuse more).
        Returns ``True`` if the job was dead-lettered
        (by `RetryDirective.DEAD_LETTER`, or because this was its last
        attempt). Fencing errors as for `ack`.
        """
        body = self._nack_body(ctx, retry, reason)
        with _otel.client_span("sepp.nack"):
            answer = await self._settle(OP_NACK, body)
        return self._nack_answer(answer)

    def _nack_body(
        self, ctx: JobCtx | UndecodableJob, retry: RetryDirective, reason: str
    ) -> dict[str, Any]:
        if not isinstance(retry, RetryDirective):
            raise TypeError(
                "retry must be a RetryDirective (RetryDirective.DEFAULT, "
                f"RetryDirective.after(delay), RetryDirective.DEAD_LETTER); got {retry!r:.80}"
            )
        body = self._lease_body(ctx)
        if retry.kind == "after":
            if retry.delay is None:
                raise ValueError("RetryDirective.after needs a delay")
            body["retry"] = RETRY_DELAY
            body["delay_ms"] = _convert.timedelta_to_ms(retry.delay)
        elif retry.kind == "dead_letter":
            body["retry"] = RETRY_DEAD_LETTER
        elif retry.kind == "default":
            body["retry"] = RETRY_DEFAULT
        else:
            raise ValueError(f"unknown retry directive {retry.kind!r}")
        if reason:
            # Cut to the byte limit every server accepts: a refused nack would
            # leave the job leased until its lease expires.
            body["reason"] = _convert.reason_within_limit(reason)
        return body

    @staticmethod
    def _nack_answer(answer: dict[str, Any]) -> bool:
        dead_lettered = answer.get("dead_lettered")
        if not isinstance(dead_lettered, bool):
            raise MalformedResponseError("a nack answer needs a boolean 'dead_lettered'")
        return dead_lettered

    async def extend(self, ctx: JobCtx, extension: timedelta) -> datetime:
        """Renew the lease to ``now + extension`` (clamped by the server) and
        return the new deadline. The same as ``await ctx.extend(extension)``."""
        if not isinstance(extension, timedelta):
            raise TypeError(
                "extension must be a datetime.timedelta, e.g. timedelta(seconds=30); "
                f"got {type(extension).__name__} {extension!r:.80}"
            )
        worker_id, token = self._lease_fence(ctx)
        expiry = await self._extend_inner(ctx.id, ctx.attempt, extension, worker_id, token)
        if ctx._lease is not None:
            ctx._lease._known_expiry_ms = _convert.datetime_to_ms(expiry)
        return expiry

    @staticmethod
    def _lease_fence(ctx: JobCtx) -> tuple[str | None, int | None]:
        """The worker id and fencing token (enqueued_at_ms) `ctx`'s calls carry."""
        if type(ctx) is not JobCtx and not isinstance(ctx, JobCtx):
            raise _not_a_job_ctx(ctx, "extend takes a JobCtx (job.ctx)")
        lease = ctx._lease
        if lease is not None:
            return lease._worker_id, lease._enqueued_at_ms
        if isinstance(ctx.enqueued_at, datetime):
            return None, _convert.datetime_to_ms(ctx.enqueued_at)
        return None, None

    async def _extend_inner(
        self,
        job_id: str,
        attempt: int,
        extension: timedelta,
        worker_id: str | None,
        enqueued_at_ms: int | None,
    ) -> datetime:
        body = self._extend_body(job_id, attempt, extension, worker_id, enqueued_at_ms)
        with _otel.client_span("sepp.extend"):
            answer = await self._settle(OP_EXTEND, body)
        return self._extend_answer(answer)

    @staticmethod
    def _extend_body(
        job_id: str,
        attempt: int,
        extension: timedelta,
        worker_id: str | None,
        enqueued_at_ms: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "job_id": job_id,
            "attempt": attempt,
            "lease_ms": _convert.timedelta_to_ms(extension, round_up=True),
        }
        if enqueued_at_ms is not None:
            body["enqueued_at_ms"] = enqueued_at_ms
        if worker_id is not None:
            body["worker_id"] = worker_id
        return body

    @staticmethod
    def _extend_answer(answer: dict[str, Any]) -> datetime:
        expiry_ms = answer.get("lease_expires_at_ms")
        expiry = _convert.ms_to_datetime(expiry_ms) if type(expiry_ms) is int else None
        if expiry is None:
            raise MalformedResponseError("an extend answer needs a valid 'lease_expires_at_ms'")
        return expiry

    # -- administration ----------------------------------------------------------------------

    async def get_server_info(self) -> ServerInfo:
        """The server's version, capabilities and global limits."""
        with _otel.client_span("sepp.get_server_info"):
            answer = await self._call(OP_SERVER_INFO, {}, retry_safe=True)
        try:
            return _convert.server_info_from_wire(answer)
        except ServerInfoError as exc:
            raise MalformedServerInfoError(exc) from exc

    async def drain_dead_letters(
        self, queue: str | None = None, max_records: int = 1
    ) -> list[DeadLetterRecord]:
        """Remove and return up to `max_records` dead-lettered jobs (oldest
        first), of one `queue` or of all.

        Destructive — the records are deleted before the answer is sent — so it
        is never retried: a lost answer loses that batch. A record the client
        cannot decode is not dropped: `UndecodableDeadLetterError` hands over
        the whole answer, the decoded ``records`` and the ``undecodable`` ones
        raw (each is also logged in full at ERROR, as the last copy). Replay a record with
        ``client.enqueue(record.to_enqueue_request())``. An empty list looks the
        same whether nothing is dead or retention is off: see
        `ServerInfo.dead_letter_retention_enabled`.
        """
        body: dict[str, Any] = {"max": max(1, max_records)}
        if queue is not None:
            body["queue"] = queue
        with _otel.client_span("sepp.drain_dead_letters"):
            answer = await self._call(OP_DRAIN_DEAD_LETTERS, body, retry_safe=False)
        raw_records = answer.get("records")
        if not isinstance(raw_records, list):
            raise MalformedResponseError("a drain answer needs a 'records' array")
        records: list[DeadLetterRecord] = []
        undecodable: list[UndecodableDeadLetter] = []
        for raw in raw_records:
            try:
                records.append(_convert.dead_letter_from_wire(raw))
            except JobConversionError as exc:
                # Already deleted on the server: the raw record goes to the
                # caller, and to the log in full in case the caller loses it.
                logger.error(
                    "drained a dead-letter record the client cannot decode (%s); raw record: %r",
                    exc,
                    raw,
                )
                undecodable.append(_convert.undecodable_dead_letter(raw, exc))
        too_large = answer.get("too_large")
        if isinstance(too_large, list) and too_large:
            # Records no answer can carry stay on the server, undeleted
            # (PROTOCOL.md 5.6): say so, for they never come back from a drain.
            logger.warning(
                "%d dead letter(s) are too large for any drain answer and stay on the "
                "server (requeue them, or let retention expire them): %r",
                len(too_large),
                too_large,
            )
        if undecodable:
            raise UndecodableDeadLetterError(records, undecodable)
        return records

    async def queue_stats(self, queues: Iterable[str] | None = None) -> list[QueueStats]:
        """Counts per queue (a sepp addition): of the named queues (an unknown
        name reports zeros), or of every known queue when `queues` is None."""
        body: dict[str, Any] = {}
        if queues is not None:
            if isinstance(queues, str):
                raise ValueError("queues must be a sequence of queue names, not one string")
            body["queues"] = list(queues)
        answer = await self._call(OP_QUEUE_STATS, body, retry_safe=True)
        return _convert.queue_stats_from_wire(answer)

    async def health(self) -> HealthStatus:
        """Whether the server is serving (a sepp addition)."""
        answer = await self._call(OP_HEALTH, {}, retry_safe=True)
        status = answer.get("status")
        if not isinstance(status, str):
            raise MalformedResponseError("a health answer needs a 'status'")
        reason = answer.get("reason")
        damaged = answer.get("damaged_history", [])
        if not isinstance(damaged, list) or not all(isinstance(d, dict) for d in damaged):
            raise MalformedResponseError(
                "a health answer's 'damaged_history' must be a list of maps"
            )
        return HealthStatus(
            serving=status == "serving",
            status=status,
            reason=reason if isinstance(reason, str) else None,
            damaged_history=tuple(damaged),
        )

    # -- admin operations (issue 15; PROTOCOL.md 5.14-5.27) -------------------------------
    #
    # The connection acts as the principal its API key gives it (PROTOCOL.md 5.14);
    # refusals raise PermissionDeniedError, QueueNotFoundError, QueueInUseError or
    # InvalidRequestError (over 1,000 ids, an unknown state or cause, a bad cursor).
    # Reads are retried like other reads; commands never are.

    async def _admin(self, op: str, body: dict[str, Any], *, read: bool) -> dict[str, Any]:
        return await self._call(op, body, retry_safe=read)

    async def get_job(self, job_id: str) -> JobInfo | None:
        """The job `job_id` in any state, or None when the server does not know it
        (never enqueued, or gone: acked, cancelled, deleted, drained, expired)."""
        answer = await self._admin(_messages.OP_GET_JOB, {"id": job_id}, read=True)
        raw = answer.get("job")
        return None if raw is None else _admin.job_info(raw)

    async def list_jobs(
        self,
        queue: str,
        state: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        cause: str | None = None,
    ) -> JobPage:
        """A page of the jobs of `queue` in `state` (``"ready"``, ``"scheduled"``,
        ``"inflight"``, ``"dead_letter"``), in the order they entered it; pass the
        page's `next_cursor` for the next one. `cause` filters dead letters."""
        body: dict[str, Any] = {"queue": queue, "state": state, "limit": limit}
        if cursor is not None:
            body["cursor"] = cursor
        if cause is not None:
            body["cause"] = cause
        return _admin.job_page(await self._admin(_messages.OP_LIST_JOBS, body, read=True))

    async def list_dead_letters(
        self, queue: str, *, cause: str | None = None, cursor: str | None = None, limit: int = 100
    ) -> JobPage:
        """A page of the dead letters of `queue` without consuming them (unlike
        `drain_dead_letters`); `cause` (``"attempts_exhausted"``, ``"rejected"``,
        ``"lease_expired"``, ``"admin"``) filters them."""
        return await self.list_jobs(queue, "dead_letter", cursor=cursor, limit=limit, cause=cause)

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue the server knows, with counts, pause flag and settings."""
        answer = await self._admin(_messages.OP_LIST_QUEUES, {}, read=True)
        queues = answer.get("queues")
        if not isinstance(queues, list):
            raise MalformedResponseError("a list_queues answer needs a 'queues' array")
        return [_admin.queue_info(q) for q in queues]

    async def queue_info(self, queue: str) -> QueueInfo:
        """One queue's counts and settings (QueueNotFoundError when unknown)."""
        answer = await self._admin(_messages.OP_QUEUE_INFO, {"queue": queue}, read=True)
        return _admin.queue_info(answer.get("queue"))

    async def dead_letter_jobs(
        self, ids: Iterable[str], *, reason: str | None = None
    ) -> AdminOutcomes:
        """Dead-letter live ready or scheduled jobs (cause ``admin``), at most
        1,000 ids a call; a per-id outcome."""
        body = {"ids": _id_list(ids), "reason": reason}
        return _admin.admin_outcomes(
            await self._admin(_messages.OP_DEAD_LETTER_JOBS, body, read=False)
        )

    async def cancel_jobs(self, ids: Iterable[str], *, reason: str | None = None) -> AdminOutcomes:
        """Delete live ready or scheduled jobs (no dead letter kept), at most
        1,000 ids a call; a per-id outcome."""
        body = {"ids": _id_list(ids), "reason": reason}
        return _admin.admin_outcomes(await self._admin(_messages.OP_CANCEL_JOBS, body, read=False))

    async def requeue_dead_letters(
        self,
        ids: Iterable[str] | None = None,
        *,
        queue: str | None = None,
        cause: str | None = None,
        reason: str | None = None,
    ) -> AdminOutcomes:
        """Put dead letters back as ready jobs (same id, attempt 1): by `ids` (at
        most 1,000), or by `queue` and / or `cause` in a bounded chunk (call again
        while `remaining` > 0)."""
        body = _dead_letters_body(ids, queue, cause, reason)
        return _admin.admin_outcomes(
            await self._admin(_messages.OP_REQUEUE_DEAD_LETTERS, body, read=False)
        )

    async def delete_dead_letters(
        self,
        ids: Iterable[str] | None = None,
        *,
        queue: str | None = None,
        cause: str | None = None,
        reason: str | None = None,
    ) -> AdminOutcomes:
        """Delete dead letters, by ids or by filter like `requeue_dead_letters`."""
        body = _dead_letters_body(ids, queue, cause, reason)
        return _admin.admin_outcomes(
            await self._admin(_messages.OP_DELETE_DEAD_LETTERS, body, read=False)
        )

    async def pause_queue(self, queue: str, *, reason: str | None = None) -> QueueChange:
        """Stop delivering from `queue` (enqueues still land); durable."""
        body = {"queue": queue, "reason": reason}
        return _admin.queue_change(await self._admin(_messages.OP_PAUSE_QUEUE, body, read=False))

    async def resume_queue(self, queue: str, *, reason: str | None = None) -> QueueChange:
        """Deliver from a paused `queue` again (wakes waiting reserves)."""
        body = {"queue": queue, "reason": reason}
        return _admin.queue_change(await self._admin(_messages.OP_RESUME_QUEUE, body, read=False))

    async def purge_queue(self, queue: str, *, reason: str | None = None) -> PurgeResult:
        """Delete a bounded chunk of the ready and scheduled jobs of `queue`
        (in-flight jobs untouched); call again while `remaining` > 0."""
        body = {"queue": queue, "reason": reason}
        return _admin.purge_result(await self._admin(_messages.OP_PURGE_QUEUE, body, read=False))

    async def put_queue(
        self,
        queue: str,
        overrides: dict[str, int | str] | None = None,
        *,
        reason: str | None = None,
    ) -> PutQueueResult:
        """Create `queue` at runtime or replace its runtime overrides (they win
        over the configuration file, key by key); durable."""
        body = {"queue": queue, "overrides": dict(overrides or {}), "reason": reason}
        return _admin.put_queue_result(await self._admin(_messages.OP_PUT_QUEUE, body, read=False))

    async def delete_queue(self, queue: str, *, reason: str | None = None) -> DeleteQueueResult:
        """Remove a runtime queue definition (QueueInUseError while jobs are in
        flight)."""
        body = {"queue": queue, "reason": reason}
        return _admin.delete_queue_result(
            await self._admin(_messages.OP_DELETE_QUEUE, body, read=False)
        )

    # -- schedules (issue 17; PROTOCOL.md 5.28-5.32) ---------------------------------------
    #
    # Refusals: PermissionDeniedError (list: viewer, pause / resume: operator, put /
    # delete: admin), ScheduleNotFoundError, InvalidRequestError whose `field` names
    # the field at fault (a bad cron: "cron"; an unknown time zone: "timezone").

    async def list_schedules(self) -> list[ScheduleInfo]:
        """Every schedule, by name, with its next fire time."""
        answer = await self._admin(_messages.OP_LIST_SCHEDULES, {}, read=True)
        schedules = answer.get("schedules")
        if not isinstance(schedules, list):
            raise MalformedResponseError("a list_schedules answer needs a 'schedules' array")
        return [_admin.schedule_info(s) for s in schedules]

    async def put_schedule(
        self,
        name: str,
        queue: str,
        job_type: str,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        timezone: str = "UTC",
        payload: bytes | str | None = None,
        encoding: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: dict[str, Any] | None = None,
        catch_up: str = "one",
        reason: str | None = None,
    ) -> ScheduleChange:
        """Create or update the schedule `name`: exactly one of `cron` (5 fields,
        in `timezone`, an IANA name) and `every_ms`; each tick enqueues a `job_type`
        job on `queue` (a str payload is sent as UTF-8). `catch_up`: ``"none"``,
        ``"one"`` or ``"all"``. An update that keeps cron, timezone and every_ms
        keeps the next tick; durable."""
        body: dict[str, Any] = {
            "name": name,
            "queue": queue,
            "job_type": job_type,
            "cron": cron,
            "every_ms": every_ms,
            "timezone": timezone,
            "priority": priority,
            "max_attempts": max_attempts,
            "custom": custom,
            "catch_up": catch_up,
            "reason": reason,
        }
        if payload is not None:
            data = payload.encode() if isinstance(payload, str) else bytes(payload)
            body["payload"] = {"data": data, "encoding": encoding}
        return _admin.schedule_change(
            await self._admin(_messages.OP_PUT_SCHEDULE, body, read=False)
        )

    async def pause_schedule(self, name: str, *, reason: str | None = None) -> ScheduleChange:
        """Stop firing the schedule `name` (durable)."""
        body = {"name": name, "reason": reason}
        return _admin.schedule_change(
            await self._admin(_messages.OP_PAUSE_SCHEDULE, body, read=False)
        )

    async def resume_schedule(self, name: str, *, reason: str | None = None) -> ScheduleChange:
        """Fire a paused schedule again, from its first tick after now."""
        body = {"name": name, "reason": reason}
        return _admin.schedule_change(
            await self._admin(_messages.OP_RESUME_SCHEDULE, body, read=False)
        )

    async def delete_schedule(self, name: str, *, reason: str | None = None) -> ScheduleChange:
        """Remove the schedule `name` (the jobs it fired stay)."""
        body = {"name": name, "reason": reason}
        return _admin.schedule_change(
            await self._admin(_messages.OP_DELETE_SCHEDULE, body, read=False)
        )


def _id_list(ids: Iterable[str]) -> list[str]:
    if isinstance(ids, str):
        raise ValueError("ids must be a sequence of job ids, not one string")
    return list(ids)


def _dead_letters_body(
    ids: Iterable[str] | None, queue: str | None, cause: str | None, reason: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"queue": queue, "cause": cause, "reason": reason}
    if ids is not None:
        body["ids"] = _id_list(ids)
    elif queue is None and cause is None:
        raise ValueError("give ids, or a queue and / or a cause")
    return body


def _timed_out(error: SeppError) -> bool:
    return isinstance(error, TransportError) and error.code == DEADLINE_EXCEEDED


def _split_addresses(addr: str | Sequence[str]) -> list[str]:
    """The addresses of ``"h1:p,h2:p"`` or a list of them (at least one)."""
    if isinstance(addr, str):
        parts = addr.split(",")
    elif isinstance(addr, Sequence) and all(isinstance(a, str) for a in addr):
        parts = list(addr)
    else:
        raise TypeError(f"addr must be a str or a list of str, got {type(addr).__name__}")
    addresses = [part.strip() for part in parts]
    if not addresses or any(not a for a in addresses):
        raise ValueError(f"empty address in {addr!r}")
    return addresses


def _deliver(call: Call, result: Any) -> None:
    if not call.future.done():
        call.future.set_result(result)


def _closed_if_unanswered(call: Call, task: asyncio.Task[None]) -> None:
    if not call.future.done():
        call.future.set_exception(ClientClosedError())
