"""The periodic refreeze does not pause a busy server (gcpolicy.RefreezeSchedule).

A full refreeze sweeps the heap and gives free pages back; measured on jemalloc on
a slow VM, the sweep took 19-89 ms and one purge after a burst of large jobs 105 ms,
every 5 s, under load: the p99 of every client (issue 13's snapshot-large probe, 61-95
ms against a 50 ms target). Now a refreeze is full only after a quiet interval or
once a minute, and the release runs on a thread."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

import pytest

from sepp.server import gcpolicy
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import RawClient, job
from tests.server.test_free_memory import _frozen_cycle, _Node

QUIET = gcpolicy.QUIET_ACTIVITY_MAX
EVERY = gcpolicy.FREEZE_INTERVAL_S


def test_a_refreeze_that_is_not_full_only_freezes() -> None:
    released: list[int] = []
    frozen_ref = _frozen_cycle()
    young = _Node()
    young_ref = weakref.ref(young)
    del young
    try:
        done = gcpolicy.refreeze(
            sweep_blocks_max=10**12, full=False, release=lambda: released.append(1)
        )
        assert done == gcpolicy.DEFERRED
        assert released == []
        assert frozen_ref() is not None and young_ref() is not None  # nothing collected

        done = gcpolicy.refreeze(sweep_blocks_max=10**12, release=lambda: released.append(1))
        assert done == gcpolicy.SWEPT
        assert released == [1]
        assert frozen_ref() is None and young_ref() is None
    finally:
        gc.unfreeze()


def test_the_schedule_is_full_after_a_quiet_interval_and_at_least_once_a_minute() -> None:
    schedule = gcpolicy.RefreezeSchedule(now=0.0, activity=0)
    assert schedule.full(EVERY, QUIET)  # quiet: at most QUIET_ACTIVITY_MAX
    activity, now, fulls = QUIET, EVERY, []
    # Busy from here on: each interval well above the quiet mark.
    while now < 3 * gcpolicy.FULL_REFREEZE_MAX_S:
        now += EVERY
        activity += 50 * QUIET
        fulls.append((now, schedule.full(now, activity)))
    full_at = [at for at, full in fulls if full]
    gaps = [b - a for a, b in zip([EVERY, *full_at], full_at, strict=False)]
    assert full_at, fulls
    assert all(gap == pytest.approx(gcpolicy.FULL_REFREEZE_MAX_S) for gap in gaps), gaps
    # A busy interval soon after a full refreeze is not full; the first quiet one
    # after it is, whenever it comes.
    burst = gcpolicy.RefreezeSchedule(now=0.0, activity=0)
    assert not burst.full(EVERY, QUIET + 1)
    assert burst.full(2 * EVERY, 2 * QUIET + 1)


@pytest.mark.usefixtures("in_process_env")
async def test_the_server_defers_its_refreeze_while_busy_and_releases_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bool] = []
    release_threads: list[int] = []
    released = threading.Event()
    refreeze = gcpolicy.refreeze

    def recording_refreeze(*args: Any, **kwargs: Any) -> str:
        calls.append(kwargs["full"])
        return refreeze(*args, **kwargs)

    def recording_release() -> bool:
        release_threads.append(threading.get_ident())
        released.set()
        return True

    monkeypatch.setattr(gcpolicy, "refreeze", recording_refreeze)
    monkeypatch.setattr(gcpolicy, "release_free_memory", recording_release)
    loop = asyncio.get_running_loop()
    async with in_process(in_process_config()) as server:
        # The refreeze at startup is full, and its release ran on another thread.
        assert calls == [True]
        assert await loop.run_in_executor(None, released.wait, 30)
        assert release_threads and threading.get_ident() not in release_threads

        client = await RawClient.connect(address_of(server))
        await client.hello()
        # Each enqueue logs an event (request metrics are off here: events alone).
        for i in range(2 * QUIET):
            await client.enqueue_ids(job(f"busy-{i % 3}"))
        server._schedule_refreeze()  # what the timer calls
        assert calls == [True, False]  # busy: frozen only
        server._schedule_refreeze()
        assert calls == [True, False, True]  # quiet again: full
        await client.close()
