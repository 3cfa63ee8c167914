"""The active segment's preallocated zeros (`sepp.storage.wal.PREALLOCATE_BYTES`).

The writer keeps the active segment's file up to PREALLOCATE_BYTES of zeros longer
than its records, so that most syncs change no file size (no file-system journal
commit). These tests hold the promises around it: records are written at the data
end (never after the zeros), the file grows a step at a time, a sealed segment and
a cleanly closed log end with their last record, and after a crash recovery cuts
the zero tail, reports it as such (not as a torn record) and the log continues at
the data end with nothing released lost.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sepp.storage import Engine, RealFileSystem, StorageFailed, StorageOptions
from sepp.storage import engine as engine_module
from sepp.storage.faultfs import FaultyFileSystem
from sepp.storage.wal import LARGE_BATCH_AHEAD_BYTES, PREALLOCATE_BYTES
from tests.storage.helpers import (
    CONFIG,
    T0,
    durable_log_seq,
    enqueue_one,
    inline_options,
    open_engine,
    segment_paths,
    segment_records,
)


def data_end(data: bytes) -> int:
    _first, records, _end = segment_records(data)
    last = records[-1]
    return last.offset + 24 + len(last.body)


def test_records_go_at_the_data_end_and_the_file_grows_a_step_at_a_time() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data"))
    fs.record_ops = True
    for n in range(300):
        engine.execute(enqueue_one(n, payload_bytes=4000), T0 + n)
        engine.flush()
    (path,) = segment_paths(fs)
    data = fs.read(path)
    end = data_end(data)
    assert engine.segments[-1].size == end
    # The file runs ahead of its records by zeros, at most one step.
    assert end < len(data) <= end + PREALLOCATE_BYTES
    assert data[end:] == bytes(len(data) - end)
    # ~1.2 MB of records: the file grew twice (at the first batch, past 1 MiB),
    # not 300 times.
    grows = [op for op, p in fs.ops if op == "write_zeros" and p == path]
    assert len(grows) == 2
    # Every record is where the reader finds it: all 300 replay.
    _first, records, _end = segment_records(data)
    assert [r.seq for r in records] == list(range(1, 301))
    engine.close()
    # A clean close cuts the zeros, durably.
    assert len(fs.durable_files()[path]) == end == len(fs.read(path))


def test_a_large_batch_is_followed_by_a_short_run_of_zeros_that_small_ones_then_fill() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data"))
    engine.execute(enqueue_one(0), T0)
    engine.flush()
    (path,) = segment_paths(fs)
    fs.record_ops = True
    # One record over a whole step: a full step of zeros after it would double
    # what it writes and syncs; it gets a short run instead.
    engine.execute(enqueue_one(1, payload_bytes=PREALLOCATE_BYTES), T0 + 1)
    engine.flush()
    end = engine.segments[-1].size
    data = fs.read(path)
    assert len(data) == end + LARGE_BATCH_AHEAD_BYTES
    assert data[end:] == bytes(LARGE_BATCH_AHEAD_BYTES)
    assert [op for op, p in fs.ops if op == "write_zeros" and p == path] == ["write_zeros"]
    # Small records written between large ones go over those zeros: the file
    # does not grow until they are used up, then by a full step again.
    fs.ops.clear()
    n = 2
    while engine.segments[-1].size + 1200 < end + LARGE_BATCH_AHEAD_BYTES:
        engine.execute(enqueue_one(n, payload_bytes=1000), T0 + n)
        engine.flush()
        n += 1
        assert len(fs.read(path)) == end + LARGE_BATCH_AHEAD_BYTES
    assert n > 10  # the short run took a few dozen small records
    assert not [op for op, p in fs.ops if op == "write_zeros"]
    for m in range(n, n + 5):
        engine.execute(enqueue_one(m, payload_bytes=1000), T0 + m)
        engine.flush()
    grown = engine.segments[-1].size
    assert grown < len(fs.read(path)) <= grown + PREALLOCATE_BYTES
    assert len(fs.read(path)) > end + LARGE_BATCH_AHEAD_BYTES + LARGE_BATCH_AHEAD_BYTES
    _first, records, _end = segment_records(fs.read(path))
    assert [r.seq for r in records] == list(range(1, n + 6))
    engine.close()
    assert len(fs.durable_files()[path]) == engine.segments[-1].size


def test_a_sealed_segment_ends_with_its_last_record() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data", segment_bytes_max=64 * 1024))
    for n in range(100):
        engine.execute(enqueue_one(n, payload_bytes=2000), T0 + n)
        engine.flush()
    paths = segment_paths(fs)
    assert len(paths) >= 3
    for sealed in paths[:-1]:
        durable = fs.durable_files()[sealed]
        assert len(durable) == data_end(durable)
    active = fs.read(paths[-1])
    assert len(active) > data_end(active)  # the active one still has its zeros
    engine.close()


def test_after_a_crash_the_zero_tail_is_cut_and_the_log_goes_on_from_the_data_end(
    rng: Any,
) -> None:
    fs = FaultyFileSystem()
    options = inline_options(persist_mode="sync_data")
    engine = open_engine(fs, options)
    for n in range(20):
        engine.execute(enqueue_one(n), T0 + n)
        engine.flush()
    (path,) = segment_paths(fs)
    end = engine.segments[-1].size
    size = len(fs.durable_files()[path])
    assert size > end
    fs.crash(rng, tear=True)  # nothing was unsynced: the zeros are durable too
    again = open_engine(fs, options)
    report = again.recovery_report
    assert report.zero_tail == (path, end, size - end)
    assert report.truncated is None
    assert len(again.state.jobs) == 20
    for n in range(20, 25):
        again.execute(enqueue_one(n), T0 + n)
        again.flush()
    assert durable_log_seq(fs) == 25  # seq 21.. right after seq 20, nothing between
    again.close()
    third = open_engine(fs, options)
    assert len(third.state.jobs) == 25
    assert third.recovery_report.zero_tail is None  # the clean close left none
    third.close()


def test_on_real_files_the_segment_runs_ahead_and_a_clean_close_cuts_it(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    options = StorageOptions(persist_mode="sync_data", snapshot_mode="inline")
    engine = Engine.open(data_dir, CONFIG, options, fs=RealFileSystem())
    for n in range(10):
        engine.execute(enqueue_one(n), T0 + n)
        engine.flush()
    path = engine.segments[-1].path
    end = engine.segments[-1].size
    size = os.path.getsize(path)
    assert end < size <= end + PREALLOCATE_BYTES
    with open(path, "rb") as f:
        f.seek(end)
        assert f.read() == bytes(size - end)
    engine.close()
    assert os.path.getsize(path) == end
    again = Engine.open(data_dir, CONFIG, options, fs=RealFileSystem())
    assert len(again.state.jobs) == 10
    again.close()


def test_write_at_and_write_zeros_on_real_files(tmp_path: Path) -> None:
    fs = RealFileSystem()
    path = str(tmp_path / "f")
    handle = fs.create(path)
    try:
        fs.write_at(handle, b"abc", 0)
        fs.write_zeros(handle, 3, 5)
        fs.write_at(handle, b"XY", 4)  # over the zeros
        fs.write_at(handle, memoryview(b"end"), 10)  # past the end: a gap of zeros
    finally:
        fs.close(handle)
    assert Path(path).read_bytes() == b"abc\0XY\0\0\0\0end"
    handle = fs.open_write(path)
    try:
        fs.write_at(handle, b"Z", 0)
    finally:
        fs.close(handle)
    assert Path(path).read_bytes()[:4] == b"Zbc\0"


def test_write_zeros_longer_than_its_buffer_on_real_files(tmp_path: Path) -> None:
    fs = RealFileSystem()
    path = str(tmp_path / "f")
    handle = fs.create(path)
    size = 2 * PREALLOCATE_BYTES + 7  # past the shared zero buffer, twice
    try:
        fs.write_at(handle, b"\xff" * (size + 10), 0)
        fs.write_zeros(handle, 3, size)
    finally:
        fs.close(handle)
    data = Path(path).read_bytes()
    assert data == b"\xff" * 3 + bytes(size) + b"\xff" * 7


def test_write_parts_at_writes_their_concatenation_through_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rng: Any
) -> None:
    # More parts than one pwritev takes, empty ones among them, and a kernel that
    # writes only part of what it is given: the file holds exactly the parts.
    parts = [rng.randbytes(rng.choice((0, 1, 7, 300))) for _ in range(3000)]
    real_pwritev = os.pwritev
    calls: list[int] = []

    def short_pwritev(fd: int, buffers: list[Any], offset: int) -> int:
        calls.append(len(buffers))
        want = sum(len(b) for b in buffers)
        if want > 1:
            # Give the kernel all but a random tail of what was asked.
            cut = rng.randrange(1, want)
            data = b"".join(bytes(b) for b in buffers)[:cut]
            return real_pwritev(fd, [data], offset)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    fs = RealFileSystem()
    path = str(tmp_path / "f")
    handle = fs.create(path)
    try:
        fs.write_at(handle, b"head", 0)
        fs.write_parts_at(handle, parts, 4)
        fs.write_parts_at(handle, [], 2)  # nothing to write: no call
    finally:
        fs.close(handle)
    assert Path(path).read_bytes() == b"head" + b"".join(parts)
    assert max(calls) <= (os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16)


def test_a_batch_given_as_parts_is_one_write_and_reads_back_as_its_records() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    for n in range(3):
        engine.execute(enqueue_one(n, payload_bytes=(1 << 20) // 2), T0)
    assert engine.pending_bytes() >= engine_module.WRITE_PARTS_BYTES_MIN
    fs.ops.clear()
    fs.record_ops = True
    engine.flush()
    assert [op for op, _path in fs.ops if op == "write"] == ["write"]
    engine.close()
    again = open_engine(fs)
    assert again.state.canonical() == engine.state.canonical()
    again.close()


# ---------------------------------------------------------------- a nearly full disk


def _used(fs: FaultyFileSystem) -> int:
    return sum(len(data) for data in fs.durable_files().values())


def _no_room_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "no room to preallocate" in r.getMessage()
    ]


def test_without_room_for_the_zeros_records_are_written_without_them_until_they_do_not_fit(
    caplog: pytest.LogCaptureFixture, rng: Any
) -> None:
    # Less than PREALLOCATE_BYTES free, on every restart: the zeros never fit, but
    # each record does, until the disk is really full.
    fs = FaultyFileSystem()
    options = inline_options(persist_mode="sync_data")
    engine = open_engine(fs, options)
    for n in range(5):
        engine.execute(enqueue_one(n), T0 + n)
        engine.flush()
    engine.close()
    fs.capacity_bytes = _used(fs) + 20_000
    caplog.set_level(logging.WARNING, logger="sepp.storage")
    engine = open_engine(fs, options)  # the restart on a nearly full disk
    (path,) = segment_paths(fs)
    flushed = 5
    with pytest.raises(StorageFailed) as failed:
        for n in range(5, 500):
            engine.execute(enqueue_one(n), T0 + n)
            engine.flush()
            flushed = n + 1
            # No zeros ahead of the records: the file ends at its last record.
            assert len(fs.read(path)) == engine.segments[-1].size
    # It failed only once a record itself did not fit, and for that reason.
    assert flushed > 5 + 20_000 // 200
    assert isinstance(engine.failure, OSError) and engine.failure.errno == errno.ENOSPC
    assert "log write failed" in str(failed.value)
    # Said once, not once per batch.
    (warning,) = _no_room_warnings(caplog)
    assert os.path.basename(path) in warning
    engine.release_lock()
    # Nothing flushed is lost, space back or not.
    fs.crash(rng, tear=True)
    fs.capacity_bytes = None
    again = open_engine(fs, options)
    assert again.appended_seq == flushed
    assert len(again.state.jobs) == flushed
    again.close()


def test_zeros_written_in_part_are_cut_and_the_next_segment_preallocates_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fs = FaultyFileSystem()
    options = inline_options(persist_mode="sync_data", segment_bytes_max=8192)
    engine = open_engine(fs, options)
    fs.capacity_bytes = _used(fs) + 300_000  # room for a part of the zeros only
    caplog.set_level(logging.WARNING, logger="sepp.storage")
    fs.record_ops = True
    engine.execute(enqueue_one(0), T0)
    engine.flush()
    (path,) = segment_paths(fs)
    # The short write of zeros was cut again, durably: the file ends at its record.
    assert fs.durable_files()[path] == fs.read(path)
    assert len(fs.read(path)) == engine.segments[-1].size
    assert ("truncate", path) in fs.ops
    assert len(_no_room_warnings(caplog)) == 1
    fs.capacity_bytes = None  # space is back: the next segment preallocates
    n = 1
    while len(segment_paths(fs)) < 2:
        engine.execute(enqueue_one(n, payload_bytes=1000), T0 + n)
        engine.flush()
        n += 1
    newest = segment_paths(fs)[-1]
    assert len(fs.read(newest)) == engine.segments[-1].size + PREALLOCATE_BYTES
    engine.close()


def test_a_real_small_tmpfs_takes_records_without_preallocation(tmp_path: Path) -> None:
    """The issue's 300 KiB tmpfs, for real (root and mount permitted only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount not permitted here: {mounted.stderr.decode().strip()}")
    try:
        data_dir = str(mount_point / "data")
        options = StorageOptions(persist_mode="sync_data", snapshot_mode="inline")
        for start in (0, 20):  # and again after a restart
            engine = Engine.open(data_dir, CONFIG, options, fs=RealFileSystem())
            for n in range(start, start + 20):
                engine.execute(enqueue_one(n), T0 + n)
                engine.flush()
            path = engine.segments[-1].path
            assert os.path.getsize(path) == engine.segments[-1].size  # no zeros fitted
            engine.close()
        again = Engine.open(data_dir, CONFIG, options, fs=RealFileSystem())
        assert len(again.state.jobs) == 40
        again.close()
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)
