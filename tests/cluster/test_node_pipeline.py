"""Pipelined appends (issue 19 item 2: "up to a few in flight, each expecting the
previous sequence"), on the in-memory log: the leader keeps up to `in_flight`
appends outstanding, releases replies only for acknowledged appends and in log
order, stops on a refusal, resolves an unknown outcome by reading the tail, and
appends one at a time right after it took over; readers skip a deposed leader's
pipelined append that landed on its successor's batch (its epoch is lower)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sepp.cluster.batch import (
    BATCH_EPOCH_BACKWARDS,
    GENESIS_HASH,
    ChainTip,
    check_batch,
    decode_batch,
    encode_batch,
)
from sepp.cluster.logengine import LogApplier, NotLeader, catch_up, new_cluster_engine, state_hash
from sepp.cluster.replog import MemoryLog
from sepp.core.commands import ChangeLeader
from sepp.server.config import ConfigError
from tests.cluster.test_node_engine import BUSY, Leader, enqueue
from tests.core.helpers import NOW
from tests.inprocess import in_process_config

# A batch limit that puts each one-job enqueue of `enqueue_each` in a batch of its own.
ONE_JOB_BYTES = 200


def enqueue_each(leader: Leader, jobs: int) -> None:
    """`jobs` single-job enqueues, buffered as one group commit (split into one
    batch per job by ONE_JOB_BYTES)."""
    for i in range(jobs):
        leader.engine.execute(enqueue(1)._replace(jobs=(enqueue(i + 1).jobs[i],)), NOW)


class HeldAnswers(MemoryLog):
    """Appends land at once (in call order) but each answer waits until the test
    releases it; counts the appends outstanding."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []
        self.outstanding = 0
        self.called = asyncio.Event()

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        self.outstanding += 1
        gate = asyncio.Event()
        self.gates.append(gate)
        self.called.set()
        try:
            seq = await super().append_if(expected_seq, data)
            await gate.wait()
            return seq
        finally:
            self.outstanding -= 1


class HeldCalls(MemoryLog):
    """Each append waits, before it reaches the log, until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return await super().append_if(expected_seq, data)


class Overlap(MemoryLog):
    """Records, for each append, how many were outstanding when it was made."""

    def __init__(self) -> None:
        super().__init__()
        self.outstanding = 0
        self.seen: dict[int, int] = {}

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        self.outstanding += 1
        self.seen[expected_seq] = self.outstanding
        try:
            await asyncio.sleep(0)
            return await super().append_if(expected_seq, data)
        finally:
            self.outstanding -= 1


# How many loop turns `wait_for` lets pass before it gives up.
TURNS_MAX = 10_000


async def wait_for(predicate: Any) -> None:
    """Let the loop run until `predicate()`, at most TURNS_MAX turns."""
    for _ in range(TURNS_MAX):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"still not {predicate} after {TURNS_MAX} loop turns")


def pipelined(log: Any, in_flight: int, **kw: Any) -> Leader:
    return Leader(log, in_flight=in_flight, pipeline_warmup=0, max_bytes=ONE_JOB_BYTES, **kw)


async def test_up_to_in_flight_appends_are_outstanding_and_replies_are_released_in_log_order() -> (
    None
):
    log = HeldAnswers()
    leader = pipelined(log, in_flight=4)
    enqueue_each(leader, 6)

    commit = asyncio.ensure_future(leader.committer.commit_once())
    await wait_for(lambda: len(log.gates) == 4)
    for _ in range(3):
        await asyncio.sleep(0)
    assert log.outstanding == 4 and len(log.gates) == 4  # the window is full
    for gate in reversed(log.gates[1:]):  # later answers first: nothing released
        gate.set()
    await wait_for(lambda: log.outstanding == 1)
    assert leader.durable == [] and leader.engine.durable_seq == 0

    log.gates[0].set()
    await wait_for(lambda: len(log.gates) == 6)
    for gate in log.gates[4:]:
        gate.set()
    await commit

    assert leader.durable == [1, 2, 3, 4, 5, 6]
    assert leader.committer.max_outstanding == 4
    assert leader.committer.log_seq == await log.last() == 6
    follower = LogApplier(new_cluster_engine(BUSY))
    await catch_up(follower, log)
    assert state_hash(follower.engine.state) == state_hash(leader.engine.state)


async def test_a_refused_append_fails_every_append_behind_it_and_readers_skip_those_that_landed() -> (
    None
):
    log = HeldCalls()
    deposed = pipelined(log, in_flight=3)
    enqueue_each(deposed, 3)
    commit = asyncio.ensure_future(deposed.committer.commit_once())
    await wait_for(lambda: len(log.gates) == 3)
    # Meanwhile another leader (epoch 2) took over and appended at sequence 1.
    successor = Leader(MemoryLog(), epoch=2)
    successor.engine.execute(ChangeLeader(epoch=2, node_id="n2", address="h:2"), NOW)
    successor.committer.log = log
    successor_commit = asyncio.ensure_future(successor.committer.commit_once())
    await wait_for(lambda: len(log.gates) == 4)
    log.gates[3].set()
    await successor_commit
    for gate in log.gates[:3]:
        gate.set()

    with pytest.raises(NotLeader) as raised:
        await commit

    assert raised.value.outcome_unknown is False
    assert deposed.durable == [] and deposed.engine.durable_seq == 0
    # The deposed leader's second and third appends expected sequences 1 and 2 and
    # landed on top of the successor's batch: every reader skips them.
    entries = await log.read(1, 10)
    assert [decode_batch(e.data).epoch for e in entries] == [2, 1, 1]
    follower = LogApplier(new_cluster_engine(BUSY))
    await catch_up(follower, log)
    assert follower.skipped == 2 and follower.log_seq == 3
    assert state_hash(follower.engine.state) == state_hash(successor.engine.state)
    assert follower.tip == successor.committer.tip


@pytest.mark.parametrize("fault", ["unknown_applied", "unknown_lost"])
async def test_an_unknown_outcome_at_the_head_is_resolved_then_the_appends_behind_it_count(
    fault: str,
) -> None:
    log = MemoryLog()
    leader = pipelined(log, in_flight=4)
    enqueue_each(leader, 4)
    log.fail_next.append(fault)

    await leader.committer.commit_once()

    assert leader.durable == [1, 2, 3, 4]
    assert await log.last() == 4
    assert [decode_batch(e.data).last_seq for e in await log.read(1, 10)] == [1, 2, 3, 4]
    follower = LogApplier(new_cluster_engine(BUSY))
    await catch_up(follower, log)
    assert follower.skipped == 0
    assert state_hash(follower.engine.state) == state_hash(leader.engine.state)


async def test_a_leader_appends_one_at_a_time_until_past_the_warmup_then_pipelines() -> None:
    log = Overlap()
    leader = Leader(log, in_flight=4, pipeline_warmup=3, max_bytes=ONE_JOB_BYTES)
    enqueue_each(leader, 10)

    await leader.committer.commit_once()

    # The first three appends (expecting sequences 0, 1, 2) go one by one.
    assert [log.seen[s] for s in range(3)] == [1, 1, 1]
    assert log.seen[3] == 1 and max(log.seen.values()) == 4
    assert leader.durable == list(range(1, 11))


async def test_one_append_in_flight_never_has_two_outstanding() -> None:
    log = Overlap()
    leader = pipelined(log, in_flight=1)
    enqueue_each(leader, 5)

    await leader.committer.commit_once()

    assert set(log.seen.values()) == {1} and leader.durable == [1, 2, 3, 4, 5]


def test_in_flight_outside_1_to_the_maximum_is_refused() -> None:
    with pytest.raises(ValueError):
        Leader(MemoryLog(), in_flight=0)
    with pytest.raises(ValueError):
        Leader(MemoryLog(), in_flight=17)


def test_check_batch_a_lower_epoch_is_epoch_backwards_whatever_its_chain() -> None:
    first, _ = encode_batch(epoch=3, first_seq=1, last_seq=2, time_ms=1000,
                            prev_hash=GENESIS_HASH, records=b"r")  # fmt: skip
    tip = ChainTip().after(decode_batch(first))
    stale, _ = encode_batch(epoch=2, first_seq=9, last_seq=9, time_ms=0,
                            prev_hash=bytes(16 * [7]), records=b"r")  # fmt: skip
    assert check_batch(stale, tip).status == BATCH_EPOCH_BACKWARDS


def test_appends_in_flight_comes_from_the_cluster_table_default_4_at_most_16() -> None:
    def settings(**kw: Any) -> Any:
        return in_process_config(
            cluster__nats_urls="nats://a:4222", cluster__node_id="n1", **kw
        ).cluster

    assert settings().appends_in_flight == 4
    assert settings(cluster__appends_in_flight=16).appends_in_flight == 16
    with pytest.raises(ConfigError, match=r"cluster\.appends_in_flight"):
        settings(cluster__appends_in_flight=17)
    with pytest.raises(ConfigError, match=r"cluster\.appends_in_flight"):
        settings(cluster__appends_in_flight=0)
