"""What only the JetStream backend does: setting up and refusing a cluster, unknown
outcomes, and surviving the loss of the stream leader (sepp/cluster/jetstream.py).

Against the session's local cluster (tests/cluster/conftest.py); a test that
kills or pauses a server starts it again before it ends, so the next test finds
three servers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.manager import JetStreamManager

from sepp.cluster import jetstream
from sepp.cluster.replog import (
    AppendOutcomeUnknown,
    AppendRefused,
    Entry,
    ReplicatedLogError,
)
from tests.cluster.conftest import unique_name
from tests.support import wait_until
from tools.cluster import JetStreamCluster

# The first acknowledged fenced append after losing the stream leader (measured
# ~5 s on these machines; the target for a whole failover is p99 12 s).
FAILOVER_DEADLINE_S = 30.0
TAIL_DEADLINE_S = 30.0
T = TypeVar("T")


def _names() -> jetstream.ClusterNames:
    return jetstream.ClusterNames(
        stream=unique_name("log"),
        lease_bucket=unique_name("lease"),
        blob_bucket=unique_name("blobs"),
    )


@asynccontextmanager
async def _connected(cluster: JetStreamCluster, **options: Any) -> AsyncIterator[NATS]:
    nc = await jetstream.connect(cluster.urls(), **options)
    try:
        yield nc
    finally:
        await nc.close()


@asynccontextmanager
async def _resources(
    cluster: JetStreamCluster,
) -> AsyncIterator[tuple[NATS, jetstream.ClusterResources]]:
    """A connection and a fresh stream, lease bucket and blob store on it."""
    async with _connected(cluster) as nc:
        yield (
            nc,
            await jetstream.ensure_cluster_resources(
                nc, _names(), monitor_urls=cluster.monitor_urls()
            ),
        )


# How long a test's own JetStream admin call is tried again: on a busy machine a
# request can time out (the client's 1 s pings declare a stalled connection dead
# and reconnect), meet a 503 while the cluster settles, or find no suitable peers
# while the meta leader sees a server offline for a moment.
ADMIN_CALL_DEADLINE_S = 30.0


async def _admin(call: Callable[[], Awaitable[T]]) -> T:
    """`call()` (an idempotent JetStream admin request), tried again while
    `jetstream.may_succeed_later` (a timeout, an unavailable answer, "no suitable
    peers") until ADMIN_CALL_DEADLINE_S."""
    deadline = time.monotonic() + ADMIN_CALL_DEADLINE_S
    while True:
        try:
            return await call()
        except Exception as exc:
            if not jetstream.may_succeed_later(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_setup_creates_an_r3_file_stream_that_never_drops_and_is_idempotent(
    jetstream_cluster: JetStreamCluster,
) -> None:
    names = _names()
    async with _connected(jetstream_cluster) as nc:
        first = await jetstream.ensure_cluster_resources(
            nc, names, monitor_urls=jetstream_cluster.monitor_urls()
        )
        # Appended as a leader does: on a busy machine the new stream's leader
        # may still be settling (no responders), an unknown outcome to read back.
        assert await _append_until_acknowledged(first.log, 0, b"kept", FAILOVER_DEADLINE_S) == 1
        second = await jetstream.ensure_cluster_resources(
            nc, names, monitor_urls=jetstream_cluster.monitor_urls()
        )
        assert await second.log.read(1, 10) == [Entry(1, b"kept")]
        js = nc.jetstream()
        info = await _admin(lambda: js.stream_info(names.stream))
        assert info.config.num_replicas == 3
        assert info.config.storage == api.StorageType.FILE
        assert info.config.discard == api.DiscardPolicy.NEW
        assert info.config.max_msg_size == jetstream.MAX_MESSAGE_BYTES
        assert info.config.subjects == [names.subject]
        kv_info = await _admin(lambda: js.stream_info(f"KV_{names.lease_bucket}"))
        assert kv_info.config.num_replicas == 3
        assert kv_info.config.max_age == pytest.approx(jetstream.LEASE_TTL_S)
        assert kv_info.config.max_msgs_per_subject == 1
        obj_info = await _admin(lambda: js.stream_info(f"OBJ_{names.blob_bucket}"))
        assert obj_info.config.num_replicas == 3


# An existing stream set up otherwise -> what the refusal names.
REFUSED_STREAMS = [
    ({"num_replicas": 1}, "1 replicas, cluster mode needs 3"),
    ({"storage": api.StorageType.MEMORY}, "needs file"),
    ({"max_msgs": 1000}, "max_msgs is 1000"),
    ({"max_bytes": 1 << 30}, "max_bytes"),
    ({"max_age": 3600.0}, "max_age"),
]


@pytest.mark.parametrize(("config", "named"), REFUSED_STREAMS, ids=[n for _, n in REFUSED_STREAMS])
async def test_an_existing_stream_that_could_lose_messages_is_refused(
    jetstream_cluster: JetStreamCluster, config: dict[str, Any], named: str
) -> None:
    names = _names()
    async with _connected(jetstream_cluster) as nc:
        settings: dict[str, Any] = {"num_replicas": 3, "storage": api.StorageType.FILE}
        settings.update(config)
        js = nc.jetstream()
        await _admin(lambda: js.add_stream(name=names.stream, subjects=[names.subject], **settings))
        with pytest.raises(jetstream.ClusterSetupRefused, match=named):
            await jetstream.ensure_cluster_resources(
                nc, names, monitor_urls=jetstream_cluster.monitor_urls()
            )


# An existing lease bucket set up otherwise -> what the refusal names.
REFUSED_BUCKETS = [
    ({"ttl": 10.0}, "lease TTL\\) is 10 s, this node's is 3 s"),
    ({"replicas": 1}, "1 replicas"),
    ({"history": 5}, "history is 5"),
]


@pytest.mark.parametrize(("config", "named"), REFUSED_BUCKETS, ids=["ttl", "replicas", "history"])
async def test_an_existing_lease_bucket_with_other_settings_is_refused(
    jetstream_cluster: JetStreamCluster, config: dict[str, Any], named: str
) -> None:
    # E.g. created by a node with another lease_ttl_ms: its max age is the TTL on
    # every node, so a node must not take it for its own.
    names = _names()
    async with _connected(jetstream_cluster) as nc:
        settings: dict[str, Any] = {"history": 1, "ttl": jetstream.LEASE_TTL_S, "replicas": 3}
        settings.update(config)
        js = nc.jetstream()
        await _admin(lambda: js.create_key_value(bucket=names.lease_bucket, **settings))
        with pytest.raises(jetstream.ClusterSetupRefused, match=named) as refused:
            await jetstream.ensure_cluster_resources(
                nc, names, monitor_urls=jetstream_cluster.monitor_urls()
            )
        assert f"lease bucket KV_{names.lease_bucket}" in str(refused.value)


def _placement_refused_first(monkeypatch: pytest.MonkeyPatch, times: int | None) -> list[str]:
    """JetStream answers the next `times` (None: every) stream creations "no
    suitable peers for placement", as it does while its meta leader sees a server
    offline (one down, or not yet reported after a start); then it creates them.
    Returns the names of the streams refused so far."""
    real = JetStreamManager.add_stream
    refused: list[str] = []

    async def add_stream(self: JetStreamManager, config: Any = None, **params: Any) -> Any:
        if times is None or len(refused) < times:
            refused.append(config.name if config is not None else params["name"])
            raise nats.js.errors.BadRequestError(
                code=400,
                err_code=jetstream.ERR_NO_SUITABLE_PEERS,
                description="no suitable peers for placement, peer offline",
            )
        return await real(self, config, **params)

    monkeypatch.setattr(JetStreamManager, "add_stream", add_stream)
    return refused


async def test_setup_asks_again_while_jetstream_cannot_place_the_stream(
    jetstream_cluster: JetStreamCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server down for a moment (restarting) is an outage to wait out, not a
    # cluster to refuse.
    refused = _placement_refused_first(monkeypatch, times=3)
    names = _names()
    async with _connected(jetstream_cluster) as nc:
        res = await jetstream.ensure_cluster_resources(
            nc, names, monitor_urls=jetstream_cluster.monitor_urls()
        )
        assert refused == [names.stream] * 3
        assert await _append_until_acknowledged(res.log, 0, b"placed", FAILOVER_DEADLINE_S) == 1
        info = await _admin(lambda: nc.jetstream().stream_info(names.stream))
        assert info.config.num_replicas == 3


async def test_setup_that_cannot_place_the_stream_until_its_deadline_is_unavailable(
    jetstream_cluster: JetStreamCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = _placement_refused_first(monkeypatch, times=None)
    async with _connected(jetstream_cluster) as nc:
        with pytest.raises(jetstream.BackendUnavailable, match="no suitable peers") as unavailable:
            await jetstream.ensure_cluster_resources(
                nc, _names(), monitor_urls=jetstream_cluster.monitor_urls(), setup_deadline_s=1.0
            )
    # Asked again every SETUP_RETRY_S until the deadline, then named what to check.
    assert len(refused) >= 2
    assert "could not place 3 replicas: is a server down" in str(unavailable.value)


async def test_servers_without_sync_interval_always_are_refused(
    lazy_jetstream_cluster: JetStreamCluster,
) -> None:
    async with _connected(lazy_jetstream_cluster) as nc:
        with pytest.raises(jetstream.ClusterSetupRefused, match="sync_interval: always"):
            await jetstream.ensure_cluster_resources(
                nc, _names(), monitor_urls=lazy_jetstream_cluster.monitor_urls()
            )


async def test_a_server_whose_monitoring_url_is_not_given_is_refused(
    jetstream_cluster: JetStreamCluster,
) -> None:
    async with _connected(jetstream_cluster) as nc:
        with pytest.raises(jetstream.ClusterSetupRefused, match="monitoring URLs"):
            await jetstream.ensure_cluster_resources(
                nc, _names(), monitor_urls=jetstream_cluster.monitor_urls()[:1]
            )


async def test_an_unreachable_monitoring_url_is_refused(
    jetstream_cluster: JetStreamCluster,
) -> None:
    closed = "http://127.0.0.1:1"
    async with _connected(jetstream_cluster) as nc:
        with pytest.raises(jetstream.ClusterSetupRefused, match="cannot read"):
            await jetstream.ensure_cluster_resources(
                nc, _names(), monitor_urls=[*jetstream_cluster.monitor_urls(), closed]
            )


async def test_a_tailed_message_carries_the_time_jetstream_stored_it(
    jetstream_cluster: JetStreamCluster,
) -> None:
    # Same machine, same clock: the stored time lies between the request and
    # its acknowledgement (a millisecond of slack for the float's rounding).
    async with _resources(jetstream_cluster) as (_, res):
        spans = []
        for seq in range(3):
            before_ms = time.time() * 1000
            await res.log.append_if(seq, b"m%d" % seq)
            spans.append((before_ms, time.time() * 1000))
        tail = res.log.read_from(1)
        try:
            got = [await asyncio.wait_for(anext(tail), TAIL_DEADLINE_S) for _ in range(3)]
        finally:
            await tail.aclose()
    assert [e.seq for e in got] == [1, 2, 3]
    for entry, (before_ms, after_ms) in zip(got, spans, strict=True):
        assert before_ms - 1 <= entry.stored_ms <= after_ms + 1, (entry, before_ms, after_ms)


async def test_an_append_on_a_lost_connection_has_an_unknown_outcome(
    jetstream_cluster: JetStreamCluster,
) -> None:
    async with _resources(jetstream_cluster) as (nc, res):
        await nc.close()
        with pytest.raises(AppendOutcomeUnknown):
            await res.log.append_if(0, b"lost")


async def test_a_message_larger_than_one_mib_is_refused_and_not_appended(
    jetstream_cluster: JetStreamCluster,
) -> None:
    async with _resources(jetstream_cluster) as (_, res):
        with pytest.raises(ReplicatedLogError) as refused:
            await res.log.append_if(0, b"x" * (jetstream.MAX_MESSAGE_BYTES + 1))
        assert not isinstance(refused.value, AppendOutcomeUnknown)
        assert await res.log.last() == 0
        assert await res.log.append_if(0, b"fits") == 1


async def _append_until_acknowledged(
    log: jetstream.JetStreamLog, expected: int, data: bytes, deadline_s: float
) -> int:
    """What a leader does: retry the fenced append, and after an unknown outcome
    read the tail to learn whether it landed, never guessing."""
    deadline = time.monotonic() + deadline_s
    while True:
        assert time.monotonic() < deadline, f"no acknowledged append within {deadline_s} s"
        try:
            return await log.append_if(expected, data)
        except (AppendOutcomeUnknown, jetstream.BackendUnavailable):
            pass
        except AppendRefused as refused:
            # Only an earlier attempt of ours can have moved the tail.
            assert refused.last_seq == expected + 1
        try:
            if await log.last() == expected + 1:
                assert await log.read(expected + 1, 1) == [Entry(expected + 1, data)]
                return expected + 1
        except jetstream.BackendUnavailable:
            pass
        await asyncio.sleep(0.05)


async def _read_when_available(log: jetstream.JetStreamLog, seq: int, limit: int) -> list[Entry]:
    """read(), asked again while the cluster is still electing (503s) after a
    server came back."""

    async def attempt() -> list[Entry] | None:
        try:
            return await log.read(seq, limit)
        except jetstream.BackendUnavailable:
            return None

    result: list[Entry] = await wait_until(attempt, timeout=TAIL_DEADLINE_S, what="a read")
    return result


async def _a_server_restarted(cluster: JetStreamCluster, name: str) -> None:
    await asyncio.to_thread(cluster.restart, name)


async def test_after_kill_9_of_the_stream_leader_a_fenced_append_succeeds_and_tails_continue(
    jetstream_cluster: JetStreamCluster,
) -> None:
    names = _names()
    async with _connected(jetstream_cluster) as nc, _connected(jetstream_cluster) as reader_nc:
        res = await jetstream.ensure_cluster_resources(
            nc, names, monitor_urls=jetstream_cluster.monitor_urls()
        )
        reader = jetstream.JetStreamLog(reader_nc, names.stream)
        for i in range(3):
            await res.log.append_if(i, b"before%d" % i)
        tail = reader.read_from(1)
        for i in range(3):
            assert await asyncio.wait_for(anext(tail), TAIL_DEADLINE_S) == Entry(
                i + 1, b"before%d" % i
            )
        leader = await wait_until(
            lambda: jetstream_cluster.stream_leader(names.stream), what="a stream leader"
        )
        await asyncio.to_thread(jetstream_cluster.kill, leader)
        try:
            seq = await _append_until_acknowledged(res.log, 3, b"after", FAILOVER_DEADLINE_S)
            assert seq == 4
            with pytest.raises(AppendRefused):
                await res.log.append_if(3, b"a deposed leader's append")
            assert await asyncio.wait_for(anext(tail), TAIL_DEADLINE_S) == Entry(4, b"after")
            assert await _read_when_available(res.log, 1, 10) == [
                *(Entry(i + 1, b"before%d" % i) for i in range(3)),
                Entry(4, b"after"),
            ]
            await tail.aclose()
        finally:
            await _a_server_restarted(jetstream_cluster, leader)


async def test_a_paused_server_is_noticed_and_appends_go_on_through_another(
    jetstream_cluster: JetStreamCluster, caplog: pytest.LogCaptureFixture
) -> None:
    names = _names()
    caplog.set_level("WARNING", logger="sepp.cluster")
    async with _connected(jetstream_cluster) as nc:
        res = await jetstream.ensure_cluster_resources(
            nc, names, monitor_urls=jetstream_cluster.monitor_urls()
        )
        await res.log.append_if(0, b"before")
        url = nc.connected_url
        assert url is not None
        paused = next(s.name for s in jetstream_cluster.servers if s.client_port == url.port)
        jetstream_cluster.pause(paused)
        try:
            # With nats-py's default ping interval (120 s) the connection to the
            # paused server would stay "up" and every append would time out.
            seq = await _append_until_acknowledged(res.log, 1, b"after", FAILOVER_DEADLINE_S)
            assert seq == 2
            assert "nats connection lost; reconnecting" in caplog.messages
        finally:
            jetstream_cluster.resume(paused)
            await asyncio.to_thread(jetstream_cluster.wait_meta_leader)
        assert await _read_when_available(res.log, 1, 10) == [
            Entry(1, b"before"),
            Entry(2, b"after"),
        ]


async def test_closing_a_connection_is_not_logged_as_a_lost_one(
    jetstream_cluster: JetStreamCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # nats-py calls the disconnected callback on close() too: a node shutting
    # down must not warn that it lost its connection and is reconnecting.
    with caplog.at_level("INFO", logger="sepp.cluster"):
        async with _connected(jetstream_cluster) as nc:
            assert nc.is_connected
    assert nc.is_closed
    assert [r.getMessage() for r in caplog.records] == []


async def test_connection_errors_are_one_line_each_and_repeats_are_counted_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    quiet = jetstream.ConnectionLog(clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="sepp.cluster"):
        for _ in range(40):  # ten seconds of failed reconnects, four a second
            await quiet.error(ConnectionRefusedError(111, "Connection refused"))
            now[0] += 0.25
        now[0] += jetstream.ERROR_LOG_INTERVAL_S
        await quiet.error(ConnectionRefusedError(111, "Connection refused"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "nats connection: [Errno 111] Connection refused",
        "nats connection: [Errno 111] Connection refused (39 more since the last one logged)",
    ]
    assert all(r.exc_info is None for r in caplog.records)
