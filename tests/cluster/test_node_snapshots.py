"""Cluster snapshots in the blob store (sepp/cluster/snapshots.py): the blob
rebuilds the state and the chain tip; a damaged one is refused and the older one
used; two are kept and the log purged below the older; a fresh node boots from
the newest and tails the rest to the leader's state; a node restarted, or a
running follower left behind, after its position was purged boots from the
snapshot."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sepp.cluster.logengine import LogApplier, catch_up, new_cluster_engine, state_hash
from sepp.cluster.node import LEASE_TTL_MS, ROLE_FOLLOWER, ClusterNode, LocalServing
from sepp.cluster.replog import Entry, MemoryBlobStore, MemoryLease, MemoryLog
from sepp.cluster.snapshots import (
    SnapshotBlobError,
    decode_snapshot_blob,
    encode_snapshot_blob,
    load_newest_snapshot,
    publish_snapshot,
    snapshot_name,
    snapshot_seqs,
)
from tests.cluster.test_node_engine import Leader, run_random
from tests.cluster.test_node_roles import ManualClock, settle
from tests.core.test_replay import BUSY, random_command


async def followed_log(rng: random.Random, commits: int = 30) -> tuple[MemoryLog, LogApplier]:
    log = MemoryLog()
    leader = Leader(log)
    await run_random(rng, leader, commits=commits)
    follower = LogApplier(new_cluster_engine(BUSY))
    await catch_up(follower, log)
    return log, follower


def blob_of(follower: LogApplier) -> bytes:
    return encode_snapshot_blob(
        follower.engine.state, follower.engine.appended_seq, follower.log_seq, follower.tip
    )


async def test_a_snapshot_blob_rebuilds_the_state_and_the_chain_tip(rng: random.Random) -> None:
    _, follower = await followed_log(rng)

    loaded = decode_snapshot_blob(blob_of(follower), BUSY)

    assert state_hash(loaded.state) == state_hash(follower.engine.state)
    assert loaded.tip == follower.tip
    assert (loaded.log_seq, loaded.record_seq) == (follower.log_seq, follower.engine.appended_seq)


async def test_a_node_booted_from_a_snapshot_applies_the_rest_of_the_log(
    rng: random.Random,
) -> None:
    log = MemoryLog()
    leader = Leader(log)
    await run_random(rng, leader, commits=20)
    follower = LogApplier(new_cluster_engine(BUSY))
    await catch_up(follower, log)
    loaded = decode_snapshot_blob(blob_of(follower), BUSY)
    await run_random(rng, leader, commits=20)

    booted = LogApplier(
        new_cluster_engine(BUSY, loaded.state, loaded.record_seq),
        tip=loaded.tip,
        log_seq=loaded.log_seq,
    )
    await catch_up(booted, log)

    assert state_hash(booted.engine.state) == state_hash(leader.engine.state)
    assert booted.engine.durable_seq == leader.engine.durable_seq


async def test_a_damaged_blob_is_refused(rng: random.Random) -> None:
    _, follower = await followed_log(rng)
    blob = bytearray(blob_of(follower))
    blob[len(blob) // 2] ^= 0x08
    with pytest.raises(SnapshotBlobError, match="checksum"):
        decode_snapshot_blob(bytes(blob), BUSY)


async def test_publishing_keeps_the_two_newest_and_purges_the_log_below_the_older(
    rng: random.Random,
) -> None:
    log, follower = await followed_log(rng, commits=40)
    blobs = MemoryBlobStore()
    last = follower.log_seq
    assert last >= 6
    for seq in (last - 4, last - 2, last):
        await publish_snapshot(blobs, log, blob_of(follower), seq)

    assert await snapshot_seqs(blobs) == [last - 2, last]
    assert await log.first() == last - 1


async def test_a_damaged_newest_snapshot_falls_back_to_the_older(rng: random.Random) -> None:
    log, older = await followed_log(rng, commits=10)
    blobs = MemoryBlobStore()
    await publish_snapshot(blobs, log, blob_of(older), older.log_seq)
    await blobs.put(snapshot_name(older.log_seq + 5), b"\x00\x00\x00\x00garbage")

    loaded = await load_newest_snapshot(blobs, BUSY)

    assert loaded is not None and loaded.log_seq == older.log_seq


async def test_no_snapshot_that_verifies_is_an_error_not_an_empty_state() -> None:
    blobs = MemoryBlobStore()
    await blobs.put(snapshot_name(7), b"\x00\x00\x00\x00garbage")
    with pytest.raises(SnapshotBlobError):
        await load_newest_snapshot(blobs, BUSY)
    assert await load_newest_snapshot(MemoryBlobStore(), BUSY) is None


# -- nodes ---------------------------------------------------------------------------


class SnapCluster:
    def __init__(self, snapshot_every: int) -> None:
        self.clock = ManualClock()
        self.log = MemoryLog()
        self.lease = MemoryLease(LEASE_TTL_MS, self.clock)
        self.blobs = MemoryBlobStore()
        self.snapshot_every = snapshot_every
        self.nodes: list[ClusterNode] = []

    def add(self, node_id: str, log_: Any = None) -> ClusterNode:
        node = ClusterNode(
            node_id=node_id,
            address=f"127.0.0.1:{7100 + len(self.nodes)}",
            log_=self.log if log_ is None else log_,
            lease=self.lease,
            config=BUSY,
            clock_ms=self.clock,
            sleep=self.clock.sleep,
            serving=LocalServing(),
            blobs=self.blobs,
            snapshot_every=self.snapshot_every,
        )
        self.nodes.append(node)
        node.start()
        return node

    async def leader(self) -> ClusterNode:
        for _ in range(100):
            leaders = [n for n in self.nodes if n.role == "leader"]
            if leaders:
                return leaders[0]
            await self.clock.advance(100)
        raise AssertionError("no leader")

    async def submit(self, rng: random.Random, leader: ClusterNode, count: int) -> None:
        """Random commands until `count` of them were logged: many are refused or
        log nothing (one seed logged 6 messages from 60 commands), and the tests
        count on the log's length (snapshots every few messages, purges)."""
        serving = leader.serving
        assert isinstance(serving, LocalServing)
        logged = 0
        for _ in range(count * 100):
            if logged == count:
                return
            assert serving.engine is not None
            command = random_command(rng, serving.engine.state, self.clock())
            if type(command).__name__ == "ChangeLeader":
                continue
            before = await self.log.last()
            await serving.submit(command, self.clock())
            await settle()
            logged += await self.log.last() > before
        raise AssertionError(f"{count * 100} random commands logged only {logged} messages")

    async def converged(self) -> set[str]:
        last = await self.log.last()
        for _ in range(200):
            if all(n.log_seq == last for n in self.nodes):
                break
            await settle()
        assert all(n.log_seq == last for n in self.nodes), [n.log_seq for n in self.nodes]
        return {state_hash(n.engine.state) for n in self.nodes}

    async def close(self) -> None:
        for node in self.nodes:
            await node.kill()


async def test_followers_snapshot_the_log_is_purged_and_a_new_node_boots_from_it(
    rng: random.Random,
) -> None:
    cluster = SnapCluster(snapshot_every=5)
    try:
        cluster.add("n1")
        cluster.add("n2")
        leader = await cluster.leader()
        await cluster.submit(rng, leader, 60)
        assert len(await cluster.converged()) == 1
        seqs = await snapshot_seqs(cluster.blobs)
        assert len(seqs) == 2 and await cluster.log.first() == seqs[0] + 1 > 1

        fresh = cluster.add("n3")  # a new (or wiped) node: the log's start is gone
        await settle()

        assert fresh.role == ROLE_FOLLOWER and fresh.failure is None
        assert len(await cluster.converged()) == 1
        await cluster.submit(rng, leader, 10)
        assert len(await cluster.converged()) == 1
    finally:
        await cluster.close()


async def test_a_node_restarted_after_a_purge_of_its_position_boots_from_the_snapshot(
    rng: random.Random,
) -> None:
    cluster = SnapCluster(snapshot_every=0)  # nobody snapshots on their own
    try:
        cluster.add("n1")
        leader = await cluster.leader()
        await cluster.submit(rng, leader, 20)
        behind = cluster.add("n2")
        await behind.kill()  # it stays at log message 0 meanwhile
        await cluster.submit(rng, leader, 20)
        # Two snapshots of the followed state, and the log purged below the older.
        applier = LogApplier(new_cluster_engine(BUSY))
        for _ in range(2):
            await catch_up(applier, cluster.log)
            await publish_snapshot(cluster.blobs, cluster.log, blob_of(applier), applier.log_seq)
            await cluster.submit(rng, leader, 10)
        assert await cluster.log.first() > 1
        cluster.nodes.remove(behind)

        again = cluster.add("n2")
        await settle()

        assert again.failure is None
        assert len(await cluster.converged()) == 1
    finally:
        await cluster.close()


class GatedLog:
    """A node's handle on the shared log whose tail waits until `open` is set."""

    def __init__(self, shared: MemoryLog) -> None:
        self.shared = shared
        self.open = asyncio.Event()

    async def _gated(self, seq: int) -> AsyncIterator[Entry]:
        await self.open.wait()
        async for entry in self.shared.read_from(seq):
            yield entry

    def read_from(self, seq: int) -> AsyncIterator[Entry]:
        return self._gated(seq)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


async def test_a_running_follower_left_behind_a_purge_boots_again_from_the_snapshot(
    rng: random.Random,
) -> None:
    cluster = SnapCluster(snapshot_every=0)
    try:
        cluster.add("n1")
        leader = await cluster.leader()
        gated = GatedLog(cluster.log)
        behind = cluster.add("n2", gated)  # booted (nothing to load), its tail held
        await cluster.submit(rng, leader, 20)
        applier = LogApplier(new_cluster_engine(BUSY))
        for _ in range(2):
            await catch_up(applier, cluster.log)
            await publish_snapshot(cluster.blobs, cluster.log, blob_of(applier), applier.log_seq)
            await cluster.submit(rng, leader, 10)
        assert await cluster.log.first() > 1 and behind.log_seq == 0

        gated.open.set()  # its tail asks for message 1: purged
        await settle()

        assert behind.failure is None and behind.snapshot_seq > 0
        assert len(await cluster.converged()) == 1
    finally:
        await cluster.close()
