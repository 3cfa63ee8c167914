"""Delivery order (sepp-semantics.md §8): strict priority 9..0, FIFO by original
enqueued_at within a priority, ties by arrival order (the reference: by job id); redeliveries keep their place; a
reserve tries its queues in list order.
"""

from __future__ import annotations

import random
import uuid

import pytest

from sepp.core import RETRY_DELAY, CoreConfig, NewJob, Reserve
from sepp.core.decide import job_answer_bytes
from tests.core.helpers import NOW, Harness, make_job, ordered_ids


def random_ids(rng: random.Random, count: int) -> list[str]:
    return [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(count)]


@pytest.mark.parametrize("one_by_one", [False, True], ids=["one reserve", "reserve by reserve"])
def test_every_ready_priority_9_job_is_served_before_any_lower_priority(
    rng: random.Random, one_by_one: bool
) -> None:
    h = Harness()
    ids = random_ids(rng, 40)
    # Enqueue times never decrease (the clock would clamp them); many are equal.
    times = [0]
    for _ in ids[1:]:
        times.append(times[-1] + rng.choice((0, 0, 1, 3)))
    spec = [(job_id, rng.randrange(10), t) for job_id, t in zip(ids, times)]
    for job_id, priority, t in spec:
        h.enqueue(make_job(job_id=job_id, priority=priority), now=NOW + t)
    # Highest priority first, then earliest enqueue time, then arrival order.
    expected = [
        job_id
        for _, (job_id, _, _) in sorted(enumerate(spec), key=lambda s: (-s[1][1], s[1][2], s[0]))
    ]

    if one_by_one:
        delivered = [h.reserve_one("q", now=NOW + times[-1]).job_id for _ in ids]
    else:
        delivered = [j.job_id for j in h.reserve("q", now=NOW + times[-1], max_jobs=len(ids))]

    assert delivered == expected
    assert h.reserve("q", now=NOW + times[-1]) == ()


def test_within_a_priority_jobs_are_served_by_original_enqueue_time() -> None:
    h = Harness()
    # Ids in descending order, so only the enqueue time can explain the order.
    late_id, mid_id, early_id = ordered_ids(3)
    h.enqueue(make_job(job_id=early_id), now=NOW)
    h.enqueue(make_job(job_id=mid_id), now=NOW + 1)
    h.enqueue(make_job(job_id=late_id), now=NOW + 2)
    assert [j.job_id for j in h.reserve("q", now=NOW + 3, max_jobs=3)] == [
        early_id,
        mid_id,
        late_id,
    ]


def test_jobs_enqueued_at_the_same_instant_are_served_in_arrival_order(rng: random.Random) -> None:
    # The reference breaks such ties by job id, which is random; sepp keeps the
    # order in which the jobs were stored (a deterministic arrival number), so
    # FIFO holds even within one millisecond.
    h = Harness()
    ids = random_ids(rng, 12)
    h.enqueue(*(make_job(job_id=i) for i in ids[:6]), now=NOW)
    for i in ids[6:]:
        h.enqueue(make_job(job_id=i), now=NOW)
    delivered = [j.job_id for j in h.reserve("q", now=NOW, max_jobs=12)]
    assert delivered == ids


def test_the_queue_default_priority_places_jobs_in_their_band() -> None:
    h = Harness(CoreConfig().with_queue("alerts", default_priority=7))
    [explicit_6] = h.enqueue(make_job(queue="alerts", priority=6), now=NOW)
    [default_7] = h.enqueue(make_job(queue="alerts"), now=NOW + 1)
    delivered = h.reserve("alerts", now=NOW + 2, max_jobs=2)
    assert [j.job_id for j in delivered] == [default_7, explicit_6]
    assert [j.priority for j in delivered] == [7, 6]


@pytest.mark.parametrize(
    "return_path",
    [
        pytest.param("nack", id="after a zero-delay nack"),
        pytest.param("explicit_delay", id="after a delayed nack and promotion"),
        pytest.param("lease_expiry", id="after a lease expiry"),
    ],
)
def test_a_redelivered_job_goes_back_near_the_front_of_its_band(return_path: str) -> None:
    h = Harness()
    [first] = h.enqueue(make_job(priority=5), now=NOW)
    [second] = h.enqueue(make_job(priority=5), now=NOW + 1)
    [higher] = h.enqueue(make_job(priority=6), now=NOW + 2)
    assert h.reserve_one("q", now=NOW + 3).job_id == higher
    assert h.reserve_one("q", now=NOW + 3, lease_ms=100).job_id == first
    if return_path == "nack":
        h.nack(first, 1, now=NOW + 4)
    elif return_path == "explicit_delay":
        h.nack(first, 1, now=NOW + 4, retry=RETRY_DELAY, delay_ms=50)
        h.sweep(now=NOW + 54)
    else:
        h.sweep(now=NOW + 103)
    [later] = h.enqueue(make_job(priority=5), now=NOW + 200)

    delivered = h.reserve("q", now=NOW + 200, max_jobs=3)

    assert [j.job_id for j in delivered] == [first, second, later]
    assert [j.attempt for j in delivered] == [2, 1, 1]
    assert delivered[0].enqueued_at == NOW


def test_a_reserve_drains_its_queues_in_list_order() -> None:
    h = Harness()
    a1, a2 = h.enqueue(make_job(queue="a", priority=0), make_job(queue="a", priority=1), now=NOW)
    [b1] = h.enqueue(make_job(queue="b", priority=9), now=NOW)

    # The first queue is drained up to max_jobs before the second is looked at,
    # whatever the priorities across queues.
    assert [j.job_id for j in h.reserve("a", "b", now=NOW, max_jobs=1)] == [a2]
    assert [j.job_id for j in h.reserve("a", "b", now=NOW, max_jobs=5)] == [a1, b1]


def test_a_reserve_takes_the_next_queue_only_for_what_the_first_lacks() -> None:
    h = Harness()
    h.enqueue(make_job(queue="a"), now=NOW)
    b_ids = h.enqueue(*(make_job(queue="b") for _ in range(3)), now=NOW)
    delivered = h.reserve("b", "a", now=NOW, max_jobs=2)
    assert {j.job_id for j in delivered} <= set(b_ids)
    assert [j.queue for j in delivered] == ["b", "b"]


def test_naming_a_queue_twice_does_not_deliver_a_job_twice() -> None:
    h = Harness()
    ids = h.enqueue(make_job(queue="a"), make_job(queue="a"), now=NOW)
    h.enqueue(make_job(queue="b"), now=NOW)
    delivered = h.reserve("a", "a", "b", "a", now=NOW, max_jobs=10)
    assert [j.job_id for j in delivered][:2] == ids
    assert len({j.job_id for j in delivered}) == len(delivered) == 3
    assert h.state.queues["a"].in_flight_count == 2


def test_a_queue_name_that_prefixes_another_is_a_different_queue() -> None:
    h = Harness()
    [in_a] = h.enqueue(make_job(queue="a"), now=NOW)
    [in_aa] = h.enqueue(make_job(queue="aa"), now=NOW)
    assert [j.job_id for j in h.reserve("aa", now=NOW, max_jobs=5)] == [in_aa]
    assert [j.job_id for j in h.reserve("a", now=NOW, max_jobs=5)] == [in_a]


def test_oldest_ready_enqueued_at_reports_the_oldest_ready_job_of_any_priority() -> None:
    h = Harness()
    assert h.state.oldest_ready_enqueued_at("q") is None
    [old_low] = h.enqueue(make_job(priority=1), now=NOW)
    h.enqueue(make_job(priority=8), now=NOW + 5)
    h.enqueue(make_job(scheduled_at=NOW + 100), now=NOW - 50)  # scheduled: not ready
    assert h.state.oldest_ready_enqueued_at("q") == NOW
    h.reserve("q", now=NOW + 6, max_jobs=1)  # takes the priority-8 job
    assert h.state.oldest_ready_enqueued_at("q") == NOW
    h.dead_letter(old_low, now=NOW + 7)
    assert h.state.oldest_ready_enqueued_at("q") is None
    assert h.state.oldest_ready_enqueued_at("nowhere") is None


# -- the reply-size cap of a reserve ----------------------------------------------


def _sized(size: int) -> NewJob:
    return make_job(payload_data=b"x" * size, payload_encoding="bin")


def _answer_bytes(job: NewJob) -> int:
    h = Harness()
    [job_id] = h.enqueue(job, now=NOW)
    return job_answer_bytes(h.job(job_id))


# A job of `_sized(10)` in an answer: its payload and everything else it carries.
TEN = _answer_bytes(_sized(10))


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "delivered"),
    [
        pytest.param([10, 10, 10], None, 3, id="no cap"),
        pytest.param([10, 10, 10], 2 * TEN + TEN // 2, 2, id="stops before the job that would pass the cap"),
        pytest.param([10, 10, 10], 3 * TEN, 3, id="a cap met exactly"),
        pytest.param([100, 1], 5, 1, id="one job is delivered whatever its size"),
        pytest.param([10, 1, 1], 5, 1, id="order is kept: no smaller job jumps the queue"),
        pytest.param([10, 10], 2 * TEN - 1, 1, id="a job's metadata counts against the cap, not only its payload"),
    ],
)  # fmt: skip
def test_a_reserve_stops_adding_jobs_at_its_byte_cap(
    sizes: list[int], max_bytes: int | None, delivered: int
) -> None:
    h = Harness()
    ids = h.enqueue(*(_sized(n) for n in sizes), now=NOW)
    decision = h.accept(
        Reserve(queues=("q",), lease_ms=1000, max_jobs=10, max_bytes=max_bytes), NOW
    )
    assert [j.job_id for j in decision.jobs] == ids[:delivered]  # type: ignore[union-attr]
