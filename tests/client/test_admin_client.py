"""The admin operations end to end (issue 15): the async and sync clients against
the in-process server over the native protocol (PROTOCOL.md 5.14-5.27). A job in
each state, paging while enqueuing, pause and resume, purge, requeue by ids,
refusals as typed errors, and the actor an API-key connection acts as.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest

from sepp.client import EnqueueRequest, Payload, ReserveOptions, SeppClient, SyncSeppClient
from sepp.client.errors import (
    InvalidRequestError,
    PermissionDeniedError,
    QueueInUseError,
    QueueNotFoundError,
)
from sepp.server.native_admin import native_principal
from sepp.server.service import Principal
from tests.inprocess import address_of, in_process, in_process_config

pytestmark = pytest.mark.usefixtures("in_process_env")

LEASE = timedelta(seconds=60)
WAIT_S = 30  # a deadline for what must happen, never a measured bound
RETAIN = {"storage__dead_letter_retention_ms": "3600000"}


def job(queue: str = "q", **kw: object) -> EnqueueRequest:
    return EnqueueRequest(queue=queue, job_type="t", **kw)  # type: ignore[arg-type]


async def test_get_job_shows_a_job_in_each_state_and_none_for_an_unknown_id():
    async with in_process(in_process_config(**RETAIN)) as server:
        client = await SeppClient.connect(address_of(server))
        later = datetime.now(UTC) + timedelta(hours=1)
        ready = await client.enqueue(job(payload=Payload(b"hi", "text/plain")))
        scheduled = await client.enqueue(job(scheduled_at=later))
        inflight = await client.enqueue(job("w"))
        dead = await client.enqueue(job("d"))
        (leased,) = await client.reserve(
            ReserveOptions(queues=["w"], lease_duration=LEASE, worker_id="w1")
        ) or [None]
        assert leased is not None
        outcomes = await client.dead_letter_jobs([dead.job_id], reason="bad")
        assert outcomes.done == [dead.job_id]
        states = {}
        for ack in (ready, scheduled, inflight, dead):
            info = await client.get_job(ack.job_id)
            assert info is not None and info.job_id == ack.job_id
            states[ack.job_id] = info
        assert states[ready.job_id].state == "ready"
        assert states[ready.job_id].payload == Payload(b"hi", "text/plain")
        assert states[scheduled.job_id].state == "scheduled"
        assert states[scheduled.job_id].run_at is not None
        assert states[inflight.job_id].state == "inflight"
        assert states[inflight.job_id].worker_id == "w1"
        assert states[inflight.job_id].lease_expires_at is not None
        assert states[dead.job_id].state == "dead_letter"
        assert states[dead.job_id].dead_letter_cause == "admin"
        assert await client.get_job("00000000-0000-0000-0000-000000000000") is None
        await client.close()


async def test_paging_a_queue_while_enqueuing_lists_every_job_once_in_order():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        ids = [a.job_id for a in await client.enqueue_batch([job() for _ in range(25)])]
        seen: list[str] = []
        cursor = None
        while True:
            page = await client.list_jobs("q", "ready", cursor=cursor, limit=10)
            seen.extend(j.job_id for j in page.jobs)
            if page.next_cursor is None:
                break
            # Enqueued between pages: it lands after the cursor, on a later page.
            ids.append((await client.enqueue(job())).job_id)
            cursor = page.next_cursor
        assert seen == ids and len(ids) > 25
        await client.close()


async def test_pause_stops_delivery_and_resume_wakes_a_waiting_reserve():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        change = await client.pause_queue("q", reason="maintenance")
        assert (change.paused, change.changed) == (True, True)
        ack = await client.enqueue(job())
        assert await client.reserve(
            ReserveOptions(queues=["q"], lease_duration=LEASE, wait_timeout=timedelta(0))
        ) in (None, [])
        waiting = asyncio.create_task(
            client.reserve(
                ReserveOptions(
                    queues=["q"], lease_duration=LEASE, wait_timeout=timedelta(seconds=WAIT_S)
                )
            )
        )
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not server.service._parked and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert server.service._parked, "the reserve never parked"
        assert (await client.resume_queue("q")).paused is False
        jobs = await asyncio.wait_for(waiting, WAIT_S)
        assert jobs and jobs[0].ctx.id == ack.job_id
        info = (await client.list_queues())[0]
        assert (info.name, info.paused, info.inflight) == ("q", False, 1)
        await client.close()


async def test_purge_returns_the_count_and_delete_queue_is_refused_while_a_job_is_in_flight():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        created = await client.put_queue("q", {"default_priority": 3})
        assert created.created and created.settings["default_priority"] == 3
        await client.enqueue_batch([job() for _ in range(4)])
        assert await client.reserve(ReserveOptions(queues=["q"], lease_duration=LEASE))
        purged = await client.purge_queue("q")
        assert (purged.purged, purged.remaining) == (3, 0)
        with pytest.raises(QueueInUseError):
            await client.delete_queue("q")
        with pytest.raises(QueueNotFoundError):
            await client.queue_info("nope")
        await client.close()


async def test_requeue_by_ids_answers_a_per_id_outcome_and_the_job_is_ready_at_attempt_one():
    async with in_process(in_process_config(**RETAIN)) as server:
        client = await SeppClient.connect(address_of(server))
        ack = await client.enqueue(job())
        await client.dead_letter_jobs([ack.job_id])
        page = await client.list_dead_letters("q", cause="admin")
        assert [j.job_id for j in page.jobs] == [ack.job_id]
        missing = "00000000-0000-0000-0000-000000000001"
        outcomes = await client.requeue_dead_letters([ack.job_id, missing])
        assert outcomes.outcomes == [(ack.job_id, "done"), (missing, "not_found")]
        info = await client.get_job(ack.job_id)
        assert info is not None and (info.state, info.attempt) == ("ready", 1)
        with pytest.raises(InvalidRequestError):
            await client.cancel_jobs([f"id-{i}" for i in range(1001)])
        await client.close()


async def test_a_viewer_connection_may_read_but_is_refused_changes():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        ack = await client.enqueue(job())
        for conn in server.connections:
            conn.principal = Principal("eve", "viewer")
        assert await client.get_job(ack.job_id) is not None
        with pytest.raises(PermissionDeniedError):
            await client.cancel_jobs([ack.job_id])
        with pytest.raises(PermissionDeniedError):
            await client.pause_queue("q")
        await client.close()


async def test_an_api_key_connection_acts_as_a_hash_of_its_key_never_the_key(caplog):
    env = {"auth__api_keys": '[{name="a", key="s3cret"}]'}
    async with in_process(in_process_config(**env)) as server:
        client = await SeppClient.connect(address_of(server), api_key="s3cret")
        ack = await client.enqueue(job())
        actor = native_principal("s3cret", True).actor
        assert actor.startswith("api-key:") and "s3cret" not in actor
        (conn,) = server.connections
        assert conn.principal == Principal(actor, "admin")
        with caplog.at_level(logging.INFO, logger="sepp.server"):
            await client.cancel_jobs([ack.job_id], reason="test")
        assert any(f"cancel_jobs by {actor}" in r.getMessage() for r in caplog.records)
        await client.close()


def test_native_connections_without_keys_act_as_local_admin():
    assert native_principal(None, False) == Principal("local", "admin")
    assert native_principal("any", False) == Principal("local", "admin")


async def test_the_sync_client_has_the_admin_methods():
    async with in_process(in_process_config()) as server:
        address = address_of(server)
        results: dict[str, object] = {}

        def run() -> None:
            with SyncSeppClient.connect(address) as client:
                ack = client.enqueue(job())
                results["info"] = client.get_job(ack.job_id)
                results["page"] = client.list_jobs("q", "ready")
                results["pause"] = client.pause_queue("q")
                results["cancel"] = client.cancel_jobs([ack.job_id])
                results["queues"] = client.list_queues()

        thread = threading.Thread(target=run)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        thread.join()
        assert results["info"] is not None
        assert len(results["page"].jobs) == 1  # type: ignore[attr-defined]
        assert results["pause"].paused  # type: ignore[attr-defined]
        assert results["cancel"].done  # type: ignore[attr-defined]
        assert results["queues"][0].paused  # type: ignore[index]


async def test_a_page_of_large_jobs_is_cut_to_fit_one_frame_and_paging_still_lists_them_all():
    small = {"limits__max_message_bytes": "32768", "limits__max_payload_bytes": "8192"}
    async with in_process(in_process_config(**small)) as server:
        client = await SeppClient.connect(address_of(server))
        big = Payload(b"x" * 8000, "application/octet-stream")
        ids = [(await client.enqueue(job(payload=big))).job_id for _ in range(10)]
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            page = await client.list_jobs("q", "ready", cursor=cursor, limit=100)
            pages += 1
            assert 1 <= len(page.jobs) <= 3  # 4 jobs of 8 kB pass a 32 KiB frame
            seen.extend(j.job_id for j in page.jobs)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == ids and pages >= 4
        await client.close()
