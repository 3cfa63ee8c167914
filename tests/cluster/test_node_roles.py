"""Cluster nodes in one process (sepp/cluster/node.py): three nodes on the
in-memory log and lease with a manual clock. One leader; followers converge to
its state hash; a killed leader is replaced after the lease's TTL; a deposed
leader's append is refused and it steps down; no two nodes ever append in the
same epoch."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections import defaultdict
from typing import Any

import pytest

from sepp.cluster.batch import decode_batch
from sepp.cluster.logengine import NotLeader, state_hash
from sepp.cluster.node import (
    LEASE_RENEW_MS,
    LEASE_TTL_MS,
    ROLE_CANDIDATE,
    ROLE_FOLLOWER,
    ROLE_LEADER,
    ROLE_STOPPED,
    STOP_RELEASE_WAIT_MS,
    ClusterNode,
    LocalServing,
)
from sepp.cluster.replog import (
    Entry,
    HeldLease,
    LeaseRecord,
    MemoryBlobStore,
    MemoryLease,
    MemoryLog,
    ReplicatedLogError,
)
from sepp.core.commands import ChangeLeader
from sepp.core.events import LeaderChanged
from sepp.storage.replay import replay_run
from tests.core.test_replay import BUSY, random_command

# Loop turns given to the nodes after each clock step (every in-memory call
# completes without a real wait, so this is where they all settle).
SETTLE_TURNS = 200


class ManualClock:
    """Milliseconds that move only when a test says; `sleep` waits on it."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def __call__(self) -> int:
        return self.now_ms

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now_ms + int(seconds * 1000), next(self._ids), future))
        await future

    async def advance(self, ms: int, step_ms: int = 100) -> None:
        """Move time on by `ms`, `step_ms` at a time, letting everything run."""
        end = self.now_ms + ms
        while self.now_ms < end:
            self.now_ms = min(end, self.now_ms + step_ms)
            while self._sleepers and self._sleepers[0][0] <= self.now_ms:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            await settle()


async def settle() -> None:
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


class NodeLog:
    """One node's handle on the shared log: records which node appended what."""

    def __init__(self, shared: MemoryLog, node_id: str, appends: list[tuple[str, int]]) -> None:
        self.shared = shared
        self.node_id = node_id
        self.appends = appends

    async def append_if(self, expected_seq: int, data: bytes) -> int:
        seq = await self.shared.append_if(expected_seq, data)
        self.appends.append((self.node_id, seq))
        return seq

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


class CutLease:
    """One node's handle on the shared lease; `cut` makes its calls hang (a
    partition between that node and the lease, not the log)."""

    def __init__(self, shared: MemoryLease) -> None:
        self.shared = shared
        self.cut = False
        # Calls fail at once (the backend unreachable) while set.
        self.failing = False
        self._never: asyncio.Event = asyncio.Event()

    async def _gate(self) -> None:
        if self.failing:
            raise ReplicatedLogError("injected: the lease's backend is unreachable")
        if self.cut:
            await self._never.wait()

    async def current(self) -> HeldLease | None:
        await self._gate()
        return await self.shared.current()

    async def acquire(self, record: LeaseRecord) -> HeldLease | None:
        await self._gate()
        return await self.shared.acquire(record)

    async def renew(self, held: HeldLease) -> HeldLease | None:
        await self._gate()
        return await self.shared.renew(held)

    async def release(self, held: HeldLease) -> None:
        await self._gate()
        await self.shared.release(held)


class Cluster:
    def __init__(self, n: int = 3) -> None:
        self.clock = ManualClock()
        self.log = MemoryLog()
        self.lease = MemoryLease(LEASE_TTL_MS, self.clock)
        self.appends: list[tuple[str, int]] = []
        self.leases: dict[str, CutLease] = {}
        self.nodes: list[ClusterNode] = []
        for i in range(1, n + 1):
            node_id = f"n{i}"
            self.leases[node_id] = CutLease(self.lease)
            self.nodes.append(
                ClusterNode(
                    node_id=node_id,
                    address=f"127.0.0.1:{7000 + i}",
                    log_=NodeLog(self.log, node_id, self.appends),
                    lease=self.leases[node_id],
                    config=BUSY,
                    clock_ms=self.clock,
                    sleep=self.clock.sleep,
                    serving=LocalServing(),
                )
            )

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def leaders(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.role == ROLE_LEADER]

    async def wait_leader(self, within_ms: int = 3 * LEASE_TTL_MS) -> ClusterNode:
        waited = 0
        while waited <= within_ms:
            leaders = self.leaders()
            if leaders:
                assert len(leaders) == 1, [n.node_id for n in leaders]
                return leaders[0]
            await self.clock.advance(100)
            waited += 100
        raise AssertionError(f"no leader within {within_ms} ms")

    async def submit_random(self, rng: random.Random, leader: ClusterNode, count: int) -> None:
        serving = leader.serving
        assert isinstance(serving, LocalServing)
        for _ in range(count):
            assert serving.engine is not None
            command = random_command(rng, serving.engine.state, self.clock())
            if isinstance(command, ChangeLeader):
                continue  # only a node appends those
            await serving.submit(command, self.clock())
            if rng.random() < 0.3:
                await self.clock.advance(rng.choice((10, 100, 400)), step_ms=50)

    async def converge(self, live: list[ClusterNode]) -> None:
        """Let followers tail the log to its end."""
        last = await self.log.last()
        for _ in range(100):
            if all(node.log_seq == last for node in live):
                return
            await settle()
        raise AssertionError([(n.node_id, n.log_seq, last) for n in live])

    async def close(self) -> None:
        for node in self.nodes:
            await node.kill()


def without_clock(state: Any) -> dict[str, Any]:
    canonical: dict[str, Any] = state.canonical()
    del canonical["clock_ms"]
    return canonical


def epochs_by_appender(cluster: Cluster) -> dict[int, set[str]]:
    """epoch -> the nodes whose appends of that epoch succeeded."""
    by_seq = dict((seq, node_id) for node_id, seq in cluster.appends)
    epochs: dict[int, set[str]] = defaultdict(set)
    for seq, node_id in by_seq.items():
        epoch = decode_batch(cluster.log._messages[seq - 1]).epoch
        epochs[epoch].add(node_id)
    return epochs


def leader_changes(cluster: Cluster) -> list[LeaderChanged]:
    """Every LeaderChanged record in the log, in order (replayed from the batches)."""
    from sepp.cluster.logengine import new_cluster_engine

    seen: list[LeaderChanged] = []
    engine = new_cluster_engine(BUSY)
    engine.observer = None
    for data in cluster.log._messages:
        batch = decode_batch(data)
        from log_format import ValidEnvelopes

        for envelope in ValidEnvelopes(batch.records, start_offset=0, expected_seq=batch.first_seq):
            for fields in envelope[3]:
                if fields[0] == LeaderChanged.TYPE:
                    seen.append(LeaderChanged(*fields[2:]))
        replay_run(engine.state, batch.records, start_offset=0, expected_seq=batch.first_seq)
    return seen


async def test_one_node_becomes_leader_and_followers_converge_to_its_state(
    rng: random.Random,
) -> None:
    cluster = Cluster()
    cluster.start()
    try:
        leader = await cluster.wait_leader()
        await cluster.submit_random(rng, leader, 80)
        await cluster.converge(cluster.nodes)

        assert [n.role for n in cluster.nodes].count(ROLE_LEADER) == 1
        hashes = {state_hash(node.engine.state) for node in cluster.nodes}
        assert len(hashes) == 1
        changes = leader_changes(cluster)
        assert changes == [LeaderChanged(epoch=1, node_id=leader.node_id, address=leader.address)]
        followers = [n for n in cluster.nodes if n is not leader]
        await cluster.clock.advance(LEASE_RENEW_MS + 100)
        assert all(n.leader == leader.address and n.role == ROLE_FOLLOWER for n in followers)
    finally:
        await cluster.close()


async def test_a_killed_leader_is_replaced_after_the_lease_ttl(rng: random.Random) -> None:
    cluster = Cluster()
    cluster.start()
    try:
        first = await cluster.wait_leader()
        await cluster.submit_random(rng, first, 30)
        await cluster.converge(cluster.nodes)
        before = without_clock(first.engine.state)
        await first.kill()
        killed_at = cluster.clock()

        second = await cluster.wait_leader(within_ms=LEASE_TTL_MS + 2 * LEASE_RENEW_MS + 500)

        assert second is not first
        assert cluster.clock() - killed_at >= LEASE_TTL_MS - LEASE_RENEW_MS
        assert second.epoch == 2
        live = [n for n in cluster.nodes if n is not first]
        await cluster.converge(live)
        # The new leader's state is the old one's (its leader-change record changes
        # no job state, only the clock may move); the remaining follower has the same.
        assert len({state_hash(n.engine.state) for n in live}) == 1
        assert without_clock(second.engine.state) == before
        await cluster.submit_random(rng, second, 30)
        await cluster.converge(live)
        assert len({state_hash(n.engine.state) for n in live}) == 1
        assert [c.epoch for c in leader_changes(cluster)] == [1, 2]
        assert all(len(nodes) == 1 for nodes in epochs_by_appender(cluster).values())
    finally:
        await cluster.close()


async def test_a_deposed_leaders_append_is_refused_and_it_steps_down(
    rng: random.Random,
) -> None:
    cluster = Cluster()
    cluster.start()
    try:
        old = await cluster.wait_leader()
        await cluster.submit_random(rng, old, 10)
        cluster.leases[old.node_id].cut = True  # it can no longer renew: its renew hangs
        new = None
        for _ in range(100):
            await cluster.clock.advance(100)
            others = [n for n in cluster.leaders() if n is not old]
            if others:
                new = others[0]
                break
        assert new is not None and old.role == ROLE_LEADER  # both think they lead
        serving = old.serving
        assert isinstance(serving, LocalServing) and serving.engine is not None
        last_before = await cluster.log.last()

        with pytest.raises(NotLeader):
            command = random_command(rng, serving.engine.state, cluster.clock())
            for _ in range(20):  # the first command that logs something is refused
                await serving.submit(command, cluster.clock())
                command = random_command(rng, serving.engine.state, cluster.clock())
        await settle()

        assert old.role in (ROLE_FOLLOWER, ROLE_CANDIDATE) and old.step_downs == 1
        assert await cluster.log.last() == last_before
        cluster.leases[old.node_id].cut = False
        await cluster.clock.advance(2 * LEASE_RENEW_MS)
        await cluster.submit_random(rng, new, 20)
        await cluster.converge(cluster.nodes)
        assert len({state_hash(n.engine.state) for n in cluster.nodes}) == 1
        assert all(len(nodes) == 1 for nodes in epochs_by_appender(cluster).values())
    finally:
        await cluster.close()


async def test_a_leader_whose_renewals_fail_for_less_than_the_ttl_keeps_leading(
    rng: random.Random,
) -> None:
    cluster = Cluster()
    cluster.start()
    try:
        leader = await cluster.wait_leader()
        cluster.leases[leader.node_id].failing = True
        await cluster.clock.advance(LEASE_TTL_MS - LEASE_RENEW_MS - 100)
        cluster.leases[leader.node_id].failing = False
        await cluster.clock.advance(LEASE_RENEW_MS + 100)

        assert leader.role == ROLE_LEADER and leader.step_downs == 0
        assert cluster.leaders() == [leader]
        await cluster.submit_random(rng, leader, 10)
    finally:
        await cluster.close()


async def test_a_leader_whose_renewals_fail_past_the_ttl_steps_down() -> None:
    cluster = Cluster()
    cluster.start()
    try:
        leader = await cluster.wait_leader()
        cluster.leases[leader.node_id].failing = True
        await cluster.clock.advance(LEASE_TTL_MS + LEASE_RENEW_MS)

        assert leader.step_downs == 1 and leader.role != ROLE_LEADER
        cluster.leases[leader.node_id].failing = False
        successor = await cluster.wait_leader()
        assert successor.epoch == 2
    finally:
        await cluster.close()


async def test_leaders_killed_again_and_again_never_share_an_epoch(rng: random.Random) -> None:
    cluster = Cluster(3)
    cluster.start()
    killed: list[ClusterNode] = []
    try:
        for round_ in range(2):
            leader = await cluster.wait_leader(within_ms=3 * LEASE_TTL_MS)
            await cluster.submit_random(rng, leader, 15)
            await leader.kill()
            killed.append(leader)
            # A killed node restarts as a fresh follower (rebuilding from the log).
            index = cluster.nodes.index(leader)
            fresh = ClusterNode(
                node_id=leader.node_id, address=leader.address,
                log_=NodeLog(cluster.log, leader.node_id, cluster.appends),
                lease=cluster.leases[leader.node_id], config=BUSY, clock_ms=cluster.clock,
                sleep=cluster.clock.sleep, serving=LocalServing(),
            )  # fmt: skip
            cluster.nodes[index] = fresh
            fresh.start()
            assert round_ >= 0
        leader = await cluster.wait_leader(within_ms=3 * LEASE_TTL_MS)
        await cluster.converge(cluster.nodes)
        assert len({state_hash(n.engine.state) for n in cluster.nodes}) == 1
        epochs = epochs_by_appender(cluster)
        assert sorted(epochs) == [1, 2, 3]
        assert all(len(nodes) == 1 for nodes in epochs.values())
        times = [decode_batch(m).time_ms for m in cluster.log._messages]
        assert times == sorted(times)
    finally:
        await cluster.close()


async def test_a_follower_that_meets_a_damaged_message_stops_naming_it() -> None:
    cluster = Cluster(2)
    cluster.start()
    try:
        leader = await cluster.wait_leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        serving = leader.serving
        assert isinstance(serving, LocalServing)
        seq = await cluster.log.last()
        # A forged message appended behind the leader's back (an engine fault).
        await cluster.log.append_if(seq, b"\x00\x00\x00\x00garbage")
        await settle()

        assert follower.role == ROLE_STOPPED
        assert follower.failure is not None and f"message {seq + 1}" in str(follower.failure)
    finally:
        await cluster.close()


def test_entry_is_what_the_log_yields() -> None:
    assert Entry(1, b"x").seq == 1


class SwallowingLog(NodeLog):
    """A log whose tail ignores the first cancellation it gets (as nats-py's
    `next_msg` can on Python 3.11, where `asyncio.wait_for` loses a cancel that
    lands as its inner wait completes) and goes on tailing."""

    def __init__(self, shared: MemoryLog, node_id: str, appends: list[tuple[str, int]]) -> None:
        super().__init__(shared, node_id, appends)
        self.swallowed = 0

    async def read_from(self, seq: int) -> Any:
        source = self.shared.read_from(seq)
        while True:
            try:
                entry = await anext(source)
            except asyncio.CancelledError:
                if self.swallowed:
                    raise
                self.swallowed += 1
                source = self.shared.read_from(seq)  # the cancelled read, started again
                continue
            seq = entry.seq + 1
            yield entry


async def test_a_follower_whose_tail_ignores_a_cancellation_still_takes_over() -> None:
    cluster = Cluster()
    follower = cluster.nodes[1]
    log = SwallowingLog(cluster.log, follower.node_id, cluster.appends)
    follower.log = log
    cluster.start()
    try:
        first = await cluster.wait_leader()
        assert first is not follower  # n1 starts first and leads
        for node in cluster.nodes:
            if node is not first and node is not follower:
                await node.kill()
        await first.kill()

        second = await cluster.wait_leader(within_ms=LEASE_TTL_MS + 4 * LEASE_RENEW_MS)

        assert second is follower
        assert log.swallowed == 1
    finally:
        await cluster.close()


class FlakyBlobs(MemoryBlobStore):
    """A blob store out of reach for its first `failures` listings."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def names(self) -> list[str]:
        if self.failures:
            self.failures -= 1
            raise ReplicatedLogError("injected: the object store is out of reach")
        return await super().names()


async def test_a_node_whose_boot_meets_an_unreachable_backend_tries_again_and_leads() -> None:
    clock = ManualClock()
    blobs = FlakyBlobs(failures=2)
    node = ClusterNode(
        node_id="n1",
        address="127.0.0.1:7001",
        log_=MemoryLog(),
        lease=MemoryLease(LEASE_TTL_MS, clock),
        config=BUSY,
        clock_ms=clock,
        sleep=clock.sleep,
        serving=LocalServing(),
        blobs=blobs,
    )
    node.start()
    try:
        for _ in range(30):
            if node.role == ROLE_LEADER:
                break
            await clock.advance(100)
        assert node.role == ROLE_LEADER
        assert blobs.failures == 0
        assert node.failure is None
    finally:
        await node.kill()


class HangingBlobs(MemoryBlobStore):
    """A snapshot store that stops answering once `hang` is set (JetStream gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = False
        self._never = asyncio.Event()

    async def names(self) -> list[str]:
        if self.hang:
            await self._never.wait()
        return await super().names()


async def test_a_leader_stops_at_once_when_its_backend_no_longer_answers() -> None:
    cluster = Cluster()
    blobs = HangingBlobs()
    for node in cluster.nodes:
        node.blobs = blobs
    cluster.start()
    leader = await cluster.wait_leader()
    blobs.hang = True
    cluster.leases[leader.node_id].cut = True  # its release hangs too
    stopping = asyncio.ensure_future(leader.stop())
    await cluster.clock.advance(STOP_RELEASE_WAIT_MS + 100)
    assert stopping.done(), "the stop waits on the backend"
    await stopping
    assert leader.role == ROLE_STOPPED
    # The others take over once the lease, never released, lapses.
    others = [n for n in cluster.nodes if n is not leader]
    await cluster.clock.advance(LEASE_TTL_MS + 1_000)
    assert [n.role for n in others].count(ROLE_LEADER) == 1
    await cluster.close()
