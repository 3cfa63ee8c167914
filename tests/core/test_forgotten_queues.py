"""The state forgets what nothing refers to any more (issue 13, found 4): an
undeclared queue that holds nothing (no ready, scheduled or in-flight job, no dead
letter, no idempotency key in its window) is dropped by the event that emptied it,
so the live path, a replay and a snapshot keep the same queues; the string intern
table is bounded, so distinct job types churned through the state are freed.

100k distinct queue names once took the server from 31 to 973 MiB, and it stayed
there after every job was acked."""

from __future__ import annotations

import sys

import msgpack

from sepp.core import (
    RETRY_DEAD_LETTER,
    Ack,
    CoreConfig,
    Decision,
    Enqueue,
    QueuePolicy,
    Reserve,
    State,
    Sweep,
    apply_record,
    check_invariants,
    decide,
)
from sepp.core.events import Event
from sepp.core.results import EnqueueResult, ReserveResult
from sepp.core.snapshot import StateBuilder, export_dead, export_dedup, export_jobs, export_meta
from sepp.core.state import COMPACT_SLACK_BYTES, STRINGS_INTERNED_MAX
from tests.core.helpers import NOW, Harness, make_job, ordered_ids

Records = list[tuple[int, tuple[Event, ...]]]


def _run(state: State, records: Records, command: object, now: int) -> object:
    """The live path without the harness's per-command invariant check (O(state)
    after each of 30,000 commands would take minutes)."""
    result = decide(state, command, now)  # type: ignore[arg-type]
    assert isinstance(result, Decision), result
    apply_record(state, result.time_ms, result.events)
    records.append((result.time_ms, result.events))
    return result.reply


def _churn(state: State, records: Records, queues: list[str], job_types: list[str]) -> None:
    """One job through each queue: enqueued, reserved, acked."""
    ids = ordered_ids(len(queues))
    for i, (name, job_type, job_id) in enumerate(zip(queues, job_types, ids, strict=True)):
        now = NOW + i
        reply = _run(
            state,
            records,
            Enqueue(jobs=(make_job(queue=name, job_type=job_type, job_id=job_id),)),
            now,
        )
        assert isinstance(reply, EnqueueResult)
        reserved = _run(state, records, Reserve(queues=(name,), lease_ms=30_000), now)
        assert isinstance(reserved, ReserveResult)
        (view,) = reserved.jobs
        _run(state, records, Ack(job_id=view.job_id, attempt=view.attempt), now)


def _snapshot(state: State, config: CoreConfig) -> State:
    body = [
        export_meta(state),
        list(export_jobs(state)),
        list(export_dedup(state)),
        list(export_dead(state)),
    ]
    meta, jobs, dedup, dead = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)
    builder = StateBuilder(config, meta)
    builder.add_jobs(jobs)
    builder.add_dedup(dedup)
    builder.add_dead(dead)
    return builder.finish()


def _replay(config: CoreConfig, records: Records) -> State:
    state = State(config)
    for time_ms, events in records:
        apply_record(state, time_ms, events)
    return state


def test_ten_thousand_churned_queues_are_all_forgotten_once_every_job_is_acked() -> None:
    config = CoreConfig().with_queue("declared")
    state = State(config)
    records: Records = []
    names = [f"churn-{i}" for i in range(10_000)] + ["declared"]

    _churn(state, records, names, ["work"] * len(names))

    check_invariants(state)
    assert list(state.queues) == ["declared"]
    assert not state.jobs and not state.dead and not state.dedup
    assert not any(name.startswith("churn-") for name in state._strings)
    replayed = _replay(config, records)
    check_invariants(replayed)
    assert replayed.canonical() == state.canonical()
    assert list(replayed.queues) == ["declared"]
    rebuilt = _snapshot(state, config)
    check_invariants(rebuilt)
    assert rebuilt.canonical() == state.canonical()


def test_the_churned_queues_are_forgotten_by_replay_and_snapshot_alike_midway() -> None:
    # Half the queues still hold a job when the snapshot is taken: those are kept,
    # the acked half is not, on every path.
    config = CoreConfig()
    state = State(config)
    records: Records = []
    _churn(state, records, [f"gone-{i}" for i in range(500)], ["work"] * 500)
    for i, job_id in enumerate(ordered_ids(1_500)[1_000:]):
        _run(state, records, Enqueue(jobs=(make_job(queue=f"kept-{i}", job_id=job_id),)), NOW)

    check_invariants(state)
    assert sorted(state.queues) == sorted(f"kept-{i}" for i in range(500))
    assert _replay(config, records).canonical() == state.canonical()
    assert _snapshot(state, config).canonical() == state.canonical()


def test_a_snapshot_listing_empty_queues_does_not_bring_them_back() -> None:
    # Snapshots written before issue 13 list every queue the state ever knew in
    # their meta: only the declared ones and those the rows fill exist after loading.
    config = CoreConfig().with_queue("declared")
    h = Harness(config)
    h.enqueue(make_job(queue="full"), now=NOW)
    meta = export_meta(h.state)
    meta["queues"] = ["old-1", "declared", "old-2", "full"]
    builder = StateBuilder(config, meta)
    builder.add_jobs(export_jobs(h.state))

    rebuilt = builder.finish()

    check_invariants(rebuilt)
    assert sorted(rebuilt.queues) == ["declared", "full"]
    assert rebuilt.canonical() == h.state.canonical()


def test_a_declared_queue_is_kept_when_it_holds_nothing() -> None:
    h = Harness(CoreConfig().with_queue("declared"))
    [job_id] = h.enqueue(make_job(queue="declared"), now=NOW)
    h.reserve_one("declared", now=NOW)
    h.ack(job_id, 1, now=NOW)

    assert list(h.state.queues) == ["declared"]
    assert h.counts("declared") == (0, 0, 0, 0)


def test_a_queue_is_kept_while_an_idempotency_key_names_it_and_forgotten_when_it_expires() -> None:
    h = Harness(CoreConfig(defaults=QueuePolicy(dedup_window_ms=1_000)))
    [job_id] = h.enqueue(make_job(queue="keyed", idempotency_key="k"), now=NOW)
    h.reserve_one("keyed", now=NOW)
    h.ack(job_id, 1, now=NOW)
    assert list(h.state.queues) == ["keyed"]
    assert h.state.queues["keyed"].dedup_count == 1

    h.sweep(now=NOW + 1_000)

    assert h.state.queues == {}
    assert h.state.dedup == {}


def test_a_queue_is_kept_while_it_holds_a_dead_letter_and_forgotten_once_drained() -> None:
    h = Harness(CoreConfig(dead_letter_retention_ms=60_000))
    [job_id] = h.enqueue(make_job(queue="failing"), now=NOW)
    h.reserve_one("failing", now=NOW)
    h.nack(job_id, 1, now=NOW, retry=RETRY_DEAD_LETTER)
    assert list(h.state.queues) == ["failing"]

    (record,) = h.drain(now=NOW, queue="failing")

    assert record.job.job_id == job_id
    assert h.state.queues == {}


def test_a_queue_is_forgotten_when_its_last_dead_letter_expires() -> None:
    h = Harness(CoreConfig(dead_letter_retention_ms=1_000))
    [job_id] = h.enqueue(make_job(queue="failing"), now=NOW)
    h.reserve_one("failing", now=NOW)
    h.nack(job_id, 1, now=NOW, retry=RETRY_DEAD_LETTER)

    h.sweep(now=NOW + 1_000)

    assert h.status(job_id) == "gone"
    assert h.state.queues == {}


def test_a_queue_is_forgotten_when_its_last_job_is_dead_lettered_without_a_record() -> None:
    h = Harness(CoreConfig(dead_letter_retention_ms=0))
    [job_id] = h.enqueue(make_job(queue="failing"), now=NOW)
    h.reserve_one("failing", now=NOW)

    h.nack(job_id, 1, now=NOW, retry=RETRY_DEAD_LETTER)

    assert h.state.queues == {}


def test_a_forgotten_queue_comes_back_with_its_next_job_in_order() -> None:
    h = Harness()
    first, second = ordered_ids(2)
    h.enqueue(make_job(queue="q", job_id=first), now=NOW)
    h.ack(h.reserve_one("q", now=NOW).job_id, 1, now=NOW)
    assert h.state.queues == {}

    h.enqueue(make_job(queue="q", job_id=second, priority=7), now=NOW + 1)

    assert h.counts("q") == (1, 0, 0, 0)
    assert h.reserve_one("q", now=NOW + 1).job_id == second


def test_distinct_job_types_churned_through_the_state_are_not_kept_forever() -> None:
    # Every distinct job type was interned for good; the table now starts over at
    # STRINGS_INTERNED_MAX entries, and the strings no job holds are freed.
    state = State(CoreConfig())
    records: Records = []
    count = 3 * STRINGS_INTERNED_MAX
    _churn(state, records, ["q"] * count, [f"type-{i}" for i in range(count)])

    check_invariants(state)
    assert len(state._strings) <= STRINGS_INTERNED_MAX
    assert state.queues == {}


def test_jobs_keep_their_strings_when_the_intern_table_starts_over() -> None:
    state = State(CoreConfig())
    records: Records = []
    ids = ordered_ids(STRINGS_INTERNED_MAX + 10)
    for i, job_id in enumerate(ids):
        job = make_job(queue=f"q{i % 3}", job_type=f"type-{i}", job_id=job_id)
        _run(state, records, Enqueue(jobs=(job,)), NOW)

    check_invariants(state)
    assert len(state._strings) <= STRINGS_INTERNED_MAX
    assert [state.jobs[job_id].job_type for job_id in ids] == [f"type-{i}" for i in range(len(ids))]
    assert sorted(state.queues) == ["q0", "q1", "q2"]
    assert _replay(CoreConfig(), records).canonical() == state.canonical()
    assert _snapshot(state, CoreConfig()).canonical() == state.canonical()


def test_the_state_gives_back_the_tables_of_its_emptied_dicts() -> None:
    # A dict keeps its table when entries are deleted: 10k acked jobs, their 10k
    # queues and 10k expired idempotency keys left ~1.5 MiB of empty tables behind.
    config = CoreConfig(defaults=QueuePolicy(dedup_window_ms=1_000))
    state = State(config)
    records: Records = []
    count = 10_000
    for i, job_id in enumerate(ordered_ids(count)):
        job = make_job(queue=f"q{i}", job_id=job_id, idempotency_key=f"key-{i}")
        _run(state, records, Enqueue(jobs=(job,)), NOW)
    assert sys.getsizeof(state.jobs) > 128 * 1024
    for i in range(count):
        reserved = _run(state, records, Reserve(queues=(f"q{i}",), lease_ms=30_000), NOW)
        assert isinstance(reserved, ReserveResult)
        (view,) = reserved.jobs
        _run(state, records, Ack(job_id=view.job_id, attempt=view.attempt), NOW)
    assert len(state.queues) == count  # each still holds its key
    for _ in range(count // CoreConfig().sweep_limit + 1):
        _run(state, records, Sweep(), NOW + 1_000)

    check_invariants(state)
    assert not state.jobs and not state.dedup and not state.queues
    for name in ("jobs", "queues", "dedup", "dead"):
        # Within the slack a dict may keep (COMPACT_SLACK_BYTES), not 10k entries' worth.
        assert sys.getsizeof(getattr(state, name)) <= COMPACT_SLACK_BYTES, name
    assert _replay(config, records).canonical() == state.canonical()
