"""The client against the byte limits of client-supplied strings (issue 13, found 4):
a long nack reason is cut to fit instead of being refused (which would leave the
job to its lease), the limits are reported in `ServerInfo`, and records too large
for a drain answer stay on the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import EnqueueRequest, Payload, ReserveOptions, RetryDirective, SeppClient
from sepp.client._convert import REASON_BYTES_MAX, reason_within_limit

ServerFactory = Callable[..., Any]
LEASE = timedelta(seconds=30)
RETAIN_DEAD = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "86400000"}


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        pytest.param("short", "short", id="a short reason is sent as it is"),
        pytest.param("x" * REASON_BYTES_MAX, "x" * REASON_BYTES_MAX, id="a reason at the limit is sent whole"),
        pytest.param("x" * (REASON_BYTES_MAX + 1), "x" * (REASON_BYTES_MAX - 6) + " [cut]", id="a longer reason is cut and marked"),
        pytest.param("é" * REASON_BYTES_MAX, "é" * ((REASON_BYTES_MAX - 6) // 2) + " [cut]", id="a cut never splits a character"),
    ],
)  # fmt: skip
def test_a_nack_reason_is_cut_to_the_byte_limit_every_server_accepts(
    reason: str, expected: str
) -> None:
    cut = reason_within_limit(reason)
    assert cut == expected
    assert len(cut.encode()) <= REASON_BYTES_MAX


async def test_a_nack_with_a_huge_reason_dead_letters_the_job_with_the_reason_cut(
    server_factory: ServerFactory,
) -> None:
    server = server_factory(env=RETAIN_DEAD)
    client = await SeppClient.connect(server.address)
    info = await client.get_server_info()
    assert (info.max_reason_bytes, info.max_trace_context_bytes) == (4096, 2048)
    assert (info.max_worker_id_bytes, info.max_encoding_bytes, info.max_stats_queues) == (
        256,
        256,
        1024,
    )
    await client.enqueue(EnqueueRequest("q", "t"))
    [job] = await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(0))) or []
    assert await client.nack(job.ctx, RetryDirective.DEAD_LETTER, "boom " * 10_000) is True
    [record] = await client.drain_dead_letters("q")
    assert record.last_reason is not None
    assert record.last_reason.startswith("boom boom")
    assert record.last_reason.endswith(" [cut]")
    assert len(record.last_reason.encode()) == REASON_BYTES_MAX
    await client.close()
    assert server.stop() == 0, server.log()


async def test_a_drain_warns_of_records_too_large_for_any_answer(
    server_factory: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    frame = 16_384
    server = server_factory(
        env={
            **RETAIN_DEAD,
            "SEPP_LIMITS__MAX_MESSAGE_BYTES": str(frame),
            "SEPP_LIMITS__MAX_PAYLOAD_BYTES": str(frame),
        }
    )
    client = await SeppClient.connect(server.address)
    payload = Payload(b"x" * (frame - 600), "application/octet-stream")
    await client.enqueue(EnqueueRequest("q", "t", payload=payload))
    [job] = await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(0))) or []
    await client.nack(job.ctx, RetryDirective.DEAD_LETTER, "r" * 4000)
    with caplog.at_level(logging.WARNING, logger="sepp.client"):
        assert await client.drain_dead_letters("q", max_records=10) == []
    assert any(
        "too large for any drain answer" in r.getMessage() and job.ctx.id in r.getMessage()
        for r in caplog.records
    )
    [stats] = await client.queue_stats(["q"])
    assert stats.dead_lettered == 1
    await client.close()
    assert server.stop() == 0, server.log()
