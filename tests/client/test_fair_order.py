"""The fair reserve from the client (issue 17 item 4): `ReserveOptions(order=
"fair")` in the async and the sync client, and `Worker(order="fair")`, against a
real `sepp serve` (the `server_factory` fixture of tests/conftest.py). The order
rules themselves are tested in the core (tests/core/test_fair_reserve.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import EnqueueRequest, ReserveOptions, SeppClient, SyncSeppClient, Worker

LEASE = timedelta(seconds=30)
NO_WAIT = timedelta(0)
ServerFactory = Callable[..., Any]


def stop(server: Any) -> None:
    assert server.stop() == 0, server.log()


async def test_a_fair_reserve_serves_a_quiet_queue_behind_a_busy_one(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    for _ in range(6):
        await client.enqueue(EnqueueRequest("busy", "t"))
    await client.enqueue(EnqueueRequest("quiet", "t"))
    strict = await client.reserve(ReserveOptions(["busy", "quiet"], LEASE, NO_WAIT, max_jobs=2))
    assert strict is not None and [j.ctx.queue for j in strict] == ["busy", "busy"]
    options = ReserveOptions(["busy", "quiet"], LEASE, NO_WAIT, max_jobs=2)
    fair = await client.reserve(options, order="fair")
    assert fair is not None and sorted(j.ctx.queue for j in fair) == ["busy", "quiet"]
    await client.close()
    stop(server)


def test_the_sync_client_reserves_in_fair_order(server_factory: ServerFactory) -> None:
    server = server_factory()
    with SyncSeppClient.connect(server.address) as client:
        for queue in ("a", "a", "a", "b"):
            client.enqueue(EnqueueRequest(queue, "t"))
        options = ReserveOptions(["a", "b"], LEASE, NO_WAIT)
        got = [
            job.ctx.queue for _ in range(3) for job in client.reserve(options, order="fair") or []
        ]
        assert got == ["a", "b", "a"]
    stop(server)


async def test_an_unknown_order_is_refused_before_it_is_sent(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    with pytest.raises(ValueError, match="order"):
        await client.reserve(ReserveOptions(["a", "b"], LEASE, NO_WAIT), order="random")
    with pytest.raises(ValueError, match="order"):
        Worker(client, ["a", "b"], LEASE, order="random")
    await client.close()
    stop(server)


async def test_a_fair_worker_serves_a_quiet_queue_behind_a_busy_one(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    for _ in range(20):
        await client.enqueue(EnqueueRequest("busy", "t"))
    await client.enqueue(EnqueueRequest("quiet", "t"))
    seen: list[str] = []
    worker = Worker(client, ["busy", "quiet"], LEASE, max_jobs=1, max_in_flight=1, order="fair")

    async def handle(payload: Any, ctx: Any) -> None:
        seen.append(ctx.queue)
        if len(seen) == 3:
            worker.stop()

    worker.handle("t", handle)
    await worker.run()
    assert "quiet" in seen[:2]  # strict order would take it after all 20 busy ones
    await client.close()
    stop(server)
