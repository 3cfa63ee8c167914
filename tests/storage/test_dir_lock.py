"""One process per data directory: the engine holds an exclusive lock on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sepp.core import CoreConfig
from sepp.storage import Engine, StorageOptions
from sepp.storage.faultfs import FaultyFileSystem
from sepp.storage.fs import DataDirLocked
from sepp.storage.recovery import RecoveryError


def test_a_second_engine_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    first = Engine.open(str(tmp_path / "d"), CoreConfig(), StorageOptions())
    with pytest.raises(DataDirLocked, match="LOCK"):
        Engine.open(str(tmp_path / "d"), CoreConfig(), StorageOptions())
    first.close()
    Engine.open(str(tmp_path / "d"), CoreConfig(), StorageOptions()).close()


def test_a_refused_recovery_releases_the_lock(tmp_path: Path) -> None:
    fs = FaultyFileSystem()
    engine = Engine.open("/d", CoreConfig(), StorageOptions(snapshot_mode="inline"), fs=fs)
    engine.close()
    fs.put("/d/wal/00000000000000000005.log", b"not a segment header at all, and long enough")
    with pytest.raises(RecoveryError, match="sepp-log verify"):
        Engine.open("/d", CoreConfig(), StorageOptions(snapshot_mode="inline"), fs=fs)
    fs.remove("/d/wal/00000000000000000005.log")
    Engine.open("/d", CoreConfig(), StorageOptions(snapshot_mode="inline"), fs=fs).close()


def test_a_crash_releases_the_lock_of_the_fake_file_system() -> None:
    fs = FaultyFileSystem()
    Engine.open("/d", CoreConfig(), StorageOptions(snapshot_mode="inline"), fs=fs)
    fs.crash()
    Engine.open("/d", CoreConfig(), StorageOptions(snapshot_mode="inline"), fs=fs).close()
