"""Every admin mutation of issue 15 survives a restart of a real `sepp serve`,
after a graceful stop (SIGTERM: from the final snapshot) and after a crash
(SIGKILL: from the log): a dead-lettered job stays a dead letter with cause
admin, a cancelled job stays gone, a requeued dead letter stays Ready at attempt
1, a deleted dead letter stays gone, a pause holds until resumed and a resume
holds, a purged queue stays empty, a runtime queue keeps its overrides and a
deleted one its jobs cancelled. Driven over the native client's admin methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from sepp.client import EnqueueRequest, Payload, ReserveOptions, SeppClient
from tests.conftest import ServerProcess
from tests.server.test_restart import restart

RETAIN = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "3600000"}
LEASE = timedelta(seconds=60)


def job(queue: str, tag: str) -> EnqueueRequest:
    return EnqueueRequest(queue=queue, job_type="t", payload=Payload(tag.encode(), "text/plain"))


async def ids(client: SeppClient, queue: str, *tags: str) -> list[str]:
    return [(await client.enqueue(job(queue, tag))).job_id for tag in tags]


async def state_of(client: SeppClient, job_id: str) -> tuple[str, int, str | None] | None:
    info = await client.get_job(job_id)
    return None if info is None else (info.state, info.attempt, info.dead_letter_cause)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_every_admin_mutation_survives_a_restart(
    server_factory: Callable[..., ServerProcess], queue_names: Iterator[str], how: str
) -> None:
    server = server_factory(env=RETAIN)
    q, paused, resumed, purged, runtime, doomed = (next(queue_names) for _ in range(6))
    client = await SeppClient.connect(server.address)
    dead, cancelled, requeued, deleted, kept = await ids(client, q, "d", "c", "r", "x", "k")
    (waiting,) = await ids(client, paused, "p")
    (running,) = await ids(client, resumed, "s")
    purged_ids = await ids(client, purged, "u1", "u2", "u3")
    (gone_with_queue,) = await ids(client, doomed, "g")

    reason = {"reason": "restart test"}
    assert (await client.dead_letter_jobs([dead], **reason)).done == [dead]
    assert (await client.cancel_jobs([cancelled], **reason)).done == [cancelled]
    assert (await client.dead_letter_jobs([requeued, deleted], **reason)).done == [
        requeued,
        deleted,
    ]
    assert (await client.requeue_dead_letters([requeued], **reason)).done == [requeued]
    assert (await client.delete_dead_letters([deleted], **reason)).done == [deleted]
    assert (await client.pause_queue(paused, **reason)).changed
    assert (await client.pause_queue(resumed, **reason)).changed
    assert (await client.resume_queue(resumed, **reason)).changed
    assert (await client.purge_queue(purged, **reason)).purged == 3
    assert (await client.put_queue(runtime, {"default_priority": 7}, **reason)).created
    assert (await client.put_queue(doomed, {"default_priority": 3}, **reason)).created
    assert (await client.delete_queue(doomed, **reason)).cancelled == 1
    before = {j: await state_of(client, j) for j in (dead, cancelled, requeued, deleted, kept)}
    await client.close()

    server = restart(server_factory, server, how, env=RETAIN)
    client = await SeppClient.connect(server.address)
    after = {j: await state_of(client, j) for j in before}
    assert after == before
    assert after[dead] == ("dead_letter", 1, "admin")
    assert after[requeued] == ("ready", 1, None)
    assert after[cancelled] is None and after[deleted] is None
    for job_id in (gone_with_queue, *purged_ids):
        assert await client.get_job(job_id) is None
    queues = {info.name: info for info in await client.list_queues()}
    assert queues[paused].paused and not queues[resumed].paused
    assert queues[runtime].declared and queues[runtime].settings["default_priority"] == 7
    # Emptied and undeclared: forgotten, and still so after the restart.
    assert purged not in queues and doomed not in queues

    # The pause still holds: nothing from `paused` until it is resumed; the
    # resumed queue delivers.
    options = ReserveOptions(queues=[paused, resumed], lease_duration=LEASE, max_jobs=10)
    assert [j.ctx.id for j in await client.reserve(options) or ()] == [running]
    assert (await client.resume_queue(paused, reason="after the restart")).changed
    assert [j.ctx.id for j in await client.reserve(options) or ()] == [waiting]
    await client.close()
