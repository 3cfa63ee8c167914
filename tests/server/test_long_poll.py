"""Long-poll reserves: parking, every kind of wake, deadlines, out-of-order answers
on one connection, fair hand-out to several waiters, and shutdown."""

from __future__ import annotations

import asyncio

from tests.server.conftest import (
    LEASE_MS,
    RawClient,
    connect,
    job,
    reserved_at,
    wait_until,
)

WAIT_MS = 20_000


async def park(client: RawClient, queues: list[str], *, wait_ms: int = WAIT_MS) -> int:
    """Send a long-poll reserve and make sure the server has parked it: requests on
    one connection are handled in order, so once a later health check is answered
    the reserve was read and (finding nothing) parked."""
    request_id = client.send("reserve", client.reserve_body(queues, wait_ms=wait_ms))
    assert await client.ok("health") == {"status": "serving"}
    assert request_id not in client.responses, client.responses[request_id]
    return request_id


async def jobs_of(client: RawClient, request_id: int) -> list[dict]:
    response = await client.response(request_id, timeout=30)
    assert response.status == "ok", response
    jobs: list[dict] = response.body["jobs"]
    return jobs


async def test_a_parked_reserve_is_woken_by_an_enqueue_on_another_connection(
    sepp_server, queue_names
):
    worker = await connect(sepp_server.address)
    producer = await connect(sepp_server.address)
    q = next(queue_names)
    waiting = await park(worker, [q])
    before = await producer.server_time()
    (job_id,) = await producer.enqueue_ids(job(q))
    (delivered,) = await jobs_of(worker, waiting)
    assert delivered["id"] == job_id
    assert delivered["attempt"] == 1
    # The lease starts when the job was handed over, not when the reserve parked.
    assert reserved_at(delivered, LEASE_MS) >= before
    assert (await worker.ack(delivered)).status == "ok"


async def test_a_reserve_parked_on_several_queues_is_woken_by_any_of_them(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    producer = await connect(sepp_server.address)
    a, b = next(queue_names), next(queue_names)
    waiting = await park(worker, [a, b])
    (job_id,) = await producer.enqueue_ids(job(b))
    (delivered,) = await jobs_of(worker, waiting)
    assert (delivered["id"], delivered["queue"]) == (job_id, b)


async def test_a_parked_reserve_is_woken_by_a_nack(sepp_server, queue_names):
    holder = await connect(sepp_server.address)
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await holder.enqueue_ids(job(q))
    (held,) = await holder.reserve([q])
    waiting = await park(worker, [q])
    assert (await holder.nack(held, reason="retry me")).status == "ok"
    (delivered,) = await jobs_of(worker, waiting)
    assert (delivered["id"], delivered["attempt"]) == (job_id, 2)


async def test_a_parked_reserve_is_woken_when_a_scheduled_job_falls_due(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    producer = await connect(sepp_server.address)
    q = next(queue_names)
    waiting = await park(worker, [q])
    at = await producer.server_time() + 300
    (job_id,) = await producer.enqueue_ids(job(q, scheduled_at_ms=at))
    (delivered,) = await jobs_of(worker, waiting)
    assert delivered["id"] == job_id
    assert reserved_at(delivered, LEASE_MS) >= at


async def test_a_parked_reserve_is_woken_by_a_lease_expiry(sepp_server, queue_names):
    holder = await connect(sepp_server.address)
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await holder.enqueue_ids(job(q))
    (held,) = await holder.reserve([q], lease_ms=300)
    waiting = await park(worker, [q])
    (delivered,) = await jobs_of(worker, waiting)
    assert (delivered["id"], delivered["attempt"]) == (job_id, 2)
    assert reserved_at(delivered, LEASE_MS) >= held["lease_expires_at_ms"]


async def test_a_long_poll_answers_empty_at_its_deadline_and_not_before(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    started = await worker.server_time()
    waiting = await park(worker, [q], wait_ms=300)
    assert await jobs_of(worker, waiting) == []
    assert await worker.server_time() >= started + 300
    # The expired wait left nothing behind: a job enqueued now stays ready.
    (job_id,) = await worker.enqueue_ids(job(q))
    assert (await worker.stats(q))["ready"] == 1
    (delivered,) = await worker.reserve([q])
    assert delivered["id"] == job_id


async def test_wait_ms_is_clamped_to_max_wait_timeout_ms(server_factory, queue_names):
    server = server_factory(env={"SEPP_LIMITS__MAX_WAIT_TIMEOUT_MS": "200"})
    worker = await connect(server.address)
    q = next(queue_names)
    assert (await worker.ok("server_info"))["max_wait_timeout_ms"] == 200
    started = await worker.server_time()
    # Asks for ten minutes; the answer comes at the clamp (well inside the
    # client's answer timeout).
    waiting = await park(worker, [q], wait_ms=600_000)
    assert await jobs_of(worker, waiting) == []
    assert await worker.server_time() >= started + 200


async def test_a_zero_max_wait_turns_every_reserve_into_a_poll(server_factory, queue_names):
    server = server_factory(env={"SEPP_LIMITS__MAX_WAIT_TIMEOUT_MS": "0"})
    worker = await connect(server.address)
    q = next(queue_names)
    assert await worker.reserve([q], wait_ms=600_000) == []


async def test_a_negative_wait_is_invalid_argument(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    response = await worker.call("reserve", worker.reserve_body([next(queue_names)], wait_ms=-1))
    assert response.status == "invalid_argument"


async def test_a_pending_reserve_does_not_hold_up_an_ack_on_the_same_connection(
    sepp_server, queue_names
):
    worker = await connect(sepp_server.address)
    producer = await connect(sepp_server.address)
    work, idle = next(queue_names), next(queue_names)
    await producer.enqueue_ids(job(work))
    (held,) = await worker.reserve([work])
    waiting = await park(worker, [idle])
    ack_id = worker.send("ack", {"job_id": held["id"], "attempt": held["attempt"]})
    ack = await worker.response(ack_id)
    assert ack.status == "ok"
    assert waiting not in worker.responses
    # Out of order: the ack's answer came before the reserve sent ahead of it.
    (later_job,) = await producer.enqueue_ids(job(idle))
    (delivered,) = await jobs_of(worker, waiting)
    assert delivered["id"] == later_job
    order = [r.id for r in worker.arrivals]
    assert order.index(ack_id) < order.index(waiting)
    worker.assert_clean()


async def test_several_parked_reserves_and_fewer_jobs_deliver_each_job_once(
    sepp_server, queue_names
):
    q = next(queue_names)
    workers = [await connect(sepp_server.address) for _ in range(4)]
    waiting = [await park(w, [q]) for w in workers]
    producer = await connect(sepp_server.address)
    ids = await producer.enqueue_ids(job(q), job(q))

    def answered() -> list[int]:
        return [i for i, (w, r) in enumerate(zip(workers, waiting)) if r in w.responses]

    await wait_until(lambda: len(answered()) >= 2, what="two parked reserves to be served")
    served = answered()
    delivered = [j["id"] for i in served for j in await jobs_of(workers[i], waiting[i])]
    assert sorted(delivered) == sorted(ids)
    # The others keep waiting: both still answer other requests with their reserve
    # pending, and the next job goes to one of them.
    rest = [i for i in range(4) if i not in served]
    for i in rest:
        assert await workers[i].ok("health") == {"status": "serving"}
        assert waiting[i] not in workers[i].responses
    (third,) = await producer.enqueue_ids(job(q))
    await wait_until(lambda: len(answered()) == 3, what="a third parked reserve to be served")
    (winner,) = [i for i in answered() if i in rest]
    (delivered_third,) = await jobs_of(workers[winner], waiting[winner])
    assert delivered_third["id"] == third
    (loser,) = [i for i in rest if i != winner]
    assert waiting[loser] not in workers[loser].responses
    stats = await producer.stats(q)
    assert (stats["ready"], stats["in_flight"]) == (0, 3)


async def test_one_enqueued_batch_wakes_as_many_waiters_as_it_has_jobs(sepp_server, queue_names):
    q = next(queue_names)
    workers = [await connect(sepp_server.address) for _ in range(3)]
    waiting = [await park(w, [q]) for w in workers]
    producer = await connect(sepp_server.address)
    ids = await producer.enqueue_ids(job(q), job(q), job(q))
    delivered = []
    for w, r in zip(workers, waiting):
        jobs = await jobs_of(w, r)
        assert len(jobs) == 1
        delivered.append(jobs[0]["id"])
    assert sorted(delivered) == sorted(ids)


async def test_on_sigterm_parked_reserves_answer_empty_and_the_exit_code_is_zero(
    server_factory, queue_names
):
    server = server_factory()
    q = next(queue_names)
    workers = [await connect(server.address) for _ in range(3)]
    waiting = [await park(w, [q]) for w in workers]
    stopping = asyncio.create_task(asyncio.to_thread(server.stop))
    for w, r in zip(workers, waiting):
        assert await jobs_of(w, r) == []
    for w in workers:
        await w.wait_closed()
        w.assert_clean()
    assert await stopping == 0
