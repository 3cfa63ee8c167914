"""What storage creates is private to its user whatever the umask (issue 13 §6):
directories 0700, files 0600; an existing directory open to others is warned
about, never chmod-ed."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sepp.core import CoreConfig
from sepp.storage import Engine, StorageOptions
from sepp.storage.engine import LOCK_FILE
from sepp.storage.fs import make_private_dirs, private_opener
from tests.storage.helpers import T0, enqueue_one


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], indirect=True)
def test_data_directory_and_every_file_are_private_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    data = tmp_path / "parent" / "data"
    engine = Engine.open(str(data), CoreConfig(), StorageOptions(snapshot_mode="inline"))
    engine.execute(enqueue_one(1), T0)
    engine.flush()
    engine.snapshot_now()
    engine.close()
    dirs = [data.parent, data, data / "wal", data / "snapshots"]
    files = [data / LOCK_FILE, *(data / "wal").iterdir(), *(data / "snapshots").iterdir()]
    assert len(files) >= 3
    assert {str(d): oct(mode(d)) for d in dirs} == {str(d): "0o700" for d in dirs}
    assert {str(f): oct(mode(f)) for f in files} == {str(f): "0o600" for f in files}


def test_an_existing_directory_open_to_others_is_warned_about_and_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o750)
    with caplog.at_level(logging.WARNING, logger="sepp.storage"):
        Engine.open(str(data), CoreConfig(), StorageOptions()).close()
        Engine.open(str(data), CoreConfig(), StorageOptions()).close()
    warnings = [r.getMessage() for r in caplog.records if "open to its group" in r.getMessage()]
    # Once, for the data directory alone (its warning covers wal/ and snapshots/).
    assert warnings == [
        f"{data} is open to its group or others (mode 0750): the data directory holds "
        "every job's payload; sepp creates it 0700 but leaves an existing directory as "
        "it is: chmod 700 it unless sharing it is intended"
    ]
    assert mode(data) == 0o750
    assert mode(data / "wal") == 0o700


def test_an_existing_private_directory_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "mine"
    data.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING, logger="sepp.storage"):
        Engine.open(str(data), CoreConfig(), StorageOptions()).close()
    assert not [r for r in caplog.records if "open to its group" in r.getMessage()]


@pytest.mark.parametrize("umask", [0o000, 0o277], indirect=True)
def test_tool_helpers_create_private_directories_and_files(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "a" / "b"
    assert make_private_dirs(str(target)) is True
    assert make_private_dirs(str(target)) is False
    with open(target / "f", "xb", opener=private_opener) as handle:
        handle.write(b"x")
    assert (mode(tmp_path / "a"), mode(target), mode(target / "f")) == (0o700, 0o700, 0o600)
    (target / "file").write_bytes(b"")
    with pytest.raises(FileExistsError):
        make_private_dirs(str(target / "file"))
