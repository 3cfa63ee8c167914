"""Bad input, nothing lost: hostile config files and environment values, truncated
and forged snapshot files. Each gets a clear error (exit code 1, one line naming
the key or the file, never a traceback) or a safe recovery that keeps every job.

Protocol fuzzing against a live server while a correct client keeps working runs
inside the crash harness (`tools/crash.py --fuzz`, on in tests/crash/test_harness.py:
its hostile connection sends junk, huge lengths, wrong types and half-closes
alongside the ledger-checked workload, through crashes); tests/server/test_fuzz.py
and test_hostile_input.py cover the frames one by one.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from log_format import snapshot_file_name
from sepp.core.config import ConfigError
from sepp.server.config import load_config
from sepp.storage.snapshots import encode_snapshot
from tests.conftest import ServerProcess
from tests.crash.helpers import Ledger, assert_survived, drain, run, serve_once
from tools.datadir import open_data_dir
from tools.replay import replay_to

QUEUE = "bad"

# ---------------------------------------------------------------- config files

DEEP = 100_000
HOSTILE_FILES: dict[str, tuple[bytes, str]] = {
    # name: (file content, what the one-line error must say)
    "binary garbage": (b"\x00\xff\xfe\x01garbage", "is not UTF-8 text"),
    "not utf-8": (b'[server]\nlisten_addr = "\xff\xfe"\n', "is not UTF-8 text"),
    "nested arrays": (
        b"[limits]\nmax_queue_depth = " + b"[" * DEEP + b"]" * DEEP + b"\n",
        "nests tables or arrays too deeply",
    ),
    "nested tables": (b"a = " + b"{b = " * 5_000 + b"1" + b"}" * 5_000, "too deeply"),
    "a NUL byte": (b'[server]\nlisten_addr = "127.0.0.1:0\x00"\n', "is not valid TOML"),
    "a duplicate key": (b"[storage]\nsweep_limit = 1\nsweep_limit = 2\n", "is not valid TOML"),
    "a section that is a value": (b"storage = 3\n", "[storage] must be a table"),
    "an unknown section": (b"[nope]\nx = 1\n", "unknown section [nope]"),
    "an unknown key": (b"[storage]\nsegment_bytes = 1\n", "storage.segment_bytes: unknown setting"),
    "a float for an integer": (b"[storage]\nsegment_bytes_max = 4096.5\n", "must be an integer"),
    "a bool for an integer": (b"[storage]\nsegment_bytes_max = true\n", "must be an integer"),
    "a negative size": (b"[storage]\nsegment_bytes_max = -1\n", "must be at least 4096"),
    "an unknown persist mode": (b'[storage]\npersist_mode = "fast"\n', "must be one of"),
    "a bad listen address": (b'[server]\nlisten_addr = "localhost"\n', "expected HOST:PORT"),
    "a port out of range": (b'[server]\nlisten_addr = "127.0.0.1:99999"\n', "out of range"),
    "an empty data dir": (b'[server]\ndata_dir = ""\n', "server.data_dir: must be a non-empty"),
    "a queue named a path": (b'[[queues]]\nname = "../a"\n', "queues."),
    "a queue declared twice": (
        b'[[queues]]\nname = "a"\n[[queues]]\nname = "a"\n',
        "declared twice",
    ),
    "api keys of the wrong shape": (b"[auth]\napi_keys = [1, 2]\n", "auth.api_keys[0]"),
    "a contradiction": (
        b"[limits]\ndefault_max_attempts = 9\nmax_attempts_ceiling = 3\n",
        "default_max_attempts",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_a_hostile_config_file_is_refused_with_one_clear_line(name: str, tmp_path: Path) -> None:
    content, expected = HOSTILE_FILES[name]
    path = tmp_path / "sepp.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert expected in str(info.value), str(info.value)


@pytest.mark.parametrize("name", ["binary garbage", "nested arrays", "a negative size"])
def test_sepp_serve_refuses_a_hostile_config_file_without_a_traceback(
    name: str, tmp_path: Path
) -> None:
    content, expected = HOSTILE_FILES[name]
    path = tmp_path / "sepp.toml"
    path.write_bytes(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    proc = subprocess.run(
        [sys.executable, "-m", "sepp.server.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=str(tmp_path),
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sepp: invalid configuration:"), lines
    assert expected in lines[0]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SEPP_STORAGE__SEGMENT_BYTES_MAX", "-1", "storage.segment_bytes_max: must be at least"),
        ("SEPP_STORAGE__SEGMENT_BYTES_MAX", "[" * DEEP, "storage.segment_bytes_max: must be an"),
        ("SEPP_STORAGE__PERSIST_MODE", "\x00", "storage.persist_mode: must be one of"),
        ("SEPP_NOPE__X", "1", "unknown section in environment variable SEPP_NOPE__X"),
        ("SEPP_SERVER__LISTEN_ADDR", "::::", "server.listen_addr"),
    ],
)
def test_a_hostile_environment_value_is_refused_naming_the_key(
    name: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, env={name: value})
    assert expected in str(info.value), str(info.value)


def test_a_data_dir_that_is_a_file_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    stderr = serve_once(target)
    assert "cannot start" in stderr and str(target) in stderr, stderr


# ---------------------------------------------------------------- snapshot files


async def _enqueue(address: str, ledger: Ledger, prefix: str, batches: int) -> None:
    from sepp.client import SeppClient

    client = SeppClient(address)
    try:
        for batch in range(batches):
            tags = [f"{prefix}{batch}-{i}" for i in range(4)]
            assert await ledger.enqueue(client, QUEUE, tags, 120)
    finally:
        await client.close()


async def _drain_at(address: str) -> dict[str, tuple[str, int]]:
    from sepp.client import SeppClient

    client = SeppClient(address)
    try:
        return await drain(client, [QUEUE])
    finally:
        await client.close()


def _two_snapshots(
    server_factory: Callable[..., ServerProcess], env: dict[str, str] | None = None
) -> tuple[Path, Ledger, list[Path]]:
    """A stopped data directory with two shutdown snapshots and the log under them."""
    ledger = Ledger()
    server = server_factory(env=env)
    run(_enqueue(server.address, ledger, "a", 5))
    assert server.stop() == 0
    server = server_factory(data_dir=server.data_dir, env=env)
    run(_enqueue(server.address, ledger, "b", 5))
    assert server.stop() == 0
    snapshots = sorted((server.data_dir / "snapshots").glob("*.snap"))
    return server.data_dir, ledger, snapshots


def _check_everything_there(
    server_factory: Callable[..., ServerProcess], data_dir: Path, ledger: Ledger
) -> ServerProcess:
    server = server_factory(data_dir=data_dir)
    seen = run(_drain_at(server.address))
    assert isinstance(seen, dict)
    assert_survived(ledger, seen)
    assert set(seen) == set(ledger.acknowledged)
    return server


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_newest_snapshot_is_set_aside_and_nothing_is_lost(
    damage: str, server_factory: Callable[..., ServerProcess], rng: random.Random
) -> None:
    data_dir, ledger, snapshots = _two_snapshots(server_factory)
    assert len(snapshots) == 2
    newest = snapshots[-1]
    data = newest.read_bytes()
    newest.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": rng.randbytes(len(data)), "empty": b""}[
            damage
        ]
    )
    server = _check_everything_there(server_factory, data_dir, ledger)
    assert f"skipped damaged snapshot {newest}" in server.log()
    assert Path(str(newest) + ".damaged").exists()


def test_a_snapshot_renamed_to_another_seq_is_not_trusted(
    server_factory: Callable[..., ServerProcess],
) -> None:
    data_dir, ledger, snapshots = _two_snapshots(server_factory)
    newest = snapshots[-1]
    seq = int(newest.stem)
    forged = newest.with_name(snapshot_file_name(seq + 1))
    newest.rename(forged)  # its header still says `seq`
    server = _check_everything_there(server_factory, data_dir, ledger)
    assert "does not match file name" in server.log(), server.log()


def test_a_forged_snapshot_newer_than_the_log_refuses_to_start(
    server_factory: Callable[..., ServerProcess],
) -> None:
    data_dir, _ledger, _snapshots = _two_snapshots(server_factory)
    result = replay_to(open_data_dir(str(data_dir)))
    assert result.state is not None
    ahead = result.seq + 100
    path = data_dir / "snapshots" / snapshot_file_name(ahead)
    path.write_bytes(b"".join(encode_snapshot(result.state, ahead)))
    stderr = serve_once(data_dir)
    assert (
        f"snapshot at seq {ahead} is newer than the log, which ends at seq {result.seq}" in stderr
    )
    assert str(path) in stderr and "sepp-log verify" in stderr


def test_a_forged_snapshot_with_valid_checksums_is_caught_by_verify_not_by_recovery(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """Recovery trusts a snapshot whose checksums hold (it cannot replay the whole
    log at every start: that is what snapshots are for). `sepp-log verify` compares
    every snapshot with the log, and catches a forged one while the log covers it."""
    data_dir, _ledger, snapshots = _two_snapshots(server_factory)
    newest = snapshots[-1]
    seq = int(newest.stem)
    result = replay_to(open_data_dir(str(data_dir)), until_seq=seq)
    assert result.state is not None and result.state.jobs
    victim = next(iter(result.state.jobs))
    del result.state.jobs[victim]  # only the dict: the export walks it
    forged = b"".join(encode_snapshot(result.state, seq))
    newest.write_bytes(forged)
    verify = subprocess.run(
        [sys.executable, "-m", "sepp_tools.sepp_log", "verify", "--no-progress", str(data_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 1, verify.stdout
    assert "snapshot" in verify.stdout and newest.name in verify.stdout, verify.stdout


def test_a_damaged_only_snapshot_with_the_log_head_gone_refuses_to_start(
    server_factory: Callable[..., ServerProcess],
) -> None:
    env = {"SEPP_STORAGE__SEGMENT_BYTES_MAX": "4096", "SEPP_STORAGE__SNAPSHOTS_KEPT": "1"}
    ledger = Ledger()
    server = server_factory(env=env)
    run(_enqueue(server.address, ledger, "a", 30))
    assert server.stop() == 0
    data_dir = server.data_dir
    (snapshot,) = sorted((data_dir / "snapshots").glob("*.snap"))
    first = sorted((data_dir / "wal").glob("*.log"))[0]
    assert int(first.stem) > 1, "retention should have removed the head of the log"
    data = snapshot.read_bytes()
    snapshot.write_bytes(data[: len(data) - 10])
    stderr = serve_once(data_dir)
    assert "no usable snapshot" in stderr and "does not start at seq 1" in stderr, stderr
    assert str(snapshot) in stderr
    snapshot.write_bytes(data)  # restored from a backup: everything is there
    _check_everything_there(server_factory, data_dir, ledger)
