"""Disk faults at the server level: what a client sees, and what survives.

- **EIO / ENOSPC on a log write or sync**, injected through the storage seam
  (`FaultyFileSystem`) under a real in-process `SeppServer` and a real client:
  the server stops accepting writes with a clear error (`internal`,
  reason `storage_failed`; health `not_serving`; exit code 3; the log names the
  errno), never answers ok again, and once the fault is gone a restart holds every
  job it acknowledged — after a clean exit and after a crash that drops unsynced
  bytes.
- **A real full disk**: the same on a small size-limited file system (a tmpfs
  and a loop-mounted ext4 image), filled up for real; skipped, with the reason,
  where mounting is not permitted. "Space back" = a ballast file is deleted.
- **A torn last write** (a record cut mid-append, zeros from a preallocated
  block) is cut by recovery; **a flipped bit in a sealed segment** makes the
  server refuse to start, naming the file, offset and sequence number that
  `sepp-log verify` names; repaired, it starts with everything; **a flipped bit in
  the last record** is indistinguishable from a torn write and is cut (exactly
  that record: a documented limit of any log without redundancy).

`tests/storage/test_faults.py` covers the engine itself; this file covers the
process, the server and the client.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    Record,
    decode_segment_header,
    encode_envelope,
    encode_record,
    parse_segment_file_name,
    scan_records,
)
from sepp.client import HealthStatus, SeppClient, ServerInternalError
from sepp.server.server import EXIT_STORAGE_FAILED, SeppServer
from sepp.storage.faultfs import FaultyFileSystem
from tests.conftest import ServerProcess
from tests.crash.helpers import Ledger, assert_survived, drain, run, serve_once
from tests.inprocess import address_of, in_process_config

QUEUE = "disk"


pytestmark = pytest.mark.usefixtures("in_process_env")


# ---------------------------------------------------------------- through the seam

SEAM_FAULTS = [
    pytest.param(op, err, mode, id=f"{op}-{errno.errorcode[err]}-{mode}")
    for op, err, mode in [
        ("write", errno.ENOSPC, "sync_all"),
        ("write", errno.EIO, "sync_data"),
        ("fsync", errno.ENOSPC, "sync_all"),
        ("fsync", errno.EIO, "sync_all"),
        ("fdatasync", errno.ENOSPC, "sync_data"),
        ("fdatasync", errno.EIO, "sync_data"),
        ("full", errno.ENOSPC, "sync_all"),
    ]
]


async def _until_storage_fails(
    fs: FaultyFileSystem, op: str, err: int, mode: str, ledger: Ledger
) -> tuple[int, HealthStatus]:
    config = in_process_config(storage__persist_mode=mode, storage__segment_bytes_max="4096")
    server = SeppServer(config, fs=fs)
    await server.start()
    # Hold the fail-stop shutdown at its first step (stopping the commit pipeline),
    # before it closes the connections, until the client has asked for health: a
    # connection that is still open must report not_serving, and without the hold
    # the answer would race the close.
    assert server.pipeline is not None
    pipeline = server.pipeline
    stop_pipeline = pipeline.stop
    health_seen = asyncio.Event()

    async def held_stop() -> None:
        await health_seen.wait()
        await stop_pipeline()

    pipeline.stop = held_stop  # type: ignore[method-assign]
    client = SeppClient(address_of(server))
    try:
        for batch in range(10):
            assert await ledger.enqueue(client, QUEUE, [f"before-{batch}-{i}" for i in range(5)])
        if op == "full":
            # Room for about 6 kB more log. Not counting the active segment's
            # preallocated zeros: the seal that cuts them would free that room, and
            # a preallocation that no longer fits is skipped, not a failure.
            used = sum(len(data.rstrip(b"\0")) for data in fs.durable_files().values())
            fs.capacity_bytes = used + 6_000
        else:
            fs.fail(op, err, path_contains="/wal/", times=1)  # one failure: a retry would pass
        for batch in range(500):
            if not await ledger.enqueue(client, QUEUE, [f"after-{batch}-{i}" for i in range(3)]):
                break
        else:
            raise AssertionError("the fault never hit")
        first = ledger.errors[0]
        # A clear error: internal, storage_failed, the outcome unknown.
        assert isinstance(first, ServerInternalError), repr(first)
        assert first.reason == "storage_failed", first.details
        try:
            health = await client.health()
        finally:
            health_seen.set()
        # Never ok again: later writes are refused or find the server gone.
        for batch in range(3):
            assert not await ledger.enqueue(client, QUEUE, [f"later-{batch}"])
    finally:
        health_seen.set()
        await client.close()
    code = await asyncio.wait_for(server.wait_stopped(), 30)
    # The process would exit now, and the kernel drop its lock on the directory.
    assert server.engine is not None
    server.engine.release_lock()
    return code, health


async def _restart_and_drain(fs: FaultyFileSystem) -> dict[str, tuple[str, int]]:
    server = SeppServer(in_process_config(storage__segment_bytes_max="4096"), fs=fs)
    await server.start()
    try:
        client = SeppClient(address_of(server))
        try:
            return await drain(client, [QUEUE])
        finally:
            await client.close()
    finally:
        await server.shutdown()


@pytest.mark.parametrize("restart", ["after_exit", "after_crash"])
@pytest.mark.parametrize(("op", "err", "mode"), SEAM_FAULTS)
def test_a_failed_write_or_sync_stops_writes_clearly_and_loses_nothing_acknowledged(
    op: str, err: int, mode: str, restart: str, rng: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fs = FaultyFileSystem()
    ledger = Ledger()
    caplog.set_level(logging.ERROR, logger="sepp")
    code, health = run(_until_storage_fails(fs, op, err, mode, ledger))  # type: ignore[misc]
    assert code == EXIT_STORAGE_FAILED
    assert (health.serving, health.reason) == (False, "storage_failed"), health
    # The operator is told why, with the errno.
    assert any(
        r.levelno >= logging.CRITICAL and f"[Errno {err}]" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    # Space is back (or the device answers again); perhaps the machine crashed too.
    fs.clear_faults()
    fs.capacity_bytes = None
    if restart == "after_crash":
        fs.crash(rng, tear=True)
    seen = run(_restart_and_drain(fs))
    assert isinstance(seen, dict)
    assert_survived(ledger, seen)
    assert len(ledger.acknowledged) >= 50


# ---------------------------------------------------------------- a real full disk


def _mount(kind: str, target: Path, work: Path) -> Callable[[], None]:
    """Mount a 16 MiB file system of `kind` on `target`; the unmount function.
    Skips (with the reason) where mounting is not permitted."""
    target.mkdir()
    if kind == "tmpfs":
        command = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(target)]
    else:
        image = work / "disk.img"
        with open(image, "wb") as f:
            f.truncate(16 * 1024 * 1024)
        mkfs = shutil.which("mkfs.ext4") or "/sbin/mkfs.ext4"
        made = subprocess.run(
            [mkfs, "-q", "-F", "-m", "0", str(image)], capture_output=True, check=False
        )
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 image: {made.stderr.decode().strip()}")
        command = ["mount", "-o", "loop", str(image), str(target)]
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited file system needs root")
    mounted = subprocess.run(command, capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"mount not permitted here: {mounted.stderr.decode().strip()}")

    def unmount() -> None:
        if subprocess.run(["umount", str(target)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=False)

    return unmount


async def _fill_until_enospc(address: str, ledger: Ledger) -> None:
    client = SeppClient(address)
    try:
        for batch in range(10_000):
            if not await ledger.enqueue(
                client, QUEUE, [f"job-{batch}-{i}" for i in range(4)], 8_000
            ):
                return
        raise AssertionError("the disk never filled up")
    finally:
        await client.close()


async def _drain_at(address: str) -> dict[str, tuple[str, int]]:
    client = SeppClient(address)
    try:
        return await drain(client, [QUEUE])
    finally:
        await client.close()


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_a_real_full_disk_stops_writes_and_loses_nothing_once_space_is_back(
    kind: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    mount_point = tmp_path / "mnt"
    unmount = _mount(kind, mount_point, tmp_path)
    try:
        # Ballast: leave about 1.5 MiB free; deleting it later is "space is back".
        ballast = mount_point / "ballast"
        free = shutil.disk_usage(mount_point).free
        with open(ballast, "wb") as f:
            f.write(b"\0" * max(0, free - 1_500_000))
            f.flush()
            os.fsync(f.fileno())
        data_dir = mount_point / "data"
        server = server_factory(data_dir=data_dir)
        ledger = Ledger()
        run(_fill_until_enospc(server.address, ledger))
        assert server.proc is not None
        code = server.proc.wait(30)
        log = server.log()
        assert code == EXIT_STORAGE_FAILED, log
        assert "No space left on device" in log, log
        assert isinstance(ledger.errors[0], ServerInternalError), repr(ledger.errors[0])
        assert len(ledger.acknowledged) >= 20
        ballast.unlink()
        restarted = server_factory(data_dir=data_dir)
        seen = run(_drain_at(restarted.address))
        assert isinstance(seen, dict)
        assert_survived(ledger, seen)
        assert restarted.stop() == 0
    finally:
        unmount()


# ---------------------------------------------------------------- torn and flipped


async def _enqueue_some(address: str, ledger: Ledger, batches: int, size: int = 150) -> None:
    client = SeppClient(address)
    try:
        for batch in range(batches):
            assert await ledger.enqueue(client, QUEUE, [f"j{batch}-{i}" for i in range(3)], size)
    finally:
        await client.close()


def _segments(data_dir: Path) -> list[Path]:
    wal = data_dir / "wal"
    return sorted(p for p in wal.iterdir() if parse_segment_file_name(p.name) is not None)


def _records(path: Path) -> list[Record]:
    data = path.read_bytes()
    first = decode_segment_header(data).first_seq
    return [
        r
        for r in scan_records(data, start_offset=FILE_HEADER_BYTES, expected_seq=first)
        if type(r) is Record
    ]


def _data_end(records: list[Record]) -> int:
    """Where the segment's records end (its file may go on with zeros)."""
    if not records:
        return FILE_HEADER_BYTES
    last = records[-1]
    return last.offset + RECORD_HEADER_BYTES + len(last.body)


SMALL_SEGMENTS = {"SEPP_STORAGE__SEGMENT_BYTES_MAX": "4096"}


@pytest.mark.parametrize("tail", ["cut_record", "zeros"])
def test_a_torn_last_write_is_cut_and_nothing_acknowledged_is_lost(
    tail: str, server_factory: Callable[..., ServerProcess]
) -> None:
    server = server_factory(env=SMALL_SEGMENTS)
    ledger = Ledger()
    run(_enqueue_some(server.address, ledger, 10))
    server.kill()
    last = _segments(server.data_dir)[-1]
    records = _records(last)
    next_seq = (
        records[-1].seq + 1 if records else decode_segment_header(last.read_bytes()).first_seq
    )
    if tail == "cut_record":
        record = encode_record(next_seq, RECORD_KIND_COMMAND, b"x" * 90)
        torn = record[: len(record) // 2]
    else:
        torn = bytes(512)
    # The torn write lands where the next record would have: right after the last
    # one, over the writer's preallocated zeros (if the killed server left any).
    end = _data_end(records)
    with open(last, "r+b") as f:
        f.seek(end)
        f.write(torn)
    cut = last.stat().st_size - end
    restarted = server_factory(data_dir=server.data_dir, env=SMALL_SEGMENTS)
    if tail == "cut_record":
        assert f"truncated torn tail of {last} at {end} ({cut} bytes)" in restarted.log()
    else:  # zeros after the last record: the writer's own preallocation, as far as
        # recovery can tell -- cut all the same, and not called torn
        assert f"released {cut} preallocated bytes after the last record" in restarted.log()
    assert last.stat().st_size == end
    seen = run(_drain_at(restarted.address))
    assert isinstance(seen, dict)
    assert_survived(ledger, seen)
    assert set(seen) == set(ledger.acknowledged)


def test_a_flipped_bit_in_a_sealed_segment_refuses_to_start_and_says_exactly_where(
    rng: Any, server_factory: Callable[..., ServerProcess]
) -> None:
    server = server_factory(env=SMALL_SEGMENTS)
    ledger = Ledger()
    run(_enqueue_some(server.address, ledger, 40))
    server.kill()
    sealed = _segments(server.data_dir)[:-1]
    assert len(sealed) >= 2
    path = rng.choice(sealed)
    records = _records(path)
    record = rng.choice(records[:-1])  # damage followed by valid records
    original = path.read_bytes()
    offset = record.offset + rng.randrange(len(record.body) + 20)
    damaged = bytearray(original)
    damaged[offset] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(damaged))
    stderr = serve_once(server.data_dir)
    assert "cannot start: corrupt record" in stderr, stderr
    assert f"file {path}; offset {record.offset}; seq {record.seq}" in stderr, stderr
    assert "sepp-log verify" in stderr
    verify = subprocess.run(
        [
            sys.executable,
            "-m",
            "sepp_tools.sepp_log",
            "verify",
            "--no-progress",
            str(server.data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 1, verify.stdout
    rel = path.relative_to(server.data_dir)
    assert f"{rel} offset {record.offset} seq {record.seq}" in verify.stdout, verify.stdout
    # The operator restores the file (from a backup, say): everything is there.
    path.write_bytes(original)
    restarted = server_factory(data_dir=server.data_dir, env=SMALL_SEGMENTS)
    seen = run(_drain_at(restarted.address))
    assert isinstance(seen, dict)
    assert set(seen) == set(ledger.acknowledged)


def test_a_flipped_bit_in_the_last_record_is_cut_like_a_torn_write(
    rng: Any, server_factory: Callable[..., ServerProcess]
) -> None:
    """A damaged last record cannot be told from a write torn by a crash (LevelDB's
    rule): recovery cuts exactly that record and says so. Without redundancy no log
    can do better; the tail's record is the one a crash could have torn anyway."""
    server = server_factory(env=SMALL_SEGMENTS)
    ledger = Ledger()
    run(_enqueue_some(server.address, ledger, 12))
    server.kill()
    last = _segments(server.data_dir)[-1]
    records = _records(last)
    assert records
    victim = records[-1]
    data = bytearray(last.read_bytes())
    data[victim.offset + rng.randrange(RECORD_HEADER_BYTES + len(victim.body))] ^= 1
    last.write_bytes(bytes(data))
    restarted = server_factory(data_dir=server.data_dir, env=SMALL_SEGMENTS)
    assert f"truncated torn tail of {last} at {victim.offset}" in restarted.log()
    seen = run(_drain_at(restarted.address))
    assert isinstance(seen, dict)
    # Exactly the last batch (one record) is gone; everything before it is there.
    lost = set(ledger.acknowledged) - set(seen)
    assert lost == {f"j11-{i}" for i in range(3)}, lost


def test_a_hole_that_out_of_order_writeback_left_is_cut_with_a_warning(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """A power cut can persist a later page of the unsynced tail and lose an earlier
    one: zeros where record n+1 was, a valid record n+2 after them. Record n+2 says
    that nothing after seq n had been synced when it was written (FORMAT.md 5.4), so
    the server starts, cuts the hole and what follows, and says so; everything
    acknowledged is there."""
    server = server_factory(env=SMALL_SEGMENTS)
    ledger = Ledger()
    run(_enqueue_some(server.address, ledger, 10))
    server.kill()
    last = _segments(server.data_dir)[-1]
    records = _records(last)
    assert records
    n = records[-1].seq
    lost = encode_record(n + 1, RECORD_KIND_COMMAND, encode_envelope(1, 1, [], n))
    kept = encode_record(n + 2, RECORD_KIND_COMMAND, encode_envelope(1, 1, [], n))
    end = _data_end(records)
    with open(last, "r+b") as f:
        f.seek(end)
        f.write(bytes(len(lost)) + kept)
    cut = last.stat().st_size - end
    restarted = server_factory(data_dir=server.data_dir, env=SMALL_SEGMENTS)
    assert (
        f"a power loss left a hole in the unsynced tail of {last} at offset {end}: cut it "
        f"and the 1 record(s) after it ({cut} bytes)"
    ) in restarted.log()
    assert last.stat().st_size == end
    seen = run(_drain_at(restarted.address))
    assert isinstance(seen, dict)
    assert_survived(ledger, seen)
    assert set(seen) == set(ledger.acknowledged)


def test_verify_and_recovery_agree_on_a_zero_filled_last_segment(tmp_path: Path) -> None:
    from log_format import segment_file_name
    from sepp.core import Enqueue, NewJob
    from sepp.storage import Engine, RecoveryError
    from tools.datadir import open_data_dir
    from tools.verify import verify

    data_dir = tmp_path / "data"
    engine = Engine.open(str(data_dir))
    job = NewJob(job_id="00000000-0000-4000-8000-000000000001", queue=QUEUE, job_type="t")
    engine.execute(Enqueue(jobs=(job,)), 1_700_000_000_000)
    engine.close()
    # A segment that was being created when the machine died, its blocks zeros.
    (data_dir / "wal" / segment_file_name(2)).write_bytes(bytes(99))
    report = verify(open_data_dir(str(data_dir)))
    verify_ok = report.ok
    try:
        Engine.open(str(data_dir)).close()
        recovery_ok = True
    except RecoveryError:
        recovery_ok = False
    assert verify_ok == recovery_ok, (verify_ok, recovery_ok)


def _cut_before_half_created(kind: str, data: bytes) -> bytes:
    from log_format import RECORD_HEADER_BYTES, Record, scan_records

    last = [item for item in scan_records(data, expected_seq=1) if type(item) is Record][-1]
    if kind == "flipped_bit":
        at = last.offset + RECORD_HEADER_BYTES + 3
        return data[:at] + bytes([data[at] ^ 8]) + data[at + 1 :]
    if kind == "torn_record":
        return data[: last.offset + RECORD_HEADER_BYTES + 2]
    if kind == "zeros_after":
        return data + bytes(4096)
    if kind == "record_missing":
        return data[: last.offset]
    return data


@pytest.mark.parametrize(
    "kind", ["intact", "flipped_bit", "torn_record", "zeros_after", "record_missing"]
)
def test_verify_and_recovery_agree_on_the_segment_before_a_half_created_one(
    kind: str, tmp_path: Path
) -> None:
    # Rotation synced that segment whole before it created the next file: only
    # an intact one, ending just before the new file's first seq, may start.
    from log_format import segment_file_name
    from sepp.core import Enqueue, NewJob
    from sepp.storage import Engine, RecoveryError
    from tools.datadir import open_data_dir
    from tools.verify import verify

    data_dir = tmp_path / "data"
    engine = Engine.open(str(data_dir))
    for n in range(3):
        job = NewJob(
            job_id=f"00000000-0000-4000-8000-00000000000{n + 1}", queue=QUEUE, job_type="t"
        )
        engine.execute(Enqueue(jobs=(job,)), 1_700_000_000_000 + n)
    engine.close()
    segment = data_dir / "wal" / segment_file_name(1)
    segment.write_bytes(_cut_before_half_created(kind, segment.read_bytes()))
    (data_dir / "wal" / segment_file_name(4)).write_bytes(b"")
    verify_ok = verify(open_data_dir(str(data_dir))).ok
    try:
        Engine.open(str(data_dir)).close()
        recovery_ok = True
    except RecoveryError:
        recovery_ok = False
    assert (verify_ok, recovery_ok) == ((True, True) if kind == "intact" else (False, False))
