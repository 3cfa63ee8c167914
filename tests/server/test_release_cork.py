"""The answers one durable release sends a connection leave together, two per
write (`ReleaseCork`, sepp/server/pipeline.py; `CORKED_ANSWERS_MAX`)."""

from __future__ import annotations

import asyncio

import pytest

from sepp.protocol import messages as pm
from sepp.server.pipeline import ReleaseCork
from sepp.server.server import CORKED_ANSWERS_MAX
from tests.inprocess import address_of, in_process_config
from tests.server.conftest import connect, job
from tests.server.test_in_process import held_sync_server
from tests.support import RecordedWrites, record_server_writes


def _answer_ids(recorded: RecordedWrites) -> list[list[int]]:
    return [[pm.decode_response(frame).id for frame in call] for call in recorded.frames()]


async def test_the_answers_of_one_group_commit_leave_a_connection_in_writes_of_two() -> None:
    config = in_process_config(storage__persist_mode="sync_data")
    async with held_sync_server(config) as (server, held):
        client = await connect(address_of(server))
        held.armed = True
        first = client.send("enqueue", {"jobs": [job("q", "first")]})
        await asyncio.to_thread(held.entered.wait, 30)
        assert held.entered.is_set()
        # The first record's sync is held: these are applied now and wait for the
        # next group commit together (health answers without a sync, after them).
        later = [client.send("enqueue", {"jobs": [job("q", f"job{i}")]}) for i in range(5)]
        assert await client.ok("health") == {"status": "serving"}
        recorded = record_server_writes(server)
        held.release.set()
        for request_id in (first, *later):
            assert (await client.response(request_id)).status == "ok"
        # One write for the first commit's answer; the next commit's five leave in
        # writes of CORKED_ANSWERS_MAX (2) answers each, in the order answered.
        assert CORKED_ANSWERS_MAX == 2
        assert _answer_ids(recorded) == [[first], later[0:2], later[2:4], later[4:]]
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


class Broken(Kept):
    def uncork(self) -> None:
        super().uncork()
        raise RuntimeError("write failed")


def test_every_held_connection_is_written_even_after_one_write_raises() -> None:
    cork = ReleaseCork()
    log: list[str] = []
    cork.begin()
    for held in (Kept("a", log), Broken("b", log), Kept("c", log)):
        cork.hold(held)
    with pytest.raises(RuntimeError, match="write failed"):
        cork.end()
    assert log == ["a", "b", "c"] and not cork.active
