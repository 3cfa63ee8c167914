"""Damaged *history*: damage in the log that recovery starts past, because it lies
wholly below the snapshot recovery starts from (`sepp/storage/recovery.py`, rows
15-18). `verify` reports it as such and `repair --set-aside-history` moves it aside.

Owns: `HistoryJudge` (is this problem damaged history?) and `recovery_base` (the
snapshot recovery would start from, found as recovery finds it: the newest that
loads and that the log reaches back to).

The rule, recovery's: a problem in a sealed segment is history when the *next*
segment's name says it starts at or below the snapshot's seq + 1 (the segment's
records are all covered; the damage may hide where they end); a gap between two
segments is history when the records missing are all at or below the snapshot.
The last segment is never history (a server appends to it), nor is an overlap of
segments or a header that disagrees with its file name (a mix-up, not damage).

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sepp.core.state import State
from sepp.storage.recovery import is_segment_being_created

from .datadir import ERROR, DataDir, Problem, SnapshotFile
from .states import choose_base

__all__ = ["HISTORY_KINDS", "HistoryJudge", "RecoveryBase", "recovery_base"]

# The kinds of damage that can be history (what recovery rows 6-9 would refuse).
HISTORY_KINDS = frozenset(("corruption", "sequence-gap", "bad-header"))


@dataclass(frozen=True, slots=True)
class RecoveryBase:
    """The snapshot recovery starts from and its state (None and seq 0: the empty
    state, or no start at all)."""

    snapshot: SnapshotFile | None
    seq: int
    state: State | None = None


def recovery_base(data_dir: DataDir) -> RecoveryBase:
    base = choose_base(data_dir, newest=True)
    if base.state is None or base.snapshot is None:
        return RecoveryBase(None, 0)
    return RecoveryBase(base.snapshot, base.seq, base.state)


class HistoryJudge:
    """Tells damaged history from damage recovery refuses, against `base`."""

    def __init__(self, data_dir: DataDir, base: RecoveryBase) -> None:
        self.base = base
        segments = list(data_dir.segments)
        if segments:
            # Recovery removes a last segment a crash left half-created (row 5):
            # the segment before it is then the last one, whose damage is not
            # history (it is where the log continues).
            with open(segments[-1].path, "rb") as f:
                if is_segment_being_created(f.read()):
                    segments.pop()
        # rel -> the last seq the segment should hold, for every sealed segment
        # wholly below the snapshot (by the next segment's name).
        self._covered: dict[str, tuple[int, int]] = {}
        # rel -> its first seq by name, for segments that start at or below seq + 1.
        self._starts: dict[str, int] = {}
        for index, segment in enumerate(segments):
            if segment.first_seq <= base.seq + 1:
                self._starts[segment.rel] = segment.first_seq
            if index + 1 < len(segments):
                end = segments[index + 1].first_seq - 1
                if base.snapshot is not None and end <= base.seq:
                    self._covered[segment.rel] = (segment.first_seq, end)

    def covered(self, rel: str) -> tuple[int, int] | None:
        """(first, last) seq of a sealed segment wholly below the snapshot, else None."""
        return self._covered.get(rel)

    def is_history(self, problem: Problem) -> bool:
        if problem.severity != ERROR or problem.kind not in HISTORY_KINDS:
            return False
        if problem.file is None or self.base.snapshot is None:
            return False
        if "does not match file name" in problem.reason or "overlap" in problem.reason:
            return False
        if problem.kind == "sequence-gap" and problem.offset == 0:
            # A gap *between* segments, reported at the start of the later one:
            # the records missing end right before it.
            return problem.file in self._starts
        return problem.file in self._covered

    def describe(self, problem: Problem) -> Problem:
        """The problem, reworded as damaged history (kind `damaged-history`)."""
        snap = self.base.snapshot
        if snap is None:  # pragma: no cover - is_history said no
            raise ValueError("no snapshot: nothing is history")
        span = self.covered(problem.file or "")
        lost = (
            f"records {span[0]}..{span[1]} are lost to audits"
            if span is not None and not (problem.kind == "sequence-gap" and problem.offset == 0)
            else "the records missing are lost to audits"
        )
        return Problem(
            ERROR,
            "damaged-history",
            problem.file,
            problem.offset,
            problem.seq,
            f"{problem.kind}: {problem.reason}; wholly below {snap.rel} (seq {snap.last_seq}), "
            f"the snapshot recovery starts from: the server starts with every job, but {lost} "
            "(`sepp-log repair --set-aside-history` moves it aside)",
        )
