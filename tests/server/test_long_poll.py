"""Long-poll reserves: parking, every kind of wake, deadlines, out-of-order answers
on one connection, fair hand-out to several waiters, and shutdown; reserves whose
client has gone (half-close, exit, withdraw, an answer that cannot be written) and
the release of attempts delivered to nobody."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import pytest

from sepp.server.server import SeppServer
from sepp.storage.faultfs import FaultyFileSystem
from tests.inprocess import address_of, in_process, in_process_config
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


# -- abandoned long polls (issue 12 §1) ----------------------------------------------------
# A reserve nobody waits for any more must never be given a job: the job's attempt
# would be spent on nobody, and with max_attempts = 1 it would be dead-lettered (and,
# with the default retention, dropped) without ever running.


async def test_a_half_close_answers_parked_reserves_empty_and_they_never_get_a_job(
    sepp_server, queue_names
):
    gone = await connect(sepp_server.address)
    q = next(queue_names)
    first = await park(gone, [q], wait_ms=60_000)
    second = await park(gone, [q], wait_ms=60_000)
    gone.half_close()
    # Both end now, answered empty while the socket still takes writes, then the
    # server closes the connection (nothing else was in flight).
    assert await jobs_of(gone, first) == []
    assert await jobs_of(gone, second) == []
    await gone.wait_closed()
    gone.assert_clean()
    producer = await connect(sepp_server.address)
    (job_id,) = await producer.enqueue_ids(job(q, max_attempts=1))
    stats = await producer.stats(q)
    assert (stats["ready"], stats["in_flight"], stats["dead_lettered"]) == (1, 0, 0)
    (delivered,) = await producer.reserve([q])
    assert (delivered["id"], delivered["attempt"], delivered["max_attempts"]) == (job_id, 1, 1)
    assert (await producer.ack(delivered)).status == "ok"


async def test_a_withdrawn_reserve_is_answered_empty_before_the_withdraw(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    waiting = await park(worker, [q], wait_ms=60_000)
    assert await worker.ok("withdraw", {"request_id": waiting}) == {"withdrawn": True}
    # The reserve's empty answer came first: once the withdraw is answered the
    # client holds everything the reserve will ever get.
    assert worker.responses[waiting].body == {"jobs": []}
    arrival = [r.id for r in worker.arrivals]
    assert arrival.index(waiting) < len(arrival) - 1
    # The withdrawn reserve is gone: a max_attempts = 1 job goes to the next
    # reserve, attempt 1, instead of being leased to nobody.
    producer = await connect(sepp_server.address)
    (job_id,) = await producer.enqueue_ids(job(q, max_attempts=1))
    (delivered,) = await worker.reserve([q], wait_ms=5_000)
    assert (delivered["id"], delivered["attempt"]) == (job_id, 1)
    assert (await worker.ack(delivered)).status == "ok"
    worker.assert_clean()


async def test_withdrawing_a_request_that_is_not_parked_says_so(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    other = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await worker.enqueue_ids(job(q))
    answered = worker.send("reserve", worker.reserve_body([q], wait_ms=60_000))
    (delivered,) = await jobs_of(worker, answered)
    # Already answered (with a job, which is now the client's to release or run),
    # never sent, or parked on another connection: nothing to withdraw.
    assert await worker.ok("withdraw", {"request_id": answered}) == {"withdrawn": False}
    assert await worker.ok("withdraw", {"request_id": 987_654}) == {"withdrawn": False}
    elsewhere = await park(other, [q + "-idle"], wait_ms=60_000)
    assert await worker.ok("withdraw", {"request_id": elsewhere}) == {"withdrawn": False}
    assert elsewhere not in other.responses
    assert delivered["id"] == job_id


async def test_a_withdraw_without_a_request_id_is_invalid_argument(sepp_server):
    worker = await connect(sepp_server.address)
    for body in ({}, {"request_id": -1}, {"request_id": "7"}):
        response = await worker.call("withdraw", body)
        assert response.status == "invalid_argument", (body, response)
    assert await worker.ok("health") == {"status": "serving"}


# -- release: an attempt handed back unused -------------------------------------------------


async def release(client: RawClient, delivered: dict, attempt: int | None = None):
    body = {
        "job_id": delivered["id"],
        "attempt": delivered["attempt"] if attempt is None else attempt,
    }
    return await client.call("release", body)


async def test_a_released_job_is_ready_at_once_and_keeps_its_attempt(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await worker.enqueue_ids(job(q, max_attempts=1))
    (delivered,) = await worker.reserve([q])
    response = await release(worker, delivered)
    assert (response.status, response.body) == ("ok", {"job_id": job_id})
    stats = await worker.stats(q)
    assert (stats["ready"], stats["in_flight"], stats["dead_lettered"]) == (1, 0, 0)
    # Not counted: the next delivery is attempt 1 again, and a failure of that
    # attempt is the job's first and last.
    (again,) = await worker.reserve([q])
    assert (again["id"], again["attempt"], again["max_attempts"]) == (job_id, 1, 1)
    nacked = await worker.nack(again)
    assert (nacked.status, nacked.body["dead_lettered"]) == ("ok", True)


async def test_a_release_wakes_a_parked_reserve(sepp_server, queue_names):
    holder = await connect(sepp_server.address)
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await holder.enqueue_ids(job(q))
    (held,) = await holder.reserve([q])
    waiting = await park(worker, [q])
    assert (await release(holder, held)).status == "ok"
    (delivered,) = await jobs_of(worker, waiting)
    assert (delivered["id"], delivered["attempt"]) == (job_id, 1)


async def test_a_release_is_fenced_like_an_ack(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await worker.enqueue_ids(job(q, max_attempts=3))
    (first,) = await worker.reserve([q])
    assert (await worker.nack(first)).status == "ok"
    (second,) = await worker.reserve([q])
    assert second["attempt"] == 2
    stale = await release(worker, first)
    assert (stale.status, stale.body["reason"], stale.body["current_attempt"]) == (
        "failed_precondition",
        "attempt_mismatch",
        2,
    )
    assert (await release(worker, second)).status == "ok"
    # Released: no longer in flight, so a second release (or an ack) finds nothing.
    assert (await release(worker, second)).status == "not_found"
    assert (await worker.ack(second)).status == "not_found"
    unknown = {"id": "00000000-0000-4000-8000-000000000000", "attempt": 1}
    assert (await release(worker, unknown)).status == "not_found"
    assert (await release(worker, {"id": "not-a-uuid", "attempt": 1})).status == (
        "invalid_argument"
    )
    assert (await release(worker, second, attempt=0)).status == "invalid_argument"
    assert (await worker.stats(q))["ready"] == 1
    assert job_id == second["id"]


async def test_a_release_survives_a_crash_and_replays_to_the_same_state(
    server_factory, queue_names
):
    server = server_factory()
    client = await connect(server.address)
    q = next(queue_names)
    released_id, kept_id = await client.enqueue_ids(job(q, max_attempts=1), job(q))
    first, second = await client.reserve([q], max_jobs=2)
    assert (first["id"], second["id"]) == (released_id, kept_id)
    assert (await release(client, first)).status == "ok"
    await client.close()
    server.kill()  # no final snapshot: recovery replays the JobReleased record
    restarted = server_factory(data_dir=server.data_dir)
    client = await connect(restarted.address)
    stats = await client.stats(q)
    assert (stats["ready"], stats["in_flight"], stats["dead_lettered"]) == (1, 1, 0)
    (again,) = await client.reserve([q])
    assert (again["id"], again["attempt"]) == (released_id, 1)
    assert (await client.ack(again)).status == "ok"
    # The job still in flight is fenced by its attempt as before the crash.
    assert (await client.ack(second)).status == "ok"


# -- in process: what only the server's own state can show ----------------------------------


def reset_on_close(client: RawClient) -> None:
    """Make the next close send a TCP reset, as a killed peer's kernel may: the
    server then sees the connection lost, not a half-close."""
    sock = client._writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def parked_count(server: SeppServer) -> int:
    return sum(len(conn.parked) for conn in server.connections)


async def test_a_client_that_exits_with_a_parked_reserve_never_receives_the_next_job(
    in_process_env, queue_names
):
    fs = FaultyFileSystem()
    async with in_process(in_process_config(), fs) as server:
        gone = await connect(address_of(server))
        q = next(queue_names)
        await park(gone, [q], wait_ms=60_000)
        # The process exits: its kernel closes the socket, no goodbye.
        await gone.close()
        await wait_until(
            lambda: parked_count(server) == 0, what="the gone client's parked reserve to end"
        )
        producer = await connect(address_of(server))
        (job_id,) = await producer.enqueue_ids(job(q, max_attempts=1))
        stats = await producer.stats(q)
        assert (stats["ready"], stats["in_flight"], stats["dead_lettered"]) == (1, 0, 0)
        (delivered,) = await producer.reserve([q])
        assert (delivered["id"], delivered["attempt"]) == (job_id, 1)
        assert (await producer.ack(delivered)).status == "ok"


class HeldSync:
    """A FaultyFileSystem hook that holds the flusher inside fdatasync until
    released: a command is applied but its answer waits for the disk."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, op: str, path: str) -> None:
        if op == "fdatasync" and self.armed and not self.release.is_set():
            self.entered.set()
            self.release.wait(60)


@pytest.mark.parametrize("parked", [False, True], ids=["immediate", "woken-from-park"])
async def test_jobs_whose_reserve_answer_cannot_be_written_are_ready_again_at_once(
    in_process_env, queue_names, parked
):
    fs = FaultyFileSystem()
    held = HeldSync()
    fs.hook = held
    config = in_process_config(storage__persist_mode="sync_data")
    async with in_process(config, fs) as server:
        try:
            gone = await connect(address_of(server))
            producer = await connect(address_of(server))
            q = next(queue_names)
            if parked:
                await park(gone, [q], wait_ms=60_000)
                held.armed = True
                sent = producer.send("enqueue", {"jobs": [job(q, max_attempts=1)]})
            else:
                (job_id,) = await producer.enqueue_ids(job(q, max_attempts=1))
                held.armed = True
                sent = gone.send("reserve", gone.reserve_body([q], lease_ms=600_000))
            # The job is leased (in memory); its answer waits for the disk, and
            # meanwhile the client's connection is lost.
            await asyncio.to_thread(held.entered.wait, 30)
            assert held.entered.is_set()
            await wait_until(
                lambda: any(j.status == 2 for j in server.engine.state.jobs.values()),
                what="the job to be leased",
            )
            reset_on_close(gone)
            await gone.close()
            await wait_until(
                lambda: len(server.connections) == 1, what="the server to see the reset"
            )
        finally:
            held.release.set()
        if parked:
            assert (await producer.response(sent)).status == "ok"

        # The answer could not be written: the job was delivered to nobody, so it
        # is Ready as soon as the server finds that out (when the answer falls
        # due) -- not In-flight until its 10-minute lease lapses, and its only
        # attempt not spent.
        async def released() -> bool:
            stats = await producer.stats(q)
            return (stats["ready"], stats["in_flight"], stats["dead_lettered"]) == (1, 0, 0)

        await wait_until(released, what="the undelivered job to be Ready again")
        (delivered,) = await producer.reserve([q])
        assert (delivered["attempt"], delivered["max_attempts"]) == (1, 1)
        if not parked:
            assert delivered["id"] == job_id
        assert (await producer.ack(delivered)).status == "ok"
