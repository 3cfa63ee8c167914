"""A raw-protocol producer's scheduled_at_ms never makes a job the client cannot
decode (issue 12, section 2; PROTOCOL.md §5.1, §5.2).

A producer in another language can send any 64-bit scheduled_at_ms. A past one
(negative even) means "ready now" and is delivered as not scheduled (nil); one
after 9999-12-31T23:59:59.999Z, which no client can represent, is refused with
`invalid_request` whatever the horizon. The Python client then decodes every
delivered job and every drained dead letter.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from sepp.client import ReserveOptions, RetryDirective, SeppClient, _convert
from tests.server.conftest import connect, job

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
TIME_MS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
DEAD_LETTERS_KEPT = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "600000"}
ENDLESS_HORIZON = {"SEPP_LIMITS__MAX_SCHEDULE_HORIZON_MS": str(2**62)}
LEASE = timedelta(seconds=60)

PAST_TIMES = [
    pytest.param(-1, id="minus one"),
    pytest.param(-86_400_000, id="a day before the epoch"),
    pytest.param(INT64_MIN, id="the smallest 64-bit integer"),
    pytest.param(0, id="the epoch"),
]


@pytest.mark.parametrize("scheduled_at_ms", PAST_TIMES)
async def test_a_past_scheduled_at_from_a_raw_producer_is_delivered_as_not_scheduled(
    sepp_server, queue_names, scheduled_at_ms
):
    raw = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await raw.enqueue_ids(job(q, scheduled_at_ms=scheduled_at_ms))
    (delivered,) = await raw.reserve([q])
    assert (delivered["id"], delivered["scheduled_at_ms"]) == (job_id, None)
    assert _convert.job_from_wire(delivered).ctx.scheduled_at is None


@pytest.mark.parametrize("scheduled_at_ms", PAST_TIMES)
async def test_the_python_client_reserves_a_job_a_raw_producer_scheduled_in_the_past(
    sepp_server, queue_names, scheduled_at_ms
):
    raw = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await raw.enqueue_ids(job(q, scheduled_at_ms=scheduled_at_ms))
    client = await SeppClient.connect(sepp_server.address)
    try:
        jobs = await client.reserve(ReserveOptions([q], LEASE))
        assert jobs is not None and [j.ctx.id for j in jobs] == [job_id]
        assert jobs[0].ctx.scheduled_at is None
        await client.ack(jobs[0].ctx)
    finally:
        await client.close()


async def test_a_drained_dead_letter_of_a_negative_scheduled_job_decodes(
    server_factory, queue_names
):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    raw = await connect(server.address)
    q = next(queue_names)
    (job_id,) = await raw.enqueue_ids(job(q, scheduled_at_ms=-5))
    client = await SeppClient.connect(server.address)
    try:
        jobs = await client.reserve(ReserveOptions([q], LEASE))
        assert jobs is not None
        assert await client.nack(jobs[0].ctx, RetryDirective.DEAD_LETTER, reason="no")
        records = await client.drain_dead_letters(q)
        assert [(r.job_id, r.scheduled_at) for r in records] == [(job_id, None)]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("env", "scheduled_at_ms"),
    [
        pytest.param({}, INT64_MAX, id="the largest 64-bit integer"),
        pytest.param(ENDLESS_HORIZON, TIME_MS_MAX + 1, id="year 10000 under an endless horizon"),
        pytest.param(ENDLESS_HORIZON, INT64_MAX, id="the largest integer under an endless horizon"),
    ],
)
async def test_a_scheduled_at_no_client_can_represent_is_an_invalid_request(
    server_factory, queue_names, env, scheduled_at_ms
):
    server = server_factory(env=env)
    raw = await connect(server.address)
    q = next(queue_names)
    (result,) = (await raw.enqueue(job(q, scheduled_at_ms=scheduled_at_ms)))["results"]
    rejection = result["rejection"]
    assert (rejection["reason"], rejection["transient"]) == ("invalid_request", False)
    assert str(scheduled_at_ms) in rejection["message"]
    assert (await raw.stats(q))["scheduled"] == 0


async def test_the_last_representable_time_is_accepted(server_factory, queue_names):
    server = server_factory(env=ENDLESS_HORIZON)
    raw = await connect(server.address)
    q = next(queue_names)
    (result,) = (await raw.enqueue(job(q, scheduled_at_ms=TIME_MS_MAX)))["results"]
    assert "job_id" in result, result
    assert (await raw.stats(q))["scheduled"] == 1
