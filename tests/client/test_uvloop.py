"""The client and the Worker on uvloop, against a real server.

uvloop's transports are not subclasses of `asyncio.Transport`; the client used to
assert they were, so `SeppClient.connect` failed with an AssertionError on the event
loop many Python services run (uvicorn's default among them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import uvloop

from sepp.client import EnqueueRequest, JobCtx, Payload, ReserveOptions, SeppClient, Worker

LEASE = timedelta(seconds=30)


def test_the_client_and_the_worker_run_on_uvloop(server_factory: Callable[..., Any]) -> None:
    server = server_factory()
    done: list[str] = []

    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        client = await SeppClient.connect(server.address)
        # Concurrent single enqueues (coalesced into batch frames), one reserve
        # and ack by hand, then a Worker for the rest.
        acks = await asyncio.gather(
            *(
                client.enqueue(EnqueueRequest("uv", "t", payload=Payload(b"%d" % i, "text/plain")))
                for i in range(20)
            )
        )
        assert len({ack.job_id for ack in acks}) == 20
        jobs = await client.reserve(ReserveOptions(["uv"], LEASE, max_jobs=1))
        assert jobs is not None and len(jobs) == 1
        await client.ack(jobs[0].ctx)
        done.append(jobs[0].ctx.id)
        worker = Worker(client, ["uv"], LEASE, wait_timeout=timedelta(seconds=1), max_in_flight=4)

        @worker.handler("t")
        async def handle(payload: Payload | None, ctx: JobCtx) -> None:
            done.append(ctx.id)
            if len(done) == 20:
                worker.shutdown_handle().shutdown()

        await worker.run()
        (stats,) = await client.queue_stats(["uv"])
        assert (stats.ready, stats.in_flight) == (0, 0)
        await client.close()

    uvloop.run(main())
    assert sorted(done) == sorted(set(done)) and len(done) == 20
    assert server.stop() == 0, server.log()
