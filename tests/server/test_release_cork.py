"""The answers one durable release sends a connection leave in one write
(`ReleaseCork`, sepp/server/pipeline.py)."""

from __future__ import annotations

import asyncio

from sepp.protocol import messages as pm
from sepp.server.pipeline import ReleaseCork
from tests.inprocess import address_of, in_process_config
from tests.server.conftest import connect, job
from tests.server.test_in_process import held_sync_server
from tests.support import RecordedWrites, record_server_writes


def _answer_ids(recorded: RecordedWrites) -> list[list[int]]:
    return [[pm.decode_response(frame).id for frame in call] for call in recorded.frames()]


async def test_the_answers_of_one_group_commit_leave_a_connection_in_one_write() -> None:
    config = in_process_config(storage__persist_mode="sync_data")
    async with held_sync_server(config) as (server, held):
        client = await connect(address_of(server))
        held.armed = True
        first = client.send("enqueue", {"jobs": [job("q", "first")]})
        await asyncio.to_thread(held.entered.wait, 30)
        assert held.entered.is_set()
        # The first record's sync is held: these two are applied now and wait for
        # the next group commit together (health answers without a sync, after both).
        second = client.send("enqueue", {"jobs": [job("q", "second")]})
        third = client.send("enqueue", {"jobs": [job("q", "third")]})
        assert await client.ok("health") == {"status": "serving"}
        recorded = record_server_writes(server)
        held.release.set()
        for request_id in (first, second, third):
            assert (await client.response(request_id)).status == "ok"
        # One write for the first commit's answer, one for the next commit's two.
        assert _answer_ids(recorded) == [[first], [second, third]]
        await client.close()


class Kept:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def uncork(self) -> None:
        self.log.append(self.name)


def test_a_cork_writes_what_it_held_once_the_outermost_release_ends() -> None:
    cork = ReleaseCork()
    log: list[str] = []
    assert not cork.active
    cork.begin()
    cork.hold(Kept("a", log))
    cork.begin()  # a release inside a release: still held at its end
    cork.hold(Kept("b", log))
    cork.end()
    assert cork.active and log == []
    cork.end()
    assert not cork.active and log == ["a", "b"]
    # Each hold is written once: a later release starts empty.
    cork.begin()
    cork.end()
    assert log == ["a", "b"]
