"""`storage.sync_method`: who syncs each group commit.

`thread` is the storage engine's flushing thread; `aio` (`LoopCommitter`) has the
loop thread write each batch and Linux AIO sync it. These tests hold the AIO
promises to the same standard as the thread's: no reply before its sync
completed, one sync in flight with the next batch gathering behind it, a failed
sync fails storage for good, stop waits for the sync in flight and flushes the
rest, and `auto` / `aio` resolve (or are refused) as documented.

Most tests drive `CommitPipeline` on a real engine in a temporary directory with
`HeldAio`, a stand-in for `AioSync` whose completions the test releases by hand
(through a real eventfd, so the loop wakes exactly as it would). Waits are loop
turns and futures with deadlines, never sleeps.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sepp.core.errors import ConfigError
from sepp.server import pipeline as pipeline_module
from sepp.server.pipeline import CommitPipeline, resolve_sync_method
from sepp.storage import Engine, StorageFailed, StorageOptions
from sepp.storage.aio import aio_unavailable
from tests.server.conftest import connect, job, payload
from tests.storage.helpers import CONFIG, T0, enqueue_one

WAIT_S = 20.0
needs_aio = pytest.mark.skipif(aio_unavailable() is not None, reason=str(aio_unavailable()))


class HeldAio:
    """AioSync's face; each submitted sync completes only when the test says."""

    def __init__(self) -> None:
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.submitted: list[tuple[int, bool, int]] = []  # (fd, datasync, token)
        self.refuse: OSError | None = None
        self._done: list[tuple[int, int]] = []
        self.in_flight = 0
        self.closed = False

    def submit(self, fd: int, datasync: bool, token: int) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append((fd, datasync, token))
        self.in_flight += 1

    def complete(self, result: int = 0) -> None:
        """The oldest sync in flight finishes with `result` (0 or -errno)."""
        assert self.in_flight, "no sync in flight"
        token = self.submitted[len(self.submitted) - self.in_flight][2]
        self._done.append((token, result))
        self.in_flight -= 1
        os.eventfd_write(self.eventfd, 1)

    def reap(self, wait: bool = False) -> list[tuple[int, int]]:
        done, self._done = self._done, []
        return done

    def close(self) -> list[tuple[int, int]]:
        assert self.in_flight == 0, "closed with a sync in flight"
        self.closed = True
        os.close(self.eventfd)
        return self.reap()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    opened = Engine.open(str(tmp_path / "data"), CONFIG, StorageOptions(persist_mode="sync_data"))
    yield opened
    if not opened.closed:
        opened.close()


def started(engine: Engine, aio: HeldAio) -> CommitPipeline:
    pipeline = CommitPipeline(engine, clock=lambda: T0)
    pipeline.start("aio", aio_factory=lambda: aio)  # type: ignore[arg-type, return-value]
    return pipeline


def submit(pipeline: CommitPipeline, n: int) -> asyncio.Future[None]:
    _decision, barrier = pipeline.execute(enqueue_one(n))
    future = pipeline.durable(barrier)
    assert future is not None
    return future


async def turns(count: int = 3) -> None:
    """Let the loop run a few turns (scheduled wakes, eventfd callbacks)."""
    for _ in range(count):
        await asyncio.sleep(0)


# ---------------------------------------------------------------- resolving the setting


def test_resolve_sync_method() -> None:
    assert resolve_sync_method("thread", "sync_data", real_fs=True) == "thread"
    # auto never fails: the thread wherever AIO cannot or need not run.
    assert resolve_sync_method("auto", "buffer", real_fs=True) == "thread"
    assert resolve_sync_method("auto", "sync_all", real_fs=False) == "thread"
    expected = "aio" if aio_unavailable() is None else "thread"
    assert resolve_sync_method("auto", "sync_data", real_fs=True) == expected
    for persist_mode, real_fs, why in [
        ("buffer", True, "buffer"),
        ("sync_data", False, "real file system"),
    ]:
        with pytest.raises(ConfigError) as refused:
            resolve_sync_method("aio", persist_mode, real_fs=real_fs)
        assert refused.value.key == "storage.sync_method"
        assert why in str(refused.value)
    with pytest.raises(ConfigError):
        resolve_sync_method("io_uring", "sync_data", real_fs=True)


def test_aio_where_linux_aio_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_module, "aio_unavailable", lambda: "io_setup failed: ENOSYS")
    assert resolve_sync_method("auto", "sync_data", real_fs=True) == "thread"
    with pytest.raises(ConfigError, match="ENOSYS"):
        resolve_sync_method("aio", "sync_data", real_fs=True)


# ---------------------------------------------------------------- the loop committer


@pytest.mark.parametrize(("persist_mode", "datasync"), [("sync_data", True), ("sync_all", False)])
async def test_no_reply_before_its_sync_and_the_next_batch_waits_behind_it(
    tmp_path: Path, persist_mode: str, datasync: bool
) -> None:
    engine = Engine.open(str(tmp_path / "d"), CONFIG, StorageOptions(persist_mode=persist_mode))
    aio = HeldAio()
    pipeline = started(engine, aio)
    first = [submit(pipeline, n) for n in range(3)]
    await turns()
    # One write of the three records and one sync of the log file, in flight.
    assert [(d, token) for _fd, d, token in aio.submitted] == [(datasync, 3)]
    assert engine.stats["flushes"] == 1 and engine.durable_seq == 0
    assert not any(f.done() for f in first)
    second = [submit(pipeline, n) for n in range(3, 5)]
    await turns()
    assert len(aio.submitted) == 1  # one sync in flight: the batch gathers behind it
    aio.complete()
    await asyncio.wait_for(asyncio.gather(*first), WAIT_S)
    assert engine.durable_seq == 3
    assert not any(f.done() for f in second)
    await turns()
    assert [token for _fd, _d, token in aio.submitted] == [3, 5]  # the next batch, at once
    aio.complete()
    await asyncio.wait_for(asyncio.gather(*second), WAIT_S)
    assert engine.durable_seq == 5
    await pipeline.stop()
    assert aio.closed
    engine.close()


async def test_a_failed_sync_fails_every_waiter_and_storage_for_good(engine: Engine) -> None:
    aio = HeldAio()
    pipeline = started(engine, aio)
    waiting = [submit(pipeline, n) for n in range(4)]
    await turns()
    behind = submit(pipeline, 4)  # gathered behind the failing sync
    aio.complete(-errno.EIO)
    for future in [*waiting, behind]:
        with pytest.raises(StorageFailed, match="Input/output error"):
            await asyncio.wait_for(future, WAIT_S)
    assert engine.durable_seq == 0 and engine.failure is not None
    with pytest.raises(StorageFailed):
        pipeline.execute(enqueue_one(9))
    assert len(aio.submitted) == 1  # never retried (fsyncgate)
    await asyncio.wait_for(pipeline.stop(), WAIT_S)
    assert aio.closed


async def test_a_sync_that_cannot_be_queued_fails_storage(engine: Engine) -> None:
    aio = HeldAio()
    aio.refuse = OSError(errno.EINVAL, "io_submit: Invalid argument")
    pipeline = started(engine, aio)
    future = submit(pipeline, 0)
    with pytest.raises(StorageFailed, match="Invalid argument"):
        await asyncio.wait_for(future, WAIT_S)
    assert engine.failure is not None and pipeline.failure is not None
    await asyncio.wait_for(pipeline.stop(), WAIT_S)


async def test_stop_waits_for_the_sync_in_flight_then_flushes_the_rest(engine: Engine) -> None:
    aio = HeldAio()
    pipeline = started(engine, aio)
    first = submit(pipeline, 0)
    await turns()
    rest = [submit(pipeline, n) for n in range(1, 4)]
    stopping = asyncio.ensure_future(pipeline.stop())
    await turns(5)
    assert not stopping.done() and not first.done()  # the sync in flight is awaited
    aio.complete()
    await asyncio.wait_for(stopping, WAIT_S)
    # The three gathered behind it were written and synced by stop itself.
    for future in [first, *rest]:
        assert future.done() and future.exception() is None
    assert engine.durable_seq == 4 and aio.closed
    assert len(aio.submitted) == 1


class HeldWrites:
    """Wraps `engine.write_unsynced`: records the thread of each write, and
    holds a write in a non-loop thread until the test releases it."""

    def __init__(self, engine: Engine) -> None:
        self.write = engine.write_unsynced
        self.threads: list[int] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self) -> tuple[int, int] | None:
        self.threads.append(threading.get_ident())
        if threading.current_thread() is not threading.main_thread():
            assert self.release.wait(WAIT_S)
        return self.write()


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


@pytest.fixture
def large(monkeypatch: pytest.MonkeyPatch) -> int:
    """A batch of this many bytes is large (written off the loop thread)."""
    monkeypatch.setattr(pipeline_module, "WRITE_OFF_LOOP_BYTES_MIN", 4000)
    return 4000


def submit_large(pipeline: CommitPipeline, n: int) -> asyncio.Future[None]:
    _decision, barrier = pipeline.execute(enqueue_one(n, payload_bytes=4000))
    future = pipeline.durable(barrier)
    assert future is not None
    return future


async def test_a_large_batch_is_written_off_the_loop_thread_and_synced_after_the_write(
    engine: Engine, large: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = HeldWrites(engine)
    monkeypatch.setattr(engine, "write_unsynced", writes)
    writes.release.clear()
    aio = HeldAio()
    pipeline = started(engine, aio)
    big = submit_large(pipeline, 0)
    await until(lambda: len(writes.threads) == 1)
    assert writes.threads[0] != threading.get_ident()
    # The loop goes on while the write is held (no other write or sync starts);
    # what arrives meanwhile joins the batch the thread takes when it writes.
    small = submit(pipeline, 1)
    await turns()
    assert aio.submitted == [] and not big.done() and len(writes.threads) == 1
    writes.release.set()
    await until(lambda: len(aio.submitted) == 1)  # its sync, queued once written
    assert [(d, token) for _fd, d, token in aio.submitted] == [(True, 2)]
    await turns()
    assert not big.done() and not small.done() and engine.durable_seq == 0
    aio.complete()
    await asyncio.wait_for(asyncio.gather(big, small), WAIT_S)
    # A small batch is written on the loop thread itself.
    last = submit(pipeline, 2)
    await until(lambda: len(aio.submitted) == 2)
    assert writes.threads[1] == threading.get_ident()
    aio.complete()
    await asyncio.wait_for(last, WAIT_S)
    assert engine.durable_seq == 3
    await pipeline.stop()
    assert aio.closed


async def test_a_large_batch_whose_write_fails_fails_every_waiter_and_storage_for_good(
    engine: Engine, large: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(engine._writer, "append", failing)
    aio = HeldAio()
    pipeline = started(engine, aio)
    big = submit_large(pipeline, 0)
    with pytest.raises(StorageFailed, match="Input/output error"):
        await asyncio.wait_for(big, WAIT_S)
    assert engine.failure is not None and pipeline.failure is not None
    with pytest.raises(StorageFailed):
        pipeline.execute(enqueue_one(9))
    assert aio.submitted == []
    await asyncio.wait_for(pipeline.stop(), WAIT_S)
    assert aio.closed


async def test_stop_waits_for_a_large_write_in_flight_and_its_sync(
    engine: Engine, large: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = HeldWrites(engine)
    monkeypatch.setattr(engine, "write_unsynced", writes)
    writes.release.clear()
    aio = HeldAio()
    pipeline = started(engine, aio)
    big = submit_large(pipeline, 0)
    await until(lambda: len(writes.threads) == 1)
    stopping = asyncio.ensure_future(pipeline.stop())
    await turns(5)
    assert not stopping.done()
    writes.release.set()
    await until(lambda: len(aio.submitted) == 1)
    assert not stopping.done()
    aio.complete()
    await asyncio.wait_for(stopping, WAIT_S)
    assert big.done() and big.exception() is None
    assert engine.durable_seq == 1 and aio.closed


@needs_aio
async def test_real_aio_commits_everything_and_it_survives_a_reopen(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    engine = Engine.open(data, CONFIG, StorageOptions(persist_mode="sync_data"))
    pipeline = CommitPipeline(engine, clock=lambda: T0)
    pipeline.start("aio")
    futures = []
    bursts = 1
    for n in range(300):
        futures.append(submit(pipeline, n))
        if n % 7 == 0:
            bursts += 1
            await asyncio.sleep(0)  # let syncs complete between bursts
    await asyncio.wait_for(asyncio.gather(*futures), WAIT_S)
    assert engine.durable_seq == 300
    # Grouped, however fast the disk: the loop thread writes whatever gathered,
    # once per loop turn at most, and a burst is submitted within one turn, so a
    # write never splits a burst (slow syncs only make the groups bigger).
    assert 1 <= engine.stats["flushes"] <= bursts == 44, engine.stats
    await pipeline.stop()
    engine.close()
    again = Engine.open(data, CONFIG, StorageOptions(persist_mode="sync_data"))
    assert len(again.state.jobs) == 300
    again.close()


# ---------------------------------------------------------------- a real server


@pytest.mark.parametrize("method", ["thread", pytest.param("aio", marks=needs_aio)])
async def test_the_server_serves_and_recovers_with_each_sync_method(
    server_factory, tmp_path, method
):
    env = {"SEPP_STORAGE__SYNC_METHOD": method, "SEPP_LOGGING__LEVEL": "info"}
    data = tmp_path / "data"
    server = server_factory(env=env, data_dir=data, args=["--persist-mode", "sync_data"])
    assert f"sync={method}" in server.log()
    client = await connect(server.address)
    request_ids = [client.send("enqueue", {"jobs": [job("q")]}) for _ in range(100)]
    # Large requests among them: 2 MiB frames, records of payload parts, batches
    # written off the loop thread (aio) and from their parts (both).
    big = payload(bytes(range(256)) * 2048)
    for _ in range(3):
        request_ids.append(client.send("enqueue", {"jobs": [job("q", payload=big)] * 4}))
        request_ids.append(client.send("enqueue", {"jobs": [job("q")]}))
    for request_id in request_ids:
        assert (await client.response(request_id)).status == "ok"
    client.assert_clean()
    await client.close()
    assert server.stop() == 0
    again = server_factory(env=env, data_dir=data, args=["--persist-mode", "sync_data"])
    client = await connect(again.address)
    assert (await client.stats("q"))["ready"] == 115
    await client.close()
    assert again.stop() == 0
