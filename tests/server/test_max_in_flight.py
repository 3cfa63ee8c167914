"""Per-queue max_in_flight on a real server (issue 17 item 3): a runtime override
caps the queue's leased jobs; a long-poll reserve at the cap is parked (not
refused) and is served when an ack frees a place."""

from __future__ import annotations

from tests.server.conftest import connect, job
from tests.server.test_long_poll import jobs_of, park


async def test_a_reserve_at_max_in_flight_parks_and_an_ack_serves_it(sepp_server, queue_names):
    worker = await connect(sepp_server.address)
    other = await connect(sepp_server.address)
    q = next(queue_names)
    await worker.ok("put_queue", {"queue": q, "overrides": {"max_in_flight": 2}})
    await other.enqueue_ids(*(job(q) for _ in range(4)))
    first = await worker.reserve([q], max_jobs=4)
    assert len(first) == 2  # fewer jobs, never an error
    assert await worker.reserve([q], max_jobs=4) == []
    waiting = await park(other, [q])
    assert (await worker.ack(first[0])).status == "ok"
    served = await jobs_of(other, waiting)
    assert len(served) == 1
    info = await worker.ok("queue_info", {"queue": q})
    assert info["queue"]["inflight"] == 2
    assert info["queue"]["settings"]["max_in_flight"] == 2
