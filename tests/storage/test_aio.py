"""Syncs through Linux AIO (`sepp.storage.aio`) and the engine's split commit
(`write_unsynced` / `synced` / `sync_failed`) that the loop committer builds on.

The AIO tests sync real files in a temporary directory and wait for completions on
the eventfd with a deadline (select), never a sleep; they are skipped where Linux
AIO cannot run. The engine tests use the fake file system, which knows exactly
what a crash would keep.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
from pathlib import Path
from typing import Any

import pytest

from sepp.core import Sweep
from sepp.storage import StorageFailed
from sepp.storage import aio as aio_module
from sepp.storage.aio import AioSync, aio_unavailable
from sepp.storage.faultfs import FaultyFileSystem
from tests.storage.helpers import (
    T0,
    WAL_DIR,
    durable_log_seq,
    enqueue_one,
    inline_options,
    open_engine,
    segment_paths,
)

WAIT_S = 20.0  # a deadline for a completion on a loaded machine, never a sleep
SYNC_OPS = ("write", "fsync", "fdatasync")

needs_aio = pytest.mark.skipif(aio_unavailable() is not None, reason=str(aio_unavailable()))


def wait_readable(fd: int) -> None:
    readable, _, _ = select.select([fd], [], [], WAIT_S)
    assert readable, "no completion within the deadline"


# ---------------------------------------------------------------- AioSync


@needs_aio
@pytest.mark.parametrize("datasync", [True, False])
def test_a_sync_completes_on_the_eventfd_with_its_token(tmp_path: Path, datasync: bool) -> None:
    aio = AioSync(4)
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"x" * 4096)
        aio.submit(fd, datasync, 1234)
        assert aio.in_flight == 1
        wait_readable(aio.eventfd)
        assert aio.reap() == [(1234, 0)]
        assert aio.in_flight == 0
        # The eventfd was drained: nothing more to reap until the next sync.
        assert aio.reap() == []
    finally:
        aio.close()
        os.close(fd)


@needs_aio
def test_submit_and_a_look_for_completions_keep_the_gil_and_only_a_wait_lets_it_go(
    tmp_path: Path,
) -> None:
    # The loop thread must not have to win the GIL back from a thread copying a
    # large batch after each io_submit: the calls that return at once keep it.
    aio = AioSync(4)
    quick = aio._quick_syscall
    assert quick._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]
    assert not aio._syscall._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]
    used: list[str] = []

    def spy(name: str, call: Any) -> Any:
        def called(*args: Any) -> Any:
            used.append(name)
            return call(*args)

        return called

    aio._quick_syscall = spy("quick", aio._quick_syscall)
    aio._syscall = spy("releasing", aio._syscall)
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"x" * 4096)
        aio.submit(fd, True, 1)
        aio.reap()  # a look, whatever it finds
        assert used and set(used) == {"quick"}
        used.clear()
        aio.close()  # waits for the sync in flight, if any: releasing the GIL
        assert "quick" not in used
    finally:
        aio.close()
        os.close(fd)


@needs_aio
def test_several_syncs_in_flight_each_come_back_once(tmp_path: Path) -> None:
    aio = AioSync(4)
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        done: list[tuple[int, int]] = []
        for token in (7, 8, 9):
            os.write(fd, b"y" * 100)
            aio.submit(fd, True, token)
        while len(done) < 3:
            wait_readable(aio.eventfd)
            done += aio.reap()
        assert sorted(done) == [(7, 0), (8, 0), (9, 0)]
        with pytest.raises(OSError, match="in flight"):
            for token in range(5):
                aio.submit(fd, True, token)
    finally:
        assert len(aio.close()) == 4  # close waited for the four still in flight
        os.close(fd)


@needs_aio
def test_a_sync_that_cannot_be_queued_is_refused_at_once() -> None:
    aio = AioSync(2)
    read_end, write_end = os.pipe()
    sock = socket.socket()
    try:
        with pytest.raises(OSError) as bad_fd:
            aio.submit(999_999, True, 1)
        assert bad_fd.value.errno == errno.EBADF
        for fd in (write_end, sock.fileno()):  # no sync for a pipe or a socket
            with pytest.raises(OSError) as refused:
                aio.submit(fd, True, 2)
            assert refused.value.errno == errno.EINVAL
        assert aio.in_flight == 0
    finally:
        aio.close()
        os.close(read_end)
        os.close(write_end)
        sock.close()
    with pytest.raises(OSError, match="closed"):
        aio.submit(0, True, 3)


def test_aio_unavailable_names_a_reason_or_none() -> None:
    why = aio_unavailable()
    assert why is None or (isinstance(why, str) and why)


@needs_aio
def test_a_kernel_that_refuses_aio_fdatasync_makes_aio_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kernels before 4.18 have io_setup but refuse IOCB_CMD_FDSYNC at submit: the
    # probe must find that out, not the first group commit.
    def refuse(self: AioSync, fd: int, datasync: bool, token: int) -> None:
        raise OSError(errno.EINVAL, "io_submit: Invalid argument")

    monkeypatch.setattr(aio_module, "_PROBED", None)
    monkeypatch.setattr(AioSync, "submit", refuse)
    why = aio_unavailable()
    assert why is not None and "refused" in why and "Invalid argument" in why
    # Probed once per process: the answer is kept.
    monkeypatch.undo()
    monkeypatch.setattr(aio_module, "_PROBED", (why,))
    assert aio_unavailable() == why


# ---------------------------------------------------------------- the engine's split commit


def wal_ops(fs: FaultyFileSystem) -> list[str]:
    return [op for op, path in fs.ops if op in SYNC_OPS and path.startswith(WAL_DIR + "/")]


@pytest.mark.parametrize("mode", ["sync_data", "sync_all"])
def test_write_unsynced_writes_once_and_only_synced_makes_it_durable(mode: str) -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode=mode))
    for n in range(10):
        engine.execute(enqueue_one(n), T0 + n)
    fs.ops.clear()
    fs.record_ops = True
    written = engine.write_unsynced()
    assert written is not None
    last_seq, fd = written
    assert last_seq == engine.appended_seq == 10
    assert wal_ops(fs) == ["write"]  # no sync: the caller's job
    assert engine.durable_seq == 0  # no reply may go out yet
    assert durable_log_seq(fs) == 0  # and a crash now would keep none of it
    # The caller syncs the descriptor it was given (here: the fake fs's call).
    fs.fdatasync(fd) if mode == "sync_data" else fs.fsync(fd)
    engine.synced(last_seq)
    assert engine.durable_seq == 10
    assert durable_log_seq(fs) == 10
    assert engine.write_unsynced() is None  # nothing buffered: nothing written
    engine.close()


def test_a_rotation_after_a_synced_batch_does_not_sync_it_again() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data", segment_bytes_max=4096))
    seq = 0
    while len(segment_paths(fs)) < 3:
        for _ in range(4):
            engine.execute(enqueue_one(seq), T0 + seq)
            seq += 1
        fs.ops.clear()
        fs.record_ops = True
        written = engine.write_unsynced()
        assert written is not None
        fs.fdatasync(written[1])
        engine.synced(written[0])
        ops = wal_ops(fs)
        # Either a plain batch (write, our sync) or a rotation first: the new
        # segment's header write and fsync, then the batch -- never a second sync
        # of the sealed segment, which the last `synced` already covered.
        assert ops in (
            ["write", "fdatasync"],
            ["write", "fsync", "write", "fdatasync"],
        ), ops
    assert durable_log_seq(fs) == engine.durable_seq == seq
    engine.close()


def test_a_rotation_while_a_batch_is_unsynced_syncs_the_sealed_segment() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data", segment_bytes_max=4096))
    n = 0
    while engine._writer.active.size < 4096:
        engine.execute(enqueue_one(n), T0 + n)
        n += 1
        assert engine.write_unsynced() is not None  # written, never synced
    assert durable_log_seq(fs) == 0
    engine.execute(enqueue_one(n), T0 + n)
    written = engine.write_unsynced()  # rotates: the sealed segment is synced first
    assert written is not None
    assert durable_log_seq(fs) == n  # everything before the new segment survives
    fs.fdatasync(written[1])
    engine.synced(written[0])
    assert durable_log_seq(fs) == n + 1 == engine.durable_seq
    engine.close()


def test_a_failed_sync_fails_the_engine_for_good() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data"))
    engine.execute(enqueue_one(0), T0)
    assert engine.write_unsynced() is not None
    error = engine.sync_failed(OSError(errno.EIO, "Input/output error"))
    assert isinstance(error, StorageFailed) and "Input/output error" in str(error)
    assert engine.durable_seq == 0  # never acknowledged
    with pytest.raises(StorageFailed):
        engine.execute(Sweep(), T0 + 1)
    with pytest.raises(StorageFailed):
        engine.write_unsynced()
    # Recovery decides what survived: here the unsynced record was lost.
    fs.crash()
    again = open_engine(fs, inline_options(persist_mode="sync_data"))
    assert len(again.state.jobs) == 0
    again.close()
