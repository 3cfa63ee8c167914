"""`sepp-log` on damaged history: damage wholly below the snapshot recovery starts
from (recovery decision table rows 15-18). `verify` names it `damaged-history` and
replays on from that snapshot, as recovery does; damage recovery refuses keeps its
old kind; `repair --set-aside-history` from the command line.

The scripted log (tests/tools/helpers.py) has segments 1..12, 13..24 and 25..40.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from log_format import RECORD_HEADER_BYTES
from sepp.storage import Engine
from sepp.storage.recovery import DamagedHistory, RecoveryError
from tests.tools.helpers import CONFIG, flip_bit, locate, options, scripted_log
from tests.tools.test_cli import run_main
from tools.datadir import ERROR, open_data_dir
from tools.verify import verify

SEG1, SEG13, SEG25 = (f"wal/{n:020d}.log" for n in (1, 13, 25))


def _errors(data_dir: Path) -> list[tuple[str, str | None, int | None]]:
    report = verify(open_data_dir(str(data_dir)))
    return [(p.kind, p.file, p.seq) for p in report.problems if p.severity == ERROR]


def test_verify_calls_damage_below_the_snapshot_damaged_history_and_replays_on_from_it(
    tmp_path: Path,
) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(30,))
    live.close()
    path, record = locate(live.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    report = verify(open_data_dir(str(live.data_dir)))
    (problem,) = [p for p in report.problems if p.severity == ERROR]
    assert (problem.kind, problem.file, problem.offset, problem.seq) == (
        "damaged-history",
        SEG13,
        record.offset,
        17,
    )
    assert "snapshots/00000000000000000030.snap (seq 30)" in problem.reason
    assert "records 13..24 are lost to audits" in problem.reason
    assert "--set-aside-history" in problem.reason
    # The replay restarted from the snapshot recovery uses, and reached the end.
    assert (report.replay_from, report.replayed_to, report.replay_stopped) == (30, 40, None)
    assert [(s.seq, s.verdict) for s in report.snapshots] == [(30, "base")]
    assert not report.ok  # the disk damaged the log all the same: exit 1


def test_records_missing_below_the_snapshot_are_damaged_history_for_verify_and_recovery(
    tmp_path: Path,
) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(30,))
    live.close()
    (live.data_dir / SEG13).unlink()
    assert _errors(live.data_dir) == [("damaged-history", SEG25, 13)]
    engine = Engine.open(str(live.data_dir), CONFIG, options())
    try:
        assert engine.recovery_report.damaged_history == [
            DamagedHistory(
                str(live.data_dir / SEG25),
                0,
                13,
                "sequence gap between segments: expected seq 13, segment starts at 25",
                13,
                24,
                30,
            )
        ]
        assert engine.state.canonical() == live.canonical[40]
    finally:
        engine.close()


def test_damage_the_snapshot_does_not_cover_stays_corruption(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(12,))
    live.close()
    path, record = locate(live.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    assert _errors(live.data_dir) == [("corruption", SEG13, 17)]


def test_damage_covered_only_by_a_damaged_newest_snapshot_stays_corruption(
    tmp_path: Path,
) -> None:
    # Recovery would fall back to the snapshot at 12 and need records 13..24.
    live = scripted_log(tmp_path / "data", snapshot_at=(12, 30))
    live.close()
    newest = live.data_dir / "snapshots" / f"{30:020d}.snap"
    flip_bit(newest, newest.stat().st_size // 2)
    path, record = locate(live.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    errors = _errors(live.data_dir)
    assert ("corruption", SEG13, 17) in errors
    assert not [e for e in errors if e[0] == "damaged-history"]


def test_repair_set_aside_history_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(30,))
    live.close()
    path, record = locate(live.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    data = str(live.data_dir)
    code, out, err = run_main(["repair", data, "--set-aside-history", "--dry-run"], capsys)
    assert code == 0, err
    assert f"would move {SEG1} " in out and f"would move {SEG13} " in out
    assert (live.data_dir / SEG13).exists()  # a dry run changes nothing
    # The cut that would drop the snapshot holding the state is refused.
    code, _out, err = run_main(["repair", data, "--truncate-at", "17"], capsys)
    assert code == 1 and "--set-aside-history" in err
    code, out, err = run_main(
        ["repair", data, "--set-aside-history", "--backup-dir", str(tmp_path / "aside")], capsys
    )
    assert code == 0, err
    assert (tmp_path / "aside" / SEG13).exists() and (tmp_path / "aside" / "REPAIR.txt").exists()
    assert run_main(["verify", data], capsys)[0] == 0
    code, out, _err = run_main(["repair", data, "--set-aside-history"], capsys)
    assert code == 0 and "none found; nothing to change" in out


def test_a_half_created_last_segment_does_not_make_the_one_before_it_history(
    tmp_path: Path,
) -> None:
    # A crash while creating segment 41 leaves an empty file; recovery removes it
    # (row 5), so 25..40 is the last segment, where damage is not history even
    # though the snapshot at 40 covers it. verify must judge it the same way.
    live = scripted_log(tmp_path / "data", snapshot_at=(40,))
    live.close()
    (live.data_dir / f"wal/{41:020d}.log").write_bytes(b"")
    path, record = locate(live.data_dir, 33)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    errors = _errors(live.data_dir)
    assert errors and all(kind != "damaged-history" for kind, _, _ in errors), errors
    with pytest.raises(RecoveryError):
        Engine.open(str(live.data_dir), CONFIG, options())
