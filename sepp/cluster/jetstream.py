"""NATS JetStream implementations of `ReplicatedLog`, `Lease` and `BlobStore`.

Owns: `JetStreamLog` (one stream is the log: one message per group commit, its
stream sequence the log sequence), `JetStreamLease` (one key of a key-value
bucket whose max age is the lease's time-to-live), `JetStreamBlobStore` (an
object store bucket), `connect` (the connection options cluster mode needs) and
`ensure_cluster_resources` (creates what is missing, then refuses a cluster that
is not R3 with `sync_interval: always`).

Promises (beyond replog.py's):
- `append_if` publishes with `Nats-Expected-Last-Sequence: expected_seq` (0 on an
  empty stream) and `Nats-Expected-Stream`; JetStream's "wrong last sequence"
  (err 10071) is `AppendRefused` with the stream's actual last sequence; a
  timeout, a lost connection, no responders or an unavailable stream leader is
  `AppendOutcomeUnknown`; any other API error is a `ReplicatedLogError`
  (nothing appended). Appends may be pipelined: each is one request on the
  connection, each expecting its predecessor's sequence.
- `read` asks the stream leader (STREAM.MSG.GET, a few at once), never a replica
  that may lag; `read_from` is an ordered push consumer from a start sequence
  that checks every sequence itself: a repeat is dropped, a gap recreates the
  consumer from the next expected sequence (or raises `Purged` if that was
  purged), and a consumer that stays quiet while the stream is ahead of it (a
  server lost, a reconnect) is recreated too.
- Every other failure of the engine is a `BackendUnavailable` (a
  `ReplicatedLogError`), never a raw nats exception.

Connections (`connect`): `ping_interval` 1 s with 2 outstanding pings, so a server
that is SIGSTOPped or cut off is noticed in ~2-3 s (nats-py's default, 120 s,
left a client stuck for minutes); reconnects forever, every 0.25 s to the next
server of the list; 2 s request timeout. `NatsCredentials` adds a user and
password, a token or a `.creds` file, and TLS (a CA bundle, a client
certificate; `tls://` URLs). A server refusing them while connecting (an
"Authorization Violation", a certificate that does not verify) is
`NatsAuthRefused` at once (nats-py would retry forever, calling only the error
callback: nats.py issue 352); after the first connect the same
refusal is one warning line per ERROR_LOG_INTERVAL_S while it reconnects.
Secrets (passwords, tokens, credentials in URLs) appear in no message.

The servers' fsync setting is not visible to a client account: JetStream's API
(stream and account info) does not report it. `ensure_cluster_resources` reads
it from each server's monitoring endpoint (`GET /varz`, `jetstream.config.
sync_always`), given as `monitor_urls`; every server hosting the stream (its
leader and replicas, by server name) must be among them and say `sync_always:
true`. (A system-account user could ask `$SYS.REQ.SERVER.PING.VARZ` instead,
but that needs system credentials in every sepp node's configuration; a
monitoring URL needs none and is what operators already scrape.)

Must not import: sepp.server, sepp.client, sepp.protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from sepp.cluster.replog import (
    AppendOutcomeUnknown,
    AppendRefused,
    Entry,
    HeldLease,
    LeaseRecord,
    Purged,
    ReplicatedLogError,
)

# JetStream's API error codes this module acts on.
ERR_WRONG_LAST_SEQUENCE = 10071
ERR_STREAM_NAME_IN_USE = 10058
# "no suitable peers for placement": JetStream cannot place a new R3 stream now
# (a server is offline or not yet known to the meta leader; or the cluster has
# fewer than three JetStream servers). Setup asks again until its deadline.
ERR_NO_SUITABLE_PEERS = 10005

# Defaults (units in the names).
REQUEST_TIMEOUT_S = 2.0
PING_INTERVAL_S = 1
MAX_OUTSTANDING_PINGS = 2
RECONNECT_WAIT_S = 0.25
MAX_MESSAGE_BYTES = 1024 * 1024
LEASE_TTL_S = 3.0
REPLICAS = 3
# How far an existing lease bucket's max age may be from this node's lease TTL
# (the server keeps it in nanoseconds; the client reads it back as a float).
LEASE_TTL_TOLERANCE_S = 0.001
# read(): at most this many message gets outstanding at once.
READ_CONCURRENCY = 32
# read_from(): the consumer's idle heartbeat, and how long a quiet consumer may
# stay behind the stream's tail before it is recreated.
TAIL_HEARTBEAT_S = 1.0
TAIL_STALL_S = 2.0
TAIL_RETRY_S = 0.25
# The connection's errors are logged one line each, repeats at most this often
# (while no server answers, nats-py fails a reconnect four times a second).
ERROR_LOG_INTERVAL_S = 30.0
# How long closing a connection whose first connect was refused may take.
CLOSE_REFUSED_TIMEOUT_S = 2.0

log = logging.getLogger("sepp.cluster")
LEASE_KEY = "leader"
# ensure_cluster_resources(): a request creating a replicated stream may take a
# while; a cluster still electing is asked again until the deadline.
SETUP_REQUEST_TIMEOUT_S = 10.0
SETUP_DEADLINE_S = 30.0
SETUP_RETRY_S = 0.25


class BackendUnavailable(ReplicatedLogError):
    """JetStream did not answer (timeout, no connection, no stream leader) or
    answered with an error; nothing is known to have changed."""


class ClusterSetupRefused(ReplicatedLogError):
    """The JetStream cluster is not one cluster mode may run on (not R3, not
    `sync_interval: always`, limits that would drop messages, unreachable
    monitoring endpoints). The message says what and how to fix it."""


_UNKNOWN_OUTCOME = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.UnexpectedEOF,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    ConnectionError,
)


def _unavailable(what: str, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(f"{what}: {type(exc).__name__}: {exc}")


class NatsAuthRefused(ReplicatedLogError):
    """The NATS servers refused this connection's credentials or TLS (an
    authorization violation, expired or revoked credentials, a certificate that
    does not verify): a configuration to fix, not an outage to wait out."""


# What a NATS server says when it refuses a client's credentials (its -ERR).
_AUTH_REFUSAL = re.compile(
    r"authori[sz]ation violation|authentication (expired|revoked|timeout)", re.IGNORECASE
)


def auth_refusal(exc: BaseException) -> str | None:
    """Why `exc` (an error nats-py reports while connecting) is a refusal of the
    credentials or TLS, or None when it is not (a server down, a timeout)."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return "the server refused the credentials (authorization violation)"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the server's TLS certificate does not verify ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc.reason or exc})"
    if isinstance(exc, nats.errors.Error) and _AUTH_REFUSAL.search(str(exc)):
        return f"the server refused the credentials ({str(exc).removeprefix('nats: ')})"
    return None


def redact_url(url: str) -> str:
    """`url` without a password or token it carries (nats://user:pass@host ->
    nats://user:***@host; nats://token@host -> nats://***@host)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(an unparsable URL)"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, _ = userinfo.partition(":")
    shown = f"{user}:***" if sep else "***"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{shown}@{hostport}"))


@dataclass(frozen=True)
class NatsCredentials:
    """How the connection authenticates and encrypts ([cluster] nats_user /
    nats_password, nats_token, creds_file, tls_*). The secrets are left out of
    repr."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca_file or self.tls_cert_file)

    def options(self, servers: Sequence[str]) -> dict[str, Any]:
        """nats.connect's keyword arguments for these credentials (a TLS context
        when a tls_* file is set or a URL is tls://)."""
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
            options["password"] = self.password or ""
        if self.token is not None:
            options["token"] = self.token
        if self.creds_file is not None:
            options["user_credentials"] = self.creds_file
        if self.tls or any(u.lower().startswith("tls://") for u in servers):
            options["tls"] = self.tls_context()
        return options

    def tls_context(self) -> ssl.SSLContext:
        """A client TLS context: the servers checked against `tls_ca_file` (else
        the system's CAs), the client certificate if one is set."""
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context


class ConnectionLog:
    """nats-py's connection callbacks as log lines: its default error callback
    prints a traceback for every failed reconnect attempt. An error is one
    warning line; repeats within ERROR_LOG_INTERVAL_S are counted, not logged,
    and the next line says how many there were."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._logged_at: float | None = None
        self._skipped = 0

    async def error(self, exc: Exception) -> None:
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < ERROR_LOG_INTERVAL_S:
            self._skipped += 1
            return
        more = f" ({self._skipped} more since the last one logged)" if self._skipped else ""
        self._logged_at, self._skipped = now, 0
        refused = auth_refusal(exc)
        if refused is not None:
            log.warning(
                "nats connection: %s: check [cluster] nats_user, nats_token, creds_file "
                "and tls_*%s",
                refused,
                more,
            )
            return
        log.warning("nats connection: %s%s", str(exc) or type(exc).__name__, more)

    async def disconnected(self) -> None:
        log.warning("nats connection lost; reconnecting")

    async def reconnected(self) -> None:
        log.info("nats connection back")


async def connect(
    urls: str | Sequence[str], credentials: NatsCredentials | None = None, **overrides: Any
) -> NATS:
    """Connect with the options cluster mode needs (module docstring) and
    `credentials`; keyword arguments override them (e.g. callbacks). Raises
    `NatsAuthRefused` when a server refuses the credentials or TLS while
    connecting, `BackendUnavailable` when none could be reached."""
    servers = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else list(urls)
    shown = [redact_url(u) for u in servers]
    connecting = True  # (nats-py's own status is "disconnected" while it dials)
    options: dict[str, Any] = {
        "servers": servers,
        "ping_interval": PING_INTERVAL_S,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": RECONNECT_WAIT_S,
        "connect_timeout": 2,
        "dont_randomize": False,
    }
    try:
        options.update((credentials or NatsCredentials()).options(servers))
    except (OSError, ssl.SSLError) as exc:
        raise NatsAuthRefused(f"cannot load the NATS TLS files: {exc}") from exc
    quiet = ConnectionLog()
    options["error_cb"] = quiet.error

    async def disconnected() -> None:
        # Not "lost": a refused first connect being closed, or our own close.
        if not connecting and not nc.is_closed:
            await quiet.disconnected()

    options["disconnected_cb"] = disconnected
    options["reconnected_cb"] = quiet.reconnected
    options.update(overrides)
    nc = NATS()
    report = options["error_cb"]

    async def error_cb(exc: Exception) -> None:
        # While the first connect runs nats-py reports a refused CONNECT here and
        # tries the next server, forever (max_reconnect_attempts -1): the first
        # refusal ends it (raised out of nc.connect; the servers of one cluster
        # share their accounts, and after a failed TLS upgrade nats-py's own
        # retry hangs closing the old transport).
        refused = auth_refusal(exc) if connecting else None
        if refused is not None:
            raise NatsAuthRefused(
                f"the NATS servers {shown} refused sepp's connection: {refused}; "
                "check [cluster] nats_user / nats_password, nats_token, creds_file "
                "and tls_* against the servers' configuration"
            )
        await report(exc)

    options["error_cb"] = error_cb
    try:
        await nc.connect(**options)
    except NatsAuthRefused:
        await _close_refused(nc)
        raise
    except ModuleNotFoundError as exc:  # creds_file without the nkeys package
        raise NatsAuthRefused(
            f"a credentials file needs the Python package {exc.name!r}: "
            "pip install 'sepp[cluster]' (or nkeys)"
        ) from exc
    except (*_UNKNOWN_OUTCOME, nats.errors.NoServersError, OSError) as exc:
        await _close_refused(nc)
        raise _unavailable(f"cannot connect to {shown}", exc) from exc
    connecting = False
    return nc


async def _close_refused(nc: NATS) -> None:
    """Close a connection whose first connect failed (nats-py's close may wait
    on a transport that never finished its TLS handshake: not for long)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), CLOSE_REFUSED_TIMEOUT_S)


# -- the log ---------------------------------------------------------------------


def log_subject(stream: str) -> str:
    return f"sepp.log.{stream}"


_LAST_SEQ = re.compile(r"wrong last sequence:?\s*(\d+)", re.IGNORECASE)


class JetStreamLog:
    """A `ReplicatedLog` on one JetStream stream with one subject."""

    def __init__(
        self,
        nc: NATS,
        stream: str,
        subject: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=timeout_s)
        self.stream = stream
        self.subject = subject or log_subject(stream)
        self._timeout_s = timeout_s

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        headers: dict[str, Any] = {
            api.Header.EXPECTED_LAST_SEQUENCE.value: str(expected_seq),
            api.Header.EXPECTED_STREAM.value: self.stream,
        }
        try:
            msg = await self._nc.request(
                self.subject, bytes(data), timeout=self._timeout_s, headers=headers
            )
        except _UNKNOWN_OUTCOME as exc:
            raise AppendOutcomeUnknown(
                f"append after {expected_seq}: {type(exc).__name__}: {exc}"
            ) from exc
        except nats.errors.MaxPayloadError as exc:
            raise ReplicatedLogError(f"append of {len(data)} bytes: {exc}") from exc
        try:
            resp = json.loads(msg.data)
        except ValueError as exc:
            raise AppendOutcomeUnknown(
                f"append after {expected_seq}: bad answer {msg.data!r}"
            ) from exc
        error = resp.get("error")
        if error is not None:
            if error.get("err_code") == ERR_WRONG_LAST_SEQUENCE:
                found = _LAST_SEQ.search(str(error.get("description", "")))
                raise AppendRefused(expected_seq, int(found.group(1)) if found else None)
            if error.get("code") == 503:
                raise AppendOutcomeUnknown(f"append after {expected_seq}: {error}")
            raise ReplicatedLogError(f"append after {expected_seq} refused: {error}")
        seq = int(resp.get("seq", 0))
        if resp.get("stream") != self.stream or seq != expected_seq + 1:
            # JetStream acknowledged something other than what was asked: an
            # engine fault; nothing can be promised about it.
            raise AppendOutcomeUnknown(
                f"append after {expected_seq} acknowledged as {resp!r} (expected "
                f"stream {self.stream!r} seq {expected_seq + 1})"
            )
        return seq

    async def _state(self) -> api.StreamState:
        try:
            info = await self._js.stream_info(self.stream)
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"stream info {self.stream}", exc) from exc
        return info.state

    async def bounds(self) -> tuple[int, int]:
        """(first, last) in one question; first is last + 1 when the stream is empty."""
        state = await self._state()
        last = int(state.last_seq or 0)
        if not state.messages:
            return last + 1, last
        return int(state.first_seq), last

    async def last(self) -> int:
        return (await self.bounds())[1]

    async def first(self) -> int:
        return (await self.bounds())[0]

    async def _get(self, seq: int) -> bytes | None:
        try:
            raw = await self._js.get_msg(self.stream, seq=seq)
        except nats.js.errors.NotFoundError:
            return None
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"get {self.stream} seq {seq}", exc) from exc
        return raw.data or b""

    async def read(self, seq: int, limit: int) -> list[Entry]:
        first, last = await self.bounds()
        if seq < first:
            raise Purged(seq, first)
        end = min(last, seq + max(limit, 0) - 1)
        if end < seq:
            return []
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(s: int) -> bytes | None:
            async with gate:
                return await self._get(s)

        found = await asyncio.gather(*(one(s) for s in range(seq, end + 1)))
        entries = []
        for s, data in zip(range(seq, end + 1), found, strict=True):
            if data is None:
                now_first = await self.first()
                if s < now_first:
                    raise Purged(s, now_first)
                raise ReplicatedLogError(
                    f"stream {self.stream} has no message {s} between {first} and {last}"
                )
            entries.append(Entry(s, data))
        return entries

    async def read_from(self, seq: int) -> AsyncIterator[Entry]:
        expected = seq
        while True:
            try:
                sub = await self._js.subscribe(
                    self.subject,
                    stream=self.stream,
                    ordered_consumer=True,
                    idle_heartbeat=TAIL_HEARTBEAT_S,
                    deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                    config=api.ConsumerConfig(opt_start_seq=expected),
                )
            except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError):
                await asyncio.sleep(TAIL_RETRY_S)
                continue
            try:
                quiet_s = 0.0
                while True:
                    try:
                        msg = await sub.next_msg(timeout=TAIL_HEARTBEAT_S)
                    except nats.errors.TimeoutError:
                        quiet_s += TAIL_HEARTBEAT_S
                        if quiet_s < TAIL_STALL_S:
                            continue
                        quiet_s = 0.0
                        try:
                            first, last = await self.bounds()
                        except BackendUnavailable:
                            continue
                        if expected < first:
                            raise Purged(expected, first) from None
                        if last >= expected:
                            break  # behind the tail and quiet: recreate the consumer
                        continue
                    except (nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
                        break
                    quiet_s = 0.0
                    metadata = msg.metadata
                    got = metadata.sequence.stream
                    if got < expected:
                        continue
                    if got > expected:
                        try:
                            first = await self.first()
                        except BackendUnavailable:
                            break
                        if expected < first:
                            raise Purged(expected, first)
                        break  # a gap: start again from the sequence expected
                    # The ack subject's time is the message's stored time.
                    yield Entry(got, msg.data, metadata.timestamp.timestamp() * 1000)
                    expected += 1
            finally:
                with contextlib.suppress(Exception):  # the connection may be gone
                    await sub.unsubscribe()
            await asyncio.sleep(TAIL_RETRY_S)

    async def purge_below(self, seq: int) -> None:
        first, last = await self.bounds()
        # Purging up to a sequence past the tail would move the stream's last
        # sequence: never beyond last + 1.
        upto = min(seq, last + 1)
        if upto <= first:
            return
        try:
            await self._js.purge_stream(self.stream, seq=upto)
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"purge {self.stream} below {upto}", exc) from exc


# -- the lease -------------------------------------------------------------------


def encode_lease(record: LeaseRecord) -> bytes:
    return json.dumps(
        {"node_id": record.node_id, "address": record.address, "epoch": record.epoch},
        separators=(",", ":"),
    ).encode()


def decode_lease(data: bytes) -> LeaseRecord:
    raw = json.loads(data)
    return LeaseRecord(str(raw["node_id"]), str(raw["address"]), int(raw["epoch"]))


class JetStreamLease:
    """A `Lease` on one key of a KV bucket (history 1) whose max age is the TTL:
    a record not renewed within the TTL is removed by JetStream."""

    def __init__(self, kv: KeyValue, key: str = LEASE_KEY) -> None:
        self._kv = kv
        self.key = key

    async def current(self) -> HeldLease | None:
        try:
            entry = await self._kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:
            return None
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"lease get {self.key}", exc) from exc
        if entry.value is None or entry.revision is None:
            return None
        return HeldLease(decode_lease(entry.value), int(entry.revision))

    async def acquire(self, record: LeaseRecord) -> HeldLease | None:
        try:
            revision = await self._kv.create(self.key, encode_lease(record))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"lease create {self.key}", exc) from exc
        return HeldLease(record, int(revision))

    async def renew(self, held: HeldLease) -> HeldLease | None:
        try:
            revision = await self._kv.update(
                self.key, encode_lease(held.record), last=held.revision
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"lease update {self.key}", exc) from exc
        return HeldLease(held.record, int(revision))

    async def release(self, held: HeldLease) -> None:
        try:
            await self._kv.delete(self.key, last=held.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # someone else's record (or none): nothing of ours to release
        except nats.js.errors.APIError as exc:
            if exc.err_code == ERR_WRONG_LAST_SEQUENCE:  # (delete does not map it)
                return
            raise _unavailable(f"lease delete {self.key}", exc) from exc
        except _UNKNOWN_OUTCOME as exc:
            raise _unavailable(f"lease delete {self.key}", exc) from exc


# -- blobs -----------------------------------------------------------------------


class JetStreamBlobStore:
    """A `BlobStore` on a JetStream object store bucket (chunked, SHA-256 checked
    on read by nats-py)."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    async def put(self, name: str, data: bytes) -> None:
        try:
            await self._store.put(name, bytes(data))
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"blob put {name}", exc) from exc

    async def get(self, name: str) -> bytes | None:
        try:
            result = await self._store.get(name)
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
            return None
        except nats.js.errors.NotFoundError:
            return None
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"blob get {name}", exc) from exc
        return bytes(result.data or b"")

    async def names(self) -> list[str]:
        try:
            infos = await self._store.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return []
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable("blob list", exc) from exc
        return sorted(str(i.name) for i in infos if not i.deleted)

    async def delete(self, name: str) -> None:
        try:
            await self._store.delete(name)
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
            return
        except nats.js.errors.NotFoundError:
            return
        except (*_UNKNOWN_OUTCOME, nats.js.errors.APIError) as exc:
            raise _unavailable(f"blob delete {name}", exc) from exc


# -- setup and checks ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterNames:
    """The JetStream resources of one sepp cluster."""

    stream: str = "sepp"
    lease_bucket: str = "sepp-lease"
    blob_bucket: str = "sepp-snapshots"

    @property
    def subject(self) -> str:
        return log_subject(self.stream)


@dataclass(frozen=True, slots=True)
class ClusterResources:
    log: JetStreamLog
    lease: JetStreamLease
    blobs: JetStreamBlobStore


def _fetch_varz(
    url: str, timeout_s: float, context: ssl.SSLContext | None = None
) -> dict[str, Any]:
    with urllib.request.urlopen(
        url.rstrip("/") + "/varz", timeout=timeout_s, context=context
    ) as response:
        data = json.loads(response.read())
    if not isinstance(data, dict):
        raise ValueError(f"/varz of {url} is not an object")
    return data


async def server_sync_settings(
    monitor_urls: Sequence[str],
    timeout_s: float = REQUEST_TIMEOUT_S,
    context: ssl.SSLContext | None = None,
) -> dict[str, bool]:
    """Each server's name -> whether JetStream fsyncs every write
    (`sync_interval: always`), read from its monitoring endpoint's /varz
    (`context`: https monitoring URLs are checked against it)."""
    settings: dict[str, bool] = {}
    for url in monitor_urls:
        try:
            varz = await asyncio.to_thread(_fetch_varz, url, timeout_s, context)
        except (OSError, ValueError) as exc:
            raise ClusterSetupRefused(
                f"cannot read the JetStream settings of {url}/varz ({exc}): cluster mode "
                "checks every server's sync_interval through its monitoring port"
            ) from exc
        js_config = (varz.get("jetstream") or {}).get("config") or {}
        settings[str(varz.get("server_name", url))] = bool(js_config.get("sync_always", False))
    return settings


async def _ensure_stream(
    js: JetStreamContext, names: ClusterNames, replicas: int
) -> api.StreamInfo:
    try:
        return await js.stream_info(names.stream)
    except nats.js.errors.NotFoundError:
        pass
    config = api.StreamConfig(
        name=names.stream,
        subjects=[names.subject],
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        max_msg_size=MAX_MESSAGE_BYTES,
        # Never drop a message to make room: no limits, and if an operator adds
        # one, appends are refused rather than old messages silently discarded.
        discard=api.DiscardPolicy.NEW,
        max_msgs=-1,
        max_bytes=-1,
        max_age=0,
        max_msgs_per_subject=-1,
        deny_delete=True,
        allow_direct=False,
    )
    try:
        return await js.add_stream(config)
    except nats.js.errors.ServiceUnavailableError:
        raise  # still electing: asked again
    except nats.js.errors.APIError as exc:
        if exc.err_code == ERR_STREAM_NAME_IN_USE:  # another node created it meanwhile
            return await js.stream_info(names.stream)
        if exc.err_code == ERR_NO_SUITABLE_PEERS:
            raise  # a server offline for now: asked again
        raise ClusterSetupRefused(f"cannot create stream {names.stream}: {exc}") from exc


def check_stream(info: api.StreamInfo, replicas: int = REPLICAS) -> None:
    """Refuse a stream that is not file-stored R`replicas` or could drop messages."""
    config = info.config
    problems = []
    if config.num_replicas != replicas:
        problems.append(f"it has {config.num_replicas} replicas, cluster mode needs {replicas}")
    if config.storage != api.StorageType.FILE:
        problems.append(f"its storage is {config.storage}, cluster mode needs file")
    for limit in ("max_msgs", "max_bytes", "max_msgs_per_subject"):
        value = getattr(config, limit)
        if value is not None and value > 0:
            problems.append(f"{limit} is {value} (a limit would discard messages)")
    if config.max_age:
        problems.append(f"max_age is {config.max_age} s (messages would expire)")
    if problems:
        raise ClusterSetupRefused(f"stream {config.name}: " + "; ".join(problems))


def check_lease_bucket(info: api.StreamInfo, lease_ttl_s: float, replicas: int = REPLICAS) -> None:
    """Refuse a lease bucket made with other settings than this node's: its max
    age is the lease's TTL (a bucket from a node with another `lease_ttl_ms`
    would make a lapsed lease look held, or a held one lapse, on every node),
    and it must be file-stored R`replicas` with a history of 1."""
    config = info.config
    problems = []
    ttl = config.max_age or 0.0
    if abs(ttl - lease_ttl_s) > LEASE_TTL_TOLERANCE_S:
        problems.append(
            f"its max age (the lease TTL) is {ttl:g} s, this node's is {lease_ttl_s:g} s"
        )
    if config.num_replicas != replicas:
        problems.append(f"it has {config.num_replicas} replicas, cluster mode needs {replicas}")
    if config.storage != api.StorageType.FILE:
        problems.append(f"its storage is {config.storage}, cluster mode needs file")
    if config.max_msgs_per_subject != 1:
        problems.append(f"its history is {config.max_msgs_per_subject}, the lease needs 1")
    if problems:
        raise ClusterSetupRefused(
            f"lease bucket {config.name}: " + "; ".join(problems) + " (every node must use "
            "the same lease settings; to change them, stop every node and delete the bucket)"
        )


def check_sync(info: api.StreamInfo, settings: dict[str, bool]) -> None:
    """Refuse unless every server hosting the stream says `sync_always`."""
    cluster = info.cluster
    hosts: list[str] = []
    if cluster is not None:
        if cluster.leader:
            hosts.append(cluster.leader)
        hosts.extend(str(p.name) for p in cluster.replicas or [])
    if not hosts:
        raise ClusterSetupRefused(
            f"stream {info.config.name} reports no leader or replicas: not a clustered stream"
        )
    unknown = [h for h in hosts if h not in settings]
    if unknown:
        raise ClusterSetupRefused(
            f"servers {unknown} host stream {info.config.name} but their monitoring URLs "
            f"were not given (have {sorted(settings)}): give every server's monitoring URL"
        )
    lazy = [h for h in hosts if not settings[h]]
    if lazy:
        raise ClusterSetupRefused(
            f"servers {lazy} run JetStream without `sync_interval: always` (a lazy fsync "
            "loses acknowledged writes when machines fail together): set "
            "`jetstream { sync_interval: always }` in their configuration and restart them"
        )


async def ensure_cluster_resources(
    nc: NATS,
    names: ClusterNames,
    *,
    monitor_urls: Sequence[str],
    lease_ttl_s: float = LEASE_TTL_S,
    replicas: int = REPLICAS,
    timeout_s: float = REQUEST_TIMEOUT_S,
    setup_deadline_s: float = SETUP_DEADLINE_S,
    monitor_tls: ssl.SSLContext | None = None,
) -> ClusterResources:
    """Create the stream, the lease bucket and the object store if missing, then
    refuse (`ClusterSetupRefused`) unless the stream is R`replicas`, file-stored,
    without discarding limits, and every server hosting it runs with
    `sync_interval: always`. A cluster still electing its leaders (timeouts,
    "JetStream system temporarily unavailable") or unable to place R`replicas`
    for now (a server offline: "no suitable peers for placement") is asked again
    until `setup_deadline_s`, then `BackendUnavailable`. `monitor_tls`: the TLS
    context https monitoring URLs are checked against (default the system's)."""
    js = nc.jetstream(timeout=max(timeout_s, SETUP_REQUEST_TIMEOUT_S))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + setup_deadline_s
    while True:
        try:
            kv, store = await _ensure_once(
                js, names, monitor_urls, lease_ttl_s, replicas, timeout_s, monitor_tls
            )
            break
        except ClusterSetupRefused:
            raise
        except (*_UNKNOWN_OUTCOME, nats.js.errors.Error) as exc:
            if not may_succeed_later(exc) or loop.time() >= deadline:
                raise _unavailable(_SETTING_UP + _placement_hint(exc, replicas), exc) from exc
            await asyncio.sleep(SETUP_RETRY_S)
    return ClusterResources(
        log=JetStreamLog(nc, names.stream, names.subject, timeout_s),
        lease=JetStreamLease(kv),
        blobs=JetStreamBlobStore(store),
    )


_SETTING_UP = "setting up the cluster's JetStream resources"


def _no_suitable_peers(exc: BaseException) -> bool:
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == ERR_NO_SUITABLE_PEERS


def may_succeed_later(exc: BaseException) -> bool:
    """Whether a JetStream admin request that raised `exc` may succeed if asked
    again: a cluster still electing (timeouts, no responders, 503) or with a
    server offline for now (no suitable peers). Setup asks again until its
    deadline."""
    return isinstance(exc, _UNKNOWN_OUTCOME) or _no_suitable_peers(exc)


def _placement_hint(exc: BaseException, replicas: int) -> str:
    if not _no_suitable_peers(exc):
        return ""
    return (
        f" (JetStream could not place {replicas} replicas: is a server down, or does the "
        f"cluster have fewer than {replicas} JetStream servers?)"
    )


async def _ensure_once(
    js: JetStreamContext,
    names: ClusterNames,
    monitor_urls: Sequence[str],
    lease_ttl_s: float,
    replicas: int,
    timeout_s: float,
    monitor_tls: ssl.SSLContext | None = None,
) -> tuple[KeyValue, ObjectStore]:
    info = await _ensure_stream(js, names, replicas)
    check_stream(info, replicas)
    check_sync(info, await server_sync_settings(monitor_urls, timeout_s, monitor_tls))
    try:
        kv = await js.key_value(names.lease_bucket)
    except nats.js.errors.BucketNotFoundError:
        kv = await js.create_key_value(
            bucket=names.lease_bucket,
            history=1,
            ttl=lease_ttl_s,
            replicas=replicas,
            storage=api.StorageType.FILE,
            direct=False,
        )
    check_lease_bucket((await kv.status()).stream_info, lease_ttl_s, replicas)
    try:
        store = await js.object_store(names.blob_bucket)
    except nats.js.errors.BucketNotFoundError:
        store = await js.create_object_store(
            names.blob_bucket, replicas=replicas, storage=api.StorageType.FILE
        )
    return kv, store
