"""Replies only after durability, under gRPC load: a real `sepp serve` takes
single-job enqueues from concurrent callers over gRPC, is killed with SIGKILL (by
PID) at a seeded moment while calls are in flight, and restarted on the same data
directory: every enqueue that was answered is there, exactly once.

Snapshots are taken every 8 KiB of log meanwhile: each forks the server while
grpc.aio runs in it (gRPC's fork support is off: sepp/grpc/__init__.py), and the
restart must come back from them.
"""

from __future__ import annotations

import asyncio
import random

import grpc
import grpc.aio

from sepp.grpc.v1 import queue_pb2 as pb
from tests.grpc.conftest import Stub, job, reserve, stub_for

CALLERS = 20


async def snapshot_published(server) -> None:  # type: ignore[no-untyped-def]
    while "published in" not in server.log():
        await asyncio.sleep(0.05)


async def test_every_answered_enqueue_survives_a_kill_9_under_grpc_load(
    grpc_process, tmp_path, seed, rng: random.Random
):
    kill_after = rng.randint(150, 600)
    print(f"SEPP_SEED={seed}: SIGKILL after {kill_after} answered enqueues")
    data_dir = tmp_path / "data"
    server, address = grpc_process(
        data_dir=data_dir, env={"SEPP_STORAGE__SNAPSHOT_EVERY_BYTES": "8192"}
    )
    acked: list[str] = []
    enough = asyncio.Event()

    async def caller(stub: Stub, number: int) -> None:
        sent = 0
        while True:
            sent += 1
            request = pb.EnqueueBatchRequest(
                jobs=[job("durable", custom={"caller": pb.PrimitiveValue(int_value=number)})]
            )
            try:
                response = await stub.EnqueueBatch(request, timeout=30)
            except grpc.aio.AioRpcError:
                return  # the server is gone: this call's outcome is unknown
            acked.append(response.results[0].success.job_id)
            if len(acked) >= kill_after:
                enough.set()

    async with stub_for(address) as stub:
        callers = [asyncio.ensure_future(caller(stub, n)) for n in range(CALLERS)]
        await asyncio.wait_for(enough.wait(), 120)
        # The restart must come back from a snapshot taken under this load: on a
        # busy machine the first one may still be writing, so the callers keep
        # going until one is published (polled, with a deadline).
        await asyncio.wait_for(snapshot_published(server), 120)
        server.kill()  # SIGKILL by PID, enqueues in flight
        await asyncio.wait_for(asyncio.gather(*callers), 60)
    answered = list(acked)
    assert len(answered) >= kill_after

    restarted, address = grpc_process(data_dir=data_dir)
    found: list[str] = []
    async with stub_for(address) as stub:
        while True:
            jobs = await reserve(stub, "durable", max_jobs=256)
            if not jobs:
                break
            found.extend(j.id for j in jobs)
    assert len(found) == len(set(found)), "a job is there twice"
    missing = set(answered) - set(found)
    assert not missing, f"{len(missing)} answered enqueue(s) lost (SEPP_SEED={seed})"
    assert restarted.stop() == 0, restarted.log()
