"""`settle` (PROTOCOL.md 5.13): acks, nacks and extends in one request, each item
run as its single operation and answered in its own result, fencing errors per
item; the batch limit advertised in the hello answer and server_info."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sepp.protocol import messages as pm
from sepp.storage.faultfs import FaultyFileSystem
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import RawClient, connect, job

pytestmark = pytest.mark.usefixtures("in_process_env")

MISSING = "00000000-0000-4000-8000-000000000000"
WAIT_S = 30  # a deadline for what must happen, never a measured bound


async def leased(client: RawClient, queue: str, count: int) -> list[dict[str, Any]]:
    await client.enqueue_ids(*[job(queue, f"t{i}") for i in range(count)])
    jobs = await client.reserve([queue], max_jobs=count)
    assert len(jobs) == count
    return jobs


def ack(j: dict[str, Any], attempt: int | None = None) -> dict[str, Any]:
    return {"kind": "ack", "job_id": j["id"], "attempt": attempt or j["attempt"]}


async def test_settle_answers_each_kind_in_order_and_applies_it():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        a, b, c = await leased(client, "q", 3)
        answer = await client.ok(
            "settle",
            {
                "items": [
                    ack(a),
                    {"kind": "nack", "job_id": b["id"], "attempt": 1, "reason": "boom"},
                    {"kind": "extend", "job_id": c["id"], "attempt": 1, "lease_ms": 120_000},
                ]
            },
        )
        ok, nacked, extended = answer["results"]
        assert ok == {"status": "ok", "job_id": a["id"]}
        assert nacked == {"status": "ok", "job_id": b["id"], "dead_lettered": False}
        assert extended["status"] == "ok" and extended["job_id"] == c["id"]
        assert extended["lease_expires_at_ms"] > c["lease_expires_at_ms"]
        # The ack deleted a; the nack made b ready again (default retry, no backoff
        # left to wait for is not assumed: look at the counts).
        stats = (await client.ok("queue_stats", {"queues": ["q"]}))["queues"][0]
        assert stats["in_flight"] == 1  # c only
        assert stats["ready"] + stats["scheduled"] == 1  # b


async def test_fencing_errors_come_back_per_item_with_the_single_operations_codes():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        a, b = await leased(client, "q", 2)
        answer = await client.ok(
            "settle",
            {
                "items": [
                    ack(a, attempt=2),  # a stale (here: future) attempt
                    {"kind": "extend", "job_id": MISSING, "attempt": 1, "lease_ms": 1000},
                    ack(b),
                    ack(b),  # in order: the second ack finds b gone
                ]
            },
        )
        stale, missing, done, again = answer["results"]
        single_stale = await client.call("ack", {"job_id": a["id"], "attempt": 2})
        single_missing = await client.call(
            "extend", {"job_id": MISSING, "attempt": 1, "lease_ms": 1000}
        )
        assert stale["status"] == single_stale.status == "failed_precondition"
        assert stale["reason"] == single_stale.body["reason"] == "attempt_mismatch"
        assert stale["current_attempt"] == single_stale.body["current_attempt"] == 1
        assert missing["status"] == single_missing.status == "not_found"
        assert done == {"status": "ok", "job_id": b["id"]}
        assert again["status"] == "not_found"
        # The refused items changed nothing: a is still leased under attempt 1.
        assert (await client.ok("ack", {"job_id": a["id"], "attempt": 1})) == {"job_id": a["id"]}


async def test_a_malformed_or_refused_item_is_invalid_argument_for_that_item_only():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        (a,) = await leased(client, "q", 1)
        answer = await client.ok(
            "settle",
            {
                "items": [
                    {"kind": "release", "job_id": a["id"], "attempt": 1},
                    {"kind": "extend", "job_id": a["id"], "attempt": 1, "lease_ms": 0},
                    {"kind": "ack", "job_id": a["id"], "attempt": True},
                    ack(a),
                ]
            },
        )
        statuses = [r["status"] for r in answer["results"]]
        assert statuses == ["invalid_argument", "invalid_argument", "invalid_argument", "ok"]
        assert all(isinstance(r["message"], str) for r in answer["results"][:3])


@pytest.mark.parametrize("items", [[], "not an array", None])
async def test_a_settle_without_items_is_refused_whole(items: Any):
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        response = await client.call("settle", {} if items is None else {"items": items})
        assert response.status == "invalid_argument", response


async def test_a_settle_over_max_settle_batch_is_refused_whole_and_applies_nothing():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        (a,) = await leased(client, "q", 1)
        items = [ack(a)] + [{"kind": "ack", "job_id": MISSING, "attempt": 1}] * pm.MAX_SETTLE_BATCH
        response = await client.call("settle", {"items": items})
        assert response.status == "invalid_argument", response
        assert "max_settle_batch" in response.body["message"]
        stats = (await client.ok("queue_stats", {"queues": ["q"]}))["queues"][0]
        assert stats["in_flight"] == 1


async def test_hello_and_server_info_advertise_the_batch_limits():
    async with in_process(in_process_config(limits__max_enqueue_batch="100")) as server:
        client = await RawClient.connect(address_of(server))
        hello = await client.hello()
        assert hello["max_settle_batch"] == pm.MAX_SETTLE_BATCH == 256
        assert hello["max_enqueue_batch"] == 100
        info = await client.ok("server_info")
        assert info["max_settle_batch"] == 256
        assert info["max_enqueue_batch"] == 100


class HeldSync:
    """Holds the flusher inside fdatasync once armed, until released."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, op: str, path: str) -> None:
        if op == "fdatasync" and self.armed and not self.release.is_set():
            self.entered.set()
            self.release.wait(60)


async def test_the_answer_waits_until_every_applied_item_is_durable():
    fs = FaultyFileSystem()
    held = HeldSync()
    fs.hook = held
    config = in_process_config(storage__persist_mode="sync_data")
    async with in_process(config, fs) as server:
        client = await connect(address_of(server))
        try:
            a, b = await leased(client, "q", 2)
            held.armed = True
            first = client.send("ack", {"job_id": a["id"], "attempt": 1})
            await asyncio.to_thread(held.entered.wait, 30)
            assert held.entered.is_set()
            settle = client.send("settle", {"items": [ack(b)]})
            assert (await client.ok("health")) == {"status": "serving"}
            assert first not in client.responses and settle not in client.responses
        finally:
            held.release.set()
        response = await client.response(settle)
        assert response.body["results"] == [{"status": "ok", "job_id": b["id"]}]


async def test_a_full_commit_backlog_refuses_each_item_with_overloaded_and_applies_none():
    fs = FaultyFileSystem()
    held = HeldSync()
    fs.hook = held
    config = in_process_config(
        storage__persist_mode="sync_data", storage__command_queue_capacity="2"
    )
    async with in_process(config, fs) as server:
        client = await connect(address_of(server))
        try:
            a, b = await leased(client, "q", 2)
            held.armed = True
            first = client.send("enqueue", {"jobs": [job("q", "x")]})
            await asyncio.to_thread(held.entered.wait, 30)
            assert held.entered.is_set()
            second = client.send("enqueue", {"jobs": [job("q", "y")]})
            settle = client.send("settle", {"items": [ack(a), ack(b)]})
            response = await client.response(settle)
        finally:
            held.release.set()
        # The backlog drains once the held sync returns.
        for request_id in (first, second):
            assert (await client.response(request_id)).status == "ok"
        results = response.body["results"]
        assert [r["status"] for r in results] == ["resource_exhausted"] * 2
        assert {r["reason"] for r in results} == {"overloaded"}
        # Neither ack was applied: both jobs are still leased under attempt 1.
        answer = await client.ok("settle", {"items": [ack(a), ack(b)]})
        assert [r["status"] for r in answer["results"]] == ["ok", "ok"]


async def test_an_item_carrying_the_enqueued_at_of_a_delivery_before_a_requeue_is_fenced() -> None:
    """The repro of the requeue bug (PROTOCOL.md 5.3): max_attempts=1, A's lease
    lapses (dead-lettered), an operator requeues the job, B reserves it at
    attempt 1 again. Each item's enqueued_at_ms is checked as the single
    operation checks it; an item without one is fenced by its attempt only (what
    the official gRPC clients get)."""
    async with in_process(in_process_config(storage__dead_letter_retention_ms="3600000")) as server:
        client = await connect(address_of(server))
        [job_id] = await client.enqueue_ids(job("q", max_attempts=1))
        [first] = await client.reserve(["q"], lease_ms=30)

        async def dead_lettered() -> bool:
            info = (await client.ok("get_job", {"id": job_id}))["job"]
            return bool(info["state"] == "dead_letter")

        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not await dead_lettered():  # a deadline, not a timing bound
            assert asyncio.get_running_loop().time() < deadline, "never dead-lettered"
            await asyncio.sleep(0.01)
        await client.ok("requeue_dead_letters", {"ids": [job_id]})
        [second] = await client.reserve(["q"])
        old, new = first["enqueued_at_ms"], second["enqueued_at_ms"]
        assert new > old and first["attempt"] == second["attempt"] == 1
        single = await client.call("ack", {"job_id": job_id, "attempt": 1, "enqueued_at_ms": old})
        assert (single.status, single.body["reason"]) == ("failed_precondition", "attempt_mismatch")

        def item(kind: str, token: int | None, **fields: Any) -> dict[str, Any]:
            body = {"kind": kind, "job_id": job_id, "attempt": 1, **fields}
            if token is not None:
                body["enqueued_at_ms"] = token
            return body

        answer = await client.ok(
            "settle",
            {
                "items": [
                    item("ack", old),
                    item("nack", old, retry="dead_letter"),
                    item("extend", old, lease_ms=5_000),
                    item("extend", new, lease_ms=120_000),
                    item("ack", "not a number"),  # type: ignore[arg-type]
                    item("extend", None, lease_ms=120_000),  # no token: attempt-only
                    item("ack", new),
                ]
            },
        )
        results = answer["results"]
        for stale in results[:3]:
            assert stale["status"] == "failed_precondition", stale
            assert (stale["reason"], stale["current_attempt"]) == ("attempt_mismatch", 1)
        assert results[3]["status"] == "ok"
        assert results[4]["status"] == "invalid_argument"
        assert results[5]["status"] == "ok"
        assert results[6] == {"status": "ok", "job_id": job_id}
