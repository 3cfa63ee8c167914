"""Whole-request problems are status codes, by one table (front.status_of): one
test per row, then each code end to end as the official client meets it (NOT_FOUND
-> JobNotFound, FAILED_PRECONDITION -> AttemptMismatch / UnknownQueues with the
names, INVALID_ARGUMENT, UNAVAILABLE while shutting down, RESOURCE_EXHAUSTED,
INTERNAL).
"""

from __future__ import annotations

import asyncio
import errno

import grpc
import grpc.aio
import pytest

from sepp.core import results as r
from sepp.grpc.front import _Refused, status_of
from sepp.grpc.v1 import queue_pb2 as pb
from sepp.server.config import load_config
from sepp.server.pipeline import Overloaded
from sepp.server.server import EXIT_STORAGE_FAILED
from sepp.server.service import CommandRefused, InvalidRequest, ShuttingDown
from sepp.storage import StorageFailed
from sepp.storage.faultfs import FaultyFileSystem
from tests.grpc.conftest import (
    enqueue_one,
    grpc_address,
    grpc_server,
    job,
    lease,
    reserve,
    status_of_call,
    stub_for,
)
from tests.inprocess import DATA_DIR, in_process, in_process_config

pytestmark = pytest.mark.usefixtures("in_process_env")

S = grpc.StatusCode
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"

TABLE = [
    (r.NotFound("gone"), S.NOT_FOUND),
    (r.QueueNotFound("no queue", "q"), S.NOT_FOUND),
    (r.AttemptMismatch("moved on", 3), S.FAILED_PRECONDITION),
    (r.FailedPrecondition("queues ['x'] are not declared", ("x",)), S.FAILED_PRECONDITION),
    (r.QueueInUse("busy", "q"), S.FAILED_PRECONDITION),
    (r.PermissionDenied("viewer"), S.PERMISSION_DENIED),
    (r.InvalidArgument("bad"), S.INVALID_ARGUMENT),
    (r.TooManyIds("too many"), S.INVALID_ARGUMENT),
    (r.CommandError("??"), S.INTERNAL),
    (CommandRefused(r.NotFound("gone")), S.NOT_FOUND),
    (ShuttingDown(), S.UNAVAILABLE),
    (InvalidRequest("wait_ms must be >= 0"), S.INVALID_ARGUMENT),
    (Overloaded("the commit backlog is full"), S.RESOURCE_EXHAUSTED),
    (StorageFailed("disk on fire"), S.INTERNAL),
    (_Refused(S.UNAUTHENTICATED, "missing or unknown API key"), S.UNAUTHENTICATED),
]


@pytest.mark.parametrize(("error", "code"), TABLE, ids=[type(row[0]).__name__ for row in TABLE])
def test_each_refusal_maps_to_its_status_code(error, code):
    got, message = status_of(error)
    assert got == code
    assert message


def test_a_refusal_outside_the_table_is_a_bug_not_a_status():
    with pytest.raises(TypeError):
        status_of(RuntimeError("unexpected"))


async def test_ack_of_an_unknown_job_is_not_found_and_a_stale_attempt_is_failed_precondition():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        code, _ = await status_of_call(stub.Ack(pb.AckRequest(job_id=UNKNOWN_ID, attempt=1)))
        assert code == S.NOT_FOUND
        await enqueue_one(stub, job("q"))
        [delivered] = await reserve(stub, "q", lease_s=0.05)
        # The lease lapses; the sweep redelivers; attempt 2 now holds the job.
        again = []
        while not again:
            again = await reserve(stub, "q", wait_s=5)
        assert again[0].attempt == 2
        for call in (
            stub.Ack(pb.AckRequest(job_id=delivered.id, attempt=1)),
            stub.Nack(pb.NackRequest(job_id=delivered.id, attempt=1)),
            stub.Extend(pb.ExtendRequest(job_id=delivered.id, attempt=1, lease_duration=lease())),
        ):
            assert (await status_of_call(call))[0] == S.FAILED_PRECONDITION
        await stub.Ack(pb.AckRequest(job_id=delivered.id, attempt=2))


async def test_reserve_of_undeclared_queues_in_strict_mode_names_them(tmp_path):
    path = tmp_path / "strict.toml"
    path.write_text('[server]\nstrict_queues = true\n\n[[queues]]\nname = "known"\n')
    config = load_config(
        str(path),
        env={"SEPP_ADMIN__LISTEN_ADDR": "off", "SEPP_GRPC__LISTEN_ADDR": "127.0.0.1:0"},
        overrides={("server", "data_dir"): DATA_DIR, ("server", "listen_addr"): "127.0.0.1:0"},
    )
    async with in_process(config) as server, stub_for(grpc_address(server)) as stub:
        request = pb.ReserveRequest(queues=["known", "nope", "nada"], lease_duration=lease())
        code, message = await status_of_call(stub.Reserve(request))
    assert code == S.FAILED_PRECONDITION
    assert "nope" in message and "nada" in message


@pytest.mark.parametrize(
    "request_",
    [
        pb.ReserveRequest(queues=["q"]),  # no lease_duration
        pb.ReserveRequest(queues=[], lease_duration=lease()),
        pb.ReserveRequest(queues=["q"], lease_duration=lease(0)),
        pb.ReserveRequest(queues=["q"], lease_duration=lease(), wait_timeout=lease(-1)),
        pb.ReserveRequest(queues=["q"], lease_duration=lease(), max_jobs=0),
        pb.ReserveRequest(queues=["q"] * 33, lease_duration=lease()),
        pb.ReserveRequest(queues=["a/b"], lease_duration=lease()),
    ],
    ids=["no-lease", "no-queues", "zero-lease", "negative-wait", "zero-max-jobs", "33-queues",
         "bad-queue-name"],
)  # fmt: skip
async def test_a_malformed_reserve_is_invalid_argument(request_):
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        assert (await status_of_call(stub.Reserve(request_)))[0] == S.INVALID_ARGUMENT


async def test_other_malformed_requests_are_invalid_argument():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        calls = [
            stub.EnqueueBatch(pb.EnqueueBatchRequest()),
            stub.EnqueueAtomic(pb.EnqueueBatchRequest(jobs=[job("q")] * 257)),
            stub.Ack(pb.AckRequest(job_id="not-a-uuid", attempt=1)),
            stub.Ack(pb.AckRequest(job_id=UNKNOWN_ID, attempt=0)),
            stub.Nack(pb.NackRequest(job_id=UNKNOWN_ID, attempt=1, retry=pb.NackRetry())),
            stub.Extend(pb.ExtendRequest(job_id=UNKNOWN_ID, attempt=1)),
            stub.DrainDeadLetters(pb.DrainDeadLettersRequest(max=0)),
            stub.DrainDeadLetters(pb.DrainDeadLettersRequest(queue="")),
        ]
        for call in calls:
            assert (await status_of_call(call))[0] == S.INVALID_ARGUMENT


async def test_calls_while_the_server_shuts_down_are_unavailable():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        server.service.stopping = True  # shutdown began: no new commands
        try:
            code, _ = await status_of_call(
                stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q")]))
            )
        finally:
            server.service.stopping = False
    assert code == S.UNAVAILABLE


async def test_a_full_commit_backlog_is_resource_exhausted(monkeypatch):
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:

        def overloaded(command):
            raise Overloaded("the commit backlog is full")

        monkeypatch.setattr(server.service, "run", overloaded)
        code, _ = await status_of_call(stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q")])))
        monkeypatch.undo()
    assert code == S.RESOURCE_EXHAUSTED


async def test_a_failed_sync_answers_the_calls_waiting_for_it_internal():
    fs = FaultyFileSystem()
    config = in_process_config(grpc__listen_addr="127.0.0.1:0")
    async with in_process(config, fs) as server, stub_for(grpc_address(server)) as stub:
        await enqueue_one(stub, job("q"))
        fs.fail("fsync", errno.EIO, times=-1)
        calls = [stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q")])) for _ in range(3)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert await asyncio.wait_for(server.wait_stopped(), 30) == EXIT_STORAGE_FAILED
    codes = [o.code() for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    # Never OK: INTERNAL when the outcome is unknown (applied, maybe not on disk),
    # UNAVAILABLE when refused untouched after the failure. Each call is its own
    # HTTP/2 stream, so which one the server reaches first is not the list's order;
    # whichever it is was applied and waited for the failed sync.
    assert len(codes) == 3, outcomes
    assert S.INTERNAL in codes, codes
    assert set(codes) <= {S.INTERNAL, S.UNAVAILABLE}
