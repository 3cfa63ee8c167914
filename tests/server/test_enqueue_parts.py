"""A large best-effort enqueue is stored in parts (sepp/server/parts.py, issue 13):
one record per part of at most ENQUEUE_PART_BYTES, each once the one before is
durable, answered once; the connection's later requests are applied after it."""

from __future__ import annotations

import asyncio
import base64
import errno
import random
from collections.abc import Callable

from sepp.cluster.logengine import new_cluster_engine
from sepp.core.commands import Enqueue, NewJob
from sepp.core.decide import Decision
from sepp.core.results import Accepted, EnqueueResult, InvalidArgument
from sepp.server.parts import (
    ENQUEUE_PART_BYTES,
    EnqueueInParts,
    batch_bytes,
    job_bytes,
    split_enqueue,
)
from sepp.server.server import EXIT_STORAGE_FAILED, SeppServer
from sepp.server.service import ShuttingDown
from sepp.storage import StorageFailed
from sepp.storage.faultfs import FaultyFileSystem
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import connect, job, payload
from tests.server.test_admin_api import admin_api
from tests.server.test_in_process import held_sync_server

# Three of these make a batch over ENQUEUE_PART_BYTES; two do not fit one part.
BIG = 700 * 1024


def _new(job_id: str, size: int, **fields: object) -> NewJob:
    return NewJob(job_id=job_id, queue="q", job_type="t", payload_data=b"x" * size, **fields)  # type: ignore[arg-type]


def test_a_batch_is_split_only_when_its_jobs_pass_the_part_size():
    small = tuple(_new(str(i), 1000) for i in range(200))
    assert split_enqueue(small, 256) is None
    assert split_enqueue((_new("a", 4 * ENQUEUE_PART_BYTES),), 256) is None  # one job
    big = tuple(_new(str(i), BIG) for i in range(5))
    parts = split_enqueue(big, 256)
    assert parts is not None and [len(p) for p in parts] == [1, 1, 1, 1, 1]
    assert [j for p in parts for j in p] == list(big)  # in order, none lost
    # A batch the core refuses whole (over max_enqueue_batch) is not split.
    assert split_enqueue(big, 4) is None


def test_parts_hold_at_most_the_part_size_unless_one_job_is_larger():
    sizes = [300_000, 300_000, 300_000, 2 * ENQUEUE_PART_BYTES, 100, 500_000, 600_000]
    jobs = tuple(_new(str(i), size) for i, size in enumerate(sizes))
    parts = split_enqueue(jobs, 256)
    assert parts is not None
    assert [[j.job_id for j in p] for p in parts] == [["0", "1", "2"], ["3"], ["4", "5"], ["6"]]
    for part in parts:
        assert len(part) == 1 or sum(map(job_bytes, part)) <= ENQUEUE_PART_BYTES
    # Trace context and idempotency keys count too.
    assert job_bytes(_new("k", 10, idempotency_key="k" * 50)) == job_bytes(_new("k", 60))


def test_the_batch_total_is_the_sum_of_its_jobs_sizes(rng: random.Random) -> None:
    # `batch_bytes` is the one-loop sum every batch enqueue pays; `job_bytes`
    # the per-job size the parts are cut by: they must agree, field by field.
    def text() -> str | None:
        return rng.choice([None, "", "é" * rng.randrange(1, 40), "k" * rng.randrange(1, 300)])

    for _ in range(500):
        jobs = tuple(
            NewJob(
                job_id=str(i),
                queue="q",
                job_type="t",
                payload_data=rng.choice([None, b"x" * rng.randrange(0, 5000)]),
                traceparent=text(),
                tracestate=text(),
                idempotency_key=text(),
            )
            for i in range(rng.randrange(1, 20))
        )
        assert batch_bytes(jobs) == sum(map(job_bytes, jobs)), jobs


def _records(server: SeppServer) -> int:
    engine = server.service.engine
    assert engine is not None
    return int(engine.stats["records"])


async def test_a_large_batch_is_one_answer_from_one_record_per_part():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        datas = [bytes([i]) * BIG for i in range(3)]
        before = _records(server)
        # Pipelined: the stats request is applied after the whole batch.
        enqueue_id = client.send(
            "enqueue", {"jobs": [job("big", payload=payload(d)) for d in datas]}
        )
        stats_id = client.send("queue_stats", {"queues": ["big"]})
        answer = await client.response(enqueue_id)
        stats = await client.response(stats_id)
        assert answer.status == "ok", answer.body
        ids = [r["job_id"] for r in answer.body["results"]]
        assert len(set(ids)) == 3 and not any(r["deduplicated"] for r in answer.body["results"])
        assert stats.status == "ok" and stats.body["queues"][0]["ready"] == 3
        assert _records(server) - before == 3  # one record per part
        delivered = await client.reserve(["big"], max_jobs=3)
        assert [d["id"] for d in delivered] == ids
        assert [d["payload"]["data"] for d in delivered] == datas
        # Atomic, or within one part: one record, as before.
        before = _records(server)
        await client.enqueue(*(job("big", payload=payload(d)) for d in datas), atomic=True)
        await client.enqueue(*(job("big", payload=payload(b"s" * 1000)) for _ in range(3)))
        assert _records(server) - before == 2
        client.assert_clean()
        await client.close()


async def test_idempotency_keys_dedup_across_the_parts_of_one_batch():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        jobs = [
            job("big", payload=payload(b"a" * BIG), idempotency_key="k1"),
            job("big", payload=payload(b"b" * BIG), idempotency_key="k2"),
            job("big", payload=payload(b"c" * BIG), idempotency_key="k1"),
        ]
        before = _records(server)
        results = (await client.enqueue(*jobs))["results"]
        # Three parts; the third, a duplicate only, logs nothing.
        assert _records(server) - before == 2
        assert results[2] == {"job_id": results[0]["job_id"], "deduplicated": True}
        assert (await client.stats("big"))["ready"] == 2
        await client.close()


async def test_shutdown_lets_a_batch_being_stored_in_parts_finish():
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        datas = [bytes([i]) * BIG for i in range(4)]
        request_id = client.send(
            "enqueue", {"jobs": [job("big", payload=payload(d)) for d in datas]}
        )
        service = server.service
        for _ in range(10_000):  # loop turns until the first part has run
            if service._parted:
                break
            await asyncio.sleep(0)
        assert service._parted, "the batch was never started in parts"
        await server.shutdown()
        answer = await client.response(request_id)
        assert answer.status == "ok", answer.body
        ids = [r["job_id"] for r in answer.body["results"]]
        assert len(ids) == 4
        jobs = service.engine.state.jobs  # type: ignore[union-attr]
        assert [jobs[i].payload_data for i in ids] == datas


async def test_the_admin_api_stores_a_large_batch_in_parts():
    async with admin_api() as api:
        datas = [bytes([i]) * BIG for i in range(3)]
        batch = {
            "jobs": [
                {
                    "job_type": "t",
                    "payload": {"data": base64.b64encode(d).decode(), "encoding": "b"},
                }
                for d in datas
            ]
        }
        before = _records(api.server)
        status, body, _ = await api.call("POST", "/queues/big/jobs", batch)
        assert status == 200, body
        assert len({r.get("job_id") for r in body["results"]}) == 3, body["results"][0]
        assert _records(api.server) - before == 3


async def test_a_storage_failure_between_parts_names_the_jobs_stored_before_it():
    fs = FaultyFileSystem()
    async with in_process(in_process_config(storage__persist_mode="sync_data"), fs) as server:
        client = await connect(address_of(server))
        await client.enqueue_ids(job("q"))  # the log exists and is synced
        fs.fail("fdatasync", errno.EIO, times=-1, after=1)  # the first part's sync passes
        jobs = [job("big", payload=payload(bytes([i]) * BIG)) for i in range(3)]
        request_id = client.send("enqueue", {"jobs": jobs})
        answer = await client.response(request_id)
        assert (answer.status, answer.body.get("reason")) == ("internal", "storage_failed")
        message = answer.body["message"]
        assert "first 1 of 3 jobs were stored" in message, message
        assert "the outcome of the next 1 is unknown; the rest were not stored" in message
        assert await asyncio.wait_for(server.wait_stopped(), 30) == EXIT_STORAGE_FAILED
    fs.clear_faults()
    fs.crash()
    async with in_process(in_process_config(storage__persist_mode="sync_data"), fs) as server:
        client = await connect(address_of(server))
        # The part synced before the failure is kept; the failed one's outcome was
        # unknown (written, never synced); the third was never run.
        ready = (await client.stats("big"))["ready"]
        assert ready in (1, 2), ready
        await client.close()


class FakeService:
    """Runs parts through a scripted `decide` and resolves barriers on demand."""

    def __init__(self, outcomes: list[object]) -> None:
        self.outcomes = outcomes  # per part: "ok", a CommandError, or an exception
        self.runs: list[tuple[tuple[str, ...], bool]] = []
        self.waiting: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        self.stop: BaseException | None = None
        self.ended = 0

    def run(self, command: Enqueue, admitted: bool = False) -> tuple[object, int]:
        self.runs.append((tuple(j.job_id for j in command.jobs), admitted))
        outcome = self.outcomes[len(self.runs) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome == "ok":
            results = tuple(Accepted(j.job_id, False) for j in command.jobs)
            return Decision((), 5, EnqueueResult(results), frozenset()), len(self.runs)
        return outcome, 0

    def after_durable(self, barrier: int, callback: Callable[..., None], *args: object) -> None:
        self.waiting.append((callback, args))

    def durable(self, error: BaseException | None = None) -> None:
        callback, args = self.waiting.pop(0)
        callback(error, *args)

    def parts_may_continue(self) -> BaseException | None:
        return self.stop

    def parts_ended(self, parted: object) -> None:
        self.ended += 1


def _parts(*sizes: int) -> list[tuple[NewJob, ...]]:
    return [tuple(_new(f"{p}.{i}", 10) for i in range(n)) for p, n in enumerate(sizes)]


def _run(service: FakeService, parts: list[tuple[NewJob, ...]]) -> list[tuple[object, object]]:
    done: list[tuple[object, object]] = []
    EnqueueInParts(service, parts, lambda e, o: done.append((e, o))).start()  # type: ignore[arg-type]
    return done


def test_parts_run_one_after_another_and_only_the_first_may_be_refused_for_backlog():
    service = FakeService(["ok", "ok", "ok"])
    done = _run(service, _parts(2, 1, 2))
    assert service.runs == [(("0.0", "0.1"), False)]  # the rest wait for its sync
    service.durable()
    service.durable()
    assert [admitted for _, admitted in service.runs] == [False, True, True]
    assert not done
    service.durable()
    ((error, outcome),) = done
    assert error is None and isinstance(outcome, Decision)
    assert [r.job_id for r in outcome.reply.results] == ["0.0", "0.1", "1.0", "2.0", "2.1"]
    assert service.ended == 1


def test_a_part_refused_whole_answers_with_the_jobs_stored_before_it():
    service = FakeService(["ok", InvalidArgument("too big for a record")])
    done = _run(service, _parts(1, 2))
    service.durable()
    service.durable()
    ((error, outcome),) = done
    assert error is None and isinstance(outcome, InvalidArgument)
    assert outcome.message == (
        "too big for a record (the batch's first 1 of 3 jobs were stored (0.0);"
        " the rest were not stored)"
    )
    # Refused at the first part: the core's refusal, unchanged.
    service = FakeService([InvalidArgument("no")])
    done = _run(service, _parts(1, 2))
    service.durable()
    assert done == [(None, InvalidArgument("no"))]


def test_a_stop_between_parts_ends_it_with_shutting_down_and_what_was_stored():
    service = FakeService(["ok", "ok"])
    done = _run(service, _parts(1, 1))
    service.stop = ShuttingDown("the server stopped while storing a batch in parts")
    service.durable()
    ((error, outcome),) = done
    assert isinstance(error, ShuttingDown) and outcome is None
    assert "first 1 of 2 jobs were stored (0.0); the rest were not stored" in str(error)
    assert len(service.runs) == 1 and service.ended == 1


async def test_another_clients_command_is_logged_between_two_parts():
    config = in_process_config(storage__persist_mode="sync_data")
    async with held_sync_server(config) as (server, held):
        client = await connect(address_of(server))
        other = await connect(address_of(server))
        held.armed = True
        big = [job("q", f"big{i}", payload=payload(bytes([i]) * BIG)) for i in range(3)]
        batch = client.send("enqueue", {"jobs": big})
        after = client.send("enqueue", {"jobs": [job("q", "after")]})
        await asyncio.to_thread(held.entered.wait, 30)
        assert held.entered.is_set()
        # The first part's sync is held. The other client's enqueue is applied
        # now, behind the first part only (health answers without a sync, after
        # the enqueue sent before it on that connection).
        between = other.send("enqueue", {"jobs": [job("q", "between")]})
        assert await other.ok("health") == {"status": "serving"}
        jobs = server.service.engine.state.jobs  # type: ignore[union-attr]
        assert sorted(j.job_type for j in jobs.values()) == ["between", "big0"]
        assert not {batch, after} & set(client.responses)  # nothing answered early
        assert between not in other.responses
        held.release.set()
        answers = [await client.response(batch), await client.response(after)]
        assert all(a.status == "ok" for a in answers), answers
        assert (await other.response(between)).status == "ok"
        delivered = await other.reserve(["q"], max_jobs=10)
        assert sorted(d["job_type"] for d in delivered) == [
            "after",
            "between",
            "big0",
            "big1",
            "big2",
        ]


async def test_cluster_mode_stores_every_batch_whole():
    # Its records are capped at one log message: a batch over it is refused whole,
    # never stored in part (tests/cluster/test_node_engine.py).
    async with in_process(in_process_config()) as server:
        service = server.service
        jobs = tuple(_new(str(i), BIG) for i in range(3))
        assert service.enqueue_parts(jobs, False) is not None  # single node: in parts
        assert service.enqueue_parts(jobs, True) is None
        single = service.engine
        service.engine = new_cluster_engine(single.state.config)  # type: ignore[union-attr]
        try:
            assert service.enqueue_parts(jobs, False) is None
        finally:
            service.engine = single


async def test_requests_held_behind_parts_are_answered_after_a_half_close():
    # A half-close means no more requests, not no more answers: the request read
    # after the batch (held while its parts are stored) is applied and answered
    # before the server closes the connection.
    async with in_process(in_process_config()) as server:
        client = await connect(address_of(server))
        big = [job("q", f"big{i}", payload=payload(bytes([i]) * BIG)) for i in range(3)]
        batch = client.send("enqueue", {"jobs": big})
        after = client.send("enqueue", {"jobs": [job("q", "after")]})
        client.half_close()
        await client.wait_closed()
        assert client.responses[batch].status == "ok"
        assert client.responses[after].status == "ok"
        assert client.responses[after].body["results"][0]["deduplicated"] is False
        assert (await _stats_of(server, "q")) == 4


async def _stats_of(server: SeppServer, queue: str) -> int:
    other = await connect(address_of(server))
    try:
        return int((await other.stats(queue))["ready"])
    finally:
        await other.close()


def test_a_storage_failure_is_reported_with_a_note_on_a_copy_of_the_shared_error():
    # The pipeline fails every waiter with one exception: the note stays on this
    # batch's copy.
    service = FakeService(["ok", "ok"])
    done = _run(service, _parts(1, 1))
    service.durable()
    shared = StorageFailed("disk gone")
    service.durable(shared)
    ((error, outcome),) = done
    assert isinstance(error, StorageFailed) and outcome is None
    assert str(error) == (
        "disk gone (the batch's first 1 of 2 jobs were stored (0.0);"
        " the outcome of the next 1 is unknown)"
    )
    assert str(shared) == "disk gone"
