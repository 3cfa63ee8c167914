"""A large best-effort enqueue is stored in parts (sepp/server/parts.py, issue 13):
one record per part of at most ENQUEUE_PART_BYTES, each once the one before is
durable, answered once; the connection's later requests are applied after it."""

from __future__ import annotations

import asyncio
import base64

from sepp.core.commands import NewJob
from sepp.server.parts import ENQUEUE_PART_BYTES, job_bytes, split_enqueue
from sepp.server.server import SeppServer
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import connect, job, payload
from tests.server.test_admin_api import admin_api

# Three of these make a batch over ENQUEUE_PART_BYTES; two do not fit one part.
BIG = 700 * 1024


def _new(job_id: str, size: int, **fields: object) -> NewJob:
    return NewJob(job_id=job_id, queue="q", job_type="t", payload_data=b"x" * size, **fields)  # type: ignore[arg-type]


def test_a_batch_is_split_only_when_its_jobs_pass_the_part_size():
    small = tuple(_new(str(i), 1000) for i in range(200))
    assert split_enqueue(small, 256) is None
    assert split_enqueue((_new("a", 4 * ENQUEUE_PART_BYTES),), 256) is None  # one job
    big = tuple(_new(str(i), BIG) for i in range(5))
    parts = split_enqueue(big, 256)
    assert parts is not None and [len(p) for p in parts] == [1, 1, 1, 1, 1]
    assert [j for p in parts for j in p] == list(big)  # in order, none lost
    # A batch the core refuses whole (over max_enqueue_batch) is not split.
    assert split_enqueue(big, 4) is None


def test_parts_hold_at_most_the_part_size_unless_one_job_is_larger():
    sizes = [300_000, 300_000, 300_000, 2 * ENQUEUE_PART_BYTES, 100, 500_000, 600_000]
    jobs = tuple(_new(str(i), size) for i, size in enumerate(sizes))
    parts = split_enqueue(jobs, 256)
    assert parts is not None
    assert [[j.job_id for j in p] for p in parts] == [["0", "1", "2"], ["3"], ["4", "5"], ["6"]]
    for part in parts:
        assert len(part) == 1 or sum(map(job_bytes, part)) <= ENQUEUE_PART_BYTES
    # Trace context and idempotency keys count too.
    assert job_bytes(_new("k", 10, idempotency_key="k" * 50)) == job_bytes(_new("k", 60))


def _records(server: SeppServer) -> int:
    engine = server.service.engine
    assert engine is not None
    return int(engine.stats["records"])


async def test_a_large_batch_is_one_answer_from_one_record_per_part():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        datas = [bytes([i]) * BIG for i in range(3)]
        before = _records(server)
        # Pipelined: the stats request is applied after the whole batch.
        enqueue_id = client.send(
            "enqueue", {"jobs": [job("big", payload=payload(d)) for d in datas]}
        )
        stats_id = client.send("queue_stats", {"queues": ["big"]})
        answer = await client.response(enqueue_id)
        stats = await client.response(stats_id)
        assert answer.status == "ok", answer.body
        ids = [r["job_id"] for r in answer.body["results"]]
        assert len(set(ids)) == 3 and not any(r["deduplicated"] for r in answer.body["results"])
        assert stats.status == "ok" and stats.body["queues"][0]["ready"] == 3
        assert _records(server) - before == 3  # one record per part
        delivered = await client.reserve(["big"], max_jobs=3)
        assert [d["id"] for d in delivered] == ids
        assert [d["payload"]["data"] for d in delivered] == datas
        # Atomic, or within one part: one record, as before.
        before = _records(server)
        await client.enqueue(*(job("big", payload=payload(d)) for d in datas), atomic=True)
        await client.enqueue(*(job("big", payload=payload(b"s" * 1000)) for _ in range(3)))
        assert _records(server) - before == 2
        client.assert_clean()
        await client.close()


async def test_idempotency_keys_dedup_across_the_parts_of_one_batch():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        jobs = [
            job("big", payload=payload(b"a" * BIG), idempotency_key="k1"),
            job("big", payload=payload(b"b" * BIG), idempotency_key="k2"),
            job("big", payload=payload(b"c" * BIG), idempotency_key="k1"),
        ]
        before = _records(server)
        results = (await client.enqueue(*jobs))["results"]
        # Three parts; the third, a duplicate only, logs nothing.
        assert _records(server) - before == 2
        assert results[2] == {"job_id": results[0]["job_id"], "deduplicated": True}
        assert (await client.stats("big"))["ready"] == 2
        await client.close()


async def test_shutdown_lets_a_batch_being_stored_in_parts_finish():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        datas = [bytes([i]) * BIG for i in range(4)]
        request_id = client.send(
            "enqueue", {"jobs": [job("big", payload=payload(d)) for d in datas]}
        )
        service = server.service
        for _ in range(10_000):  # loop turns until the first part has run
            if service._parted:
                break
            await asyncio.sleep(0)
        assert service._parted, "the batch was never started in parts"
        await server.shutdown()
        answer = await client.response(request_id)
        assert answer.status == "ok", answer.body
        ids = [r["job_id"] for r in answer.body["results"]]
        assert len(ids) == 4
        jobs = service.engine.state.jobs  # type: ignore[union-attr]
        assert [jobs[i].payload_data for i in ids] == datas


async def test_the_admin_api_stores_a_large_batch_in_parts():
    async with admin_api() as api:
        datas = [bytes([i]) * BIG for i in range(3)]
        batch = {
            "jobs": [
                {
                    "job_type": "t",
                    "payload": {"data": base64.b64encode(d).decode(), "encoding": "b"},
                }
                for d in datas
            ]
        }
        before = _records(api.server)
        status, body, _ = await api.call("POST", "/queues/big/jobs", batch)
        assert status == 200, body
        assert len({r.get("job_id") for r in body["results"]}) == 3, body["results"][0]
        assert _records(api.server) - before == 3
