"""The retry policy (which failures, which operations, how long between tries)
and reconnecting after a dropped connection."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import pytest

from sepp.client import (
    ConnectError,
    EnqueueRequest,
    InvalidRequestError,
    JobNotFoundError,
    MessageTooLargeError,
    OverloadedError,
    ReserveOptions,
    RetryPolicy,
    SeppClient,
    ServerInternalError,
    TransportError,
    UnauthenticatedError,
    UnsupportedProtocolError,
)
from sepp.client._retry import backoff_delays, is_transient
from tests.client.fakeserver import DROP, SERVER_INFO, FakeServer, error, eventually, make_job

LEASE = timedelta(seconds=30)


def quick_policy(rng: random.Random, attempts: int = 4) -> RetryPolicy:
    # Millisecond backoffs: the policy's own waits, not waiting for an event.
    return RetryPolicy(
        max_attempts=attempts,
        initial_backoff=timedelta(milliseconds=1),
        max_backoff=timedelta(milliseconds=2),
        rng=rng,
    )


def failing_then_ok(failures: int, failure: tuple[str, dict], success: tuple[str, dict]):
    """A handler answering `failure` `failures` times, then `success`."""
    count = itertools.count()

    def handler(conn, request):
        return failure if next(count) < failures else success

    return handler


OVERLOADED = error("resource_exhausted", "busy", reason="overloaded")
SHUTTING_DOWN = error("unavailable", "bye", reason="shutting_down")

# -- the policy itself ------------------------------------------------------------------------


def test_backoff_grows_exponentially_to_the_cap_with_jitter_in_half_to_one(
    rng: random.Random,
) -> None:
    policy = RetryPolicy(
        max_attempts=10,
        initial_backoff=timedelta(milliseconds=100),
        max_backoff=timedelta(seconds=1),
        multiplier=2.0,
        rng=rng,
    )
    bases = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    for _ in range(50):
        delays = list(itertools.islice(backoff_delays(policy), len(bases)))
        for delay, base in zip(delays, bases, strict=True):
            assert 0.5 * base <= delay < base


def test_backoff_without_jitter_is_exact() -> None:
    policy = RetryPolicy(
        initial_backoff=timedelta(milliseconds=50),
        max_backoff=timedelta(milliseconds=300),
        multiplier=3.0,
        jitter=False,
    )
    assert list(itertools.islice(backoff_delays(policy), 4)) == pytest.approx(
        [0.05, 0.15, 0.3, 0.3]
    )


def test_the_policy_defaults_to_no_retries_and_clamps_its_floor() -> None:
    assert RetryPolicy().max_attempts == 1
    clamped = RetryPolicy(max_attempts=0, multiplier=0.5)
    assert (clamped.max_attempts, clamped.multiplier) == (1, 1.0)


@pytest.mark.parametrize(
    ("error_value", "transient"),
    [
        (TransportError("x"), True),
        (OverloadedError("x"), True),
        (ConnectError("a", "refused"), True),
        (MessageTooLargeError("x"), False),
        (UnsupportedProtocolError("a", "old", [2]), False),
        (UnauthenticatedError("x"), False),
        (InvalidRequestError("x"), False),
        (ServerInternalError("x"), False),
        (JobNotFoundError(), False),
    ],
)
def test_only_transient_failures_are_retryable(error_value: Exception, transient: bool) -> None:
    assert is_transient(error_value) is transient


# -- which operations are retried ------------------------------------------------------------------


@pytest.mark.parametrize("failure", [OVERLOADED, SHUTTING_DOWN])
async def test_server_info_is_retried_until_it_succeeds(
    fake: FakeServer, rng: random.Random, failure: tuple[str, dict]
) -> None:
    async with fake:
        fake.on("server_info", failing_then_ok(2, failure, ("ok", SERVER_INFO)))
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        info = await client.get_server_info()
        assert info.version == "0.1.0"
        assert len(fake.ops("server_info")) == 3
        await client.close()


async def test_retries_stop_after_max_attempts(fake: FakeServer, rng: random.Random) -> None:
    async with fake:
        fake.reply("health", *OVERLOADED)
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng, 3))
        with pytest.raises(OverloadedError):
            await client.health()
        assert len(fake.ops("health")) == 3
        await client.close()


async def test_without_a_policy_nothing_is_retried(fake: FakeServer) -> None:
    async with fake:
        fake.reply("health", *OVERLOADED)
        client = await SeppClient.connect(fake.address)
        with pytest.raises(OverloadedError):
            await client.health()
        assert len(fake.ops("health")) == 1
        await client.close()


async def test_permanent_errors_are_not_retried(fake: FakeServer, rng: random.Random) -> None:
    async with fake:
        fake.reply("health", *error("invalid_argument", "bad"))
        fake.reply("queue_stats", *error("internal", "disk"))
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        with pytest.raises(InvalidRequestError):
            await client.health()
        with pytest.raises(ServerInternalError):
            await client.queue_stats()
        assert len(fake.ops("health")) == len(fake.ops("queue_stats")) == 1
        await client.close()


async def test_reserve_is_never_retried(fake: FakeServer, rng: random.Random) -> None:
    async with fake:
        fake.reply("reserve", *OVERLOADED)
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        with pytest.raises(OverloadedError):
            await client.reserve(ReserveOptions(["q"], LEASE))
        assert len(fake.ops("reserve")) == 1
        await client.close()


async def test_drain_dead_letters_is_never_retried(fake: FakeServer, rng: random.Random) -> None:
    async with fake:
        fake.reply("drain_dead_letters", *SHUTTING_DOWN)
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        with pytest.raises(TransportError):
            await client.drain_dead_letters()
        assert len(fake.ops("drain_dead_letters")) == 1
        await client.close()


@pytest.mark.parametrize(
    "keys",
    [(None,), ("k1", None), (None, None)],
    ids=["no-key", "one-key-missing", "no-keys"],
)
async def test_an_enqueue_without_every_idempotency_key_is_not_retried(
    fake: FakeServer, rng: random.Random, keys: tuple[str | None, ...]
) -> None:
    async with fake:
        fake.reply("enqueue", *OVERLOADED)
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        jobs = [EnqueueRequest("q", "t", idempotency_key=k) for k in keys]
        with pytest.raises(OverloadedError):
            await client.enqueue_batch(jobs)
        assert len(fake.ops("enqueue")) == 1
        await client.close()


async def test_an_enqueue_where_every_job_has_a_key_is_retried(
    fake: FakeServer, rng: random.Random
) -> None:
    success = ("ok", {"results": [{"job_id": "a", "deduplicated": False}] * 2})
    async with fake:
        fake.on("enqueue", failing_then_ok(1, OVERLOADED, success))
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        acks = await client.enqueue_atomic(
            [EnqueueRequest("q", "t", idempotency_key=k) for k in ("k1", "k2")]
        )
        assert len(acks) == 2
        assert len(fake.ops("enqueue")) == 2
        await client.close()


async def test_ack_nack_and_extend_are_retried(fake: FakeServer, rng: random.Random) -> None:
    async with fake:
        for op in ("ack", "nack", "extend"):
            real = fake.handlers[op]
            count = itertools.count()
            fake.on(
                op,
                lambda conn, req, real=real, count=count: (
                    OVERLOADED if next(count) == 0 else real(conn, req)
                ),
            )
        fake.queue.push(make_job(), make_job())
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        jobs = await client.reserve(ReserveOptions(["q"], LEASE, max_jobs=2))
        assert jobs is not None
        await client.extend(jobs[0].ctx, LEASE)
        await client.ack(jobs[0].ctx)
        await client.nack(jobs[1].ctx)
        assert [len(fake.ops(op)) for op in ("ack", "nack", "extend")] == [2, 2, 2]
        await client.close()


# -- reconnecting ------------------------------------------------------------------------------------


async def test_the_next_call_after_a_drop_reconnects_with_the_same_hello() -> None:
    async with FakeServer(api_key="k") as fake:
        client = await SeppClient.connect(fake.address, api_key="k")
        fake.drop_all()
        await eventually(lambda: client._connection is None or client._connection.closed)
        assert (await client.health()).serving
        hellos = fake.ops("hello")
        assert len(hellos) == 2 and hellos[0].body == hellos[1].body
        assert len(fake.connections) == 2
        await client.close()


async def test_a_call_in_flight_during_a_drop_fails_then_the_client_recovers(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.on("health", failing_then_ok(1, DROP, ("ok", {"status": "serving"})))  # type: ignore[arg-type]
        client = await SeppClient.connect(fake.address)
        with pytest.raises(TransportError):
            await client.health()
        assert (await client.health()).serving
        assert fake.hellos == 2
        await client.close()


async def test_a_retry_safe_call_survives_a_drop_when_retries_are_on(
    fake: FakeServer, rng: random.Random
) -> None:
    async with fake:
        fake.on("health", failing_then_ok(1, DROP, ("ok", {"status": "serving"})))  # type: ignore[arg-type]
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        assert (await client.health()).serving
        assert fake.hellos == 2
        await client.close()


async def test_a_reserve_in_flight_during_a_drop_is_not_retried(
    fake: FakeServer, rng: random.Random
) -> None:
    async with fake:
        fake.on("reserve", lambda conn, req: DROP)
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
        with pytest.raises(TransportError):
            await client.reserve(ReserveOptions(["q"], LEASE))
        assert len(fake.ops("reserve")) == 1
        await client.close()


async def test_reconnecting_to_a_dead_server_is_a_connect_error(rng: random.Random) -> None:
    async with FakeServer() as fake:
        client = await SeppClient.connect(fake.address)
    # The server is gone now.
    with pytest.raises(ConnectError):
        await client.health()
    retrying = await _client_for_gone_server(rng)
    with pytest.raises(ConnectError):
        await retrying.health()
    await client.close()
    await retrying.close()


async def _client_for_gone_server(rng: random.Random) -> SeppClient:
    async with FakeServer() as fake:
        client = await SeppClient.connect(fake.address, retry_policy=quick_policy(rng))
    return client


async def test_a_refused_key_on_reconnect_is_not_retried(rng: random.Random) -> None:
    async with FakeServer(api_key="k") as fake:
        client = await SeppClient.connect(fake.address, api_key="k", retry_policy=quick_policy(rng))
        fake.api_key = "rotated"
        fake.drop_all()
        await eventually(lambda: client._connection is None or client._connection.closed)
        with pytest.raises(UnauthenticatedError):
            await client.health()
        assert fake.hellos == 2
        await client.close()
