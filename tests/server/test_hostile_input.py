"""Misbehaving clients: garbage, broken framing, oversized frames, wrong types,
floods, slow readers, too many requests or connections, silent connections.

After each attack a bystander — a well-behaved connection opened before it, with
jobs of its own — must still get correct answers, and its data must be intact.
"""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest

from sepp.protocol import messages as pm
from sepp.protocol.framing import encode_frame
from tests.server.conftest import (
    ANSWER_TIMEOUT_S,
    ConnectionClosed,
    RawClient,
    connect,
    job,
    payload,
    wait_until,
)

# The payload limit must fit in a frame.
SMALL_FRAMES = {"SEPP_LIMITS__MAX_MESSAGE_BYTES": "4096", "SEPP_LIMITS__MAX_PAYLOAD_BYTES": "4000"}


class Bystander:
    """A well-behaved client with three jobs of its own, opened before an attack."""

    def __init__(self, client: RawClient, queue: str, ids: list[str]) -> None:
        self.client = client
        self.queue = queue
        self.ids = ids

    @classmethod
    async def start(cls, address: str, queue: str) -> Bystander:
        client = await connect(address)
        ids = await client.enqueue_ids(*[job(queue, payload=payload(bytes([i]))) for i in range(3)])
        return cls(client, queue, ids)

    async def check(self, address: str, fresh: RawClient | None = None) -> None:
        """Its connection still answers, its jobs are all there, and a fresh
        connection (or `fresh`) can run a whole job through."""
        assert await self.client.ok("health") == {"status": "serving"}
        stats = await self.client.stats(self.queue)
        assert (stats["ready"], stats["in_flight"]) == (3, 0)
        if fresh is None:
            fresh = await connect(address)
        probe = self.queue + "-probe"
        (job_id,) = await fresh.enqueue_ids(job(probe))
        (delivered,) = await fresh.reserve([probe])
        assert delivered["id"] == job_id
        assert (await fresh.ack(delivered)).status == "ok"
        self.client.assert_clean()


@pytest.fixture
def bystander_queue(queue_names) -> str:
    return next(queue_names)


async def attacked(server, bystander_queue: str) -> Bystander:
    return await Bystander.start(server.address, bystander_queue)


async def test_random_garbage_is_answered_with_errors_or_a_close(sepp_server, bystander_queue, rng):
    bystander = await attacked(sepp_server, bystander_queue)
    for i in range(20):
        client = await RawClient.connect(sepp_server.address)
        if i % 2:
            await client.hello()
        client.send_raw(rng.randbytes(rng.randrange(1, 4000)))
        client.half_close()
        await client.wait_closed()
        client.assert_clean()
    await bystander.check(sepp_server.address)


async def test_a_frame_over_the_limit_is_refused_from_its_length_alone_then_closed(
    server_factory, bystander_queue
):
    server = server_factory(env=SMALL_FRAMES)
    bystander = await attacked(server, bystander_queue)
    for length in (4097, 2**31, 2**32 - 1):
        client = await connect(server.address)
        # Only the 4-byte prefix: the answer cannot wait for (or allocate) the body.
        client.send_raw(struct.pack(">I", length))
        await client.wait_closed()
        (error,) = client.arrivals[1:]
        assert error.id == 0
        assert error.status == "resource_exhausted"
        assert error.body["reason"] == "frame_too_large"
        client.assert_clean()
    await bystander.check(server.address)


async def test_a_frame_of_exactly_the_limit_is_accepted(server_factory, bystander_queue):
    limit = 4096
    server = server_factory(env=SMALL_FRAMES)
    client = await connect(server.address)
    assert (await client.ok("server_info"))["max_message_bytes"] == limit
    q = bystander_queue
    request_id = 77

    def frame_body(size: int) -> bytes:
        return pm.encode_request(
            request_id, "enqueue", {"jobs": [job(q, payload=payload(b"x" * size))]}
        )

    # Grow the payload until the whole request is exactly `limit` bytes.
    size = limit - len(frame_body(0))
    while len(frame_body(size)) > limit:
        size -= 1
    body = frame_body(size)
    assert len(body) == limit
    client.send_raw(encode_frame(body))
    response = await client.response(request_id)
    assert response.status == "ok", response
    # The frame is read and answered; its job is refused, typed, because with the
    # fields the server adds on delivery (id, attempt, times) no reserve answer
    # within the limit could carry it.
    (result,) = response.body["results"]
    rejection = result["rejection"]
    assert (rejection["reason"], rejection["actual"]) == ("payload_too_large", size)
    fitting = rejection["limit"]
    assert 0 < fitting < size
    (accepted,) = (await client.enqueue(job(q, payload=payload(b"y" * fitting))))["results"]
    assert "job_id" in accepted, accepted
    (delivered,) = await client.reserve([q])
    assert delivered["payload"]["data"] == b"y" * fitting


async def test_a_truncated_frame_then_a_half_close_ends_the_connection(
    sepp_server, bystander_queue
):
    bystander = await attacked(sepp_server, bystander_queue)
    client = await RawClient.connect(sepp_server.address)
    hello = client.send("hello", {"protocol": 1})
    client.send_raw(struct.pack(">I", 100) + b"\x93" + b"\x00" * 9)
    client.half_close()
    await client.wait_closed()
    # What came before the broken frame was answered.
    assert [r.id for r in client.arrivals] == [hello]
    await bystander.check(sepp_server.address)


async def test_requests_sent_before_a_half_close_are_all_answered_then_it_closes(
    sepp_server, bystander_queue
):
    client = await connect(sepp_server.address)
    q = bystander_queue
    sent = [
        client.send("enqueue", {"jobs": [job(q)]}),
        client.send("reserve", client.reserve_body([q + "-idle"], wait_ms=300)),
        client.send("ack", {"job_id": UUID, "attempt": 1}),
        client.send("enqueue", {"jobs": [job(q), job(q)]}),
    ]
    client.half_close()
    await client.wait_closed()
    assert sorted(r.id for r in client.arrivals[1:]) == sorted(sent)
    statuses = [client.responses[i].status for i in sent]
    assert statuses == ["ok", "ok", "not_found", "ok"]
    checker = await connect(sepp_server.address)
    assert (await checker.stats(q))["ready"] == 3


@pytest.mark.parametrize("after_hello", [False, True], ids=["before-hello", "after-hello"])
async def test_a_zero_length_frame_closes_the_connection(sepp_server, bystander_queue, after_hello):
    bystander = await attacked(sepp_server, bystander_queue)
    client = await RawClient.connect(sepp_server.address)
    if after_hello:
        await client.hello()
    client.send_raw(b"\x00\x00\x00\x00")
    await client.wait_closed()
    assert len(client.arrivals) == (1 if after_hello else 0)
    await bystander.check(sepp_server.address)


async def test_a_request_before_hello_is_invalid_argument_and_closes(sepp_server, bystander_queue):
    bystander = await attacked(sepp_server, bystander_queue)
    client = await RawClient.connect(sepp_server.address)
    response = await client.call("reserve", client.reserve_body([bystander_queue]))
    assert response.status == "invalid_argument"
    assert "hello" in response.body["message"]
    await client.wait_closed()
    # The refused reserve did not lease anything.
    await bystander.check(sepp_server.address)


@pytest.mark.parametrize(
    "value",
    [
        ["1", "health", {}],
        [-1, "health", {}],
        [1.5, "health", {}],
        [None, "health", {}],
        [1, "health"],
        [1, "health", {}, 4],
        {"id": 1, "op": "health", "body": {}},
        "health",
        42,
    ],
    ids=repr,
)
async def test_a_frame_without_a_usable_request_id_closes_the_connection(
    sepp_server, bystander_queue, value
):
    bystander = await attacked(sepp_server, bystander_queue)
    client = await connect(sepp_server.address)
    client.send_value(value)
    await client.wait_closed()
    assert len(client.arrivals) == 1  # the hello
    await bystander.check(sepp_server.address)


async def test_a_frame_that_is_not_msgpack_closes_the_connection(sepp_server, bystander_queue):
    bystander = await attacked(sepp_server, bystander_queue)
    # 0xc1 is never used in msgpack; two values in one frame is not one value.
    for body in (b"\xc1", msgpack.packb(1) + msgpack.packb(2)):
        client = await connect(sepp_server.address)
        client.send_raw(encode_frame(body))
        await client.wait_closed()
    await bystander.check(sepp_server.address)


UUID = "00000000-0000-4000-8000-000000000000"
WRONG_TYPES = [
    ("hello", {"protocol": "1"}),
    ("hello", {"protocol": 1, "api_key": 5}),
    ("enqueue", {"jobs": "not a list"}),
    ("enqueue", {"jobs": [{"queue": "q", "job_type": "t"}], "atomic": "yes"}),
    ("enqueue", {}),
    ("reserve", {"queues": "q", "lease_ms": 1000}),
    ("reserve", {"queues": [1], "lease_ms": 1000}),
    ("reserve", {"queues": ["q"], "lease_ms": "1000"}),
    ("reserve", {"queues": ["q"], "lease_ms": 1000, "wait_ms": 1.5}),
    ("reserve", {"queues": ["q"], "lease_ms": 1000, "max_jobs": [1]}),
    ("reserve", {"queues": ["q"], "lease_ms": 1000, "worker_id": 7}),
    ("reserve", {"queues": ["q"], "lease_ms": 0}),
    ("reserve", {"queues": [], "lease_ms": 1000}),
    ("reserve", {"queues": ["q"], "lease_ms": 1000, "max_jobs": 0}),
    ("reserve", {"queues": ["q"], "lease_ms": 2**63}),
    ("ack", {"job_id": 5, "attempt": 1}),
    ("ack", {"job_id": UUID, "attempt": "1"}),
    ("ack", {"job_id": UUID, "attempt": True}),
    ("ack", {"job_id": UUID}),
    ("ack", {"job_id": UUID, "attempt": 1, "worker_id": b"w"}),
    ("nack", {"job_id": UUID, "attempt": 1, "retry": 3}),
    ("nack", {"job_id": UUID, "attempt": 1, "retry": "delay", "delay_ms": "5"}),
    ("nack", {"job_id": UUID, "attempt": 1, "reason": 9}),
    ("nack", {"job_id": [UUID], "attempt": 1}),
    ("extend", {"job_id": UUID, "attempt": 1, "lease_ms": "1"}),
    ("extend", {"job_id": UUID, "attempt": 1}),
    ("drain_dead_letters", {"queue": 5}),
    ("drain_dead_letters", {"max": "10"}),
    ("drain_dead_letters", {"max": 0}),
    ("queue_stats", {"queues": "q"}),
    ("queue_stats", {"queues": [1, 2]}),
    ("health", []),
    ("server_info", "x"),
    ("ack", None),
]


async def test_wrong_types_in_every_operation_are_invalid_argument_and_the_connection_stays_open(
    sepp_server, bystander_queue
):
    bystander = await attacked(sepp_server, bystander_queue)
    client = await connect(sepp_server.address)
    for op, body in WRONG_TYPES:
        request_id = client.next_id()
        client.send_value([request_id, op, body])
        response = await client.response(request_id)
        assert response.status == "invalid_argument", (op, body, response)
        assert isinstance(response.body["message"], str) and response.body["message"]
    assert not client.closed
    assert await client.ok("health") == {"status": "serving"}
    client.assert_clean()
    await bystander.check(sepp_server.address)


async def test_an_unknown_operation_is_invalid_argument_and_the_connection_stays_open(
    sepp_server, bystander_queue
):
    bystander = await attacked(sepp_server, bystander_queue)
    client = await connect(sepp_server.address)
    for op in ("publish", "", "HELLO", 7, None):
        request_id = client.next_id()
        client.send_value([request_id, op, {}])
        response = await client.response(request_id)
        assert response.status == "invalid_argument", (op, response)
    assert await client.ok("health") == {"status": "serving"}
    await bystander.check(sepp_server.address)


async def test_a_job_with_wrong_field_types_is_rejected_in_its_place_in_the_batch(
    sepp_server, bystander_queue
):
    client = await connect(sepp_server.address)
    q = bystander_queue
    bad_jobs = [
        "not a map",
        {"queue": 1, "job_type": "t"},
        {"queue": q, "job_type": None},
        {"queue": q, "job_type": "t", "payload": b"raw"},
        {"queue": q, "job_type": "t", "payload": {"data": "text", "encoding": "e"}},
        {"queue": q, "job_type": "t", "priority": 1.0},
        {"queue": q, "job_type": "t", "max_attempts": "3"},
        {"queue": q, "job_type": "t", "scheduled_at_ms": "now"},
        {"queue": q, "job_type": "t", "idempotency_key": 5},
        {"queue": q, "job_type": "t", "custom": {"k": [1]}},
        {"queue": q, "job_type": "t", "custom": "x"},
        {"queue": q, "job_type": "t", "trace_context": {"traceparent": 1}},
    ]
    body = await client.enqueue(job(q, "good"), *bad_jobs)
    results = body["results"]
    assert "job_id" in results[0]
    for bad, result in zip(bad_jobs, results[1:]):
        assert result["rejection"]["reason"] == "invalid_request", (bad, result)
    atomic = await client.enqueue(job(q, "good"), *bad_jobs, atomic=True)
    assert [f["index"] for f in atomic["failures"]] == list(range(1, len(bad_jobs) + 1))
    assert (await client.stats(q))["ready"] == 1


async def test_a_client_that_floods_and_never_reads_is_disconnected_past_the_output_limit(
    server_factory, bystander_queue
):
    server = server_factory(env={"SEPP_SERVER__OUTPUT_BUFFER_BYTES_MAX": "65536"})
    bystander = await attacked(server, bystander_queue)
    flooder = await RawClient.connect(server.address, rcvbuf=4096, reading=False)
    flooder.send("hello", {"protocol": 1})
    count = 30_000  # ~20 MB of answers: more than every kernel buffer in the way
    flooder.send_raw(
        b"".join(encode_frame(pm.encode_request(i, "server_info", {})) for i in range(2, count))
    )
    # Async polling: the event loop must keep pushing the flood out meanwhile.
    await wait_until(
        lambda: "it stopped reading" in server.log(),
        what="the server to drop the client that does not read",
    )
    await bystander.check(server.address)
    flooder.start_reading()
    await flooder.wait_closed()
    assert len(flooder.responses) < count - 1
    assert server.proc.poll() is None


async def test_a_client_that_reads_late_is_paused_not_dropped_and_gets_every_answer(
    sepp_server, bystander_queue
):
    bystander = await attacked(sepp_server, bystander_queue)
    flooder = await RawClient.connect(sepp_server.address, rcvbuf=4096, reading=False)
    flooder.send("hello", {"protocol": 1})
    count = 20_000
    flooder.send_raw(
        b"".join(encode_frame(pm.encode_request(i, "server_info", {})) for i in range(2, count))
    )
    # While its answers pile up, everybody else is served.
    await bystander.check(sepp_server.address)
    flooder.start_reading()
    await flooder.wait(lambda: len(flooder.responses) == count - 1, timeout=60)
    assert [r.id for r in flooder.arrivals] == list(range(1, count))
    assert all(r.status == "ok" for r in flooder.arrivals)
    flooder.assert_clean()
    assert not flooder.closed
    assert "it stopped reading" not in sepp_server.log()


async def test_a_reading_client_gets_a_response_larger_than_the_output_limit(
    server_factory, bystander_queue
):
    # One reserve answer of ~6 MB against a 1 MiB output limit: the limit is for
    # clients that stop reading, not for big answers.
    server = server_factory(env={"SEPP_SERVER__OUTPUT_BUFFER_BYTES_MAX": "1048576"})
    client = await connect(server.address)
    q = bystander_queue
    datas = [bytes([i]) * 1_000_000 for i in range(6)]
    for data in datas:
        await client.enqueue_ids(job(q, payload=payload(data)))
    delivered = await client.reserve([q], max_jobs=6)
    assert sorted(d["payload"]["data"] for d in delivered) == datas
    assert not client.closed
    assert "it stopped reading" not in server.log()


async def test_the_in_flight_cap_refuses_the_excess_request_with_too_many_requests(
    server_factory, bystander_queue
):
    server = server_factory(env={"SEPP_SERVER__MAX_IN_FLIGHT_PER_CONNECTION": "4"})
    bystander = await attacked(server, bystander_queue)
    client = await connect(server.address)
    idle = bystander_queue + "-idle"
    parked = [client.send("reserve", client.reserve_body([idle], wait_ms=30_000)) for _ in range(5)]
    fifth = await client.response(parked[4])
    assert fifth.status == "resource_exhausted"
    assert fifth.body["reason"] == "too_many_requests"
    assert not any(p in client.responses for p in parked[:4])
    # One job frees one slot: a new request is accepted again.
    (job_id,) = await bystander.client.enqueue_ids(job(idle))
    await client.wait(lambda: sum(p in client.responses for p in parked[:4]) == 1)
    (served,) = [p for p in parked[:4] if p in client.responses]
    assert client.responses[served].body["jobs"][0]["id"] == job_id
    assert await client.ok("health") == {"status": "serving"}
    assert not client.closed
    await bystander.check(server.address)


async def test_connections_beyond_max_connections_are_refused_with_an_error_frame(
    server_factory, bystander_queue
):
    server = server_factory(env={"SEPP_SERVER__MAX_CONNECTIONS": "2"})
    bystander = await attacked(server, bystander_queue)
    second = await connect(server.address)
    refused = await RawClient.connect(server.address)
    await refused.wait_closed()
    (error,) = refused.arrivals
    assert (error.id, error.status) == (0, "resource_exhausted")
    assert error.body["reason"] == "too_many_connections"
    assert await second.ok("health") == {"status": "serving"}
    # A freed slot can be taken again (once the server has seen the close).
    await second.close()

    async def third_connects() -> RawClient | None:
        client = await RawClient.connect(server.address)
        try:
            await client.hello()
        except ConnectionClosed:
            await client.close()
            return None
        return client

    third = await wait_until(third_connects, what="a connection slot to free up")
    assert await third.ok("health") == {"status": "serving"}
    await bystander.check(server.address, fresh=third)


async def test_a_connection_that_sends_no_hello_is_closed_after_the_handshake_timeout(
    server_factory, bystander_queue
):
    server = server_factory(env={"SEPP_SERVER__HANDSHAKE_TIMEOUT_MS": "200"})
    bystander = await attacked(server, bystander_queue)
    early = await connect(server.address)
    idle = await RawClient.connect(server.address)
    health_only = await RawClient.connect(server.address)
    assert await health_only.ok("health") == {"status": "serving"}
    await idle.wait_closed()
    await health_only.wait_closed()
    assert idle.arrivals == []
    # A connection that said hello in time is not affected.
    assert await early.ok("health") == {"status": "serving"}
    assert not early.closed
    await bystander.check(server.address)


async def test_hostile_clients_in_parallel_do_not_disturb_a_busy_worker(
    sepp_server, bystander_queue, rng
):
    bystander = await attacked(sepp_server, bystander_queue)
    q = bystander_queue + "-work"
    worker = await connect(sepp_server.address)

    async def attack(i: int) -> None:
        client = await RawClient.connect(sepp_server.address)
        if i % 3 == 0:
            await client.hello()
        kind = i % 4
        if kind == 0:
            client.send_raw(rng.randbytes(500))
        elif kind == 1:
            client.send_raw(struct.pack(">I", 2**31))
        elif kind == 2:
            client.send_raw(b"\x00\x00\x00\x00")
        else:
            client.send_value([i, "nope", {}])
        client.half_close()
        await client.wait_closed(timeout=ANSWER_TIMEOUT_S)
        client.assert_clean()

    async def work() -> list[str]:
        done = []
        for _ in range(30):
            (job_id,) = await worker.enqueue_ids(job(q))
            (delivered,) = await worker.reserve([q])
            assert delivered["id"] == job_id
            assert (await worker.ack(delivered)).status == "ok"
            done.append(job_id)
        return done

    results = await asyncio.gather(work(), *[attack(i) for i in range(40)])
    assert len(set(results[0])) == 30
    await bystander.check(sepp_server.address)


@pytest.mark.parametrize(
    "body",
    [{"protocol": "1"}, {}, {"protocol": 1, "api_key": 5}, {"protocol": 1, "client": b"x"}],
    ids=["protocol-as-text", "no-protocol", "key-as-int", "client-as-bytes"],
)
async def test_a_malformed_first_hello_is_invalid_argument_and_closes(server_factory, body):
    # A handshake timeout far away: only the failed hello may close the connection.
    server = server_factory(env={"SEPP_SERVER__HANDSHAKE_TIMEOUT_MS": "600000"})
    client = await RawClient.connect(server.address)
    response = await client.call("hello", body)
    assert response.status == "invalid_argument"
    # A failed hello closes the connection (PROTOCOL.md §3), malformed or not.
    await client.wait_closed()
