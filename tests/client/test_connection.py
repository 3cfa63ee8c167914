"""The connection against a scripted fake server: handshake, pipelining with
out-of-order answers, deadlines, dropped connections and frame limits."""

from __future__ import annotations

import asyncio
import socket
import struct
from datetime import timedelta

import pytest

from sepp.client import (
    ClientClosedError,
    ConnectError,
    EnqueueRequest,
    InvalidApiKeyError,
    MalformedResponseError,
    MessageTooLargeError,
    OverloadedError,
    Payload,
    ReserveOptions,
    SeppClient,
    TransportError,
    UnauthenticatedError,
    UnsupportedProtocolError,
)
from sepp.client._connection import parse_address
from sepp.protocol import decode_request, encode_frame, encode_response
from tests.client.fakeserver import CLOSE, DROP, SILENT, FakeServer, error, make_job
from tests.support import record_client_writes

LEASE = timedelta(seconds=30)

# -- handshake ----------------------------------------------------------------------------


async def test_connect_sends_hello_first_with_protocol_key_and_name() -> None:
    async with FakeServer(api_key="s3cret") as fake:
        client = await SeppClient.connect(fake.address, api_key="s3cret", client_name="test/1")
        assert fake.requests[0].op == "hello"
        assert fake.requests[0].body == {"protocol": 1, "api_key": "s3cret", "client": "test/1"}
        assert (await client.health()).serving
        await client.close()


async def test_a_wrong_api_key_fails_connect_with_unauthenticated() -> None:
    async with FakeServer(api_key="right") as fake:
        with pytest.raises(UnauthenticatedError) as caught:
            await SeppClient.connect(fake.address, api_key="wrong")
        assert caught.value.code == "unauthenticated"
        with pytest.raises(UnauthenticatedError):
            await SeppClient.connect(fake.address)


async def test_an_unsupported_protocol_version_fails_connect() -> None:
    async with FakeServer() as fake:
        fake.reply(
            "hello",
            "invalid_argument",
            {"message": "protocol 1 is too old", "supported_protocol_versions": [2, 3]},
        )
        with pytest.raises(UnsupportedProtocolError) as caught:
            await SeppClient.connect(fake.address)
        assert caught.value.supported_protocol_versions == [2, 3]
        assert isinstance(caught.value, ConnectError)


async def test_connect_to_a_closed_port_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConnectError) as caught:
        await SeppClient.connect(f"127.0.0.1:{port}")
    assert caught.value.addr == f"127.0.0.1:{port}"


async def test_a_server_that_never_answers_hello_times_out_as_connect_error(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.on("hello", lambda conn, req: SILENT)
        with pytest.raises(ConnectError, match="within"):
            await SeppClient.connect(fake.address, connect_timeout=timedelta(milliseconds=50))


def test_an_empty_api_key_is_refused_before_connecting() -> None:
    with pytest.raises(InvalidApiKeyError):
        SeppClient("127.0.0.1:1", api_key="")


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:7000", ("127.0.0.1", 7000, False)),
        ("queue.example.com", ("queue.example.com", 7463, False)),
        ("https://queue.example.com:443/", ("queue.example.com", 443, True)),
        ("http://localhost:1", ("localhost", 1, False)),
        ("[::1]:9", ("::1", 9, False)),
        ("::1", ("::1", 7463, False)),
    ],
)
def test_addresses_parse_with_default_port_and_scheme(
    address: str, expected: tuple[str, int, bool]
) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "host:0", "host:port", "[::1", "host:99999"])
def test_bad_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValueError):
        parse_address(address)


def test_tls_options_build_a_context() -> None:
    assert SeppClient("127.0.0.1:1")._endpoint.ssl is None
    assert SeppClient("127.0.0.1:1", tls=True)._endpoint.ssl is not None
    assert SeppClient("https://127.0.0.1:1")._endpoint.ssl is not None
    client = SeppClient("127.0.0.1:1", tls_domain="queue.internal")
    assert client._endpoint.ssl is not None
    assert client._endpoint.server_hostname == "queue.internal"


# -- pipelining ------------------------------------------------------------------------------


async def test_responses_out_of_order_reach_the_right_callers(fake: FakeServer) -> None:
    gates = {name: asyncio.Event() for name in ("a", "b", "c")}

    async def enqueue(conn, request):
        queue = request.body["jobs"][0]["queue"]
        await gates[queue].wait()
        return "ok", {"results": [{"job_id": f"id-{queue}", "deduplicated": False}]}

    async with fake:
        fake.on("enqueue", enqueue)
        client = await SeppClient.connect(fake.address)
        calls = {
            name: asyncio.ensure_future(client.enqueue(EnqueueRequest(name, "t")))
            for name in ("a", "b", "c")
        }
        await fake.wait_until(lambda: len(fake.ops("enqueue")) == 3)
        # All three are in flight on one connection; answer them backwards.
        assert len(fake.connections) == 1
        for name in ("c", "b", "a"):
            gates[name].set()
            ack = await calls[name]
            assert ack.job_id == f"id-{name}"
        await client.close()


async def test_a_pending_long_poll_does_not_block_an_ack(fake: FakeServer) -> None:
    async with fake:
        fake.queue.push(make_job("first"))
        client = await SeppClient.connect(fake.address)
        jobs = await client.reserve(ReserveOptions(["q"], LEASE))
        assert jobs is not None
        # Nothing is ready now: this reserve parks on the server for 30 s.
        parked = asyncio.ensure_future(
            client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(seconds=30)))
        )
        await fake.wait_until(lambda: len(fake.queue.reserves) == 2)
        await client.ack(jobs[0].ctx)  # answered while the reserve still waits
        assert fake.queue.acked == [jobs[0].ctx.id]
        assert not parked.done()
        fake.queue.push(make_job("second"))
        second = await parked
        assert second is not None and second[0].ctx.job_type == "second"
        await client.close()


async def test_request_ids_are_unique_among_pending_requests(fake: FakeServer) -> None:
    async with fake:
        fake.reply("queue_stats", "ok", {"server_time_ms": 0, "queues": []})
        client = await SeppClient.connect(fake.address)
        await asyncio.gather(*(client.queue_stats() for _ in range(50)))
        ids = [r.id for r in fake.requests]
        assert len(ids) == len(set(ids)) == 51
        await client.close()


async def test_requests_sent_while_corked_for_a_turn_leave_in_one_write(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        recorded = record_client_writes(client)
        connection = client._connection
        assert connection is not None
        connection.cork_for_turn()
        sent = [connection.send("health", {}, timeout=5) for _ in range(3)]
        assert recorded.writes == []  # held until the turn's callbacks have run
        await asyncio.sleep(0)  # one loop turn, no waiting for time
        assert [[decode_request(f).id for f in frames] for frames in recorded.frames()] == [
            [request_id for request_id, _ in sent]
        ]
        for _, answer in sent:
            assert (await answer).body == {"status": "serving"}
        # Uncorked: the next request leaves at once, in a write of its own.
        assert (await client.health()).serving
        assert len(recorded.writes) == 2
        await client.close()


# -- deadlines and drops ------------------------------------------------------------------------


async def test_a_call_without_answer_fails_at_its_deadline(fake: FakeServer) -> None:
    async with fake:
        fake.on("server_info", lambda conn, req: SILENT)
        client = await SeppClient.connect(fake.address, rpc_timeout=timedelta(milliseconds=50))
        with pytest.raises(TransportError) as caught:
            await client.get_server_info()
        assert caught.value.code == "deadline_exceeded"
        # The connection survives a timed-out call.
        assert (await client.health()).serving
        await client.close()


async def test_many_pending_calls_share_one_deadline_timer_and_each_fails_at_its_own(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.on("server_info", lambda conn, req: SILENT)
        client = await SeppClient.connect(fake.address, rpc_timeout=timedelta(milliseconds=50))
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        call_at = loop.call_at

        def counting_call_at(when: float, callback, *args):  # type: ignore[no-untyped-def]
            armed.append(when)
            return call_at(when, callback, *args)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        try:
            outcomes = await asyncio.gather(
                *(client.get_server_info() for _ in range(20)), return_exceptions=True
            )
        finally:
            loop.call_at = call_at  # type: ignore[method-assign]
        assert all(
            isinstance(o, TransportError) and o.code == "deadline_exceeded" for o in outcomes
        ), outcomes
        # Not a timer per call (asyncio.timeout / wait_for arm one each): the
        # connection's sweep, armed at the first deadline, fails all twenty.
        assert 1 <= len(armed) <= 2, armed
        assert (await client.health()).serving
        await client.close()


async def test_a_reserve_deadline_is_its_wait_plus_ten_seconds(fake: FakeServer) -> None:
    async with fake:
        fake.on("reserve", lambda conn, req: SILENT)
        client = await SeppClient.connect(fake.address, rpc_timeout=timedelta(milliseconds=1))
        seen: list[float | None] = []
        connection = await client._ensure_connection()
        original = connection.request

        async def spy(op, body, *, timeout, on_orphan=None, withdrawable=False):
            seen.append(timeout)
            raise TransportError("stop here")

        connection.request = spy  # type: ignore[method-assign]
        with pytest.raises(TransportError):
            await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(seconds=5)))
        assert seen == [15.0]
        connection.request = original  # type: ignore[method-assign]
        await client.close()


async def test_requests_in_flight_on_a_dropped_connection_fail_with_transport_error(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.on("server_info", lambda conn, req: SILENT)
        fake.on("queue_stats", lambda conn, req: DROP)
        client = await SeppClient.connect(fake.address)
        waiting = asyncio.ensure_future(client.get_server_info())
        await fake.wait_until(lambda: len(fake.ops("server_info")) == 1)
        with pytest.raises(TransportError) as dropped:
            await client.queue_stats()
        with pytest.raises(TransportError) as also:
            await waiting
        assert dropped.value.code == also.value.code == "connection_lost"
        await client.close()


async def test_close_fails_pending_calls_and_later_calls(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        parked = asyncio.ensure_future(
            client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(seconds=30)))
        )
        await fake.wait_until(lambda: len(fake.queue.reserves) == 1)
        await client.close()
        with pytest.raises(ClientClosedError):
            await parked
        with pytest.raises(ClientClosedError):
            await client.health()
        await client.close()  # twice is fine


# -- frames -----------------------------------------------------------------------------------


async def test_a_request_over_the_server_frame_limit_is_refused_before_sending() -> None:
    async with FakeServer(max_message_bytes=1024) as fake:
        client = await SeppClient.connect(fake.address)
        big = EnqueueRequest("q", "t", payload=Payload(b"x" * 2000, "bin"))
        with pytest.raises(MessageTooLargeError) as caught:
            await client.enqueue(big)
        assert caught.value.limit == 1024
        assert fake.ops("enqueue") == []
        assert (await client.health()).serving  # the connection is intact
        await client.close()


async def test_the_servers_frame_too_large_farewell_fails_the_pending_call() -> None:
    async with FakeServer(max_message_bytes=1024) as fake:
        client = await SeppClient.connect(fake.address)
        connection = await client._ensure_connection()
        connection.max_message_bytes = 10_000  # the client believes a bigger limit
        with pytest.raises(MessageTooLargeError) as caught:
            await client.enqueue(EnqueueRequest("q", "t", payload=Payload(b"x" * 2000, "b")))
        assert caught.value.reason == "frame_too_large"
        assert isinstance(caught.value, OverloadedError)
        # The next call reconnects.
        assert (await client.health()).serving
        assert fake.hellos == 2
        await client.close()


async def test_a_malformed_frame_from_the_server_closes_the_connection(fake: FakeServer) -> None:
    def garbage(conn, request):
        conn.send_raw(struct.pack(">I", 0))  # zero-length frames are invalid
        return SILENT

    async with fake:
        fake.on("server_info", garbage)
        client = await SeppClient.connect(fake.address)
        with pytest.raises(MalformedResponseError):
            await client.get_server_info()
        await client.close()


async def test_a_response_to_an_unknown_id_is_ignored(fake: FakeServer) -> None:
    def stray(conn, request):
        conn.send_raw(encode_frame(encode_response(999_999, "ok", {})))
        return "ok", {"status": "serving"}

    async with fake:
        fake.on("health", stray)
        client = await SeppClient.connect(fake.address)
        assert (await client.health()).serving
        assert (await client.health()).serving
        await client.close()


async def test_a_too_many_connections_farewell_is_an_overloaded_connect_error(
    fake: FakeServer,
) -> None:
    def refuse(conn, request):
        conn.send(0, *error("resource_exhausted", "full", reason="too_many_connections"))
        return CLOSE

    async with fake:
        fake.on("hello", refuse)
        with pytest.raises(ConnectError, match="full"):
            await SeppClient.connect(fake.address)


async def test_a_response_over_the_receive_limit_closes_the_connection(fake: FakeServer) -> None:
    async with fake:
        fake.reply("queue_stats", "ok", {"server_time_ms": 0, "queues": [], "pad": "x" * 5000})
        client = await SeppClient.connect(fake.address, max_receive_message_bytes=4096)
        with pytest.raises(MalformedResponseError, match="frame"):
            await client.queue_stats()
        assert (await client.health()).serving  # a new connection
        assert fake.hellos == 2
        await client.close()


async def test_a_bug_in_the_reader_fails_pending_calls_at_once(
    fake: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sepp.client._connection import Connection

    async with fake:
        client = await SeppClient.connect(fake.address)

        def broken(self, response):
            raise RuntimeError("bug")

        monkeypatch.setattr(Connection, "_dispatch", broken)
        with pytest.raises(MalformedResponseError, match="reader failed"):
            await client.health()
        monkeypatch.undo()
        assert (await client.health()).serving
        await client.close()
