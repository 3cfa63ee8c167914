"""The blocking client: the same operations as plain calls, safe from many
threads at once over one connection."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from sepp.client import (
    ClientClosedError,
    EnqueueRequest,
    JobRejectedError,
    OverloadedError,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    SyncSeppClient,
    UnauthenticatedError,
)
from tests.client.fakeserver import SERVER_INFO, ThreadedFakeServer, error, make_job

LEASE = timedelta(seconds=30)
THREADS = 8
CALLS_PER_THREAD = 25


def enqueue_echo(conn, request):
    """Answer each enqueue with a job id naming the job's type."""
    results = [{"job_id": j["job_type"], "deduplicated": False} for j in request.body["jobs"]]
    return "ok", {"results": results}


def test_many_threads_share_one_client_and_one_connection() -> None:
    with ThreadedFakeServer() as fake:
        fake.call(lambda s: s.on("enqueue", enqueue_echo))
        with SyncSeppClient.connect(fake.server.address) as client:

            def work(thread: int) -> list[str]:
                return [
                    client.enqueue(EnqueueRequest("q", f"t{thread}-{i}")).job_id
                    for i in range(CALLS_PER_THREAD)
                ]

            with ThreadPoolExecutor(THREADS) as pool:
                results = list(pool.map(work, range(THREADS)))
            for thread, ids in enumerate(results):
                assert ids == [f"t{thread}-{i}" for i in range(CALLS_PER_THREAD)]
            assert fake.call(lambda s: len(s.connections)) == 1
            assert fake.call(lambda s: len(s.ops("enqueue"))) == THREADS * CALLS_PER_THREAD


def test_the_consumer_calls_work_from_a_thread() -> None:
    with ThreadedFakeServer() as fake:
        fake.call(lambda s: s.queue.push(make_job("a"), make_job("b"), make_job("c")))
        fake.call(lambda s: s.reply("server_info", "ok", SERVER_INFO))
        with SyncSeppClient.connect(fake.server.address) as client:
            jobs = client.reserve(ReserveOptions(["q"], LEASE, max_jobs=3))
            assert jobs is not None and len(jobs) == 3
            # The Job instead of its ctx: a TypeError naming the fix, and nothing sent.
            for call in (client.ack, client.nack, client.release):
                with pytest.raises(TypeError, match=r"got Job \(pass job\.ctx\)"):
                    call(jobs[0])
            with pytest.raises(TypeError, match=r"got Job \(pass job\.ctx\)"):
                client.extend(jobs[0], LEASE)
            assert fake.call(lambda s: [r.op for r in s.requests]) == ["hello", "reserve"]
            client.extend(jobs[0].ctx, timedelta(minutes=1))
            client.ack(jobs[0].ctx)
            assert client.nack(jobs[1].ctx, RetryDirective.DEAD_LETTER, "bad") is True
            assert client.nack(jobs[2].ctx) is False
            assert client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(0))) is None
            assert client.get_server_info().version == "0.1.0"
            assert client.health().serving
        assert fake.call(lambda s: len(s.queue.acked)) == 1


def test_errors_surface_in_the_calling_thread() -> None:
    with ThreadedFakeServer() as fake:
        fake.call(lambda s: s.reply("queue_stats", *error("resource_exhausted", "busy")))
        fake.call(
            lambda s: s.reply(
                "enqueue",
                "ok",
                {
                    "results": [
                        {
                            "rejection": {
                                "reason": "queue_full",
                                "message": "m",
                                "queue": "q",
                                "limit": 1,
                            }
                        }
                    ]
                },
            )
        )
        with SyncSeppClient.connect(fake.server.address) as client:
            with pytest.raises(OverloadedError):
                client.queue_stats(["q"])
            with pytest.raises(JobRejectedError):
                client.enqueue(EnqueueRequest("q", "t"))


def test_connect_failures_raise_and_leave_no_thread_behind() -> None:
    before = threading.active_count()
    with ThreadedFakeServer(api_key="k") as fake, pytest.raises(UnauthenticatedError):
        SyncSeppClient.connect(fake.server.address, api_key="wrong")
    assert threading.active_count() <= before


def test_calls_after_close_raise_client_closed() -> None:
    with ThreadedFakeServer() as fake:
        client = SyncSeppClient.connect(fake.server.address)
        client.close()
        client.close()
        assert client.closed
        with pytest.raises(ClientClosedError):
            client.health()


def test_the_async_client_underneath_is_exposed() -> None:
    with ThreadedFakeServer() as fake, SyncSeppClient(fake.server.address) as client:
        assert isinstance(client.async_client, SeppClient)
        assert client.health().serving  # lazily connected on the first call
