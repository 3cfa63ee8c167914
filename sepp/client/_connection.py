"""One TCP (or TLS) connection to a sepp server, with pipelined requests.

Owns: opening the socket and the ``hello`` handshake, request ids, writing
request frames, and the reader (the transport's protocol) that cuts the byte
stream into frames and hands each response to the future (or `Receiver`) of the
request it answers. Nothing waits for anything but its own future, so responses
may arrive in any order: a long-polling reserve does not hold up the acks sent
after it.

Promises:

* every request gets exactly one outcome: its response, a deadline error
  (`TransportError`, code ``deadline_exceeded``), or — if the connection
  dies first — the error that killed it (`TransportError`, or the error a
  connection-level error frame announced just before the close);
* a request larger than the server's frame limit is refused before anything
  is sent (`MessageTooLargeError`): sending it would cost the connection;
* a request abandoned by its caller (cancelled or timed out) may register an
  *orphan handler*, which receives the late response if one comes — the client
  uses it to release jobs leased by a reserve nobody waits for any more;
* a *withdrawable* request (a long-polling reserve) that its caller abandons is
  withdrawn on the server at once (``withdraw``, PROTOCOL.md §5.12), so a
  parked reserve nobody waits for is never handed a job; `withdraw_pending`
  does the same for every such request before a close.

The request path costs one future and one dict entry per request: no task,
no timer and no ``wait_for`` of its own. Answers are cut into frames and handed
to their requests inside the transport's ``data_received`` (an
`asyncio.Protocol`, no reader task and no stream buffer between). One deadline timer per connection
(`_sweep`) is armed at the earliest deadline of the pending requests and fails
the ones past theirs when it fires; `send` starts a request without a
coroutine (the client's coalescers use it), `request` starts one and waits.

Framing and encoding are `sepp.protocol`'s; this module only moves bytes.
Reconnecting is the client's job: a closed `Connection` stays closed. A
connection the client stops using while requests are still on it (a cluster
node that is no longer the leader) is *retired*: it takes no new request and
closes once those have their outcomes, each its own answer.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sepp.client._convert import cluster_from_wire
from sepp.client.errors import (
    DEADLINE_EXCEEDED,
    ClientClosedError,
    ConnectError,
    MalformedResponseError,
    MessageTooLargeError,
    SeppError,
    TransportError,
    UnsupportedProtocolError,
    error_from_response,
)
from sepp.client.types import ClusterInfo
from sepp.protocol import (
    FRAME_BYTES_MAX_DEFAULT,
    OK,
    FrameReader,
    FramingError,
    Response,
    decode_response,
    encode_frame,
    encode_request,
)
from sepp.protocol.errors import INVALID_ARGUMENT, REASON_NOT_LEADER, UNAUTHENTICATED
from sepp.protocol.messages import OP_HELLO, OP_WITHDRAW, REQUEST_ID_MAX

logger = logging.getLogger("sepp.client")

DEFAULT_PORT = 7463
# A request waits for the socket to take what is buffered only when more than
# this is waiting to be written (asyncio's own high-water mark is 64 KiB).
WRITE_BUFFER_WAIT_BYTES = 64 * 1024
# The deadline sweep treats a request due within this many seconds as due (the
# loop may run a timer up to its clock resolution early).
DEADLINE_SLACK_S = 0.001

OrphanHandler = Callable[[Response], None]


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect: host, port and the TLS context (None = plain
    TCP). `address` is the caller's spelling, for messages."""

    address: str
    host: str
    port: int
    ssl: ssl.SSLContext | None = None
    server_hostname: str | None = None


@dataclass(frozen=True)
class Handshake:
    """The server's answer to ``hello`` (PROTOCOL.md §3)."""

    protocol: int
    server_version: str
    server_time_ms: int
    max_message_bytes: int
    auth_required: bool
    # Batch limits the server advertises (None from a server that does not):
    # the client coalesces enqueues, and acks/nacks/extends into `settle`
    # (PROTOCOL.md 5.13), only up to these, and not at all without them.
    max_enqueue_batch: int | None = None
    max_settle_batch: int | None = None
    # Cluster mode only (None from a single node, whose answer has no `cluster`).
    cluster: ClusterInfo | None = None


def parse_address(address: str) -> tuple[str, int, bool]:
    """``(host, port, tls)`` of ``host:port``, ``[v6]:port`` or a bare host,
    optionally prefixed with ``http://`` / ``https://`` (sepp-py accepts both;
    ``https`` asks for TLS). The port defaults to 7463."""
    rest = address.strip()
    tls = False
    for scheme, scheme_tls in (("https://", True), ("http://", False)):
        if rest.lower().startswith(scheme):
            rest, tls = rest[len(scheme) :], scheme_tls
            break
    rest = rest.rstrip("/")
    if not rest:
        raise ValueError(f"no host in address {address!r}")
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError(f"malformed IPv6 address {address!r}")
        port_text = tail[1:] if tail else ""
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        # A bare host name, or a bare IPv6 address without a port.
        host, port_text = rest, ""
    if not port_text:
        return host, DEFAULT_PORT, tls
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port in address {address!r}")
    return host, int(port_text), tls


def _handshake_from(body: dict[str, Any]) -> Handshake:
    try:
        protocol = body["protocol"]
        frame_max = body.get("max_message_bytes", FRAME_BYTES_MAX_DEFAULT)
        handshake = Handshake(
            protocol=protocol,
            server_version=str(body.get("server_version", "")),
            server_time_ms=int(body.get("server_time_ms", 0)),
            max_message_bytes=frame_max,
            auth_required=bool(body.get("auth_required", False)),
            max_enqueue_batch=_batch_limit(body.get("max_enqueue_batch")),
            max_settle_batch=_batch_limit(body.get("max_settle_batch")),
            cluster=cluster_from_wire(body.get("cluster")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedResponseError(f"malformed hello answer: {exc}") from exc
    if type(protocol) is not int or type(frame_max) is not int or frame_max < 1:
        raise MalformedResponseError("malformed hello answer: protocol or limit is not an int")
    return handshake


def _batch_limit(value: Any) -> int | None:
    return value if type(value) is int and value >= 1 else None


class Receiver:
    """Where `send_to` delivers a request's outcome: straight to a callback,
    ``callback(response, None)`` or ``callback(None, error)``, from the reader
    or the deadline sweep -- no future and no extra loop turn. A callback that
    raises is logged, never allowed to stop the reader."""

    __slots__ = ("_callback", "_done")

    def __init__(self, callback: Callable[[Response | None, SeppError | None], None]) -> None:
        self._callback = callback
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, response: Response) -> None:
        self._deliver(response, None)

    def set_exception(self, error: BaseException) -> None:
        self._deliver(None, error if isinstance(error, SeppError) else SeppError(str(error)))

    def _deliver(self, response: Response | None, error: SeppError | None) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._callback(response, error)
        except Exception:
            logger.exception("a sepp client callback failed")


# A pending request: its op, its future (or Receiver), its deadline (loop time,
# None for none), its timeout in seconds (for the message), its orphan handler,
# and whether it is withdrawable.
_Pending = tuple[
    str,
    "asyncio.Future[Response] | Receiver",
    float | None,
    float | None,
    OrphanHandler | None,
    bool,
]


class _Stream(asyncio.Protocol):
    """The transport's callbacks, passed on to the `Connection`; write flow
    control (`writable`)."""

    def __init__(self) -> None:
        self.connection: Connection | None = None
        self.transport: asyncio.Transport | None = None
        # Data or an end that came before the Connection was attached.
        self._early: list[bytes] = []
        self._early_end: tuple[Exception | None] | None = None
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def attach(self, connection: Connection) -> None:
        self.connection = connection
        for data in self._early:
            connection._received(data)
        self._early.clear()
        if self._early_end is not None:
            connection._ended(self._early_end[0])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whatever its class: uvloop's are not subclasses of
        # asyncio.Transport (they only have its methods).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.connection is None:
            self._early.append(data)
        else:
            self.connection._received(data)

    def eof_received(self) -> bool | None:
        self._end(None)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._wake_writers()
        self._end(exc)
        if not self.lost.done():
            self.lost.set_result(None)

    def _end(self, exc: Exception | None) -> None:
        if self.connection is None:
            if self._early_end is None:
                self._early_end = (exc,)
        else:
            self.connection._ended(exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()

    def _wake_writers(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    async def writable(self) -> None:
        """Until the transport takes more (or is gone)."""
        if not self._paused or self.lost.done():
            return
        if self._resumed is None:
            self._resumed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._resumed)


class Connection:
    """A live connection; make one with `Connection.open`."""

    def __init__(
        self,
        endpoint: Endpoint,
        transport: asyncio.Transport,
        stream: _Stream,
        *,
        receive_bytes_max: int,
    ) -> None:
        self.endpoint = endpoint
        self._stream = stream
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._frames = FrameReader(receive_bytes_max)
        self._pending: dict[int, _Pending] = {}
        # The deadline sweep: its timer and the loop time it is armed for.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._orphans: dict[int, OrphanHandler] = {}
        # Pending withdrawable requests (long-polling reserves) and their orphan
        # handlers, for `withdraw_pending`.
        self._withdrawable: dict[int, OrphanHandler | None] = {}
        # While `withdraw_pending` waits: the orphaned ids still unanswered, and
        # the future it waits on.
        self._settling: tuple[set[int], asyncio.Future[None]] | None = None
        self._next_id = 1
        self._closed = False
        # While corked (`cork_for_turn`): the frames sent, written together by `uncork`.
        self._corked: list[bytes] | None = None
        # Coalesced enqueue requests sent on this connection and not yet
        # answered (kept by the client: SeppClient._enqueues_ahead).
        self.enqueues_in_flight = 0
        # Retired: no new requests; closed once nothing is pending (`retire`).
        self._retiring = False
        # Builds the error for requests still pending when the connection ends.
        self._failure: Callable[[], SeppError] | None = None
        # A connection-level error frame (request id 0), reported at the close.
        self._farewell: tuple[str, dict[str, Any]] | None = None
        self.handshake: Handshake | None = None
        # Until hello answers, assume the protocol's default limit.
        self.max_message_bytes = FRAME_BYTES_MAX_DEFAULT
        stream.attach(self)

    # -- opening ------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        endpoint: Endpoint,
        *,
        hello: dict[str, Any],
        timeout: float,
        receive_bytes_max: int,
    ) -> Connection:
        """Connect and complete the handshake within `timeout` seconds.

        Raises `ConnectError` (socket, TLS, timeout, or a server that does not
        answer hello properly), `UnsupportedProtocolError`, or
        `UnauthenticatedError` for a refused API key.
        """
        where = endpoint.address
        connection: Connection | None = None
        try:
            async with asyncio.timeout(timeout):
                transport, stream = await asyncio.get_running_loop().create_connection(
                    _Stream,
                    endpoint.host,
                    endpoint.port,
                    ssl=endpoint.ssl,
                    server_hostname=endpoint.server_hostname if endpoint.ssl else None,
                )
                # No isinstance check: uvloop's transports are not subclasses of
                # asyncio.Transport.
                connection = cls(endpoint, transport, stream, receive_bytes_max=receive_bytes_max)
                response = await connection._exchange(OP_HELLO, hello)
        except TimeoutError:
            await _close_quietly(connection)
            raise ConnectError(where, f"no connection and handshake within {timeout:g} s") from None
        except OSError as exc:
            await _close_quietly(connection)
            raise ConnectError(where, str(exc) or type(exc).__name__) from exc
        except SeppError as exc:
            await _close_quietly(connection)
            raise ConnectError(where, f"handshake failed: {exc}") from exc
        except BaseException:
            await _close_quietly(connection)
            raise
        if response.status != OK:
            await _close_quietly(connection)
            raise _hello_error(where, response)
        try:
            connection.handshake = _handshake_from(response.body)
        except MalformedResponseError as exc:
            await _close_quietly(connection)
            raise ConnectError(where, str(exc)) from exc
        connection.max_message_bytes = connection.handshake.max_message_bytes
        return connection

    async def _exchange(self, op: str, body: dict[str, Any]) -> Response:
        # The handshake itself: no deadline of its own (open() has one).
        return await self.request(op, body, timeout=None)

    # -- requests ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def retiring(self) -> bool:
        """`retire` was called: this connection takes no new request."""
        return self._retiring

    def retire(self) -> None:
        """Stop using this connection: new requests are refused (`TransportError`,
        as on a closed one), those already sent keep waiting for their own answers
        (or deadlines), and the connection closes once none is left. For a
        cluster node that stopped being the leader: what it already took is
        answered there (a refusal the client then sends on to the leader), not
        cut off with an unknown outcome."""
        if self._closed or self._retiring:
            return
        self._retiring = True
        self._close_if_retired()

    def _close_if_retired(self) -> None:
        if self._retiring and not self._pending and not self._closed:
            self._finish(ClientClosedError)
            self._transport.close()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def send(
        self,
        op: str,
        body: dict[str, Any],
        *,
        timeout: float | None,
        on_orphan: OrphanHandler | None = None,
        withdrawable: bool = False,
    ) -> tuple[int, asyncio.Future[Response]]:
        """Send one request without waiting; returns its id and the future of its
        response (any status), which fails with `TransportError` at the deadline
        (`timeout` seconds, None for none) or with the error that ended the
        connection. Raises `TransportError` on a closed connection and
        `MessageTooLargeError` for a request over the frame limit (nothing is
        sent). A caller that stops waiting must call `abandon`."""
        future: asyncio.Future[Response] = self._loop.create_future()
        request_id = self._send(op, body, timeout, on_orphan, withdrawable, future)
        return request_id, future

    def send_to(
        self, op: str, body: dict[str, Any], *, timeout: float | None, receiver: Receiver
    ) -> None:
        """`send`, with the outcome handed to `receiver` (see `Receiver`)."""
        self._send(op, body, timeout, None, False, receiver)

    def _send(
        self,
        op: str,
        body: dict[str, Any],
        timeout: float | None,
        on_orphan: OrphanHandler | None,
        withdrawable: bool,
        future: asyncio.Future[Response] | Receiver,
    ) -> int:
        if self._closed or self._retiring:
            raise TransportError(f"{op}: the connection is closed")
        request_id = self._next_id
        self._next_id = 1 if request_id >= REQUEST_ID_MAX else request_id + 1
        data = encode_request(request_id, op, body)
        if len(data) > self.max_message_bytes:
            raise MessageTooLargeError(
                f"{op} request of {len(data)} bytes is over the server's frame limit "
                f"of {self.max_message_bytes} bytes",
                size=len(data),
                limit=self.max_message_bytes,
            )
        loop = self._loop
        if timeout is None:
            deadline = None
        else:
            deadline = loop.time() + timeout
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)
        self._pending[request_id] = (op, future, deadline, timeout, on_orphan, withdrawable)
        if withdrawable:
            self._withdrawable[request_id] = on_orphan
        corked = self._corked
        if corked is None:
            self._transport.write(encode_frame(data))
        else:
            corked.append(encode_frame(data))
        return request_id

    def cork_for_turn(self) -> None:
        """Hold the frames sent from now on until the callbacks already scheduled
        for this loop turn have run, then write them in one call: a burst of
        requests made in one turn costs one system call and one wake-up of the
        server, not one each. Nothing waits for time; an idle connection is
        never corked."""
        if self._corked is None:
            self._corked = []
            self._loop.call_soon(self.uncork)

    def uncork(self) -> None:
        corked = self._corked
        self._corked = None
        if corked and not self._closed and not self._transport.is_closing():
            self._transport.write(corked[0] if len(corked) == 1 else b"".join(corked))

    @property
    def congested(self) -> bool:
        """More than WRITE_BUFFER_WAIT_BYTES wait to be written: callers should
        `wait_writable` before adding more."""
        return self._transport.get_write_buffer_size() > WRITE_BUFFER_WAIT_BYTES

    async def wait_writable(self, timeout: float | None) -> None:
        """Wait (at most `timeout` seconds) until the socket takes what is
        buffered; a failure here shows in the pending requests' outcomes."""
        try:
            async with asyncio.timeout(timeout):
                await self._stream.writable()
        except TimeoutError:
            return

    async def request(
        self,
        op: str,
        body: dict[str, Any],
        *,
        timeout: float | None,
        on_orphan: OrphanHandler | None = None,
        withdrawable: bool = False,
    ) -> Response:
        """Send one request and wait for its response (any status).

        `timeout` (seconds, None for none) bounds the whole exchange. If the
        caller gives up — cancellation or the deadline — and `on_orphan` is set,
        a response that arrives later is passed to it. A `withdrawable` request
        (a long poll) that the caller gives up on is also withdrawn on the
        server, which then answers it empty unless its answer had already left.
        """
        request_id, future = self.send(
            op, body, timeout=timeout, on_orphan=on_orphan, withdrawable=withdrawable
        )
        try:
            if self._transport.get_write_buffer_size() > WRITE_BUFFER_WAIT_BYTES:
                await self.wait_writable(timeout)
            return await future
        except asyncio.CancelledError:
            self.abandon(request_id, future, on_orphan)
            raise

    def _take_id(self) -> int:
        request_id = self._next_id
        self._next_id = 1 if request_id >= REQUEST_ID_MAX else request_id + 1
        return request_id

    def abandon(
        self,
        request_id: int,
        future: asyncio.Future[Response],
        on_orphan: OrphanHandler | None = None,
    ) -> None:
        """The caller of request `request_id` stopped waiting (cancelled): a late
        answer goes to its orphan handler, and a withdrawable request is
        withdrawn on the server."""
        entry = self._pending.pop(request_id, None)
        self._withdrawable.pop(request_id, None)
        if future.done() and not future.cancelled():
            # Answered (or failed) in the same step as the caller gave up.
            if future.exception() is None and on_orphan is not None:
                _run_orphan_handler(on_orphan, future.result())
            return
        if entry is None:
            return  # failed with the connection, or past its deadline (handled there)
        # Not answered yet (cancelling the caller cancels the future it awaits).
        future.cancel()
        self._orphan(request_id, on_orphan, entry[5])
        self._close_if_retired()

    def _orphan(self, request_id: int, on_orphan: OrphanHandler | None, withdrawable: bool) -> None:
        if self._closed:
            return
        if on_orphan is not None:
            self._orphans[request_id] = on_orphan
        if withdrawable:
            # Tell the server at once, so that it never hands this long poll a
            # job (an abandoned reserve's job would burn an attempt otherwise).
            self._send_withdraw(request_id)

    # -- deadlines -------------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """The deadline timer: fail every pending request past its deadline (its
        orphan handler keeps a late answer, a long poll is withdrawn), then arm
        the timer for the earliest deadline left."""
        self._timer = None
        if self._closed:
            return
        now = self._loop.time() + DEADLINE_SLACK_S
        expired: list[int] = []
        earliest: float | None = None
        for request_id, entry in self._pending.items():
            deadline = entry[2]
            if deadline is None:
                continue
            if deadline <= now:
                expired.append(request_id)
            elif earliest is None or deadline < earliest:
                earliest = deadline
        for request_id in expired:
            op, future, _, timeout, on_orphan, withdrawable = self._pending.pop(request_id)
            self._withdrawable.pop(request_id, None)
            if not future.done():
                future.set_exception(
                    TransportError(f"{op}: no answer within {timeout} s", code=DEADLINE_EXCEEDED)
                )
            self._orphan(request_id, on_orphan, withdrawable)
        if earliest is not None:
            self._arm(earliest)
        self._close_if_retired()

    def _send_withdraw(self, request_id: int) -> None:
        """Withdraw the parked request `request_id` (PROTOCOL.md §5.12), without
        waiting: the server answers that request empty (unless its answer has
        already left, which its orphan handler then receives) and then this one,
        whose answer is not needed."""
        if self._closed or self._transport.is_closing():
            return
        withdraw_id = self._take_id()
        self._orphans[withdraw_id] = _withdraw_answered
        try:
            data = encode_request(withdraw_id, OP_WITHDRAW, {"request_id": request_id})
            self._transport.write(encode_frame(data))
        except (OSError, RuntimeError) as exc:
            # The connection is going down; the server ends the parked reserves
            # of a connection that closed.
            self._orphans.pop(withdraw_id, None)
            logger.debug("could not withdraw request %d: %s", request_id, exc)

    async def withdraw_pending(self, timeout: float) -> None:
        """Withdraw every pending withdrawable request (long-polling reserves)
        before a close: their callers fail with `ClientClosedError`, the server
        answers them empty, and an answer that had already left with jobs goes to
        the request's orphan handler (which releases them). Waits up to `timeout`
        seconds for those answers."""
        if self._closed:
            return
        waiting: set[int] = set()
        for request_id, on_orphan in list(self._withdrawable.items()):
            entry = self._pending.pop(request_id, None)
            self._withdrawable.pop(request_id, None)
            if entry is None or entry[1].done():
                continue
            self._orphans[request_id] = on_orphan or _ignore_answer
            waiting.add(request_id)
            entry[1].set_exception(ClientClosedError())
            self._send_withdraw(request_id)
        if not waiting:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._settling = (waiting, done)
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            logger.info(
                "closing with %d withdrawn reserve(s) unanswered after %g s", len(waiting), timeout
            )
        finally:
            self._settling = None

    # -- the reader ------------------------------------------------------------------------

    def _received(self, data: bytes) -> None:
        """The transport read `data`: cut it into frames and hand each answer to
        its request."""
        if self._closed:
            return
        failure: Callable[[], SeppError]
        try:
            for frame in self._frames.feed(data):
                self._dispatch(decode_response(frame))
            return
        except FramingError as exc:
            message = f"the server sent a malformed frame: {exc}"
            logger.warning("closing the connection to %s: %s", self.endpoint.address, message)
            failure = lambda: MalformedResponseError(message)  # noqa: E731
        except Exception as exc:
            # A bug on this side: fail every caller at once rather than leave
            # them waiting for their deadlines, and keep the traceback.
            logger.exception("the sepp client's reader failed")
            text = f"the client's reader failed: {exc!r}"
            failure = lambda: MalformedResponseError(text)  # noqa: E731
        self._finish(failure)
        self._transport.close()

    def _ended(self, exc: Exception | None) -> None:
        """The stream ended: the server closed it (`exc` None) or it broke."""
        if self._closed:
            return
        if exc is None:
            failure = self._lost("the server closed the connection")
        else:
            failure = self._lost(f"connection lost: {exc or type(exc).__name__}")
        self._finish(failure)
        self._transport.close()

    def _lost(self, message: str) -> Callable[[], SeppError]:
        farewell = self._farewell
        if farewell is not None:
            status, body = farewell
            if body.get("reason") == REASON_NOT_LEADER:
                # A node that stopped leading closed the connection: what was
                # still pending was not refused one by one, so its outcome is
                # unknown (only what is safe to repeat is sent again).
                body = {**body, "outcome_unknown": True}
            return lambda: error_from_response("", status, body)
        return lambda: TransportError(message)

    def _dispatch(self, response: Response) -> None:
        request_id = response.id
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            if entry[5]:
                self._withdrawable.pop(request_id, None)
            future = entry[1]
            if not future.done():
                future.set_result(response)
            if self._retiring:
                self._close_if_retired()
            return
        if request_id == 0 and response.status != OK:
            # A connection-level error: the server closes the connection next.
            self._farewell = (response.status, response.body)
            logger.warning(
                "sepp server %s reported %s: %s",
                self.endpoint.address,
                response.status,
                response.body.get("message"),
            )
            return
        orphan = self._orphans.pop(request_id, None)
        if orphan is not None:
            _run_orphan_handler(orphan, response)
            self._settled(request_id)
            return
        logger.debug("ignoring a response to unknown request %d", request_id)

    def _settled(self, request_id: int) -> None:
        settling = self._settling
        if settling is not None:
            waiting, done = settling
            waiting.discard(request_id)
            if not waiting and not done.done():
                done.set_result(None)

    def _finish(self, failure: Callable[[], SeppError]) -> None:
        if self._failure is None:
            self._failure = failure
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = list(self._pending.values())
        self._pending.clear()
        self._orphans.clear()
        self._withdrawable.clear()
        settling = self._settling
        if settling is not None and not settling[1].done():
            settling[1].set_result(None)
        for entry in pending:
            future = entry[1]
            if not future.done():
                future.set_exception(self._failure())

    # -- closing -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the socket; requests still pending fail with `ClientClosedError`."""
        if self._failure is None:
            self._failure = ClientClosedError
        self._closed = True
        self._finish(self._failure)
        self._transport.close()
        await asyncio.shield(self._stream.lost)


def _withdraw_answered(response: Response) -> None:
    if response.status != OK:
        logger.debug("withdraw answered %s: %s", response.status, response.body.get("message"))


def _ignore_answer(response: Response) -> None:
    logger.debug("ignoring the late answer of a withdrawn request: %s", response.status)


def _run_orphan_handler(handler: OrphanHandler, response: Response) -> None:
    try:
        handler(response)
    except SeppError as exc:
        logger.warning("could not handle a late response: %s", exc)


def _hello_error(address: str, response: Response) -> SeppError:
    body = response.body
    message = body.get("message", "")
    if response.status == UNAUTHENTICATED:
        return error_from_response(OP_HELLO, response.status, body)
    supported = body.get("supported_protocol_versions")
    if response.status == INVALID_ARGUMENT and supported is not None:
        versions = supported if isinstance(supported, list) else [supported]
        return UnsupportedProtocolError(
            address, f"protocol version not supported: {message}", versions
        )
    return ConnectError(address, f"hello refused ({response.status}): {message}")


async def _close_quietly(connection: Connection | None) -> None:
    if connection is not None:
        await connection.close()
