"""benchmarks/bound_leader.py, the bound `bench_cluster --bound` measures against:
it must do what its figure claims, append every request's frame, as it came, to
its stream before answering it, or its rate bounds nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import loadgen
from sepp.cluster import jetstream
from tests.cluster.conftest import unique_name
from tools.cluster import JetStreamCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("options", [[], ["--colocate"]], ids=["any server", "colocated"])
async def test_the_bound_leader_answers_a_request_once_its_frame_is_in_the_stream(
    jetstream_cluster: JetStreamCluster, options: list[str]
) -> None:
    stream = unique_name("bound")
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bound_leader",
         "--nats", ",".join(jetstream_cluster.urls()),
         "--monitor", ",".join(jetstream_cluster.monitor_urls()),
         "--stream", stream, "--appends-in-flight", "4", *options],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    nc = await jetstream.connect(jetstream_cluster.urls())
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("bound leader listening on 127.0.0.1:"), line
        conn = await loadgen.connect("127.0.0.1", int(line.rsplit(":", 1)[1]))
        log = jetstream.JetStreamLog(nc, stream)
        sent: list[bytes] = []

        async def call(op: str, body: dict[str, object]) -> object:
            rid = conn.next_id
            answer = await conn.call(op, body)
            sent.append(loadgen._pack([rid, op, body]))
            # Answered: every frame sent so far is in the stream, in order.
            entries = await log.read(1, 1000)
            frames = b"".join(entry.data for entry in entries)
            assert frames == b"".join(sent)
            return answer

        enqueued = await call("enqueue", {"jobs": [loadgen._job("q"), loadgen._job("q")]})
        assert enqueued == {"job_ids": [1, 2]}
        reserved = await call("reserve", {"queues": ["q"], "lease_ms": 1000, "wait_ms": 0})
        assert reserved == {"jobs": [{"id": 1, "attempt": 1}]}
        assert await call("ack", {"job_id": 1, "attempt": 1}) == {}
        # Several requests outstanding at once go out together, still in order.
        first_id = conn.next_id
        bodies = [{"jobs": [loadgen._job("q")]} for _ in range(5)]
        answers = await asyncio.gather(*(conn.call("enqueue", body) for body in bodies))
        assert answers == [{"job_ids": [n]} for n in range(3, 8)]
        sent += [loadgen._pack([first_id + i, "enqueue", body]) for i, body in enumerate(bodies)]
        entries = await log.read(1, 1000)
        assert b"".join(entry.data for entry in entries) == b"".join(sent)
        # The first message is the empty one it appended before serving.
        assert entries[0].data == b""
        assert conn.transport is not None
        conn.transport.close()
    finally:
        await nc.close()
        proc.terminate()
        proc.wait(10)
