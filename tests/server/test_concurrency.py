"""Many connections at once: producers and workers pipelining against one server.
Whatever the interleaving, every job is acked exactly once, no two deliveries of
a job share an attempt, and nothing is left behind. The soak variant crashes the
server (SIGKILL) again and again under a stream of pipelined enqueues and checks
that no acknowledged enqueue is ever lost."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from sepp.protocol import messages as pm
from sepp.protocol.framing import encode_frame
from tests.server.conftest import RawClient, connect, job


async def produce(address: str, q: str, count: int, rng: random.Random) -> list[str]:
    client = await connect(address)
    ids: list[str] = []
    while len(ids) < count:
        size = min(rng.randrange(1, 12), count - len(ids))
        ids += await client.enqueue_ids(*[job(q, priority=rng.randrange(3)) for _ in range(size)])
    return ids


async def work(
    address: str,
    q: str,
    rng: random.Random,
    deliveries: dict[str, list[int]],
    acked: list[str],
    done: asyncio.Event,
) -> None:
    client = await connect(address)
    while not done.is_set():
        jobs = await client.reserve([q], wait_ms=200, max_jobs=rng.randrange(1, 6))
        for delivered in jobs:
            deliveries[delivered["id"]].append(delivered["attempt"])
            if delivered["attempt"] < 3 and rng.random() < 0.15:
                response = await client.nack(delivered, reason="unlucky")
                assert response.status == "ok", response
                assert response.body["dead_lettered"] is False
            else:
                response = await client.ack(delivered)
                assert response.status == "ok", response
                acked.append(delivered["id"])
        client.assert_clean()


async def test_concurrent_producers_and_workers_ack_every_job_exactly_once(
    sepp_server, queue_names, rng
):
    q = next(queue_names)
    deliveries: dict[str, list[int]] = defaultdict(list)
    acked: list[str] = []
    done = asyncio.Event()
    workers = [
        asyncio.create_task(
            work(sepp_server.address, q, random.Random(rng.random()), deliveries, acked, done)
        )
        for _ in range(4)
    ]
    produced = await asyncio.gather(
        *[produce(sepp_server.address, q, 80, random.Random(rng.random())) for _ in range(3)]
    )
    expected = {i for ids in produced for i in ids}
    assert len(expected) == 240

    async def all_acked() -> None:
        while len(acked) < len(expected):
            failed = [w for w in workers if w.done() and w.exception()]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
            await asyncio.sleep(0.02)

    await asyncio.wait_for(all_acked(), 60)
    done.set()
    await asyncio.gather(*workers)
    assert sorted(acked) == sorted(expected)
    for job_id, attempts in deliveries.items():
        # Each redelivery is a new attempt: never the same attempt twice.
        assert attempts == list(range(1, len(attempts) + 1)), (job_id, attempts)
    checker = await connect(sepp_server.address)
    stats = await checker.stats(q)
    assert (stats["ready"], stats["scheduled"], stats["in_flight"]) == (0, 0, 0)


@pytest.mark.soak
async def test_no_acknowledged_enqueue_is_lost_across_repeated_crashes(
    server_factory, queue_names, rng
):
    q = next(queue_names)
    server = server_factory()
    acknowledged: set[str] = set()
    unanswered_jobs = 0
    for _ in range(40):
        client = await RawClient.connect(server.address)
        await client.hello()
        sent: dict[int, int] = {}
        stream = []
        for _ in range(rng.randrange(20, 200)):
            request_id = client.next_id()
            size = rng.randrange(1, 5)
            sent[request_id] = size
            stream.append(
                encode_frame(pm.encode_request(request_id, "enqueue", {"jobs": [job(q)] * size}))
            )
        client.send_raw(b"".join(stream))
        # Crash once some (a random share) of the answers are in.
        wanted = 1 + int(rng.random() * len(sent))  # the hello's answer, then some
        await client.wait(lambda c=client, n=wanted: len(c.responses) >= n)
        server.kill()
        await client.wait_closed()
        for request_id, size in sent.items():
            response = client.responses.get(request_id)
            if response is None:
                unanswered_jobs += size
            else:
                assert response.status == "ok", response
                acknowledged.update(r["job_id"] for r in response.body["results"])
        server = server_factory(data_dir=server.data_dir)
        checker = await connect(server.address)
        stats = await checker.stats(q)
        assert len(acknowledged) <= stats["ready"] <= len(acknowledged) + unanswered_jobs
        await checker.close()
        await client.close()
    checker = await connect(server.address)
    present: set[str] = set()
    while batch := await checker.reserve([q], max_jobs=256):
        present.update(d["id"] for d in batch)
    assert acknowledged <= present
