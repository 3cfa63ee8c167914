"""A job the client cannot decode never vanishes (issue 12, section 2).

The client's stance (README "The client", PROTOCOL.md §5.2): `reserve` never
skips a delivered job it cannot decode and never turns it into an empty poll; it
raises `UndecodableJobError` carrying the raw job (id, attempt, why), leased to the
caller, plus the jobs of the same answer that did decode. `drain_dead_letters`
does the same with `UndecodableDeadLetterError` (the records are already deleted
on the server: the raw record is the last copy). The Worker dead-letters an
undecodable job at once with a reason that says why.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sepp.client import (
    JobConversionError,
    JobCtx,
    Payload,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    UndecodableDeadLetterError,
    UndecodableJobError,
    Worker,
    _convert,
)
from tests.client.fakeserver import SERVER_INFO, FakeServer, make_job, now_ms

LEASE = timedelta(seconds=30)
NO_WAIT = timedelta(0)
# One millisecond after the last instant Python's datetime can hold.
AFTER_9999_MS = 253_402_300_800_000


def _unrepresentable(job_type: str = "t") -> dict[str, Any]:
    """A job whose scheduled_at_ms no datetime can hold (year 10000)."""
    return make_job(job_type, scheduled_at_ms=AFTER_9999_MS)


def _record(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "job": job,
        "cause": "attempts_exhausted",
        "failed_at_ms": 1_764_500_000_000,
        "final_attempt": 3,
        "last_reason": "boom",
    }


# -- reserve --------------------------------------------------------------------------------


async def test_reserve_raises_for_an_undecodable_job_instead_of_an_empty_poll(
    fake: FakeServer,
) -> None:
    bad = _unrepresentable()
    async with fake:
        fake.queue.push(bad)
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UndecodableJobError) as caught:
            await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=NO_WAIT))
        (undecodable,) = caught.value.undecodable
        assert caught.value.jobs == []
        assert (undecodable.id, undecodable.attempt, undecodable.queue) == (bad["id"], 1, "q")
        assert undecodable.raw["scheduled_at_ms"] == AFTER_9999_MS
        assert "scheduled_at_ms" in undecodable.error
        assert bad["id"] in str(caught.value)
        await client.close()


@pytest.mark.parametrize("rows", [False, True], ids=["maps", "rows"])
async def test_the_decoded_jobs_of_the_same_answer_come_with_the_error(
    fake: FakeServer, rows: bool
) -> None:
    fake.queue.rows = rows
    good = make_job("good")
    bad = dict(make_job("bad"), priority=12)
    async with fake:
        fake.queue.push(bad, good)
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UndecodableJobError) as caught:
            await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=NO_WAIT, max_jobs=2))
        assert [job.ctx.id for job in caught.value.jobs] == [good["id"]]
        (undecodable,) = caught.value.undecodable
        assert (undecodable.id, undecodable.attempt, undecodable.job_type) == (bad["id"], 1, "bad")
        # A row is handed over as the map it stands for, the field names with it.
        assert undecodable.raw == bad
        assert "priority" in undecodable.error
        await client.ack(caught.value.jobs[0].ctx)  # the decoded job is leased and usable
        assert fake.queue.acked == [good["id"]]
        await client.close()


async def test_an_undecodable_job_can_be_nacked_to_the_dead_letters_with_its_reason(
    fake: FakeServer,
) -> None:
    bad = _unrepresentable()
    async with fake:
        fake.queue.push(bad)
        client = await SeppClient.connect(fake.address)
        opts = ReserveOptions(["q"], LEASE, wait_timeout=NO_WAIT, worker_id="w-7")
        with pytest.raises(UndecodableJobError) as caught:
            await client.reserve(opts)
        (undecodable,) = caught.value.undecodable
        assert await client.nack(undecodable, RetryDirective.DEAD_LETTER, reason=undecodable.reason)
        (nack,) = fake.queue.nacked
        assert (nack["job_id"], nack["attempt"], nack["retry"]) == (bad["id"], 1, "dead_letter")
        assert nack["worker_id"] == "w-7"
        assert nack["reason"].startswith("undecodable by the sepp Python client")
        assert "scheduled_at_ms" in nack["reason"]
        await client.close()


async def test_an_undecodable_job_without_an_id_cannot_be_nacked_and_says_so(
    fake: FakeServer,
) -> None:
    bad = dict(make_job(), id=None, attempt=1, lease_expires_at_ms=now_ms() + 1_000)
    async with fake:
        fake.reply("reserve", "ok", {"jobs": [bad]})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UndecodableJobError) as caught:
            await client.reserve(ReserveOptions(["q"], LEASE))
        (undecodable,) = caught.value.undecodable
        assert undecodable.id is None and undecodable.raw is not None
        with pytest.raises(ValueError, match="no readable id"):
            await client.nack(undecodable, RetryDirective.DEAD_LETTER)
        await client.close()


async def test_the_worker_dead_letters_an_undecodable_job_and_runs_the_rest(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    bad = _unrepresentable("work")
    good = make_job("work")
    seen: list[str] = []
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = Worker(client, ["q"], LEASE, wait_timeout=timedelta(seconds=5))

        @worker.handler("work")
        async def work(payload: Payload | None, ctx: JobCtx) -> None:
            seen.append(ctx.id)

        fake.queue.push(bad, good)
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.nacked) == 1 and len(fake.queue.acked) == 1)
        worker.shutdown_handle().shutdown()
        await task
        await client.close()
    (nack,) = fake.queue.nacked
    assert (nack["job_id"], nack["retry"]) == (bad["id"], "dead_letter")
    assert "scheduled_at_ms" in nack["reason"]
    assert seen == [good["id"]] and fake.queue.acked == [good["id"]]
    # The log line carries the raw job: with retention 0 it is the only copy left.
    assert any(
        r.levelno == logging.ERROR and bad["id"] in r.getMessage() and repr(bad) in r.getMessage()
        for r in caplog.records
    )


# -- drain ----------------------------------------------------------------------------------


async def test_drain_hands_over_an_undecodable_record_raw_with_the_decoded_ones(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    good = _record(make_job("good"))
    bad = _record(dict(make_job("bad"), enqueued_at_ms=-5))
    async with fake:
        fake.reply("drain_dead_letters", "ok", {"records": [bad, good]})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UndecodableDeadLetterError) as caught:
            await client.drain_dead_letters(max_records=2)
        await client.close()
    assert [r.job_id for r in caught.value.records] == [good["job"]["id"]]
    (undecodable,) = caught.value.undecodable
    assert undecodable.raw == bad
    assert (undecodable.job_id, undecodable.queue) == (bad["job"]["id"], "q")
    assert "enqueued_at_ms" in undecodable.error
    # The log keeps the whole raw record too: the server has already deleted it.
    assert any(r.levelno == logging.ERROR and repr(bad) in r.getMessage() for r in caplog.records)


async def test_drain_of_only_undecodable_records_is_not_an_empty_list(fake: FakeServer) -> None:
    bad = _record(_unrepresentable())
    async with fake:
        fake.reply("drain_dead_letters", "ok", {"records": [bad]})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UndecodableDeadLetterError) as caught:
            await client.drain_dead_letters()
        await client.close()
    assert caught.value.records == []
    assert [u.raw for u in caught.value.undecodable] == [bad]


# -- decoding the schedule ------------------------------------------------------------------


def _delivered(**fields: Any) -> dict[str, Any]:
    raw = make_job(enqueued_at_ms=1_764_500_000_000, **fields)
    raw["lease_expires_at_ms"] = 1_764_500_030_000
    return raw


@pytest.mark.parametrize(
    ("scheduled_at_ms", "expected"),
    [
        pytest.param(None, None, id="no schedule"),
        pytest.param(-5, None, id="a negative time from an older server is not scheduled"),
        pytest.param(-(2**63), None, id="the smallest 64-bit time is not scheduled"),
        pytest.param(1_764_500_000_000, None, id="the enqueue time itself is not scheduled"),
        pytest.param(
            1_764_500_001_000,
            datetime(2025, 11, 30, 10, 53, 21, tzinfo=UTC),
            id="a future time is the schedule",
        ),
        pytest.param(
            253_402_300_799_999,
            datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC),
            id="the last representable millisecond",
        ),
    ],
)
def test_a_scheduled_at_not_after_the_enqueue_time_decodes_as_not_scheduled(
    scheduled_at_ms: int | None, expected: datetime | None
) -> None:
    raw = _delivered(scheduled_at_ms=scheduled_at_ms)
    assert _convert.job_from_wire(raw).ctx.scheduled_at == expected
    record = _convert.dead_letter_from_wire(_record(raw))
    assert record.scheduled_at == expected


def test_a_scheduled_at_after_9999_is_a_conversion_error() -> None:
    with pytest.raises(JobConversionError, match="scheduled_at_ms"):
        _convert.job_from_wire(_delivered(scheduled_at_ms=AFTER_9999_MS))


def test_server_info_with_a_horizon_beyond_timedelta_decodes_as_the_largest() -> None:
    info = _convert.server_info_from_wire(dict(SERVER_INFO, max_schedule_horizon_ms=2**62))
    assert info.max_schedule_horizon == timedelta.max


async def test_the_drain_command_deletes_nothing_from_a_page_it_cannot_decode(
    fake: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # The drain writes a record before deleting it (issue 15 item 3): a page the
    # client cannot decode is written by nobody, so none of it may be deleted.
    from sepp.server.cli import main

    def info(job: dict[str, Any]) -> dict[str, Any]:
        return {**job, "state": "dead_letter", "dead_letter_cause": "attempts_exhausted"}

    good = info(make_job("good"))
    bad = {**info(make_job("bad")), "priority": "high"}  # no JobInfo can hold it
    async with fake:
        fake.reply("list_jobs", "ok", {"jobs": [bad, good], "next_cursor": None})
        argv = ["dead-letters", "drain", "--addr", fake.address, "--queue", "q", "--max", "2"]
        code = await asyncio.to_thread(main, argv)
        deletes = fake.ops("delete_dead_letters")
    out, err = capsys.readouterr()
    assert code == 1
    assert deletes == []
    assert out == "" and "priority" in err
