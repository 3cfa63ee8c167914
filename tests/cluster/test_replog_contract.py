"""The promises of sepp/cluster/replog.py, checked on every backend.

Each test runs twice through the `backend` fixture (tests/cluster/conftest.py):
on MemoryLog / MemoryLease / MemoryBlobStore and on the JetStream ones against a
local three-server cluster. The bodies are the same; only how a lease's TTL runs
out differs (the memory clock moves; JetStream is polled with a deadline).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from sepp.cluster.replog import AppendRefused, Entry, LeaseRecord, Purged
from tests.cluster.conftest import Backend

NODE_A = LeaseRecord("node-a", "127.0.0.1:7001", 1)
NODE_B = LeaseRecord("node-b", "127.0.0.1:7002", 2)
# How long a test waits for a tailing reader's next message.
TAIL_DEADLINE_S = 10.0


async def test_sequences_start_at_one_and_each_append_returns_the_next(backend: Backend) -> None:
    async with backend.open() as b:
        assert await b.log.last() == 0
        assert await b.log.first() == 1
        assert await b.log.append_if(0, b"one") == 1
        assert await b.log.append_if(1, b"two") == 2
        assert await b.log.last() == 2
        assert await b.log.read(1, 10) == [Entry(1, b"one"), Entry(2, b"two")]


async def test_an_append_expecting_a_stale_sequence_is_refused_and_changes_nothing(
    backend: Backend,
) -> None:
    async with backend.open() as b:
        await b.log.append_if(0, b"one")
        await b.log.append_if(1, b"two")
        for stale in (0, 1, 3):
            with pytest.raises(AppendRefused) as refused:
                await b.log.append_if(stale, b"intruder")
            assert refused.value.expected_seq == stale
            assert refused.value.last_seq == 2
        assert await b.log.last() == 2
        assert await b.log.read(1, 10) == [Entry(1, b"one"), Entry(2, b"two")]


async def test_two_writers_expecting_the_same_sequence_only_one_appends(backend: Backend) -> None:
    async with backend.open() as b:
        results = await asyncio.gather(
            b.log.append_if(0, b"a"), b.log.append_if(0, b"b"), return_exceptions=True
        )
        assert sorted(type(r).__name__ for r in results) == ["AppendRefused", "int"]
        winner = b"a" if results[0] == 1 else b"b"
        assert await b.log.read(1, 10) == [Entry(1, winner)]


async def test_pipelined_appends_each_expecting_its_predecessor_all_land_in_order(
    backend: Backend, rng: random.Random
) -> None:
    async with backend.open() as b:
        payloads = [rng.randbytes(rng.randrange(1, 2048)) for _ in range(40)]
        seqs = await asyncio.gather(*(b.log.append_if(i, p) for i, p in enumerate(payloads)))
        assert seqs == list(range(1, 41))
        assert await b.log.read(1, 100) == [Entry(i + 1, p) for i, p in enumerate(payloads)]


async def test_read_returns_at_most_limit_messages_and_nothing_past_the_tail(
    backend: Backend,
) -> None:
    async with backend.open() as b:
        for i in range(5):
            await b.log.append_if(i, b"m%d" % (i + 1))
        assert [e.seq for e in await b.log.read(2, 2)] == [2, 3]
        assert [e.seq for e in await b.log.read(4, 100)] == [4, 5]
        assert await b.log.read(6, 10) == []
        assert await b.log.read(1, 0) == []


async def test_read_from_yields_every_message_in_order_then_tails_new_ones(
    backend: Backend,
) -> None:
    async with backend.open() as b:
        for i in range(3):
            await b.log.append_if(i, b"old%d" % i)
        tail = b.log.read_from(2)
        got = [await asyncio.wait_for(anext(tail), TAIL_DEADLINE_S) for _ in range(2)]
        assert got == [Entry(2, b"old1"), Entry(3, b"old2")]
        waiting = asyncio.ensure_future(anext(tail))
        await b.log.append_if(3, b"new")
        assert await asyncio.wait_for(waiting, TAIL_DEADLINE_S) == Entry(4, b"new")
        await tail.aclose()


async def test_purge_below_drops_older_messages_and_reading_them_raises_purged(
    backend: Backend,
) -> None:
    async with backend.open() as b:
        for i in range(5):
            await b.log.append_if(i, b"m%d" % (i + 1))
        await b.log.purge_below(4)
        assert await b.log.first() == 4
        assert await b.log.last() == 5
        with pytest.raises(Purged) as purged:
            await b.log.read(2, 10)
        assert purged.value.first_seq == 4
        assert [e.seq for e in await b.log.read(4, 10)] == [4, 5]
        tail = b.log.read_from(1)
        with pytest.raises(Purged):
            await asyncio.wait_for(anext(tail), TAIL_DEADLINE_S)
        assert await b.log.append_if(5, b"m6") == 6


async def test_purge_below_past_the_tail_keeps_the_sequence_going(backend: Backend) -> None:
    async with backend.open() as b:
        await b.log.append_if(0, b"one")
        await b.log.append_if(1, b"two")
        await b.log.purge_below(100)
        assert await b.log.last() == 2
        assert await b.log.first() == 3
        assert await b.log.read(3, 10) == []
        tail = b.log.read_from(1)  # nothing left to deliver, and 1 is gone
        with pytest.raises(Purged):
            await asyncio.wait_for(anext(tail), TAIL_DEADLINE_S)
        assert await b.log.append_if(2, b"three") == 3
        assert await b.log.read(3, 10) == [Entry(3, b"three")]


async def test_only_one_node_holds_the_lease_at_a_time(backend: Backend) -> None:
    async with backend.open() as b:
        assert await b.lease.current() is None
        held = await b.lease.acquire(NODE_A)
        assert held is not None and held.record == NODE_A
        assert await b.other_lease.acquire(NODE_B) is None
        assert await b.lease.acquire(NODE_A) is None
        current = await b.other_lease.current()
        assert current is not None and current.record == NODE_A


async def test_a_renewal_succeeds_only_with_the_current_revision(backend: Backend) -> None:
    async with backend.open() as b:
        held = await b.lease.acquire(NODE_A)
        assert held is not None
        renewed = await b.lease.renew(held)
        assert renewed is not None and renewed.record == NODE_A
        assert renewed.revision > held.revision
        assert await b.lease.renew(held) is None  # the old revision lost the race
        again = await b.lease.renew(renewed)
        assert again is not None
        current = await b.other_lease.current()
        assert current is not None and current.revision == again.revision


async def test_a_lease_not_renewed_lapses_and_another_node_acquires_it(backend: Backend) -> None:
    async with backend.open(lease_ttl_s=1.0) as b:
        held = await b.lease.acquire(NODE_A)
        assert held is not None
        await b.lapse()
        assert await b.lease.renew(held) is None
        taken = await b.other_lease.acquire(NODE_B)
        assert taken is not None and taken.record == NODE_B
        current = await b.lease.current()
        assert current is not None and current.record == NODE_B


async def test_release_frees_the_lease_and_a_stale_release_changes_nothing(
    backend: Backend,
) -> None:
    async with backend.open() as b:
        held = await b.lease.acquire(NODE_A)
        assert held is not None
        await b.lease.release(held)
        assert await b.lease.current() is None
        taken = await b.other_lease.acquire(NODE_B)
        assert taken is not None
        await b.lease.release(held)  # node A's old lease: B keeps it
        current = await b.lease.current()
        assert current is not None and current.record == NODE_B


async def test_blobs_are_stored_listed_read_back_and_deleted(
    backend: Backend, rng: random.Random
) -> None:
    async with backend.open() as b:
        assert await b.blobs.names() == []
        assert await b.blobs.get("snap-1") is None
        big = rng.randbytes(300_000)
        await b.blobs.put("snap-1", big)
        await b.blobs.put("snap-2", b"small")
        assert await b.blobs.names() == ["snap-1", "snap-2"]
        assert await b.blobs.get("snap-1") == big
        await b.blobs.put("snap-2", b"replaced")
        assert await b.blobs.get("snap-2") == b"replaced"
        await b.blobs.delete("snap-1")
        await b.blobs.delete("never-there")
        assert await b.blobs.names() == ["snap-2"]
        assert await b.blobs.get("snap-1") is None
