"""Synced log and snapshot bytes leave the page cache (`FileSystem.drop_cache`).

The writer advises the kernel to free the pages of records once they are synced,
in steps of CACHE_DROP_BYTES, and the rest of a segment when it is sealed; a
snapshot's chunks after each sync. The advice must never cover a byte that is not
synced yet, and must leave the files unchanged (they read back and recover).
"""

from __future__ import annotations

import os
from typing import Any

from sepp.storage import Engine, RealFileSystem, StorageOptions
from sepp.storage.faultfs import FaultyFileSystem
from sepp.storage.wal import CACHE_DROP_BYTES, PAGE_BYTES
from tests.storage.helpers import (
    CONFIG,
    T0,
    enqueue_one,
    inline_options,
    open_engine,
    segment_paths,
)


def drops_of(fs: FaultyFileSystem, path: str) -> list[tuple[int, int]]:
    return [(offset, length) for p, offset, length in fs.cache_drops if p == path]


def test_synced_records_are_dropped_in_steps_and_never_ahead_of_the_sync() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="sync_data"))
    synced_ends = []
    for n in range(700):  # ~2.8 MB of records, one batch each
        engine.execute(enqueue_one(n, payload_bytes=4000), T0 + n)
        engine.flush()
        synced_ends.append(engine.segments[-1].size)
        for path, offset, length in fs.cache_drops:
            # Never past what was synced when it was given.
            assert offset + length <= synced_ends[-1], (path, offset, length)
    (path,) = segment_paths(fs)
    drops = drops_of(fs, path)
    assert len(drops) >= 2
    # Steps of at least CACHE_DROP_BYTES, each from where the last one stopped
    # (minus its last partial page), together covering the segment up to the
    # last step.
    start = 0
    for offset, length in drops:
        assert offset == start
        assert length >= CACHE_DROP_BYTES
        end = offset + length
        start = end - end % PAGE_BYTES
    assert engine.segments[-1].size - start < CACHE_DROP_BYTES + PAGE_BYTES
    engine.close()


def test_a_sealed_segment_is_dropped_to_its_end_and_still_recovers() -> None:
    fs = FaultyFileSystem()
    options = inline_options(persist_mode="sync_all", segment_bytes_max=64 * 1024)
    engine = open_engine(fs, options)
    for n in range(200):
        engine.execute(enqueue_one(n, payload_bytes=1000), T0 + n)
        engine.flush()
    sealed = segment_paths(fs)[:-1]
    assert len(sealed) >= 2
    for path in sealed:
        drops = drops_of(fs, path)
        assert drops, path
        offset, length = drops[-1]
        assert offset + length == fs.size(path)  # the whole rest, at rotation
    live = engine.state.canonical()
    engine.close()
    again = open_engine(fs, options)
    assert again.state.canonical() == live
    again.close()


def test_nothing_unsynced_is_dropped_in_buffer_mode() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode="buffer"))
    for n in range(400):
        engine.execute(enqueue_one(n, payload_bytes=4000), T0 + n)
        engine.flush()  # written, not synced
    assert fs.cache_drops == []
    engine.sync()
    (path,) = segment_paths(fs)
    ((offset, length),) = drops_of(fs, path)
    assert (offset, offset + length) == (0, engine.segments[-1].size)
    engine.close()


class _DropRecordingFS(RealFileSystem):
    """Records (file name, file size then, offset, length) of every drop."""

    def __init__(self) -> None:
        super().__init__()
        self.drops: list[tuple[str, int, int, int]] = []

    def drop_cache(self, handle: int, offset: int, length: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{handle}"))
        self.drops.append((name, os.fstat(handle).st_size, offset, length))
        super().drop_cache(handle, offset, length)


def test_snapshot_chunks_are_dropped_after_their_sync_on_real_files(tmp_path: Any) -> None:
    fs = _DropRecordingFS()
    data_dir = str(tmp_path / "data")
    options = StorageOptions(snapshot_mode="inline")
    engine = Engine.open(data_dir, CONFIG, options, fs=fs)
    for n in range(400):  # a snapshot of ~1.6 MB: a chunk and a rest
        engine.execute(enqueue_one(n, payload_bytes=4000), T0 + n)
    engine.flush()
    seq = engine.snapshot_now()
    engine.close()
    name = f"{seq:020d}.snap"
    size = os.path.getsize(os.path.join(data_dir, "snapshots", name))
    drops = [drop[1:] for drop in fs.drops if drop[0] == name + ".tmp"]
    assert len(drops) >= 2
    for file_size, offset, length in drops:  # never past what was written
        assert offset + length <= file_size
    assert drops[-1][1:] == (0, size)  # the whole file once it is synced
    again = Engine.open(data_dir, CONFIG, options, fs=RealFileSystem())
    assert again.recovery_report.snapshot_seq == seq
    assert len(again.state.jobs) == 400
    again.close()
