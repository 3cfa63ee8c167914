"""A job's life through the wire protocol, against a real `sepp serve` process:
enqueue (single, batch, atomic), priorities and FIFO, scheduling, dedup, ack, nack,
extend, fencing, lease expiry, dead letters and the read-only operations."""

from __future__ import annotations

import re
from typing import Any

from tests.server.conftest import (
    LEASE_MS,
    RawClient,
    connect,
    job,
    payload,
    reserved_at,
    wait_server_tick,
    wait_until,
)

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
DEAD_LETTERS_KEPT = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "600000"}


# -- handshake and read-only operations --------------------------------------------------


async def test_health_answers_before_hello(sepp_server):
    client = await RawClient.connect(sepp_server.address)
    assert await client.ok("health") == {"status": "serving"}
    # The connection is still usable for the handshake afterwards.
    hello = await client.hello()
    assert hello["protocol"] == 1


async def test_hello_reports_the_protocol_and_the_frame_limit(sepp_server):
    client = await RawClient.connect(sepp_server.address)
    hello = await client.hello()
    assert hello["protocol"] == 1
    assert isinstance(hello["server_version"], str) and hello["server_version"]
    assert isinstance(hello["server_time_ms"], int) and hello["server_time_ms"] > 0
    assert hello["max_message_bytes"] == 16 * 1024 * 1024
    assert hello["auth_required"] is False


async def test_hello_with_an_unsupported_protocol_lists_the_supported_ones_and_closes(
    sepp_server,
):
    client = await RawClient.connect(sepp_server.address)
    response = await client.call("hello", {"protocol": 99})
    assert response.status == "invalid_argument"
    assert response.body["supported_protocol_versions"] == [1]
    await client.wait_closed()


async def test_server_info_carries_every_documented_field(server_factory):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    info = await client.ok("server_info")
    expected = {
        "server_version": str,
        "supported_protocol_versions": list,
        "server_time_ms": int,
        "restricts_encodings": bool,
        "allowed_encodings": list,
        "max_payload_bytes": int,
        "max_message_bytes": int,
        "max_custom_entries": int,
        "max_custom_total_bytes": int,
        "max_custom_key_bytes": int,
        "max_queue_name_bytes": int,
        "max_job_type_bytes": int,
        "max_idempotency_key_bytes": int,
        "max_trace_context_bytes": int,
        "max_encoding_bytes": int,
        "max_worker_id_bytes": int,
        "max_reason_bytes": int,
        "max_stats_queues": int,
        "max_schedule_horizon_ms": int,
        "max_enqueue_batch": int,
        "max_reserve_batch": int,
        "max_reserve_queues": int,
        "max_wait_timeout_ms": int,
        "max_lease_duration_ms": int,
        "max_settle_batch": int,
        "strict_queues": bool,
        "dead_letter_retention_enabled": bool,
        "dead_letter_retention_ms": int,
        "persist_mode": str,
    }
    assert set(info) == set(expected)
    for name, kind in expected.items():
        assert type(info[name]) is kind, (name, info[name])
    assert info["supported_protocol_versions"] == ["v1"]
    assert info["restricts_encodings"] is False and info["allowed_encodings"] == []
    assert info["max_message_bytes"] == 16 * 1024 * 1024
    assert info["max_enqueue_batch"] == 256
    assert info["max_reserve_batch"] == 256
    assert info["max_reserve_queues"] == 32
    assert info["max_wait_timeout_ms"] == 300_000
    assert info["max_lease_duration_ms"] == 300_000
    assert info["strict_queues"] is False
    assert info["dead_letter_retention_enabled"] is True
    assert info["dead_letter_retention_ms"] == 600_000
    assert info["persist_mode"] == "sync_all"


async def test_queue_stats_counts_each_state_and_the_age_of_the_oldest_ready_job(
    server_factory, queue_names
):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    q = next(queue_names)
    before = await client.server_time()
    now = before
    ids = await client.enqueue_ids(job(q), job(q), job(q), job(q, scheduled_at_ms=now + 3_600_000))
    assert len(ids) == 4
    (leased,) = await client.reserve([q])
    (failed,) = await client.reserve([q])
    assert (await client.nack(failed, retry="dead_letter")).status == "ok"
    stats = await client.stats(q)
    assert stats["name"] == q
    assert stats["ready"] == 1
    assert stats["scheduled"] == 1
    assert stats["in_flight"] == 1
    assert stats["dead_lettered"] == 1
    # The remaining ready job was enqueued at or after `before`: its age is at most
    # the time that has passed since, and never negative.
    age = stats["oldest_ready_age_ms"]
    assert isinstance(age, int)
    assert 0 <= age <= stats["server_time_ms"] - before
    assert leased["id"] != failed["id"]


async def test_queue_stats_of_an_empty_queue_has_no_oldest_ready_age(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    assert delivered["id"] == job_id
    stats = await client.stats(q)
    assert stats["ready"] == 0 and stats["in_flight"] == 1
    assert stats["oldest_ready_age_ms"] is None


async def test_queue_stats_reports_unknown_queues_with_zero_counts(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    stats = await client.stats(next(queue_names))
    assert (stats["ready"], stats["scheduled"], stats["in_flight"], stats["dead_lettered"]) == (
        0,
        0,
        0,
        0,
    )
    assert stats["oldest_ready_age_ms"] is None


async def test_queue_stats_without_names_lists_every_known_queue(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    a, b = next(queue_names), next(queue_names)
    await client.enqueue_ids(job(a), job(b), job(b))
    body = await client.ok("queue_stats", {})
    by_name = {entry["name"]: entry for entry in body["queues"]}
    assert by_name[a]["ready"] == 1
    assert by_name[b]["ready"] == 2


# -- enqueue ---------------------------------------------------------------------------


async def test_an_enqueued_job_is_delivered_with_every_field_it_was_sent_with(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    before = await client.server_time()
    sent = job(
        q,
        "send_email",
        payload=payload(b'{"to": 42}', "application/json"),
        priority=7,
        max_attempts=5,
        trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        custom={"tenant": "acme", "n": 3, "ratio": 0.5, "vip": True},
    )
    result = await client.enqueue(sent)
    ((entry),) = result["results"]
    assert entry["deduplicated"] is False
    assert UUID.match(entry["job_id"])
    lease_ms = 45_000
    (delivered,) = await client.reserve([q], lease_ms=lease_ms)
    assert delivered["id"] == entry["job_id"]
    assert delivered["queue"] == q
    assert delivered["job_type"] == "send_email"
    assert delivered["payload"] == {"data": b'{"to": 42}', "encoding": "application/json"}
    assert delivered["priority"] == 7
    assert delivered["attempt"] == 1
    assert delivered["max_attempts"] == 5
    assert delivered["scheduled_at_ms"] is None
    assert delivered["trace_context"]["traceparent"] == sent["trace_context"]["traceparent"]
    assert delivered["custom"] == {"tenant": "acme", "n": 3, "ratio": 0.5, "vip": True}
    assert before <= delivered["enqueued_at_ms"] <= reserved_at(delivered, lease_ms)


async def test_a_job_without_options_gets_the_queue_defaults(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    assert delivered["payload"] is None
    assert delivered["priority"] == 0
    assert delivered["max_attempts"] == 3
    assert delivered["trace_context"] is None
    assert delivered["custom"] == {}


async def test_max_attempts_above_the_ceiling_is_clamped(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q, max_attempts=10_000))
    (delivered,) = await client.reserve([q])
    assert delivered["max_attempts"] == 100


async def test_a_best_effort_batch_answers_every_job_in_order_with_its_rejection(
    server_factory, queue_names
):
    server = server_factory(env={"SEPP_LIMITS__MAX_PAYLOAD_BYTES": "16"})
    client = await connect(server.address)
    q = next(queue_names)
    now = await client.server_time()
    jobs = [
        job(q, "first"),
        job(q, payload=payload(b"x" * 17)),
        job(q, priority=10),
        job(q, priority="high"),
        job("q" * 600),
        job(q, scheduled_at_ms=now + 10 * 2_592_000_000),
        job(q, "last"),
    ]
    results = (await client.enqueue(*jobs))["results"]
    assert len(results) == len(jobs)
    assert "job_id" in results[0] and "job_id" in results[-1]
    reasons = [r["rejection"]["reason"] for r in results[1:-1]]
    assert reasons == [
        "payload_too_large",
        "invalid_request",
        "invalid_request",
        "queue_name_too_long",
        "scheduled_too_far",
    ]
    too_large = results[1]["rejection"]
    assert (too_large["limit"], too_large["actual"]) == (16, 17)
    assert too_large["transient"] is False
    assert isinstance(too_large["message"], str) and too_large["message"]
    assert results[4]["rejection"]["limit"] == 512
    assert results[4]["rejection"]["actual"] == 600
    assert results[5]["rejection"]["actual"] == jobs[5]["scheduled_at_ms"]
    # Only the two good jobs were stored.
    stats = await client.stats(q)
    assert stats["ready"] == 2
    delivered = await client.reserve([q], max_jobs=10)
    assert {d["id"] for d in delivered} == {results[0]["job_id"], results[-1]["job_id"]}


async def test_an_atomic_batch_with_failures_stores_nothing_and_lists_every_failing_index(
    server_factory, queue_names
):
    server = server_factory(env={"SEPP_LIMITS__MAX_PAYLOAD_BYTES": "16"})
    client = await connect(server.address)
    q = next(queue_names)
    body = await client.enqueue(
        job(q),
        job(q, payload=payload(b"x" * 100)),
        job(q),
        job(q, job_type=""),
        job(q, priority=-1),
        atomic=True,
    )
    assert "results" not in body
    failures = body["failures"]
    assert [f["index"] for f in failures] == [1, 3, 4]
    assert [f["rejection"]["reason"] for f in failures] == [
        "payload_too_large",
        "invalid_request",
        "invalid_request",
    ]
    stats = await client.stats(q)
    assert stats["ready"] == 0
    assert await client.reserve([q]) == []


async def test_an_atomic_batch_without_failures_stores_every_job(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    body = await client.enqueue(job(q), job(q), job(q), atomic=True)
    ids = [r["job_id"] for r in body["results"]]
    assert len(set(ids)) == 3
    delivered = await client.reserve([q], max_jobs=10)
    assert {d["id"] for d in delivered} == set(ids)


async def test_an_empty_or_oversized_batch_is_invalid_argument(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    empty = await client.call("enqueue", {"jobs": []})
    assert empty.status == "invalid_argument"
    oversized = await client.call("enqueue", {"jobs": [job(q)] * 257})
    assert oversized.status == "invalid_argument"
    assert (await client.stats(q))["ready"] == 0


# -- order -----------------------------------------------------------------------------


async def test_higher_priority_jobs_are_delivered_first(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    low, high, middle = await client.enqueue_ids(
        job(q, priority=1), job(q, priority=9), job(q, priority=5)
    )
    order = [(await client.reserve([q]))[0]["id"] for _ in range(3)]
    assert order == [high, middle, low]


async def test_jobs_of_one_priority_come_out_in_enqueue_order(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    ids = []
    for i in range(5):
        (job_id,) = await client.enqueue_ids(job(q, f"step{i}"))
        ids.append(job_id)
        # Ties within one millisecond are broken by id; step the server clock so
        # each job has an enqueue time of its own.
        await wait_server_tick(client, await client.server_time())
    delivered = await client.reserve([q], max_jobs=10)
    assert [d["id"] for d in delivered] == ids
    assert [d["job_type"] for d in delivered] == [f"step{i}" for i in range(5)]


async def test_a_reserve_batch_is_ordered_by_priority_then_enqueue_time_then_arrival(
    sepp_server, queue_names, rng
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    arrival: dict[str, int] = {}
    for _ in range(4):
        batch = [job(q, priority=rng.randrange(10)) for _ in range(rng.randrange(1, 20))]
        for job_id in await client.enqueue_ids(*batch):
            arrival[job_id] = len(arrival)
        await wait_server_tick(client, await client.server_time())
    delivered = await client.reserve([q], max_jobs=256)
    keys = [(-d["priority"], d["enqueued_at_ms"], arrival[d["id"]]) for d in delivered]
    assert keys == sorted(keys)
    assert (await client.stats(q))["ready"] == 0


async def test_reserve_tries_queues_in_the_order_given(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    a, b = next(queue_names), next(queue_names)
    (in_a,) = await client.enqueue_ids(job(a, priority=0))
    (in_b,) = await client.enqueue_ids(job(b, priority=9))
    delivered = await client.reserve([a, b], max_jobs=2)
    assert [d["id"] for d in delivered] == [in_a, in_b]


async def test_max_jobs_above_the_batch_limit_is_clamped(server_factory, queue_names):
    server = server_factory(env={"SEPP_LIMITS__MAX_RESERVE_BATCH": "3"})
    client = await connect(server.address)
    q = next(queue_names)
    await client.enqueue_ids(*[job(q) for _ in range(5)])
    assert len(await client.reserve([q], max_jobs=100)) == 3


# -- scheduling ---------------------------------------------------------------------------


async def test_a_scheduled_job_is_not_delivered_before_its_time_and_is_after(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    now = await client.server_time()
    at = now + 700
    (job_id,) = await client.enqueue_ids(job(q, scheduled_at_ms=at))
    stats = await client.stats(q)
    if stats["server_time_ms"] < at:
        assert (stats["scheduled"], stats["ready"]) == (1, 0)
    lease_ms = 30_000
    polls = []

    async def poll() -> list[dict[str, Any]]:
        jobs = await client.reserve([q], lease_ms=lease_ms)
        polls.append(jobs)
        return jobs

    (delivered,) = await wait_until(poll, what="the scheduled job")
    assert delivered["id"] == job_id
    assert delivered["scheduled_at_ms"] == at
    # The lease was taken no earlier than the scheduled time.
    assert reserved_at(delivered, lease_ms) >= at
    assert all(p == [] for p in polls[:-1])


async def test_a_job_scheduled_in_the_past_is_ready_at_once_and_not_scheduled(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    now = await client.server_time()
    (job_id,) = await client.enqueue_ids(job(q, scheduled_at_ms=now - 60_000))
    (delivered,) = await client.reserve([q])
    assert delivered["id"] == job_id
    assert delivered["scheduled_at_ms"] is None  # PROTOCOL.md 5.1: past = not scheduled


# -- dedup --------------------------------------------------------------------------------


async def test_the_same_idempotency_key_returns_the_original_id_marked_deduplicated(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q, other = next(queue_names), next(queue_names)
    first = (await client.enqueue(job(q, idempotency_key="order-17")))["results"][0]
    assert first["deduplicated"] is False
    again = (await client.enqueue(job(q, "different", idempotency_key="order-17")))["results"][0]
    assert again == {"job_id": first["job_id"], "deduplicated": True}
    # Keys are scoped to their queue.
    elsewhere = (await client.enqueue(job(other, idempotency_key="order-17")))["results"][0]
    assert elsewhere["deduplicated"] is False
    assert elsewhere["job_id"] != first["job_id"]
    assert (await client.stats(q))["ready"] == 1


async def test_a_key_repeated_inside_one_batch_dedups_to_its_first_occurrence(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    results = (
        await client.enqueue(
            job(q, idempotency_key="k"), job(q, idempotency_key="k"), job(q, idempotency_key="j")
        )
    )["results"]
    assert results[0]["deduplicated"] is False
    assert results[1] == {"job_id": results[0]["job_id"], "deduplicated": True}
    assert results[2]["deduplicated"] is False
    assert (await client.stats(q))["ready"] == 2


async def test_dedup_answers_with_the_original_id_even_after_the_job_was_acked(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q, idempotency_key="once"))
    (delivered,) = await client.reserve([q])
    assert (await client.ack(delivered)).status == "ok"
    again = (await client.enqueue(job(q, idempotency_key="once")))["results"][0]
    assert again == {"job_id": job_id, "deduplicated": True}
    assert await client.reserve([q]) == []


# -- ack, nack, extend, fencing -------------------------------------------------------------


async def test_ack_deletes_the_job_and_a_second_ack_is_not_found(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    first = await client.ack(delivered)
    assert first.status == "ok"
    assert first.body == {"job_id": delivered["id"]}
    second = await client.ack(delivered)
    assert second.status == "not_found"
    assert isinstance(second.body["message"], str)
    stats = await client.stats(q)
    assert (stats["ready"], stats["in_flight"]) == (0, 0)


async def test_a_job_id_is_accepted_in_upper_case(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    response = await client.call(
        "ack", {"job_id": delivered["id"].upper(), "attempt": delivered["attempt"]}
    )
    assert response.status == "ok"
    assert response.body["job_id"] == delivered["id"]


async def test_fencing_errors_for_an_unknown_job_and_a_reassigned_lease(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (first,) = await client.reserve([q])
    assert (await client.nack(first, retry="delay", delay_ms=0)).body["dead_lettered"] is False
    (second,) = await client.reserve([q])
    assert second["id"] == first["id"]
    assert second["attempt"] == 2
    # The first attempt's holder no longer owns the job, whatever it tries.
    stale = [
        await client.ack(first),
        await client.nack(first),
        await client.call("extend", {"job_id": first["id"], "attempt": 1, "lease_ms": 1000}),
    ]
    for response in stale:
        assert response.status == "failed_precondition", response
        assert response.body["reason"] == "attempt_mismatch"
        assert response.body["current_attempt"] == 2
    unknown = "00000000-0000-4000-8000-000000000000"
    for op, body in [
        ("ack", {"job_id": unknown, "attempt": 1}),
        ("nack", {"job_id": unknown, "attempt": 1}),
        ("extend", {"job_id": unknown, "attempt": 1, "lease_ms": 1000}),
    ]:
        response = await client.call(op, body)
        assert response.status == "not_found", (op, response)
    # The current holder is unaffected.
    assert (await client.ack(second)).status == "ok"


async def test_a_job_id_that_is_not_a_uuid_or_an_attempt_below_one_is_invalid_argument(
    sepp_server,
):
    client = await connect(sepp_server.address)
    for body in [{"job_id": "nope", "attempt": 1}, {"job_id": "0" * 36, "attempt": 1}]:
        assert (await client.call("ack", body)).status == "invalid_argument"
    zero = {"job_id": "00000000-0000-4000-8000-000000000000", "attempt": 0}
    assert (await client.call("ack", zero)).status == "invalid_argument"


async def test_a_default_nack_returns_the_job_with_its_attempt_raised(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (first,) = await client.reserve([q])
    response = await client.nack(first, reason="flaky upstream")
    assert response.status == "ok"
    assert response.body == {"job_id": first["id"], "dead_lettered": False}
    # The default retry delay is 0: the job is ready again at once.
    (again,) = await client.reserve([q])
    assert again["id"] == first["id"]
    assert again["attempt"] == 2


async def test_a_nack_with_a_delay_holds_the_job_back_for_that_long(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (first,) = await client.reserve([q])
    before = await client.server_time()
    delay_ms = 400
    assert (await client.nack(first, retry="delay", delay_ms=delay_ms)).status == "ok"
    stats = await client.stats(q)
    if stats["server_time_ms"] < before + delay_ms:
        assert (stats["scheduled"], stats["ready"], stats["in_flight"]) == (1, 0, 0)
    lease_ms = 30_000
    (again,) = await client.reserve([q], lease_ms=lease_ms, wait_ms=10_000)
    assert again["id"] == first["id"]
    assert again["attempt"] == 2
    assert reserved_at(again, lease_ms) >= before + delay_ms


async def test_a_nack_with_retry_delay_needs_delay_ms(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (first,) = await client.reserve([q])
    assert (await client.nack(first, retry="delay")).status == "invalid_argument"
    assert (await client.nack(first, retry="delay", delay_ms=-1)).status == "invalid_argument"
    assert (await client.nack(first, retry="later")).status == "invalid_argument"
    # None of these touched the lease.
    assert (await client.ack(first)).status == "ok"


async def test_extend_moves_the_lease_deadline_to_now_plus_the_lease_clamped(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q], lease_ms=5_000)
    before = await client.server_time()
    extended = await client.ok(
        "extend", {"job_id": delivered["id"], "attempt": 1, "lease_ms": 120_000}
    )
    assert extended["job_id"] == delivered["id"]
    after = await client.server_time()
    assert before + 120_000 <= extended["lease_expires_at_ms"] <= after + 120_000
    clamped = await client.ok(
        "extend", {"job_id": delivered["id"], "attempt": 1, "lease_ms": 10**12}
    )
    later = await client.server_time()
    assert clamped["lease_expires_at_ms"] <= later + 300_000
    assert clamped["lease_expires_at_ms"] >= after + 300_000
    bad = await client.call("extend", {"job_id": delivered["id"], "attempt": 1, "lease_ms": 0})
    assert bad.status == "invalid_argument"


async def test_a_reserve_lease_is_clamped_to_the_queue_maximum(server_factory, queue_names):
    server = server_factory(env={"SEPP_LIMITS__MAX_LEASE_DURATION_MS": "10000"})
    client = await connect(server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    before = await client.server_time()
    (delivered,) = await client.reserve([q], lease_ms=10**9)
    after = await client.server_time()
    assert before + 10_000 <= delivered["lease_expires_at_ms"] <= after + 10_000


async def test_an_expired_lease_is_redelivered_with_the_attempt_raised(sepp_server, queue_names):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q))
    (first,) = await client.reserve([q], lease_ms=300)
    (second,) = await client.reserve([q], lease_ms=LEASE_MS, wait_ms=10_000)
    assert second["id"] == job_id
    assert second["attempt"] == 2
    assert reserved_at(second, LEASE_MS) >= first["lease_expires_at_ms"]
    stale = await client.ack(first)
    assert stale.status == "failed_precondition"
    assert stale.body["current_attempt"] == 2
    assert (await client.ack(second)).status == "ok"


# -- dead letters -----------------------------------------------------------------------------


async def test_nack_dead_letter_ends_the_job_and_drain_returns_it_with_cause_rejected(
    server_factory, queue_names
):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q, payload=payload(b"p")))
    (delivered,) = await client.reserve([q])
    response = await client.nack(delivered, retry="dead_letter", reason="poison")
    assert response.body == {"job_id": job_id, "dead_lettered": True}
    assert await client.reserve([q]) == []
    assert (await client.stats(q))["dead_lettered"] == 1
    records = (await client.ok("drain_dead_letters", {"queue": q, "max": 10}))["records"]
    (record,) = records
    assert record["cause"] == "rejected"
    assert record["final_attempt"] == 1
    assert record["last_reason"] == "poison"
    assert isinstance(record["failed_at_ms"], int)
    assert record["job"]["id"] == job_id
    assert record["job"]["payload"] == payload(b"p")
    # Drain is destructive.
    assert (await client.ok("drain_dead_letters", {"queue": q, "max": 10}))["records"] == []
    assert (await client.stats(q))["dead_lettered"] == 0


async def test_failing_the_final_attempt_dead_letters_the_job(server_factory, queue_names):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q, max_attempts=2))
    (first,) = await client.reserve([q])
    assert (await client.nack(first, reason="one")).body["dead_lettered"] is False
    (second,) = await client.reserve([q])
    assert second["attempt"] == 2
    assert (await client.nack(second, reason="two")).body["dead_lettered"] is True
    assert await client.reserve([q]) == []
    (record,) = (await client.ok("drain_dead_letters", {"queue": q, "max": 5}))["records"]
    assert record["cause"] == "attempts_exhausted"
    assert record["final_attempt"] == 2
    assert record["last_reason"] == "two"


async def test_a_lease_expiring_on_the_final_attempt_dead_letters_the_job(
    server_factory, queue_names
):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q, max_attempts=1))
    (delivered,) = await client.reserve([q], lease_ms=200)

    async def dead() -> bool:
        return (await client.stats(q))["dead_lettered"] == 1

    await wait_until(dead, what="the expired job to be dead-lettered")
    assert (await client.ack(delivered)).status == "not_found"
    (record,) = (await client.ok("drain_dead_letters", {"queue": q}))["records"]
    assert record["job"]["id"] == job_id
    assert record["cause"] == "lease_expired"
    assert record["final_attempt"] == 1
    assert record["failed_at_ms"] >= delivered["lease_expires_at_ms"]


async def test_drain_returns_dead_letters_oldest_first_with_their_cause_names(
    server_factory, queue_names
):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    q, other = next(queue_names), next(queue_names)
    rejected_id, exhausted_id = await client.enqueue_ids(job(q), job(q, max_attempts=1))
    (other_id,) = await client.enqueue_ids(job(other))
    by_id = {d["id"]: d for d in await client.reserve([q], max_jobs=2)}
    (in_other,) = await client.reserve([other])
    assert (await client.nack(by_id[rejected_id], retry="dead_letter")).status == "ok"
    assert (await client.nack(in_other, retry="dead_letter")).status == "ok"
    assert (await client.nack(by_id[exhausted_id])).body["dead_lettered"] is True
    # Across every queue, oldest first, `max` at a time.
    first = (await client.ok("drain_dead_letters", {"max": 2}))["records"]
    assert [r["job"]["id"] for r in first] == [rejected_id, other_id]
    assert [r["cause"] for r in first] == ["rejected", "rejected"]
    rest = (await client.ok("drain_dead_letters", {"max": 10}))["records"]
    assert [r["job"]["id"] for r in rest] == [exhausted_id]
    assert rest[0]["cause"] == "attempts_exhausted"
    stamps = [r["failed_at_ms"] for r in first + rest]
    assert stamps == sorted(stamps)


async def test_drain_takes_one_record_by_default_and_filters_by_queue(server_factory, queue_names):
    server = server_factory(env=DEAD_LETTERS_KEPT)
    client = await connect(server.address)
    q, other = next(queue_names), next(queue_names)
    await client.enqueue_ids(job(q), job(q), job(other))
    for delivered in await client.reserve([q, other], max_jobs=3):
        assert (await client.nack(delivered, retry="dead_letter")).status == "ok"
    assert len((await client.ok("drain_dead_letters", {"queue": q}))["records"]) == 1
    assert len((await client.ok("drain_dead_letters", {"queue": q, "max": 9}))["records"]) == 1
    (last,) = (await client.ok("drain_dead_letters", {"max": 9}))["records"]
    assert last["job"]["queue"] == other


async def test_without_retention_dead_letters_are_dropped_and_drain_is_empty(
    sepp_server, queue_names
):
    client = await connect(sepp_server.address)
    q = next(queue_names)
    await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    assert (await client.nack(delivered, retry="dead_letter")).body["dead_lettered"] is True
    info = await client.ok("server_info")
    assert info["dead_letter_retention_enabled"] is False
    assert (await client.ok("drain_dead_letters", {"max": 10}))["records"] == []
    stats = await client.stats(q)
    assert (stats["ready"], stats["in_flight"], stats["dead_lettered"]) == (0, 0, 0)


# -- configuration seen through the protocol -------------------------------------------------

STRICT_CONFIG = """
[server]
strict_queues = true

[[queues]]
name = "short"
max_lease_duration_ms = 5000
default_priority = 4

[[queues]]
name = "long"
"""


async def test_strict_mode_rejects_undeclared_queues_on_enqueue_and_reserve(
    server_factory, tmp_path
):
    config = tmp_path / "strict.toml"
    config.write_text(STRICT_CONFIG)
    server = server_factory(args=["--config", str(config)])
    client = await connect(server.address)
    assert (await client.ok("server_info"))["strict_queues"] is True
    results = (await client.enqueue(job("long"), job("nowhere")))["results"]
    assert "job_id" in results[0]
    rejection = results[1]["rejection"]
    assert (rejection["reason"], rejection["queue"]) == ("unknown_queue", "nowhere")
    response = await client.call(
        "reserve", client.reserve_body(["long", "nowhere", "elsewhere"], wait_ms=10_000)
    )
    assert response.status == "failed_precondition"
    assert response.body["reason"] == "unknown_queue"
    assert response.body["queues"] == ["nowhere", "elsewhere"]


async def test_a_declared_queue_applies_its_own_defaults_and_lease_clamp(server_factory, tmp_path):
    config = tmp_path / "queues.toml"
    config.write_text(STRICT_CONFIG)
    server = server_factory(args=["--config", str(config)])
    client = await connect(server.address)
    (in_long,) = await client.enqueue_ids(job("long"))
    (in_short,) = await client.enqueue_ids(job("short"))
    before = await client.server_time()
    # Listing "short" clamps the lease of the whole reserve to its 5 s maximum.
    delivered = await client.reserve(["long", "short"], lease_ms=60_000, max_jobs=2)
    after = await client.server_time()
    assert [d["id"] for d in delivered] == [in_long, in_short]
    assert [d["priority"] for d in delivered] == [0, 4]
    for d in delivered:
        assert before + 5_000 <= d["lease_expires_at_ms"] <= after + 5_000


async def test_allowed_encodings_are_enforced_and_reported(server_factory, queue_names):
    server = server_factory(env={"SEPP_LIMITS__ALLOWED_ENCODINGS": '["application/json"]'})
    client = await connect(server.address)
    q = next(queue_names)
    info = await client.ok("server_info")
    assert info["restricts_encodings"] is True
    assert info["allowed_encodings"] == ["application/json"]
    results = (
        await client.enqueue(
            job(q, payload=payload(b"{}", "application/json")),
            job(q, payload=payload(b"x", "text/plain")),
            job(q),
        )
    )["results"]
    assert "job_id" in results[0] and "job_id" in results[2]
    rejection = results[1]["rejection"]
    assert rejection["reason"] == "encoding_not_allowed"
    assert rejection["encoding"] == "text/plain"
    assert rejection["allowed"] == ["application/json"]


async def test_a_full_queue_rejects_further_jobs_as_transient(server_factory, queue_names):
    server = server_factory(env={"SEPP_LIMITS__MAX_QUEUE_DEPTH": "2"})
    client = await connect(server.address)
    q = next(queue_names)
    results = (await client.enqueue(job(q), job(q), job(q)))["results"]
    rejection = results[2]["rejection"]
    assert (rejection["reason"], rejection["queue"], rejection["limit"]) == ("queue_full", q, 2)
    assert rejection["transient"] is True
    (delivered,) = await client.reserve([q])
    assert (await client.ack(delivered)).status == "ok"
    # Room again once a job is gone.
    assert "job_id" in (await client.enqueue(job(q)))["results"][0]
