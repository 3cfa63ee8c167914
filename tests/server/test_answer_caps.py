"""Answers fit one frame, counting every byte they carry, and a drain deletes only
what its answer delivers; every client-supplied string has a byte limit (issue 13,
found 1 and 4).

Against a real server with a small frame limit (16 KiB), so the attacks of the
issue (40 dead letters with 15 MiB traceparents: a 629 MB answer that no client
accepts, and a store emptied by it) are reproduced at a thousandth of the size.
"""

from __future__ import annotations

import asyncio
import logging
import random
import string
from typing import Any

import msgpack
import pytest

from sepp.client._convert import job_map_of_row
from sepp.core.decide import dead_letter_answer_bytes, job_answer_bytes
from sepp.core.events import CAUSE_NAMES
from sepp.core.state import DeadLetter, Job
from sepp.server.wire import dead_letter_body, job_view_body, job_view_row
from sepp.storage.faultfs import FaultyFileSystem
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import RawClient, connect, job, payload, wait_until
from tests.server.test_long_poll import HeldSync, reset_on_close

FRAME = 16_384
SMALL_FRAMES = {
    "SEPP_LIMITS__MAX_MESSAGE_BYTES": str(FRAME),
    "SEPP_LIMITS__MAX_PAYLOAD_BYTES": str(FRAME),
    "SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "600000",
}
# Under the trace context limit (2048), but 40 of them are five frames.
TRACEPARENT = "00-" + "a" * 1_990


class SizedClient(RawClient):
    """A raw client that also records the size of every frame it receives."""

    frame_sizes: list[int]

    def _accept(self, frame: bytes) -> None:
        if not hasattr(self, "frame_sizes"):
            self.frame_sizes = []
        self.frame_sizes.append(len(frame))
        super()._accept(frame)


async def sized_connect(address: str) -> SizedClient:
    client = await SizedClient.connect(address)
    await client.hello()
    assert isinstance(client, SizedClient)
    return client


async def dead_letters(
    client: RawClient, queue: str, jobs: list[dict[str, Any]], reason: str = "r" * 100
) -> list[str]:
    """Enqueue `jobs` and dead-letter each (reserve one, nack to the dead letters)."""
    ids = await enqueue_one_by_one(client, jobs)
    for _ in ids:
        (delivered,) = await client.reserve([queue])
        response = await client.nack(delivered, retry="dead_letter", reason=reason)
        assert response.status == "ok", response
    return ids


async def enqueue_one_by_one(client: RawClient, jobs: list[dict[str, Any]]) -> list[str]:
    """One request per job: a batch of them would pass the frame limit."""
    ids: list[str] = []
    for one in jobs:
        ids.extend(await client.enqueue_ids(one))
    return ids


async def dead_count(client: RawClient, queue: str) -> int:
    count: int = (await client.stats(queue))["dead_lettered"]
    return count


async def test_drains_of_large_dead_letters_fit_the_frame_and_delete_only_what_they_carry(
    server_factory, queue_names
):
    server = server_factory(env=SMALL_FRAMES)
    q = next(queue_names)
    client = await sized_connect(server.address)
    ids = await dead_letters(
        client, q, [job(q, trace_context={"traceparent": TRACEPARENT}) for _ in range(40)]
    )
    assert await dead_count(client, q) == 40

    drained: list[str] = []
    for _ in range(40):
        before = len(client.frame_sizes)
        body = await client.ok("drain_dead_letters", {"queue": q, "max": 256})
        # The answer is within the frame limit every client enforces...
        assert max(client.frame_sizes[before:]) <= FRAME
        records = body["records"]
        if not records:
            break
        assert all(r["job"]["trace_context"]["traceparent"] == TRACEPARENT for r in records)
        drained.extend(r["job"]["id"] for r in records)
        # ... and the store lost exactly what the answer delivered.
        assert await dead_count(client, q) == 40 - len(drained)
    # Repeated drains deliver every record, once, oldest first.
    assert drained == ids
    assert await dead_count(client, q) == 0
    client.assert_clean()


async def test_a_dead_letter_too_large_for_any_answer_is_listed_and_never_deleted(
    server_factory, queue_names
):
    server = server_factory(env=SMALL_FRAMES)
    q = next(queue_names)
    client = await sized_connect(server.address)
    # A job as large as a request may be, then a long last reason: no answer
    # within the frame can carry this record.
    [big] = await dead_letters(
        client, q, [job(q, payload=payload(b"x" * (FRAME - 600)))], reason="r" * 4000
    )
    [small] = await dead_letters(client, q, [job(q)])

    for _ in range(3):  # as often as asked: it stays
        before = len(client.frame_sizes)
        body = await client.ok("drain_dead_letters", {"queue": q, "max": 10})
        assert max(client.frame_sizes[before:]) <= FRAME
        assert [entry["job_id"] for entry in body["too_large"]] == [big]
        assert body["too_large"][0]["bytes"] > FRAME
        assert [r["job"]["id"] for r in body["records"]] == ([small] if _ == 0 else [])
    assert await dead_count(client, q) == 1
    client.assert_clean()


async def test_the_largest_payload_an_enqueue_accepts_is_delivered_within_one_frame(
    server_factory, queue_names
):
    server = server_factory(env=SMALL_FRAMES)
    q = next(queue_names)
    client = await sized_connect(server.address)
    custom = {"k": "v" * 300}
    # A payload too close to the frame limit is refused, typed, naming what fits.
    (refused,) = (
        await client.enqueue(job(q, payload=payload(b"x" * (FRAME - 700)), custom=custom))
    )["results"]
    rejection = refused["rejection"]
    assert rejection["reason"] == "payload_too_large"
    largest = rejection["limit"]
    # The largest accepted job is delivered in an answer within the frame.
    (accepted,) = (await client.enqueue(job(q, payload=payload(b"x" * largest), custom=custom)))[
        "results"
    ]
    assert "job_id" in accepted, accepted
    (over,) = (await client.enqueue(job(q, payload=payload(b"x" * (largest + 1)), custom=custom)))[
        "results"
    ]
    assert over["rejection"]["reason"] == "payload_too_large"
    before = len(client.frame_sizes)
    (delivered,) = await client.reserve([q])
    assert delivered["id"] == accepted["job_id"]
    assert max(client.frame_sizes[before:]) <= FRAME
    client.assert_clean()


async def test_a_reserve_answer_counts_trace_context_and_custom_against_its_cap(
    server_factory, queue_names
):
    server = server_factory(env=SMALL_FRAMES)
    q = next(queue_names)
    client = await sized_connect(server.address)
    custom = {f"k{i}": "v" * 200 for i in range(10)}
    ids = await enqueue_one_by_one(
        client,
        [job(q, trace_context={"traceparent": TRACEPARENT}, custom=custom) for _ in range(40)],
    )
    delivered: list[str] = []
    for _ in range(40):
        before = len(client.frame_sizes)
        jobs = await client.reserve([q], max_jobs=256)
        assert max(client.frame_sizes[before:]) <= FRAME
        if not jobs:
            break
        delivered.extend(j["id"] for j in jobs)
    assert delivered == ids
    client.assert_clean()


async def test_every_client_supplied_string_is_refused_past_its_limit(sepp_server, queue_names):
    q = next(queue_names)
    client = await connect(sepp_server.address)
    info = await client.ok("server_info")
    assert info["max_trace_context_bytes"] == 2048
    assert info["max_encoding_bytes"] == 256
    assert info["max_worker_id_bytes"] == 256
    assert info["max_reason_bytes"] == 4096
    assert info["max_stats_queues"] == 1024

    (rejected,) = (await client.enqueue(job(q, trace_context={"traceparent": "t" * 2049})))[
        "results"
    ]
    assert rejected["rejection"]["reason"] == "invalid_request"
    assert "max_trace_context_bytes" in rejected["rejection"]["message"]
    (rejected,) = (await client.enqueue(job(q, payload=payload(b"x", "e" * 257))))["results"]
    assert rejected["rejection"]["reason"] == "invalid_request"

    body = client.reserve_body([q], worker_id="w" * 257)
    response = await client.call("reserve", body)
    assert response.status == "invalid_argument", response
    assert "max_worker_id_bytes" in response.body["message"]

    await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    response = await client.nack(delivered, reason="r" * 4097)
    assert response.status == "invalid_argument", response
    assert "max_reason_bytes" in response.body["message"]
    assert (await client.stats(q))["in_flight"] == 1  # refused: nothing changed
    assert (await client.nack(delivered, reason="r" * 4096)).status == "ok"

    response = await client.call("queue_stats", {"queues": [f"n{i}" for i in range(1025)]})
    assert response.status == "invalid_argument", response
    assert "max_stats_queues" in response.body["message"]
    client.assert_clean()


async def test_queue_stats_answers_a_repeated_name_once(sepp_server, queue_names):
    q = next(queue_names)
    client = await connect(sepp_server.address)
    await client.enqueue_ids(job(q))
    body = await client.ok("queue_stats", {"queues": [q] * 100_000 + ["other", q]})
    assert [entry["name"] for entry in body["queues"]] == [q, "other"]
    assert body["queues"][0]["ready"] == 1


def _random_text(rng: random.Random, most: int) -> str:
    alphabet = string.ascii_letters + "éß€😀"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, most)))


def test_the_core_bound_on_a_job_or_record_in_an_answer_is_never_below_its_encoding(rng):
    # The caps above rest on decide.job_answer_bytes being an upper bound of the
    # msgpack the server really sends, for every shape of job.
    for _ in range(500):
        custom: dict[str, Any] | None = None
        if rng.random() < 0.7:
            custom = {}
            for _ in range(rng.randrange(0, 20)):
                value: Any = rng.choice(
                    [
                        rng.randrange(-(2**63), 2**63),
                        rng.random(),
                        rng.random() < 0.5,
                        _random_text(rng, 300),
                    ]
                )
                custom[_random_text(rng, 40)] = value
        data = rng.randbytes(rng.choice([1, 31, 255, 256, 65_535, 65_536, 70_000]))
        with_payload = rng.random() < 0.7
        with_trace = rng.random() < 0.7
        big = 2**63 - 1
        job_state = Job(
            job_id="0b6f1c5e-3f7a-4d2b-9b1e-8f0c2a9d4e11",
            queue=_random_text(rng, 600),
            job_type=_random_text(rng, 300),
            payload_data=data if with_payload else None,
            payload_encoding=_random_text(rng, 300) if with_payload else None,
            priority=rng.randrange(10),
            max_attempts=rng.choice([1, big]),
            enqueued_at=rng.choice([0, big]),
            scheduled_at=rng.choice([None, big]),
            idempotency_key=None,
            traceparent=_random_text(rng, 2000) if with_trace else None,
            tracestate=rng.choice([None, _random_text(rng, 600)]) if with_trace else None,
            custom=custom,
            order=0,
            attempt=rng.choice([1, big]),
            status=0,
            due_ms=0,
            worker_id=None,
            last_reason=None,
        )
        view = job_state.view(rng.choice([0, big]))
        encoded = len(msgpack.packb(job_view_body(view), use_bin_type=True))
        assert encoded <= job_answer_bytes(job_state), (encoded, job_state.view(0))
        # The array layout (PROTOCOL.md 5.2) carries the same job in fewer bytes,
        # and stands for exactly the map the map layout sends.
        row = job_view_row(view)
        assert len(msgpack.packb(row, use_bin_type=True)) < encoded
        assert job_map_of_row(row) == job_view_body(view)
        record = DeadLetter(
            job_state,
            rng.choice(list(CAUSE_NAMES)),
            big,
            big,
            rng.choice([None, _random_text(rng, 4096)]),
        )
        encoded = len(msgpack.packb(dead_letter_body(record.view()), use_bin_type=True))
        assert encoded <= dead_letter_answer_bytes(record), encoded


@pytest.mark.usefixtures("in_process_env")
async def test_a_drain_answer_that_cannot_be_written_leaves_its_records_in_the_log(
    queue_names, caplog
):
    # The drain's records are deleted by the record its answer waits for; if the
    # connection is gone when the answer falls due, nothing brings them back, so
    # the server logs them in full (PROTOCOL.md 5.6) rather than lose them silently.
    fs = FaultyFileSystem()
    held = HeldSync()
    fs.hook = held
    config = in_process_config(
        storage__persist_mode="sync_data", storage__dead_letter_retention_ms="600000"
    )
    async with in_process(config, fs) as server:
        try:
            gone = await connect(address_of(server))
            q = next(queue_names)
            [job_id] = await dead_letters(
                gone, q, [job(q, payload=payload(b"the only copy"))], reason="why"
            )
            held.armed = True
            gone.send("drain_dead_letters", {"queue": q, "max": 10})
            await asyncio.to_thread(held.entered.wait, 30)
            assert held.entered.is_set()
            await wait_until(lambda: not server.engine.state.dead, what="the drain to be decided")
            reset_on_close(gone)
            await gone.close()
            await wait_until(lambda: not server.connections, what="the server to see the reset")
        finally:
            held.release.set()

        def logged() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if r.levelno == logging.ERROR and "drain answer" in r.getMessage()
            ]

        [record] = await wait_until(logged, what="the undelivered drain to be logged")
        assert job_id in record.getMessage()
        assert "the only copy" in record.getMessage()
