"""`sepp-log` end to end, as an operator runs it: the installed console script,
exit codes (0 success, 1 problems found, 2 usage error), JSON lines that parse, no
progress bar when piped (and one on a terminal), and `dump --follow` on a log that
a live engine keeps appending to.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from log_format import RECORD_HEADER_BYTES
from sepp.core import Enqueue
from tests.storage.helpers import numbered_id
from tests.tools.helpers import T0, LiveLog, flip_bit, job, locate, scripted_log
from tools.sepp_log import main

SEPP_LOG = Path(sys.executable).parent / "sepp-log"


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`sepp-log ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        code: int | str | None = main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    return int(code or 0), captured.out, captured.err


def sepp_log(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SEPP_LOG), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,  # type: ignore[call-overload]
    )


def test_the_console_script_is_installed_and_lists_every_command() -> None:
    assert SEPP_LOG.exists(), "pip install -e . declares sepp-log = sepp_tools.sepp_log:main"
    result = sepp_log("--help")
    assert result.returncode == 0
    for command in ("verify", "dump", "replay", "audit", "stats", "repair"):
        assert command in result.stdout


def test_verify_exits_0_on_a_clean_log_and_1_on_a_damaged_one(scripted: LiveLog) -> None:
    clean = sepp_log("verify", scripted.data_dir)
    assert (clean.returncode, clean.stderr) == (0, "")
    assert clean.stdout.splitlines()[-1] == "OK: 0 errors, 0 warnings"
    path, record = locate(scripted.data_dir, 5)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 10)
    damaged = sepp_log("verify", scripted.data_dir)
    assert damaged.returncode == 1
    assert (
        f"ERROR corruption: wal/00000000000000000001.log offset {record.offset} seq 5: "
        "bad body checksum"
    ) in damaged.stdout.splitlines()
    assert damaged.stdout.splitlines()[-1] == "FAILED: 1 errors, 0 warnings"


def test_a_torn_tail_is_a_warning_with_exit_code_0(scripted: LiveLog) -> None:
    segment = scripted.data_dir / "wal" / f"{25:020d}.log"
    with open(segment, "ab") as handle:
        handle.write(b"\x07" * 5)
    result = sepp_log("verify", scripted.data_dir)
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == "OK: 0 errors, 1 warnings"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["verify"],
        ["verify", "{missing}"],
        ["verify", "{empty}"],
        ["dump", "{data}", "--since", "last tuesday"],
        ["dump", "{data}", "--type", "JobFrobbed"],
        ["dump", "{data}", "--from-seq", "9", "--to-seq", "3"],
        ["replay", "{data}", "--until-seq", "-3"],
        ["replay", "{data}", "--until-seq", "3", "--until-time", "2024-01-01"],
        ["replay", "{data}", "--into", "{data}"],
        ["audit", "{data}"],
        ["audit", "{data}", "some-job", "--queue", "emails"],
        ["audit", "{data}", "--queue", "emails"],
        ["repair", "{data}"],
        ["repair", "{data}", "--truncate-at", "0"],
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path, scripted: LiveLog, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    paths = {
        "data": str(scripted.data_dir),
        "missing": str(tmp_path / "missing"),
        "empty": str(tmp_path / "empty"),
    }
    code, out, err = run_main([a.format(**paths) for a in args], capsys)
    assert code == 2, (out, err)
    assert err.strip()
    assert out == ""


def test_problems_the_data_cannot_satisfy_exit_1(
    scripted: LiveLog, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(scripted.data_dir)
    assert run_main(["replay", data, "--until-seq", "99"], capsys)[0] == 1
    assert run_main(["repair", data, "--truncate-at", "99"], capsys)[0] == 1
    path, record = locate(scripted.data_dir, 20)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 1)
    code, out, err = run_main(["dump", data], capsys)
    assert code == 1
    assert out.splitlines()[-1].startswith("19 ")
    assert err == (
        f"sepp-log dump: ERROR corruption: wal/00000000000000000013.log offset {record.offset} "
        "seq 20: bad body checksum\n"
    )
    assert run_main(["stats", data], capsys)[0] == 1
    assert run_main(["audit", data, numbered_id(2)], capsys)[0] == 1


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "{data}"],
        ["dump", "{data}"],
        ["dump", "{data}", "--queue", "reports", "--since", "2023-11-14T22:13:40"],
        ["replay", "{data}", "--until-time", "2023-11-14T22:13:50Z"],
        ["audit", "{data}", numbered_id(2)],
        ["audit", "{data}", "--key", "emails", "welcome-24"],
        ["audit", "{data}", "--queue", "emails", "--since", "2023-11-14"],
        ["stats", "{data}"],
        ["repair", "{data}", "--truncate-at", "30", "--dry-run"],
    ],
)
def test_json_output_is_one_object_per_line(
    scripted: LiveLog, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main([*(a.format(data=scripted.data_dir) for a in args), "--json"], capsys)
    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines
    objects = [json.loads(line) for line in lines]
    assert all(isinstance(o, dict) and isinstance(o.get("type"), str) for o in objects)


def test_json_verify_reports_problems_as_objects(scripted: LiveLog) -> None:
    (scripted.data_dir / "wal" / f"{13:020d}.log").unlink()
    result = sepp_log("verify", scripted.data_dir, "--json")
    assert result.returncode == 1
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o for o in objects if o["type"] == "problem"] == [
        {
            "type": "problem",
            "severity": "error",
            "kind": "sequence-gap",
            "file": "wal/00000000000000000025.log",
            "offset": 0,
            "seq": 13,
            "reason": "sequence gap between segments: expected seq 13, segment starts at seq 25",
        }
    ]
    summary = objects[-1]
    assert (summary["type"], summary["ok"], summary["errors"], summary["replayed_to"]) == (
        "summary",
        False,
        1,
        12,
    )


@pytest.mark.parametrize("command", ["verify", "dump", "audit"])
def test_no_progress_bar_when_piped(scripted: LiveLog, command: str) -> None:
    extra = [numbered_id(2)] if command == "audit" else []
    result = sepp_log(command, scripted.data_dir, *extra)
    assert result.returncode == 0
    assert result.stderr == ""


def test_progress_bar_on_a_terminal(scripted: LiveLog) -> None:
    leader, follower = pty.openpty()
    try:
        result = subprocess.run(
            [str(SEPP_LOG), "verify", str(scripted.data_dir)],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=60,
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while select.select([leader], [], [], 0)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert result.returncode == 0
    assert b"verify [" in drawn and b"% " in drawn
    assert drawn.endswith(b"\r\x1b[K")  # erased at the end
    assert "verify [" not in result.stdout


def test_repair_dry_run_changes_nothing_and_repair_does(tmp_path: Path, scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    before = sorted((p, p.stat().st_size) for p in scripted.data_dir.rglob("*") if p.is_file())
    dry = sepp_log("repair", scripted.data_dir, "--truncate-at", "17", "--dry-run")
    assert dry.returncode == 0
    assert dry.stdout.splitlines()[1] == (
        f"  would truncate wal/00000000000000000013.log at offset {record.offset} "
        f"(removes {path.stat().st_size - record.offset} bytes: seq 17 and after)"
    )
    assert (
        sorted((p, p.stat().st_size) for p in scripted.data_dir.rglob("*") if p.is_file()) == before
    )
    done = sepp_log("repair", scripted.data_dir, "--truncate-at", "17")
    assert done.returncode == 0, done.stderr
    backups = [p for p in scripted.data_dir.iterdir() if p.name.startswith("repair-backup-")]
    assert len(backups) == 1 and (backups[0] / "REPAIR.txt").exists()
    assert sepp_log("verify", scripted.data_dir).returncode == 0


def test_repair_is_refused_while_a_server_holds_the_data_directory(
    tmp_path: Path, scripted: LiveLog
) -> None:
    from sepp.storage import RealFileSystem

    path, record = locate(scripted.data_dir, 17)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    before = sorted((p, p.stat().st_size) for p in scripted.data_dir.rglob("*") if p.is_file())
    # What a running server holds: the flock on DATA_DIR/LOCK.
    held = RealFileSystem().lock(str(scripted.data_dir / "LOCK"))
    try:
        refused = sepp_log("repair", scripted.data_dir, "--truncate-at", "17")
    finally:
        os.close(held)
    assert refused.returncode == 1
    assert refused.stdout == ""  # not even the plan: nothing will happen
    assert refused.stderr.startswith("sepp-log repair: ERROR locked: LOCK offset 0: ")
    assert refused.stderr.rstrip().endswith("(is a sepp server running?): stop it first")
    after = sorted((p, p.stat().st_size) for p in scripted.data_dir.rglob("*") if p.is_file())
    assert after == before  # nothing moved, cut or backed up
    assert sepp_log("repair", scripted.data_dir, "--truncate-at", "17").returncode == 0


def test_replay_into_writes_a_directory_and_says_so(tmp_path: Path, scripted: LiveLog) -> None:
    target = tmp_path / "restored"
    result = sepp_log("replay", scripted.data_dir, "--until-seq", "20", "--into", target)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("state after seq 20 (2023-11-14T22:13:40.000Z)")
    assert result.stdout.splitlines()[-1].startswith(f"wrote {target}: wal/")
    assert sepp_log("verify", target).returncode == 0


def test_dump_follow_prints_what_a_live_engine_appends(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    proc = subprocess.Popen(
        [
            str(SEPP_LOG),
            "dump",
            str(live.data_dir),
            "--from-seq",
            "40",
            "--follow",
            "--poll-interval",
            "0.02",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        seqs = _read_seqs(proc, until=40)
        for n in range(100, 112):  # enough to rotate into a new segment
            live.run(Enqueue(jobs=(job(n),)), T0 + 60_000 + n)
        seqs += _read_seqs(proc, until=live.last_seq)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        live.close()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    assert seqs == list(range(40, 53))


def _read_seqs(proc: subprocess.Popen[bytes], *, until: int) -> list[int]:
    """Seqs of the events the dump prints, until `until` arrives (deadline 30 s)."""
    assert proc.stdout is not None
    seqs: list[int] = []
    buffer = b""
    deadline = time.monotonic() + 30
    while not seqs or seqs[-1] < until:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            raise AssertionError(f"dump --follow printed {seqs}, waiting for seq {until}")
        if select.select([proc.stdout], [], [], remaining)[0]:
            chunk = os.read(proc.stdout.fileno(), 65536)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            seqs.extend(json.loads(line)["seq"] for line in lines if line)
    return seqs
