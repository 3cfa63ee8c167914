"""Answers carrying large payloads leave as parts: each payload of at least
`messages.SPLICE_BYTES_MIN` goes to the socket as the very object the server holds,
never copied into an encoding first (a reserve of fifteen 1 MiB jobs was copied
three times on the event loop, holding every other client for 50-60 ms)."""

from __future__ import annotations

import pytest

from sepp.client._convert import job_map_of_row
from sepp.protocol import messages as pm
from sepp.server.server import SeppServer
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import connect, job, payload
from tests.support import RecordedWrites, record_server_writes

LARGE = pm.SPLICE_BYTES_MIN


def _held(server: SeppServer, job_ids: list[str]) -> list[bytes]:
    jobs = server.service.engine.state.jobs
    return [jobs[job_id].payload_data for job_id in job_ids]  # type: ignore[misc]


def _sent_uncopied(recorder: RecordedWrites, held: list[bytes]) -> bool:
    parts = [part for call in recorder.lines for part in call]
    return all(any(part is data for part in parts) for data in held)


@pytest.mark.parametrize("layout", [None, pm.JOB_LAYOUT_MAP, pm.JOB_LAYOUT_ARRAY])
async def test_a_reserve_answer_sends_the_large_payloads_it_holds_uncopied(
    layout: str | None,
) -> None:
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        datas = [bytes([i]) * (LARGE + i) for i in range(3)]
        ids = await client.enqueue_ids(*(job("big", payload=payload(d)) for d in datas))
        small = await client.enqueue_ids(job("big", payload=payload(b"small")))
        held = _held(server, ids)
        recorder = record_server_writes(server)
        answer = await client.reserve(["big"], max_jobs=4, job_layout=layout)
        # Rows in the array layout (PROTOCOL.md 5.2), maps otherwise.
        assert all(type(d) is (list if layout == pm.JOB_LAYOUT_ARRAY else dict) for d in answer)
        delivered = [job_map_of_row(d) for d in answer]
        assert [d["payload"]["data"] for d in delivered] == [*datas, b"small"]
        assert [d["id"] for d in delivered] == ids + small
        assert len(recorder.lines) == 1 and _sent_uncopied(recorder, held)
        # Small payloads only: the answer is one frame, written whole.
        await client.enqueue_ids(job("small", payload=payload(b"x" * 100)))
        assert len(await client.reserve(["small"], job_layout=layout)) == 1
        assert len(recorder.lines) == 1
        await client.close()


async def test_a_drain_answer_sends_the_large_payloads_it_holds_uncopied() -> None:
    config = in_process_config(storage__dead_letter_retention_ms="600000")
    async with in_process(config) as server:
        client = await connect(address_of(server))
        datas = [bytes([7]) * LARGE, bytes([8]) * (2 * LARGE)]
        ids = await client.enqueue_ids(*(job("dlq", payload=payload(d)) for d in datas))
        for delivered in await client.reserve(["dlq"], max_jobs=2):
            body = {"job_id": delivered["id"], "attempt": 1, "retry": "dead_letter"}
            await client.ok("nack", body)
        dead = server.service.engine.state.dead
        held = [dead[job_id].job.payload_data for job_id in ids]
        recorder = record_server_writes(server)
        answer = await client.ok("drain_dead_letters", {"queue": "dlq", "max": 10})
        assert [r["job"]["payload"]["data"] for r in answer["records"]] == datas
        assert len(recorder.lines) == 1 and _sent_uncopied(recorder, held)  # type: ignore[arg-type]
        assert not server.service.engine.state.dead
        await client.close()
