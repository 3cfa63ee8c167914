"""`sepp-log repair --truncate-at SEQ`: for a log that recovery refuses, keep
records 1..SEQ-1, remove the rest (and the snapshots of later states) into a backup,
and leave a directory the engine starts from with the state at SEQ-1. A cut that
could not give such a directory is refused before anything changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from log_format import RECORD_HEADER_BYTES, snapshot_file_name
from sepp.client import SeppClient
from sepp.core import Ack, Enqueue, Reserve
from sepp.server.config import load_config
from sepp.server.server import SeppServer
from sepp.storage import Engine, RealFileSystem, RecoveryError
from sepp.storage.snapshots import write_snapshot_file
from tests.tools.helpers import (
    CONFIG,
    T0,
    LiveLog,
    flip_bit,
    job,
    locate,
    options,
    replace_record,
    scripted_log,
    segment_paths,
    tree,
)
from tools.datadir import ERROR, Problem, open_data_dir
from tools.repair import apply_repair, apply_set_aside, plan_repair, plan_set_aside
from tools.replay import replay_to
from tools.verify import verify

SEG1, SEG13, SEG25 = (f"wal/{n:020d}.log" for n in (1, 13, 25))


def _repair(data_dir: Path, seq: int, backup: Path) -> list[str]:
    plan = plan_repair(open_data_dir(str(data_dir)), seq)
    assert plan.refusal is None, plan.refusal
    return apply_repair(plan, str(backup))


def _starts_with_state_at(live: LiveLog, seq: int) -> None:
    engine = Engine.open(str(live.data_dir), CONFIG, options())
    try:
        assert engine.recovery_report.last_seq == seq
        assert engine.state.canonical() == live.canonical[seq]
    finally:
        engine.close()


def _refuses(data_dir: Path) -> None:
    copy = data_dir.parent / f"{data_dir.name}-copy"
    shutil.copytree(data_dir, copy)
    with pytest.raises(RecoveryError):
        Engine.open(str(copy), CONFIG, options())
    shutil.rmtree(copy)


def test_cut_at_a_corrupt_record_in_a_sealed_segment(tmp_path: Path, scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    _refuses(scripted.data_dir)
    damaged = tree(scripted.data_dir)
    backup = tmp_path / "backup"
    done = _repair(scripted.data_dir, 17, backup)
    _starts_with_state_at(scripted, 16)
    size = len(damaged[SEG13][2])
    assert done == [
        f"moved {SEG25} to {backup / SEG25}",
        f"truncated {SEG13} at offset {record.offset}; the {size - record.offset} bytes cut "
        f"are in {backup / 'wal' / '00000000000000000013.log.from-offset-'}{record.offset}",
    ]
    # Everything removed is in the backup, byte for byte: putting it back as
    # REPAIR.txt says gives the damaged directory again.
    assert (
        (backup / "REPAIR.txt")
        .read_text()
        .startswith(f"sepp-log repair {scripted.data_dir} --truncate-at 17\n")
    )
    tail = backup / "wal" / f"00000000000000000013.log.from-offset-{record.offset}"
    assert (scripted.data_dir / SEG13).read_bytes() + tail.read_bytes() == damaged[SEG13][2]
    assert (backup / SEG25).read_bytes() == damaged[SEG25][2]


def test_the_backup_is_private_whatever_the_umask(tmp_path: Path, scripted: LiveLog) -> None:
    # A backup holds jobs' payloads like the data directory (issue 13 §6).
    path, record = locate(scripted.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    backup = tmp_path / "backup"
    old = os.umask(0)
    try:
        _repair(scripted.data_dir, 17, backup)
    finally:
        os.umask(old)
    modes = {
        str(p.relative_to(backup)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in [backup, *backup.rglob("*")]
    }
    assert len(modes) == 6  # ., wal/, snapshots/, REPAIR.txt, a moved segment, a cut tail
    assert modes == {name: "0o700" if (backup / name).is_dir() else "0o600" for name in modes}


def test_cut_at_a_record_that_does_not_decode(tmp_path: Path, scripted: LiveLog) -> None:
    replace_record(scripted.data_dir, 30, b"\xc1")
    _refuses(scripted.data_dir)
    _repair(scripted.data_dir, 30, tmp_path / "backup")
    _starts_with_state_at(scripted, 29)


def test_cut_after_a_deleted_middle_segment_removes_the_segments_after_the_gap(
    tmp_path: Path, scripted: LiveLog
) -> None:
    (scripted.data_dir / SEG13).unlink()
    _refuses(scripted.data_dir)
    plan = plan_repair(open_data_dir(str(scripted.data_dir)), 13)
    assert plan.describe() == [
        f"remove {SEG25} ({(scripted.data_dir / SEG25).stat().st_size} bytes)"
    ]
    apply_repair(plan, str(tmp_path / "backup"))
    _starts_with_state_at(scripted, 12)


def test_cut_at_the_first_record_of_a_segment_keeps_its_header(
    tmp_path: Path, scripted: LiveLog
) -> None:
    _repair(scripted.data_dir, 13, tmp_path / "backup")
    assert (scripted.data_dir / SEG13).stat().st_size == 32
    assert not (scripted.data_dir / SEG25).exists()
    _starts_with_state_at(scripted, 12)


def test_snapshots_after_the_cut_are_removed(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(10, 30))
    live.close()
    backup = tmp_path / "backup"
    _repair(live.data_dir, 20, backup)
    snap10, snap30 = (f"snapshots/{snapshot_file_name(s)}" for s in (10, 30))
    assert (live.data_dir / snap10).exists()
    assert not (live.data_dir / snap30).exists()
    assert (backup / snap30).exists()
    _starts_with_state_at(live, 19)


def test_cut_keeps_the_snapshot_that_covers_the_head_of_the_log(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(24,))
    live.close()
    for path in segment_paths(live.data_dir)[:2]:
        path.unlink()
    _repair(live.data_dir, 25, tmp_path / "backup")
    _starts_with_state_at(live, 24)


def test_cut_after_damage_is_refused_and_changes_nothing(tmp_path: Path, scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    before = tree(scripted.data_dir)
    plan = plan_repair(open_data_dir(str(scripted.data_dir)), 20)
    assert plan.refusal == Problem(
        ERROR,
        "repair",
        SEG13,
        None,
        20,
        "the log is damaged at seq 17, before seq 20 (corruption in "
        f"{SEG13} offset {record.offset}: bad body checksum); records from seq 17 on cannot "
        "be kept (use --truncate-at 17)",
    )
    with pytest.raises(ValueError, match="refused"):
        apply_repair(plan, str(tmp_path / "backup"))
    assert tree(scripted.data_dir) == before


def test_cut_past_the_end_of_the_log_is_refused(scripted: LiveLog) -> None:
    data_dir = open_data_dir(str(scripted.data_dir))
    refused = plan_repair(data_dir, 42)
    assert refused.refusal is not None
    assert refused.refusal.reason == "the log ends at seq 40: nothing at seq 42 to cut"
    nothing = plan_repair(data_dir, 41)
    assert nothing.refusal is None
    assert not nothing.changes_anything


def test_cut_that_leaves_the_head_of_the_log_uncovered_is_refused(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(20,))
    live.close()
    (live.data_dir / SEG1).unlink()
    plan = plan_repair(open_data_dir(str(live.data_dir)), 15)
    assert plan.refusal is not None
    assert plan.refusal.reason == (
        "after the cut the log starts at seq 13 and no usable snapshot at or before seq 14 "
        "covers seqs 1..12: recovery would still refuse"
    )
    before = plan_repair(open_data_dir(str(live.data_dir)), 5)
    assert before.refusal is not None
    assert before.refusal.reason == "seq 5 is before the start of the log (seq 13)"


def test_removing_a_snapshot_newer_than_the_log(tmp_path: Path, scripted: LiveLog) -> None:
    state = replay_to(open_data_dir(str(scripted.data_dir))).state
    assert state is not None
    name = snapshot_file_name(45)
    write_snapshot_file(RealFileSystem(), str(scripted.data_dir / "snapshots" / name), state, 45)
    _refuses(scripted.data_dir)
    _repair(scripted.data_dir, 41, tmp_path / "backup")
    assert (tmp_path / "backup" / "snapshots" / name).exists()
    _starts_with_state_at(scripted, 40)


# ---------------------------------------------------------------- damaged history


def _issue_scenario(data_dir: Path) -> LiveLog:
    """Issue 12's directory: 305 jobs enqueued, 100 of them acked, snapshots at
    seqs 11 and 111, every segment kept (a long `log_retention_ms`)."""
    live = LiveLog.open(data_dir, snapshot_at=(11, 111))
    for n in range(305):
        live.run(Enqueue(jobs=(job(n),)), T0 + n)
    for _ in range(100):
        reserved = live.run(Reserve(queues=("emails",), lease_ms=60_000, worker_id="w"), T0 + 1000)
        job_id = reserved.events[0].job_id  # type: ignore[attr-defined]
        live.run(Ack(job_id=job_id, attempt=1, worker_id="w"), T0 + 1000)
    live.close()
    return live


async def _serve_and_ask_health(data_dir: Path) -> tuple[dict[str, Any], int]:
    config = load_config(
        None,
        env={"SEPP_STORAGE__LOG_RETENTION_MS": str(10**13), "SEPP_STORAGE__SNAPSHOTS_KEPT": "10"},
        overrides={
            ("server", "data_dir"): str(data_dir),
            ("server", "listen_addr"): "127.0.0.1:0",
            ("admin", "listen_addr"): "off",
        },
    )
    server = SeppServer(config)
    await server.start()
    try:
        assert server.address is not None and server.engine is not None
        jobs = len(server.engine.state.jobs)
        client = SeppClient(f"{server.address[0]}:{server.address[1]}")
        try:
            answer = await client._call("health", {}, retry_safe=True)
        finally:
            await client.close()
    finally:
        await server.shutdown()
        await asyncio.wait_for(server.wait_stopped(), 30)
    return answer, jobs


def test_a_flipped_bit_in_history_starts_the_server_and_repair_sets_aside_history_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./sepp.toml
    data_dir = tmp_path / "data"
    live = _issue_scenario(data_dir)
    last = live.last_seq
    assert last == 505 and len(live.canonical[last]["jobs"]) == 205
    path, record = locate(data_dir, 8)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    damaged_rel = f"wal/{path.name}"
    before = tree(data_dir)

    # The server starts with every job, and says so loudly: log and health.
    caplog.set_level(logging.ERROR, logger="sepp")
    health, jobs = asyncio.run(_serve_and_ask_health(data_dir))
    assert jobs == 205
    assert health["status"] == "serving"
    (damage,) = health["damaged_history"]
    assert damage["file"] == str(path) and damage["snapshot_seq"] == 111
    assert (damage["offset"], damage["seq"]) == (record.offset, 8)
    assert damage["first_seq"] == 1 and damage["reason"] == "corrupt record (bad body checksum)"
    assert any(
        r.levelno == logging.ERROR
        and "damaged history" in r.getMessage()
        and path.name in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    for name in list(tree(data_dir)):
        if name.startswith("snapshots/") and name not in before:
            # The server's shutdown snapshot: the rest of the test wants issue 12's pair.
            (data_dir / name).unlink()

    # verify agrees: damaged history, and the replay goes on from the snapshot.
    report = verify(open_data_dir(str(data_dir)))
    assert [(p.kind, p.file, p.seq) for p in report.problems if p.severity == ERROR] == [
        ("damaged-history", damaged_rel, 8)
    ]
    assert report.replay_from == 111 and report.replayed_to == last

    # The cut the issue was offered is refused: it would delete both snapshots.
    plan = plan_repair(open_data_dir(str(data_dir)), 8)
    assert plan.refusal is not None and "--set-aside-history" in plan.refusal.reason
    assert not plan.changes_anything

    # Setting history aside moves the damaged segment (and none after it).
    aside = plan_set_aside(open_data_dir(str(data_dir)))
    assert [s.rel for s in aside.segments] == [damaged_rel]
    assert aside.other == []
    backup = tmp_path / "aside"
    done = apply_set_aside(aside, str(backup))
    assert done == [f"moved {damaged_rel} to {backup / damaged_rel}"]
    assert (backup / damaged_rel).read_bytes() == before[damaged_rel][2]
    after = tree(data_dir)
    assert set(before) - set(after) == {damaged_rel}
    assert all(after[name] == before[name] for name in after)  # nothing else touched

    engine = Engine.open(str(data_dir), CONFIG, options())
    try:
        assert engine.recovery_report.damaged_history == []
        assert engine.state.canonical() == live.canonical[last]
    finally:
        engine.close()
    assert verify(open_data_dir(str(data_dir))).ok


def test_set_aside_history_takes_the_segments_before_the_damage_along(tmp_path: Path) -> None:
    # Damage in the second segment: moving only it would leave a gap after the
    # first, reported on every start; both go, and nothing above the snapshot.
    live = scripted_log(tmp_path / "data", snapshot_at=(30,))
    live.close()
    path, record = locate(live.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    aside = plan_set_aside(open_data_dir(str(live.data_dir)))
    assert [s.rel for s in aside.segments] == [SEG1, SEG13]
    assert aside.history_end == 24
    apply_set_aside(aside, str(tmp_path / "aside"))
    assert [p.name for p in segment_paths(live.data_dir)] == [SEG25.removeprefix("wal/")]
    engine = Engine.open(str(live.data_dir), CONFIG, options())
    try:
        assert engine.recovery_report.damaged_history == []
        assert engine.state.canonical() == live.canonical[40]
    finally:
        engine.close()


def test_set_aside_history_leaves_damage_above_the_snapshot_alone(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(12,))
    live.close()
    path, record = locate(live.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    aside = plan_set_aside(open_data_dir(str(live.data_dir)))
    assert aside.segments == [] and not aside.changes_anything
    assert [(p.kind, p.seq) for p in aside.other] == [("corruption", 17)]
    # The cut stays the way out, as before.
    assert plan_repair(open_data_dir(str(live.data_dir)), 17).refusal is None
