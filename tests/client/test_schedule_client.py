"""The schedule operations end to end (issue 17): the async and sync clients
against the in-process server over the native protocol (PROTOCOL.md 5.28-5.32).
A put / list / pause / resume / delete round, the role refusals, an unknown
schedule, and a bad cron or unknown time zone refused naming the field.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from sepp.client import SeppClient, SyncSeppClient
from sepp.client.errors import (
    InvalidRequestError,
    PermissionDeniedError,
    ScheduleNotFoundError,
)
from sepp.server.native_admin import schedule_field
from sepp.server.service import Principal
from tests.inprocess import address_of, in_process, in_process_config

pytestmark = pytest.mark.usefixtures("in_process_env")

EVERY_MS = 60_000


async def test_a_schedule_is_put_listed_with_its_next_fire_time_paused_resumed_and_deleted():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        put = await client.put_schedule(
            "digest",
            "emails",
            "send_digest",
            cron="0 2 * * *",
            timezone="Europe/Berlin",
            payload="{}",
            encoding="application/json",
            catch_up="all",
            reason="test",
        )
        assert put.name == "digest" and put.created and put.changed and not put.paused
        assert put.next_ms is not None
        (info,) = await client.list_schedules()
        assert info.name == "digest" and info.queue == "emails"
        assert info.job_type == "send_digest" and info.cron == "0 2 * * *"
        assert info.timezone == "Europe/Berlin" and info.every_ms is None
        assert info.catch_up == "all" and info.payload_encoding == "application/json"
        assert info.next_ms == put.next_ms
        assert info.next_fire_at == datetime.fromtimestamp(put.next_ms / 1000, UTC)
        assert info.next_fire_at > datetime.now(UTC)
        again = await client.put_schedule(
            "digest", "emails", "send_digest", cron="0 2 * * *", timezone="Europe/Berlin",
            payload="{}", encoding="application/json", catch_up="all",
        )  # fmt: skip
        assert not again.created and again.next_ms == put.next_ms
        paused = await client.pause_schedule("digest")
        assert paused.paused and paused.changed
        assert (await client.list_schedules())[0].paused
        resumed = await client.resume_schedule("digest")
        assert not resumed.paused and resumed.changed
        deleted = await client.delete_schedule("digest")
        assert deleted.name == "digest" and deleted.next_ms is None
        assert await client.list_schedules() == []
        await client.close()


async def test_an_every_ms_schedule_fires_its_next_tick_one_interval_after_its_creation():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        put = await client.put_schedule("tick", "q", "t", every_ms=EVERY_MS)
        (info,) = await client.list_schedules()
        assert info.every_ms == EVERY_MS and info.cron is None and info.catch_up == "one"
        assert put.next_ms == info.next_ms
        assert info.next_ms - int(info.created_at.timestamp() * 1000) == EVERY_MS
        await client.close()


async def test_an_unknown_schedule_is_refused_with_a_typed_error_naming_it():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        for call in (client.pause_schedule, client.resume_schedule, client.delete_schedule):
            with pytest.raises(ScheduleNotFoundError) as caught:
                await call("nope")
            assert caught.value.schedule == "nope"
        await client.close()


async def test_a_bad_cron_is_refused_with_an_invalid_request_naming_the_cron_field():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        with pytest.raises(InvalidRequestError) as caught:
            await client.put_schedule("s", "q", "t", cron="61 * * * *")
        assert caught.value.field == "cron"
        assert await client.list_schedules() == []
        await client.close()


async def test_an_unknown_time_zone_is_refused_with_an_invalid_request_naming_timezone():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        with pytest.raises(InvalidRequestError) as caught:
            await client.put_schedule("s", "q", "t", cron="0 * * * *", timezone="Mars/Olympus")
        assert caught.value.field == "timezone"
        assert "Mars/Olympus" in str(caught.value)
        await client.close()


async def test_neither_cron_nor_every_ms_is_refused_without_naming_one_field():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        with pytest.raises(InvalidRequestError) as caught:
            await client.put_schedule("s", "q", "t")
        assert caught.value.field is None
        await client.close()


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("cron '61 * * * *': minute 61 out of range", "cron"),
        ("unknown time zone 'Mars/Olympus'", "timezone"),
        ("timezone must be a name of 1..64 bytes", "timezone"),
        ("every_ms must be an integer 1000..31536000000", "every_ms"),
        ("catch_up must be one of ['none', 'one', 'all']", "catch_up"),
        ("a schedule needs exactly one of cron and every_ms", None),
    ],
)
def test_schedule_field_names_the_field_a_refusal_is_about(message: str, field: str | None):
    assert schedule_field(message) == field


async def test_a_viewer_may_list_schedules_an_operator_may_pause_but_only_an_admin_may_put():
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        await client.put_schedule("s", "q", "t", every_ms=EVERY_MS)
        for conn in server.connections:
            conn.principal = Principal("eve", "viewer")
        assert [s.name for s in await client.list_schedules()] == ["s"]
        with pytest.raises(PermissionDeniedError):
            await client.pause_schedule("s")
        for conn in server.connections:
            conn.principal = Principal("olga", "operator")
        assert (await client.pause_schedule("s")).paused
        assert not (await client.resume_schedule("s")).paused
        with pytest.raises(PermissionDeniedError):
            await client.put_schedule("s2", "q", "t", every_ms=EVERY_MS)
        with pytest.raises(PermissionDeniedError):
            await client.delete_schedule("s")
        assert [s.name for s in await client.list_schedules()] == ["s"]
        await client.close()


async def test_the_sync_client_has_the_schedule_methods():
    async with in_process(in_process_config()) as server:
        address = address_of(server)
        results: dict[str, object] = {}

        def run() -> None:
            with SyncSeppClient.connect(address) as client:
                results["put"] = client.put_schedule("s", "q", "t", every_ms=EVERY_MS)
                results["pause"] = client.pause_schedule("s")
                results["resume"] = client.resume_schedule("s")
                results["list"] = client.list_schedules()
                results["delete"] = client.delete_schedule("s")

        thread = threading.Thread(target=run)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        thread.join()
        assert results["put"].created  # type: ignore[attr-defined]
        assert results["pause"].paused  # type: ignore[attr-defined]
        assert not results["resume"].paused  # type: ignore[attr-defined]
        assert [s.name for s in results["list"]] == ["s"]  # type: ignore[attr-defined]
        assert results["delete"].next_ms is None  # type: ignore[attr-defined]
