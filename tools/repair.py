"""`sepp-log repair DATA_DIR --truncate-at SEQ` and `sepp-log repair DATA_DIR
--set-aside-history`: the operator's repairs of a log -- the one command that
changes a data directory.

Owns: `plan_repair` (`RepairPlan`: what a cut at SEQ removes, or why it cannot be
done), `apply_repair` (do it, keeping a backup of everything removed),
`plan_set_aside` / `apply_set_aside` (`SetAsidePlan`: move damaged *history* aside).

Setting history aside: damage wholly below the snapshot recovery starts from
(recovery rows 15, 16; `tools.history`) loses no state -- the server starts past
it and reports it on every start. `--set-aside-history` moves the damaged
segments, and every segment before them (else the log would keep a gap), into the
backup folder: the log then starts after the damage, still reaching back to that
snapshot, and recovery starts clean. No snapshot and no record above the snapshot
is touched. A cut (`--truncate-at`) at a seq inside damaged history would throw
away every later record and the snapshots holding the state, so it is refused
while setting aside suffices, pointing at `--set-aside-history`.

The rule: **cut at SEQ** -- keep records 1..SEQ-1, remove record SEQ and every
record after it, and every snapshot of a state after SEQ-1 (last_seq >= SEQ). The
usual case is damage that recovery refuses at seq SEQ (a flipped bit in a sealed
segment, a record that does not decode or apply, a sequence gap): truncating at
SEQ trades the records from SEQ on -- which the operator accepts by choosing SEQ --
for a directory the server starts from, with the state as of SEQ-1. `sepp-log
verify` tells which SEQ.

Promises:
- Nothing is deleted without a copy: removed files are moved, and the bytes cut
  from a segment copied, into `DATA_DIR/repair-backup-<UTC time>/` (or
  `--backup-dir`), with a REPAIR.txt that says what came from where and how to put
  it back. Copies are synced before the originals change.
- The cut is checked first, read-only, and refused (exit 1) when it cannot give a
  directory recovery accepts: SEQ lies after damage (the log is unreadable at an
  earlier seq -- cut there instead), after the end of the log, or before its start;
  or no usable snapshot would cover the head of the log that retention removed.
- Order of changes: snapshots, then whole segments (the last first), then the cut
  segment's tail. A crash half-way leaves a directory that the same command, run
  again, finishes (every step is idempotent given the backup).
- The server must be stopped: a running server appends to the segment being cut.
  `lock_data_dir` takes the lock a server holds on `DATA_DIR/LOCK` (flock), so a
  repair is refused while a server runs on the directory, and a server cannot start
  on it while the repair changes it.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

from log_format import FILE_HEADER_BYTES, Record, encode_segment_header, segment_file_name
from sepp.storage.engine import LOCK_FILE
from sepp.storage.fs import RealFileSystem, make_private_dirs, private_opener
from sepp.storage.recovery import SNAPSHOT_DIR, WAL_DIR

from .datadir import ERROR, DataDir, Problem, SegmentFile, SnapshotFile
from .history import HistoryJudge, RecoveryBase, recovery_base
from .output import UsageError
from .segments import LogWalker, SegmentStart
from .states import SnapshotError, load_snapshot_file

__all__ = [
    "RepairPlan",
    "SetAsidePlan",
    "apply_repair",
    "apply_set_aside",
    "default_backup_dir",
    "lock_data_dir",
    "plan_repair",
    "plan_set_aside",
]

_FS = RealFileSystem()


@dataclass
class RepairPlan:
    """What `--truncate-at seq` does. `refusal` set: it cannot be done."""

    data_dir: DataDir
    seq: int
    # The segment cut inside, at `cut_offset` (it keeps its bytes before it).
    cut: SegmentFile | None = None
    cut_offset: int = 0
    # Whole files removed.
    segments: list[SegmentFile] = field(default_factory=list)
    snapshots: list[SnapshotFile] = field(default_factory=list)
    # A header-only segment written so that the log still reaches back to the
    # newest kept snapshot (when every segment goes).
    new_segment: str | None = None
    last_log_seq: int | None = None
    why: str = ""
    refusal: Problem | None = None

    @property
    def changes_anything(self) -> bool:
        return bool(self.cut or self.segments or self.snapshots or self.new_segment)

    def describe(self) -> list[str]:
        lines = []
        if self.cut is not None:
            size = _size(self.cut.path)
            lines.append(
                f"truncate {self.cut.rel} at offset {self.cut_offset} "
                f"(removes {size - self.cut_offset} bytes: seq {self.seq} and after)"
            )
        for segment in self.segments:
            lines.append(f"remove {segment.rel} ({_size(segment.path)} bytes)")
        for snap in self.snapshots:
            lines.append(f"remove {snap.rel} (the state at seq {snap.last_seq}, after the cut)")
        if self.new_segment is not None:
            lines.append(
                f"write {self.new_segment} (a header only: the log restarts at seq {self.seq})"
            )
        return lines


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def plan_repair(data_dir: DataDir, seq: int) -> RepairPlan:
    """Work out, read-only, what a cut at `seq` removes (see the module docstring)."""
    if seq < 1:
        raise UsageError("--truncate-at must be at least 1")
    plan = RepairPlan(data_dir, seq)
    segments = data_dir.segments
    history = plan_set_aside(data_dir)
    from_seq: int | None = None
    if history.segments:
        snap = history.base.snapshot if history.base is not None else None
        if seq <= history.history_end and snap is not None:
            later = [s for s in data_dir.snapshots if s.last_seq >= seq]
            return _refuse(
                plan,
                history.damaged[0].file,
                f"seq {seq} lies in damaged history, wholly below {snap.rel} (seq "
                f"{snap.last_seq}), which holds the state: a cut here would remove "
                f"{len(later)} snapshot(s) and every record from seq {seq} on; "
                "use --set-aside-history, which moves only the damaged history aside",
            )
        # The damage before the cut is history: it does not stop the cut.
        from_seq = history.history_end + 1
        segments = segments[len(history.segments) :]
    walker = LogWalker(data_dir)
    current: SegmentFile | None = None
    expected: int | None = segments[0].first_seq if segments else 1
    found = False
    for item in walker.walk(from_seq=from_seq):
        if type(item) is SegmentStart:
            current = item.segment
            if expected is not None and item.first_seq == seq and seq == expected:
                # The cut falls on a segment boundary: keep the header.
                plan.cut, plan.cut_offset, found = current, FILE_HEADER_BYTES, True
                plan.why = f"record {seq} is the first of {current.rel}"
                break
        elif type(item) is Record:
            if item.seq == seq and current is not None:
                plan.cut, plan.cut_offset, found = current, item.offset, True
                plan.why = f"record {seq} starts at offset {item.offset} of {current.rel}"
                break
            if item.seq > seq:
                return _refuse(
                    plan, None, f"seq {seq} is before the start of the log (seq {item.seq})"
                )
            expected = item.seq + 1
        elif type(item) is Problem:
            at = walker.last_seq + 1 if walker.last_seq is not None else expected
            if item.severity != ERROR and item.kind != "torn-tail":
                continue
            if at is not None and at > seq:
                return _refuse(plan, None, f"seq {seq} is before the start of the log (seq {at})")
            if at is None or at < seq:
                return _refuse(
                    plan,
                    item.file,
                    f"the log is damaged at seq {at}, before seq {seq} ({_where(item)}); "
                    f"records from seq {at} on cannot be kept (use --truncate-at {at})",
                )
            # Damage exactly where record `seq` should be.
            plan.why = f"damage where record {seq} should be: {_where(item)}"
            found = True
            target = next((s for s in segments if s.rel == item.file), None)
            if target is None:
                return _refuse(plan, item.file, f"cannot cut at {_where(item)}")
            if item.offset is None or item.offset < FILE_HEADER_BYTES:
                plan.segments.append(target)  # a bad header or a gap before it: whole file
            else:
                plan.cut, plan.cut_offset = target, item.offset
            current = target
            break
    plan.last_log_seq = walker.last_seq
    if not found:
        last = walker.last_seq if walker.last_seq is not None else (expected or 1) - 1
        if seq > last + 1:
            return _refuse(plan, None, f"the log ends at seq {last}: nothing at seq {seq} to cut")
        plan.why = f"the log ends at seq {last}: no record is removed"
    # Every segment after the cut goes.
    if current is not None:
        after = segments[segments.index(current) + 1 :] if current in segments else []
        plan.segments.extend(s for s in after if s not in plan.segments)
    plan.snapshots = [s for s in data_dir.snapshots if s.last_seq >= seq]
    _check_recoverable(plan)
    return plan


@dataclass
class SetAsidePlan:
    """What `--set-aside-history` moves: `segments` (the damaged history and every
    segment before it), kept in the backup folder. Empty: nothing to set aside."""

    data_dir: DataDir
    base: RecoveryBase | None = None
    # The damaged history found (as `verify` words it).
    damaged: list[Problem] = field(default_factory=list)
    segments: list[SegmentFile] = field(default_factory=list)
    # The last seq set aside; the log then starts at history_end + 1.
    history_end: int = 0
    # Damage that is not history: setting aside leaves it (recovery still refuses).
    other: list[Problem] = field(default_factory=list)

    @property
    def changes_anything(self) -> bool:
        return bool(self.segments)

    def describe(self) -> list[str]:
        lines = [
            f"move {segment.rel} ({_size(segment.path)} bytes) aside" for segment in self.segments
        ]
        if self.segments and self.base is not None and self.base.snapshot is not None:
            lines.append(
                f"keep every snapshot and every later segment: the log then starts at seq "
                f"{self.history_end + 1}, and {self.base.snapshot.rel} (seq {self.base.seq}) "
                "holds the state before it"
            )
        return lines


def plan_set_aside(data_dir: DataDir) -> SetAsidePlan:
    """Find the damaged history of `data_dir`, read-only (one walk of the log)."""
    plan = SetAsidePlan(data_dir)
    segments = data_dir.segments
    if not segments or not data_dir.snapshots:
        return plan
    judge: HistoryJudge | None = None
    upto = 0  # segments[:upto] are set aside
    for item in LogWalker(data_dir, resync=True).walk():
        if type(item) is not Problem or item.severity != ERROR:
            continue
        if judge is None:
            plan.base = recovery_base(data_dir)
            judge = HistoryJudge(data_dir, plan.base)
        if not judge.is_history(item):
            plan.other.append(item)
            continue
        plan.damaged.append(judge.describe(item))
        index = next(i for i, s in enumerate(segments) if s.rel == item.file)
        # A gap between segments is reported at the start of the later one: the
        # segments before it go; damage inside a segment takes it along.
        between = item.kind == "sequence-gap" and item.offset == 0
        upto = max(upto, index if between else index + 1)
    plan.segments = segments[:upto]
    if upto:
        plan.history_end = segments[upto].first_seq - 1
    return plan


def apply_set_aside(plan: SetAsidePlan, backup_dir: str) -> list[str]:
    """Move the plan's segments into `backup_dir`/wal (which must not exist), synced,
    with a REPAIR.txt. Returns lines describing what was done."""
    if os.path.lexists(backup_dir):
        raise UsageError(f"{backup_dir}: already exists (choose another --backup-dir)")
    root = plan.data_dir.root
    backup_wal = os.path.join(backup_dir, WAL_DIR)
    make_private_dirs(backup_wal)
    done: list[str] = []
    # The oldest first: a crash half-way leaves a log that starts later, still
    # reaching back to the snapshot (every segment moved is wholly below it).
    for segment in plan.segments:
        shutil.move(segment.path, os.path.join(backup_wal, os.path.basename(segment.path)))
        done.append(f"moved {segment.rel} to {os.path.join(backup_dir, segment.rel)}")
    for directory in (os.path.join(root, WAL_DIR), backup_wal, backup_dir):
        _FS.fsync_dir(directory)
    lines = [
        f"sepp-log repair {root} --set-aside-history",
        f"at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        "why: damaged history, wholly below the snapshot recovery starts from:",
        *(f"  {problem.human()}" for problem in plan.damaged),
        "",
        "done:",
        *(f"  {line}" for line in done),
        "",
        "these files are history only (the snapshot holds the state after them): keep them",
        "for audits (sepp-log dump/audit read a copy of a data directory), or delete them.",
        "to undo (server stopped): move the files under wal/ back into DATA_DIR/wal/.",
    ]
    with open(
        os.path.join(backup_dir, "REPAIR.txt"), "x", encoding="utf-8", opener=private_opener
    ) as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _FS.fsync_dir(backup_dir)
    return done


def _where(problem: Problem) -> str:
    offset = f" offset {problem.offset}" if problem.offset is not None else ""
    return f"{problem.kind} in {problem.file}{offset}: {problem.reason}"


def _refuse(plan: RepairPlan, file: str | None, reason: str) -> RepairPlan:
    plan.refusal = Problem(ERROR, "repair", file, None, plan.seq, reason)
    plan.cut, plan.segments, plan.snapshots = None, [], []
    return plan


def _check_recoverable(plan: RepairPlan) -> None:
    """Refuse a cut after which recovery would still refuse to start: the kept log
    must start at seq 1, or a usable kept snapshot must cover its head."""
    removed = {s.rel for s in plan.segments}
    kept = [s for s in plan.data_dir.segments if s.rel not in removed]
    if not kept and plan.seq > 1:
        plan.new_segment = os.path.join(WAL_DIR, segment_file_name(plan.seq))
        log_first = plan.seq
    else:
        log_first = kept[0].first_seq if kept else 1
    if log_first == 1:
        return
    for snap in reversed(plan.data_dir.snapshots):
        if snap in plan.snapshots or snap.last_seq + 1 < log_first:
            continue
        try:
            load_snapshot_file(snap)
        except (SnapshotError, FileNotFoundError):
            continue
        return
    _refuse(
        plan,
        None,
        f"after the cut the log starts at seq {log_first} and no usable snapshot at or "
        f"before seq {plan.seq - 1} covers seqs 1..{log_first - 1}: recovery would still refuse",
    )


def lock_data_dir(data_dir: DataDir) -> int:
    """Hold the data directory's lock for the repair (release with `os.close`).
    Raises `sepp.storage.fs.DataDirLocked` while a server runs on it."""
    return _FS.lock(os.path.join(data_dir.root, LOCK_FILE))


def default_backup_dir(data_dir: DataDir) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return os.path.join(data_dir.root, f"repair-backup-{stamp}")


def apply_repair(plan: RepairPlan, backup_dir: str) -> list[str]:
    """Carry out `plan`, backing up into `backup_dir` (which must not exist).
    Returns lines describing what was done."""
    if plan.refusal is not None:
        raise ValueError("a refused plan cannot be applied")
    if os.path.lexists(backup_dir):
        raise UsageError(f"{backup_dir}: already exists (choose another --backup-dir)")
    root = plan.data_dir.root
    backup_wal = os.path.join(backup_dir, WAL_DIR)
    backup_snap = os.path.join(backup_dir, SNAPSHOT_DIR)
    make_private_dirs(backup_wal)
    make_private_dirs(backup_snap)
    done: list[str] = []
    for snap in plan.snapshots:
        shutil.move(snap.path, os.path.join(backup_snap, os.path.basename(snap.path)))
        done.append(f"moved {snap.rel} to {os.path.join(backup_dir, snap.rel)}")
    for segment in reversed(plan.segments):
        shutil.move(segment.path, os.path.join(backup_wal, os.path.basename(segment.path)))
        done.append(f"moved {segment.rel} to {os.path.join(backup_dir, segment.rel)}")
    if plan.cut is not None:
        name = os.path.basename(plan.cut.path)
        tail = os.path.join(backup_wal, f"{name}.from-offset-{plan.cut_offset}")
        cut_bytes = _copy_tail(plan.cut.path, plan.cut_offset, tail)
        _FS.truncate(plan.cut.path, plan.cut_offset)  # ftruncate + fsync
        done.append(
            f"truncated {plan.cut.rel} at offset {plan.cut_offset}; the {cut_bytes} bytes "
            f"cut are in {tail}"
        )
    if plan.new_segment is not None:
        path = os.path.join(root, plan.new_segment)
        with open(path, "xb", opener=private_opener) as handle:
            handle.write(encode_segment_header(plan.seq))
            handle.flush()
            os.fsync(handle.fileno())
        done.append(f"wrote {plan.new_segment} (header only)")
    for directory in (
        os.path.join(root, WAL_DIR),
        os.path.join(root, SNAPSHOT_DIR),
        backup_wal,
        backup_snap,
        backup_dir,
    ):
        if os.path.isdir(directory):
            _FS.fsync_dir(directory)
    _write_notes(plan, backup_dir, done)
    return done


def _copy_tail(path: str, offset: int, target: str) -> int:
    with open(path, "rb") as src, open(target, "xb", opener=private_opener) as dst:
        src.seek(offset)
        shutil.copyfileobj(src, dst, 8 << 20)
        dst.flush()
        os.fsync(dst.fileno())
        return dst.tell()


def _write_notes(plan: RepairPlan, backup_dir: str, done: list[str]) -> None:
    lines = [
        f"sepp-log repair {plan.data_dir.root} --truncate-at {plan.seq}",
        f"at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"why: {plan.why}",
        "",
        "done:",
        *(f"  {line}" for line in done),
        "",
        "to undo (server stopped): move the files under wal/ and snapshots/ back into the",
        "data directory, and append each wal/<name>.from-offset-<N> file to wal/<name>",
        "(which was truncated to N bytes): cat <backup>/wal/<name>.from-offset-<N> >> wal/<name>",
    ]
    path = os.path.join(backup_dir, "REPAIR.txt")
    with open(path, "x", encoding="utf-8", opener=private_opener) as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
