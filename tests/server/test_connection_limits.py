"""Connections a peer cannot use to exhaust the server (issue 13 §2, §4, §5, §6): the
cap on connections without hello, the small frame before hello, the idle timeout,
the descriptor reserve, the raised RLIMIT_NOFILE, rate-limited warnings.

Real servers on 127.0.0.1:0, except where only the server's own state shows the
point (in process, on a file system in memory)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import struct
import weakref
from collections.abc import Iterator

import pytest

from sepp.protocol import messages as pm
from sepp.protocol.framing import encode_frame
from sepp.server import admission
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import RawClient, connect, job, payload, wait_until

resource = pytest.importorskip("resource")


async def never_hello(address: str, count: int) -> list[RawClient]:
    """`count` connections that never say anything."""
    return [await RawClient.connect(address) for _ in range(count)]


def closed_to_make_room(client: RawClient) -> bool:
    errors = client.connection_errors
    return (
        client.closed
        and len(errors) == 1
        and errors[0].status == "resource_exhausted"
        and errors[0].body["reason"] == "too_many_connections"
    )


# -- the cap on connections without hello ---------------------------------------------------


async def test_never_hello_sockets_up_to_the_pre_auth_cap_do_not_keep_an_authenticated_client_out(
    server_factory, queue_names
):
    server = server_factory(
        env={
            "SEPP_SERVER__MAX_CONNECTIONS": "4",
            "SEPP_SERVER__MAX_UNAUTHENTICATED_CONNECTIONS": "2",
        }
    )
    # As many silent sockets as the whole connection cap: before the fix they
    # took every slot and the next client was refused.
    silent = await never_hello(server.address, 4)
    # The oldest two made room for the newer two, with an error frame each.
    await wait_until(
        lambda: sum(closed_to_make_room(c) for c in silent) == 2, what="two silent closed"
    )
    assert [closed_to_make_room(c) for c in silent] == [True, True, False, False]
    client = await connect(server.address)
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q))
    # More silent sockets push out each other, never the authenticated client.
    more = await never_hello(server.address, 3)
    await wait_until(
        lambda: sum(closed_to_make_room(c) for c in silent + more) == 5, what="five closed"
    )
    (delivered,) = await client.reserve([q])
    assert delivered["id"] == job_id
    assert not client.closed
    # A second real client still gets in (a silent one makes room for it).
    second = await connect(server.address)
    assert await second.ok("health") == {"status": "serving"}
    client.assert_clean()


async def test_when_every_connection_is_authenticated_a_newcomer_is_refused(server_factory):
    server = server_factory(
        env={
            "SEPP_SERVER__MAX_CONNECTIONS": "2",
            "SEPP_SERVER__MAX_UNAUTHENTICATED_CONNECTIONS": "2",
        }
    )
    first = await connect(server.address)
    second = await connect(server.address)
    refused = await RawClient.connect(server.address)
    await refused.wait_closed()
    (error,) = refused.arrivals
    assert (error.id, error.status, error.body["reason"]) == (
        0,
        "resource_exhausted",
        "too_many_connections",
    )
    assert await first.ok("health") == {"status": "serving"}
    assert await second.ok("health") == {"status": "serving"}


# -- the frame limit before hello ---------------------------------------------------------


async def test_a_frame_over_the_pre_hello_limit_is_refused_from_its_length_prefix(
    server_factory,
):
    server = server_factory(env={"SEPP_SERVER__FRAME_BYTES_MAX_BEFORE_HELLO": "4096"})
    for length in (4097, 1024 * 1024, 16 * 1024 * 1024):
        client = await RawClient.connect(server.address)
        # Only the 4-byte prefix: the server must not wait for (or buffer) the body.
        client.send_raw(struct.pack(">I", length))
        await client.wait_closed()
        (error,) = client.arrivals
        assert (error.id, error.status, error.body["reason"]) == (
            0,
            "resource_exhausted",
            "frame_too_large",
        )
        client.assert_clean()
    # After hello the full limit holds again.
    client = await connect(server.address)
    assert (await client.ok("server_info"))["max_message_bytes"] == 16 * 1024 * 1024


async def test_a_large_request_pipelined_behind_a_hello_is_judged_by_the_full_limit(
    server_factory, queue_names
):
    server = server_factory(env={"SEPP_SERVER__FRAME_BYTES_MAX_BEFORE_HELLO": "4096"})
    client = await RawClient.connect(server.address)
    q = next(queue_names)
    data = b"x" * 100_000
    hello = pm.encode_request(101, "hello", {"protocol": pm.PROTOCOL_VERSION})
    enqueue = pm.encode_request(102, "enqueue", {"jobs": [job(q, payload=payload(data))]})
    # One write: both frames usually arrive in one read.
    client.send_raw(encode_frame(hello) + encode_frame(enqueue))
    assert (await client.response(101)).status == "ok"
    response = await client.response(102)
    assert response.status == "ok", response
    (delivered,) = await client.reserve([q])
    assert delivered["payload"]["data"] == data


async def test_health_before_hello_is_still_answered_frame_by_frame(server_factory):
    server = server_factory()
    client = await RawClient.connect(server.address)
    first = client.send("health")
    second = client.send("health")
    assert (await client.response(first)).body == {"status": "serving"}
    assert (await client.response(second)).body == {"status": "serving"}
    await client.hello()
    assert await client.ok("health") == {"status": "serving"}


# -- the idle timeout ---------------------------------------------------------------------


async def test_the_idle_timeout_closes_a_silent_connection_but_not_one_with_a_parked_reserve(
    server_factory, queue_names
):
    server = server_factory(env={"SEPP_SERVER__IDLE_TIMEOUT_MS": "300"})
    q = next(queue_names)
    waiting = await connect(server.address)
    parked = waiting.send("reserve", waiting.reserve_body([q], wait_ms=60_000))
    idle = await connect(server.address)
    # The idle check of `waiting` is due before that of `idle` (it said hello
    # first): once `idle` is closed, `waiting` has been judged and kept.
    await idle.wait_closed()
    assert idle.connection_errors == []
    assert not waiting.closed
    producer = await connect(server.address)
    (job_id,) = await producer.enqueue_ids(job(q))
    response = await waiting.response(parked)
    assert [j["id"] for j in response.body["jobs"]] == [job_id]
    assert await waiting.ok("health") == {"status": "serving"}


async def test_an_idle_timeout_of_zero_never_closes(server_factory):
    server = server_factory(
        env={"SEPP_SERVER__IDLE_TIMEOUT_MS": "0", "SEPP_SERVER__HANDSHAKE_TIMEOUT_MS": "100"}
    )
    quiet = await connect(server.address)
    # A never-hello connection times out after 100 ms; by then a 0 idle timeout
    # (were it a timer) would have fired long ago.
    silent = await RawClient.connect(server.address)
    await silent.wait_closed()
    assert not quiet.closed
    assert await quiet.ok("health") == {"status": "serving"}


# -- RLIMIT_NOFILE at startup -----------------------------------------------------------------


@pytest.fixture
def lowered_soft_descriptor_limit() -> Iterator[int]:
    """Lower this process's soft RLIMIT_NOFILE (a child inherits it); put it back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = 256
    if hard != resource.RLIM_INFINITY and hard <= lowered:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        yield lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_server_raises_its_soft_descriptor_limit_at_startup(
    server_factory, lowered_soft_descriptor_limit
):
    server = server_factory()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = admission.DESCRIPTORS_TARGET_UNLIMITED if hard == resource.RLIM_INFINITY else hard
    assert (
        f"descriptor limit: raised soft RLIMIT_NOFILE from {lowered_soft_descriptor_limit} "
        f"to {target} (hard {hard})"
    ) in server.log()
    assert server.stop() == 0


# -- in process: the descriptor reserve, the rate-limited hello warning --------------------------


async def test_a_connection_that_would_eat_into_the_descriptor_reserve_is_refused(
    in_process_env, monkeypatch, caplog
):
    # A small configured limit: room for exactly two connections beside what is
    # open and the reserve (the real limit is not touched).
    reserved = 16
    monkeypatch.setattr(admission, "open_descriptors", lambda: 100)
    monkeypatch.setattr(
        admission,
        "raise_descriptor_limit",
        lambda: admission.DescriptorLimit(soft_before=118, soft=118, hard=118),
    )
    config = in_process_config(server__descriptors_reserved=str(reserved))
    with caplog.at_level(logging.WARNING, logger="sepp.server"):
        async with in_process(config) as server:
            assert server.descriptor_connections == 2
            assert "holds only 2 connections" in caplog.text
            address = address_of(server)
            first = await connect(address)
            silent = await RawClient.connect(address)
            # The bound is full, but one connection has no hello: it makes room.
            second = await connect(address)
            await wait_until(lambda: closed_to_make_room(silent), what="silent closed")
            # Now both are authenticated: the next one is refused at accept.
            refused = await RawClient.connect(address)
            await refused.wait_closed()
            (error,) = refused.arrivals
            assert error.body["reason"] == "too_many_connections"
            assert "descriptor limit" in error.body["message"]
            assert "descriptors left are reserved for storage" in caplog.text
            assert await first.ok("health") == {"status": "serving"}
            assert await second.ok("health") == {"status": "serving"}


async def test_failed_hellos_log_one_warning_per_interval(in_process_env, caplog):
    config = in_process_config(auth__api_keys='["right"]')
    with caplog.at_level(logging.WARNING, logger="sepp.server"):
        async with in_process(config) as server:
            server.warn.clock = lambda: 1000.0  # frozen: every failure in one interval
            for _ in range(20):
                await failed_hello(address_of(server))
            server.warn.clock = lambda: 1001.0
            await failed_hello(address_of(server))
    lines = [r.getMessage() for r in caplog.records if "unknown API key" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "(19 similar line(s) held back" in lines[1]


async def failed_hello(address: str) -> None:
    client = await RawClient.connect(address)
    response = await client.call("hello", {"protocol": pm.PROTOCOL_VERSION, "api_key": "wrong"})
    assert response.status == "unauthenticated"
    await client.wait_closed()


async def connected_at_once(address: str, count: int) -> list[RawClient]:
    """`count` silent connections made before the server's loop runs again, so
    it accepts them in one turn (as a flood arrives)."""
    host, _, port = address.rpartition(":")
    # Blocking connects: the kernel completes them without the server's accept.
    socks = [socket.create_connection((host, int(port))) for _ in range(count)]
    clients = []
    for sock in socks:
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
        clients.append(RawClient(reader, writer))
    return clients


async def test_each_newcomer_closes_a_different_connection_without_hello(in_process_env):
    # All accepted in one turn: a connection closed to make room is reported
    # lost only later, and must not be picked to make room a second time.
    config = in_process_config(server__max_unauthenticated_connections="2")
    async with in_process(config) as server:
        silent = await connected_at_once(address_of(server), 5)
        await wait_until(
            lambda: sum(closed_to_make_room(c) for c in silent) == 3, what="three closed"
        )
        assert [closed_to_make_room(c) for c in silent] == [True, True, True, False, False]
        await wait_until(lambda: len(server.connections) == 2, what="the closed ones lost")
        assert len(server.unauthenticated) == 2


# -- a closed connection leaves no cycle behind ---------------------------------------------
# The server freezes what is alive every few seconds (gcpolicy); a frozen object that
# later ends up in a garbage cycle is not reclaimed while the heap is large (issue 13:
# 171 connections refused before hello kept 15 MiB resident for good). So a closed
# connection must be freed by reference counting alone: these run with the collector off.


async def _freed_without_the_collector(server, close) -> None:
    gc.disable()
    try:
        client = await RawClient.connect(address_of(server))
        await wait_until(lambda: len(server.connections) == 1, what="the connection admitted")
        ref = weakref.ref(next(iter(server.connections)))
        await close(client)
        await client.wait_closed()
        await wait_until(lambda: not server.connections, what="the connection lost")
        await wait_until(lambda: ref() is None, what="the connection freed")
    finally:
        gc.enable()


@pytest.mark.parametrize("after_hello", [False, True], ids=["before_hello", "after_hello"])
async def test_a_connection_refused_for_a_frame_too_large_is_freed_by_reference_counting(
    in_process_env, after_hello
):
    async def too_large(client: RawClient) -> None:
        # A frame and then a length prefix past the limit in one write: after hello
        # the error found behind the frame is kept by the reader for later.
        first = (
            pm.encode_request(1, "hello", {"protocol": pm.PROTOCOL_VERSION})
            if after_hello
            else pm.encode_request(1, "health", {})
        )
        client.send_raw(encode_frame(first) + struct.pack(">I", 64 * 1024 * 1024))

    async with in_process(in_process_config()) as server:
        await _freed_without_the_collector(server, too_large)


async def test_a_connection_closed_for_no_hello_is_freed_by_reference_counting(in_process_env):
    async def silent(client: RawClient) -> None:
        return None

    config = in_process_config(server__handshake_timeout_ms="200")
    async with in_process(config) as server:
        await _freed_without_the_collector(server, silent)
