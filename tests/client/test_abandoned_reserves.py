"""A reserve its caller abandons never consumes an attempt (issue 12, section 1):
`asyncio.wait_for` giving up, a cancelled task or `Worker.run()`, `close()` with a
reserve still waiting, a script that exits. Against a real server process: each
test enqueues a job with max_attempts = 1 after the abandon and checks that the
next reserve gets it as attempt 1 -- before the fix, the abandoned long poll took
it and the client's nack (or the lapsed lease) dead-lettered it unseen.

Ordering without sleeping: requests on one connection are handled in order, so
once a later call on the same connection is answered, the server has read the
withdraw the client sent when it gave up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import (
    ClientClosedError,
    EnqueueRequest,
    JobCtx,
    Payload,
    ReserveOptions,
    SeppClient,
    Worker,
)
from sepp.client.sync import SyncSeppClient
from tests.client.fakeserver import eventually

ServerFactory = Callable[..., Any]
LEASE = timedelta(seconds=30)
LONG_WAIT = timedelta(seconds=60)


async def parked_reserve(client: SeppClient, queue: str) -> asyncio.Future[Any]:
    """A reserve with a 60 s wait, read (and parked) by the server."""
    task = asyncio.ensure_future(client.reserve(ReserveOptions([queue], LEASE, LONG_WAIT)))
    await eventually(lambda: client._connection is not None and client._connection.in_flight > 0)
    await client.health()  # answered after the reserve was read: it is parked
    return task


async def first_attempt_delivered(client: SeppClient, queue: str) -> None:
    """A max_attempts = 1 job enqueued now reaches the next reserve as attempt 1."""
    ack = await client.enqueue(EnqueueRequest(queue, "t", max_attempts=1))
    stats = (await client.queue_stats([queue]))[0]
    assert (stats.ready, stats.in_flight, stats.dead_lettered) == (1, 0, 0)
    jobs = await client.reserve(ReserveOptions([queue], LEASE, timedelta(seconds=5)))
    assert jobs is not None and len(jobs) == 1
    assert (jobs[0].ctx.id, jobs[0].ctx.attempt, jobs[0].ctx.max_attempts) == (ack.job_id, 1, 1)
    await client.ack(jobs[0].ctx)


async def test_a_reserve_given_up_by_wait_for_is_withdrawn(server_factory: ServerFactory) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    task = await parked_reserve(client, "q")
    with pytest.raises(TimeoutError):
        # wait_for giving up cancels the reserve; the client withdraws it.
        await asyncio.wait_for(task, 0.001)
    await client.health()
    await first_attempt_delivered(client, "q")
    await client.close()


async def test_a_cancelled_worker_run_leaves_no_parked_reserve(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    seen: list[int] = []

    async def handler(payload: Payload | None, ctx: JobCtx) -> None:
        seen.append(ctx.attempt)

    worker = Worker(client, ["w"], LEASE, wait_timeout=LONG_WAIT)
    worker.handle("t", handler)
    run = asyncio.ensure_future(worker.run())
    await eventually(lambda: client._connection is not None and client._connection.in_flight > 0)
    await client.health()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await client.health()
    await first_attempt_delivered(client, "w")
    assert seen == []
    await client.close()


async def test_close_withdraws_a_waiting_reserve_first(server_factory: ServerFactory) -> None:
    server = server_factory()
    closing = await SeppClient.connect(server.address)
    task = await parked_reserve(closing, "c")
    await closing.close()
    with pytest.raises(ClientClosedError):
        await task
    # close() returned after the server answered the withdrawn reserve: nothing
    # of that connection is parked any more.
    other = await SeppClient.connect(server.address)
    await first_attempt_delivered(other, "c")
    await other.close()


SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from datetime import timedelta
    from sepp.client import ReserveOptions, SeppClient

    async def main():
        client = await SeppClient.connect(sys.argv[1])
        opts = ReserveOptions(["x"], timedelta(seconds=30), timedelta(seconds=60))
        try:
            await asyncio.wait_for(client.reserve(opts), 0.5)
        except TimeoutError:
            pass
        await client.health()  # the withdraw was read before this was answered
        # ... and the script ends without closing the client.

    asyncio.run(main())
    """
)


async def test_a_script_whose_wait_for_gave_up_exits_without_stranding_the_next_job(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", SCRIPT, server.address],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    client = await SeppClient.connect(server.address)
    await first_attempt_delivered(client, "x")
    await client.close()


def test_the_sync_client_releases_a_job_without_counting_an_attempt(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    with SyncSeppClient.connect(server.address) as client:
        ack = client.enqueue(EnqueueRequest("s", "t", max_attempts=1))
        jobs = client.reserve(ReserveOptions(["s"], LEASE))
        assert jobs is not None and jobs[0].ctx.id == ack.job_id
        client.release(jobs[0].ctx)
        again = client.reserve(ReserveOptions(["s"], LEASE))
        assert again is not None and (again[0].ctx.id, again[0].ctx.attempt) == (ack.job_id, 1)
        client.ack(again[0].ctx)
