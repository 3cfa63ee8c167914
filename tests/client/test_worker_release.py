"""The Worker hands jobs back with `release` (no attempt counted) where a nack
would lose them (issue 12, section 5): a job without a handler on its last
attempt, and jobs whose handlers a forced stop cancelled. Against the fake server."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta

from sepp.client import JobCtx, Payload, SeppClient, Worker
from tests.client.fakeserver import FakeServer, eventually, make_job

LEASE = timedelta(seconds=30)
WAIT = timedelta(seconds=5)


async def test_a_job_without_a_handler_on_its_last_attempt_is_released_not_dead_lettered(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = Worker(
            client, ["q"], LEASE, wait_timeout=WAIT, no_handler_delay=timedelta(milliseconds=1)
        )
        last = make_job("unknown", attempt=2, max_attempts=3)  # delivered as attempt 3 of 3
        fake.queue.push(last)
        task = asyncio.ensure_future(worker.run())
        # Held, released, delivered again (same attempt), held longer, released again.
        await fake.wait_until(lambda: len(fake.queue.released) >= 2)
        worker.stop()
        await task
        assert fake.queue.nacked == []  # a nack would have dead-lettered it
        assert {r["job_id"] for r in fake.queue.released} == {last["id"]}
        assert {r["attempt"] for r in fake.queue.released} == {3}
        await client.close()


async def test_jobs_cancelled_by_a_second_signal_are_released(fake: FakeServer) -> None:
    started = asyncio.Event()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = Worker(client, ["q"], LEASE, wait_timeout=WAIT)

        @worker.handler("work")
        async def hangs(payload: Payload | None, ctx: JobCtx) -> None:
            started.set()
            await asyncio.Event().wait()

        job = make_job("work")
        fake.queue.push(job)
        task = asyncio.ensure_future(worker.run(handle_signals=True))
        await asyncio.wait_for(started.wait(), 5)
        os.kill(os.getpid(), signal.SIGINT)
        await eventually(lambda: worker.shutdown_handle().is_shutdown)
        os.kill(os.getpid(), signal.SIGINT)
        await task
        assert [r["job_id"] for r in fake.queue.released] == [job["id"]]
        assert fake.ops("ack") == [] and fake.ops("nack") == []
        await client.close()
