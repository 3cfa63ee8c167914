"""The storage engine on a replicated log (sepp/cluster/logengine.py), on the
in-memory log: the leader's group commits become fenced batches, a follower
applies them through the replay path to the same state; refused and
unknown-outcome appends; a follower stops on a damaged log."""

from __future__ import annotations

import random
from typing import Any

import pytest

from log_format import RECORD_KIND_COMMAND, encode_envelope, encode_record
from sepp.cluster.batch import ChainTip, decode_batch, encode_batch
from sepp.cluster.logengine import (
    RECORD_BYTES_MAX,
    LogApplier,
    LogCommitter,
    LogMismatch,
    NotLeader,
    catch_up,
    new_cluster_engine,
    state_hash,
)
from sepp.cluster.replog import AppendOutcomeUnknown, Entry, MemoryLog
from sepp.core.commands import ChangeLeader, Enqueue, NewJob
from sepp.core.config import CoreConfig
from sepp.core.decide import Decision
from sepp.core.events import LeaderChanged
from sepp.core.results import RecordTooLarge
from sepp.storage import Engine, StorageFailed
from tests.core.helpers import NOW
from tests.core.test_replay import BUSY, next_time, random_command

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"


class Leader:
    """A leader engine appending to `log` (no lease, no node: the write path only)."""

    def __init__(self, log: Any, config: CoreConfig = BUSY, *, epoch: int = 1, **kw: Any) -> None:
        self.engine = new_cluster_engine(config)
        self.durable: list[int] = []
        self.failures: list[BaseException] = []
        self.committer = LogCommitter(
            self.engine,
            log,
            epoch=epoch,
            tip=ChainTip(),
            log_seq=0,
            on_durable=self.durable.append,
            on_failure=self.failures.append,
            resolve_pause_s=0,
            **kw,
        )


def enqueue(n: int = 1) -> Enqueue:
    return Enqueue(
        jobs=tuple(
            NewJob(
                job_id=f"{JOB[:-4]}{i:04d}",
                queue="a",
                job_type="t",
                payload_data=b"x" * 50,
                payload_encoding="bytes",
            )
            for i in range(n)
        ),
        atomic=False,
    )


async def run_random(rng: random.Random, leader: Leader, commits: int) -> None:
    now = NOW
    for _ in range(commits):
        for _ in range(rng.randrange(1, 8)):
            now = next_time(rng, now)
            leader.engine.execute(random_command(rng, leader.engine.state, now), now)
        await leader.committer.commit_once()


def follower_of(log: MemoryLog, config: CoreConfig = BUSY) -> LogApplier:
    return LogApplier(new_cluster_engine(config))


async def test_leader_batches_applied_on_a_follower_rebuild_the_same_state(
    rng: random.Random,
) -> None:
    log = MemoryLog()
    leader = Leader(log)
    await run_random(rng, leader, commits=60)
    follower = follower_of(log)

    await catch_up(follower, log)

    assert await log.last() == leader.committer.log_seq == follower.log_seq
    assert follower.engine.durable_seq == leader.engine.durable_seq == leader.engine.appended_seq
    assert state_hash(follower.engine.state) == state_hash(leader.engine.state)
    assert follower.tip == leader.committer.tip


async def test_a_follower_tailing_the_log_as_it_grows_stays_identical(
    rng: random.Random,
) -> None:
    log = MemoryLog()
    leader = Leader(log)
    follower = follower_of(log)
    for _ in range(10):
        await run_random(rng, leader, commits=3)
        await catch_up(follower, log)
        assert state_hash(follower.engine.state) == state_hash(leader.engine.state)


async def test_a_group_commit_over_the_batch_limit_is_split_at_record_boundaries() -> None:
    log = MemoryLog()
    leader = Leader(log, max_bytes=400)
    for i in range(10):
        leader.engine.execute(enqueue(1)._replace(jobs=(enqueue(i + 1).jobs[i],)), NOW)
    await leader.committer.commit_once()
    batches = [decode_batch(e.data) for e in await log.read(1, 100)]
    assert len(batches) > 1
    assert [b.first_seq for b in batches[1:]] == [b.last_seq + 1 for b in batches[:-1]]
    assert batches[-1].last_seq == 10
    follower = follower_of(log)
    await catch_up(follower, log)
    assert state_hash(follower.engine.state) == state_hash(leader.engine.state)


async def test_the_durable_seq_advances_only_when_the_append_is_acknowledged() -> None:
    log = MemoryLog()
    leader = Leader(log)
    _, barrier = leader.engine.execute(enqueue(), NOW)
    assert leader.engine.durable_seq < barrier and await log.last() == 0
    await leader.committer.commit_once()
    assert leader.engine.durable_seq == barrier and leader.durable == [barrier]


async def test_a_refused_append_stops_the_leader_and_releases_nothing() -> None:
    log = MemoryLog()
    leader = Leader(log)
    leader.engine.execute(enqueue(), NOW)
    log.fail_next.append("refuse")

    with pytest.raises(NotLeader) as raised:
        await leader.committer.commit_once()

    assert raised.value.outcome_unknown is False
    assert leader.engine.durable_seq == 0 and leader.durable == []
    assert await log.last() == 0
    with pytest.raises(StorageFailed):
        leader.engine.execute(enqueue(), NOW)


async def test_a_deposed_leaders_append_is_refused_once_another_appended() -> None:
    log = MemoryLog()
    old = Leader(log)
    old.engine.execute(enqueue(), NOW)
    await old.committer.commit_once()
    new = LogApplier(new_cluster_engine(BUSY))
    await catch_up(new, log)
    newer = LogCommitter(
        new.engine, log, epoch=2, tip=new.tip, log_seq=new.log_seq,
        on_durable=lambda seq: None, on_failure=lambda exc: None,
    )  # fmt: skip
    new.engine.execute(ChangeLeader(epoch=2, node_id="n2", address="h:2"), NOW)
    await newer.commit_once()
    old.engine.execute(enqueue(2), NOW)

    with pytest.raises(NotLeader):
        await old.committer.commit_once()

    assert await log.last() == 2


async def test_an_unknown_outcome_whose_batch_landed_counts_as_appended() -> None:
    log = MemoryLog()
    leader = Leader(log)
    _, barrier = leader.engine.execute(enqueue(), NOW)
    log.fail_next.append("unknown_applied")

    await leader.committer.commit_once()

    assert await log.last() == 1 and leader.engine.durable_seq == barrier


async def test_an_unknown_outcome_whose_batch_was_lost_is_appended_again() -> None:
    log = MemoryLog()
    leader = Leader(log)
    _, barrier = leader.engine.execute(enqueue(), NOW)
    log.fail_next.append("unknown_lost")

    await leader.committer.commit_once()

    assert await log.last() == 1 and leader.engine.durable_seq == barrier
    follower = follower_of(log)
    await catch_up(follower, log)
    assert state_hash(follower.engine.state) == state_hash(leader.engine.state)


class RacedLog(MemoryLog):
    """An append whose outcome is unknown while another writer takes the slot."""

    def __init__(self, intruder: bytes) -> None:
        super().__init__()
        self.intruder = intruder
        self.raced = False

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        if not self.raced:
            self.raced = True
            await super().append_if(expected_seq, self.intruder)
            raise AppendOutcomeUnknown("injected: lost the answer; another writer appended")
        return await super().append_if(expected_seq, data)


async def test_an_unknown_outcome_with_another_writers_batch_at_the_tail_stops_the_leader() -> None:
    intruder, _ = encode_batch(
        epoch=2, first_seq=1, last_seq=1, time_ms=NOW, prev_hash=ChainTip().hash,
        records=encode_record(1, RECORD_KIND_COMMAND, encode_envelope(NOW, 8, [])),
    )  # fmt: skip
    log = RacedLog(intruder)
    leader = Leader(log)
    leader.engine.execute(enqueue(), NOW)

    with pytest.raises(NotLeader) as raised:
        await leader.committer.commit_once()

    assert raised.value.outcome_unknown is False  # the tail shows ours is not there
    assert leader.engine.durable_seq == 0 and await log.last() == 1


class SilentLog(MemoryLog):
    """Every append's outcome is unknown and nothing lands."""

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        raise AppendOutcomeUnknown("injected: no answer")


async def test_an_outcome_that_stays_unknown_stops_the_leader_with_outcome_unknown() -> None:
    leader = Leader(SilentLog())
    leader.engine.execute(enqueue(), NOW)

    with pytest.raises(NotLeader) as raised:
        await leader.committer.commit_once()

    assert raised.value.outcome_unknown is True and leader.engine.durable_seq == 0


# -- a follower stops on a log it cannot apply ----------------------------------------


async def leader_log(rng: random.Random, messages: int = 6) -> tuple[MemoryLog, list[Entry]]:
    """A log of at least `messages` batches (a group commit of refusals logs none)."""
    log = MemoryLog()
    leader = Leader(log)
    while await log.last() < messages:
        await run_random(rng, leader, commits=1)
    return log, await log.read(1, 100)


def replaced(entries: list[Entry], index: int, data: bytes) -> list[Entry]:
    copy = list(entries)
    copy[index] = Entry(copy[index].seq, data)
    return copy


def apply_all(entries: list[Entry]) -> LogApplier:
    follower = LogApplier(new_cluster_engine(BUSY))
    for entry in entries:
        follower.apply(entry)
    return follower


async def test_a_corrupted_message_stops_the_follower_naming_its_sequence(
    rng: random.Random,
) -> None:
    _, entries = await leader_log(rng)
    damaged = bytearray(entries[2].data)
    damaged[len(damaged) // 2] ^= 0x40

    with pytest.raises(LogMismatch) as raised:
        apply_all(replaced(entries, 2, bytes(damaged)))

    assert raised.value.log_seq == 3 and "bad_checksum" in str(raised.value)


async def test_a_broken_hash_chain_stops_the_follower(rng: random.Random) -> None:
    _, entries = await leader_log(rng)
    b = decode_batch(entries[3].data)
    forged, _ = encode_batch(
        epoch=b.epoch, first_seq=b.first_seq, last_seq=b.last_seq, time_ms=b.time_ms,
        prev_hash=bytes(16), records=b.records,
    )  # fmt: skip

    with pytest.raises(LogMismatch) as raised:
        apply_all(replaced(entries, 3, forged))

    assert raised.value.log_seq == 4 and "broken_chain" in str(raised.value)


async def test_a_record_seq_gap_between_batches_stops_the_follower(rng: random.Random) -> None:
    _, entries = await leader_log(rng)
    follower = apply_all(entries[:2])

    with pytest.raises(LogMismatch) as raised:
        follower.apply(Entry(3, entries[3].data))  # message 3 skipped

    assert raised.value.log_seq == 3 and "broken_chain" in str(raised.value)


async def test_a_batch_whose_records_skip_a_seq_stops_the_follower() -> None:
    body = encode_envelope(NOW, 8, [])
    records = encode_record(1, RECORD_KIND_COMMAND, body) + encode_record(
        3, RECORD_KIND_COMMAND, body
    )
    message, _ = encode_batch(
        epoch=1, first_seq=1, last_seq=2, time_ms=NOW, prev_hash=bytes(16), records=records
    )

    with pytest.raises(LogMismatch) as raised:
        apply_all([Entry(1, message)])

    assert raised.value.log_seq == 1 and "record seq 2" in str(raised.value)


async def test_a_message_out_of_log_order_stops_the_follower(rng: random.Random) -> None:
    _, entries = await leader_log(rng)
    with pytest.raises(LogMismatch) as raised:
        apply_all([entries[0], entries[2]])
    assert raised.value.log_seq == 3


# -- the leader-change record ---------------------------------------------------------


async def test_a_new_leader_never_decides_a_time_below_the_last_logged_time() -> None:
    log = MemoryLog()
    leader = Leader(log)
    leader.engine.execute(enqueue(), NOW + 5_000)
    await leader.committer.commit_once()
    follower = follower_of(log)
    await catch_up(follower, log)

    decision, _ = follower.engine.execute(
        ChangeLeader(epoch=2, node_id="n2", address="h:2"),
        NOW,  # its clock is behind
    )

    assert isinstance(decision, Decision)
    assert decision.time_ms == NOW + 5_000
    assert decision.events == (LeaderChanged(epoch=2, node_id="n2", address="h:2"),)


def test_a_leader_change_changes_no_job_state(rng: random.Random) -> None:
    engine: Engine = new_cluster_engine(BUSY)
    engine.execute(enqueue(3), NOW)
    before = engine.state.canonical()
    engine.execute(ChangeLeader(epoch=7, node_id="n1", address="h:1"), NOW)
    after = engine.state.canonical()
    assert after == before


async def test_a_command_whose_record_would_not_fit_one_message_is_refused_up_front() -> None:
    log = MemoryLog()
    leader = Leader(log)
    big = enqueue()._replace(
        jobs=(enqueue().jobs[0]._replace(payload_data=b"x" * RECORD_BYTES_MAX),)
    )
    before = state_hash(leader.engine.state)
    refused, barrier = leader.engine.execute(big, NOW)
    assert isinstance(refused, RecordTooLarge) and refused.code == "invalid_argument"
    assert "fewer or smaller jobs" in refused.message
    assert barrier == leader.engine.appended_seq == 0
    assert state_hash(leader.engine.state) == before
    # The leader goes on: the next command is decided, appended and durable.
    decision, barrier = leader.engine.execute(enqueue(), NOW)
    assert isinstance(decision, Decision)
    await leader.committer.commit_once()
    assert leader.failures == [] and leader.durable == [barrier] and await log.last() == 1


def test_a_single_node_engine_takes_a_record_of_any_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = Engine.open(str(tmp_path / "data"), BUSY)
    try:
        three = enqueue(3)
        big = three._replace(
            jobs=tuple(j._replace(payload_data=b"x" * 700_000) for j in three.jobs)
        )
        decision, barrier = engine.execute(big, NOW)
        assert isinstance(decision, Decision) and len(decision.events) == 3 and barrier == 1
    finally:
        engine.close()
