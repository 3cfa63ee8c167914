"""What a restart keeps: every acknowledged write, after a graceful stop (SIGTERM)
and after a crash (SIGKILL); leases, attempts, dedup keys and dead letters too."""

from __future__ import annotations

import asyncio
import os

import pytest

from sepp.protocol import messages as pm
from sepp.protocol.framing import encode_frame
from sepp.storage.recovery import SNAPSHOT_DIR, SNAPSHOT_TMP_SUFFIX
from tests.server.conftest import (
    LEASE_MS,
    RawClient,
    connect,
    job,
    payload,
    reserved_at,
)

DEAD_LETTERS_KEPT = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "600000"}


def restart(server_factory, server, how: str, env=None):
    if how == "sigterm":
        assert server.stop() == 0
    else:
        server.kill()
    return server_factory(data_dir=server.data_dir, env=env)


async def enqueue_some(client: RawClient, q: str, rng, count: int) -> dict[str, bytes]:
    """Enqueue `count` jobs in batches of random size; {id: payload data}."""
    sent: dict[str, bytes] = {}
    while len(sent) < count:
        size = min(rng.randrange(1, 8), count - len(sent))
        datas = [rng.randbytes(rng.randrange(1, 200)) for _ in range(size)]
        ids = await client.enqueue_ids(*[job(q, payload=payload(d)) for d in datas])
        sent.update(zip(ids, datas))
    return sent


async def drain_all(client: RawClient, q: str) -> dict[str, dict]:
    delivered: dict[str, dict] = {}
    while batch := await client.reserve([q], max_jobs=256):
        for d in batch:
            assert d["id"] not in delivered
            delivered[d["id"]] = d
    return delivered


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_acknowledged_enqueues_survive_a_restart(server_factory, queue_names, rng, how):
    server = server_factory()
    q = next(queue_names)
    client = await connect(server.address)
    sent = await enqueue_some(client, q, rng, 40)
    await client.close()
    server = restart(server_factory, server, how)
    client = await connect(server.address)
    delivered = await drain_all(client, q)
    assert {i: d["payload"]["data"] for i, d in delivered.items()} == sent
    assert all(d["attempt"] == 1 for d in delivered.values())


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_acked_jobs_stay_gone_after_a_restart(server_factory, queue_names, how):
    server = server_factory()
    q = next(queue_names)
    client = await connect(server.address)
    kept, gone = await client.enqueue_ids(job(q, priority=0), job(q, priority=9))
    (first,) = await client.reserve([q])
    assert first["id"] == gone
    assert (await client.ack(first)).status == "ok"
    await client.close()
    server = restart(server_factory, server, how)
    client = await connect(server.address)
    assert list(await drain_all(client, q)) == [kept]


async def test_after_a_crash_a_leased_job_stays_leased_until_its_lease_expires(
    server_factory, queue_names
):
    server = server_factory()
    q = next(queue_names)
    client = await connect(server.address)
    (job_id,) = await client.enqueue_ids(job(q))
    (leased,) = await client.reserve([q], lease_ms=2_500)
    await client.close()
    server = restart(server_factory, server, "sigkill")
    client = await connect(server.address)
    stats = await client.stats(q)
    if stats["server_time_ms"] < leased["lease_expires_at_ms"]:
        assert (stats["in_flight"], stats["ready"]) == (1, 0)
    # A long poll gets the job only once the old lease has run out, as attempt 2.
    (again,) = await client.reserve([q], lease_ms=LEASE_MS, wait_ms=20_000)
    assert again["id"] == job_id
    assert again["attempt"] == 2
    assert reserved_at(again, LEASE_MS) >= leased["lease_expires_at_ms"]
    # The pre-crash holder is fenced off.
    stale = await client.ack(leased)
    assert stale.status == "failed_precondition"
    assert stale.body["current_attempt"] == 2


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_dedup_keys_survive_a_restart(server_factory, queue_names, how):
    server = server_factory()
    q = next(queue_names)
    client = await connect(server.address)
    first = (await client.enqueue(job(q, idempotency_key="invoice-9")))["results"][0]
    await client.close()
    server = restart(server_factory, server, how)
    client = await connect(server.address)
    again = (await client.enqueue(job(q, idempotency_key="invoice-9")))["results"][0]
    assert again == {"job_id": first["job_id"], "deduplicated": True}
    assert (await client.stats(q))["ready"] == 1


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_attempts_scheduled_jobs_and_dead_letters_survive_a_restart(
    server_factory, queue_names, how
):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    q = next(queue_names)
    client = await connect(server.address)
    retried, dead = await client.enqueue_ids(job(q, priority=9), job(q, priority=0))
    at = await client.server_time() + 3_600_000
    (scheduled,) = await client.enqueue_ids(job(q, scheduled_at_ms=at))
    (first,) = await client.reserve([q])
    assert first["id"] == retried
    assert (await client.nack(first)).status == "ok"
    (second,) = await client.reserve([q])
    assert (second["id"], second["attempt"]) == (retried, 2)
    (victim,) = await client.reserve([q])
    assert victim["id"] == dead
    assert (await client.nack(victim, retry="dead_letter", reason="bad")).status == "ok"
    await client.close()
    server = restart(server_factory, server, how, env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    stats = await client.stats(q)
    assert (stats["ready"], stats["scheduled"], stats["in_flight"], stats["dead_lettered"]) == (
        0,
        1,
        1,
        1,
    )
    assert (await client.ack(second)).status == "ok"
    (record,) = (await client.ok("drain_dead_letters", {"queue": q}))["records"]
    assert (record["job"]["id"], record["cause"], record["last_reason"]) == (
        dead,
        "rejected",
        "bad",
    )
    assert scheduled not in (second["id"], record["job"]["id"])


async def test_a_graceful_stop_leaves_a_snapshot_in_the_data_directory(server_factory, queue_names):
    server = server_factory()
    q = next(queue_names)
    client = await connect(server.address)
    ids = await client.enqueue_ids(job(q), job(q))
    await client.close()
    assert server.stop() == 0
    snapshots = os.listdir(server.data_dir / SNAPSHOT_DIR)
    assert snapshots, "no snapshot after a graceful stop"
    assert not [name for name in snapshots if name.endswith(SNAPSHOT_TMP_SUFFIX)]
    # ... and the restart starts from it.
    server = server_factory(data_dir=server.data_dir)
    client = await connect(server.address)
    assert sorted(await drain_all(client, q)) == sorted(ids)
    assert "snapshot seq 0 " not in server.log().rsplit("recovered", 1)[-1]


async def test_a_graceful_stop_answers_every_command_it_applied(server_factory, queue_names):
    # Neither back-pressure limit may answer first: a slow disk would otherwise
    # fill the commit backlog and refuse with `overloaded` before the stop.
    server = server_factory(
        env={
            "SEPP_SERVER__MAX_IN_FLIGHT_PER_CONNECTION": "100000",
            "SEPP_STORAGE__COMMAND_QUEUE_CAPACITY": "100000",
        }
    )
    q = next(queue_names)
    client = await connect(server.address)
    sent = [client.next_id() for _ in range(20_000)]
    client.send_raw(
        b"".join(encode_frame(pm.encode_request(i, "enqueue", {"jobs": [job(q)]})) for i in sent)
    )
    await client.wait(lambda: sent[0] in client.responses)
    stopping = asyncio.create_task(asyncio.to_thread(server.stop))
    await client.wait_closed()
    assert await stopping == 0
    acknowledged = set()
    for request_id in sent:
        response = client.responses.get(request_id)
        if response is None:
            continue  # never read: the connection closed first
        if response.status == "ok":
            acknowledged.add(response.body["results"][0]["job_id"])
        else:
            assert (response.status, response.body["reason"]) == ("unavailable", "shutting_down")
    client.assert_clean()
    server = server_factory(data_dir=server.data_dir)
    checker = await connect(server.address)
    # Exactly the acknowledged jobs: nothing applied went unanswered.
    assert set(await drain_all(checker, q)) == acknowledged
