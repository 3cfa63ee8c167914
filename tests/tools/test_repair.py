"""`sepp-log repair --truncate-at SEQ`: for a log that recovery refuses, keep
records 1..SEQ-1, remove the rest (and the snapshots of later states) into a backup,
and leave a directory the engine starts from with the state at SEQ-1. A cut that
could not give such a directory is refused before anything changes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from log_format import RECORD_HEADER_BYTES, snapshot_file_name
from sepp.storage import Engine, RealFileSystem, RecoveryError
from sepp.storage.snapshots import write_snapshot_file
from tests.tools.helpers import (
    CONFIG,
    LiveLog,
    flip_bit,
    locate,
    options,
    replace_record,
    scripted_log,
    segment_paths,
    tree,
)
from tools.datadir import ERROR, Problem, open_data_dir
from tools.repair import apply_repair, plan_repair
from tools.replay import replay_to

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
