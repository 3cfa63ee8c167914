"""States for the tools: where a replay starts (empty state or a snapshot), loading
snapshots read-only, and comparing two states in words.

Owns: `choose_base` (the replay base for a target sequence number -- the newest or
the oldest usable starting point, by the rule recovery uses), `load_snapshot_file`,
`comparable` and `describe_difference`.

Promises: snapshots are loaded with `sepp.storage.snapshots.load_snapshot`, the
storage layer's own reader, under a default `CoreConfig` (apply reads nothing
from the config but which queues are declared, so replay does not otherwise depend
on it). The comparison is over `State.canonical()` with one normalisation: queues
holding nothing at all are left out, because a queue declared in the server's
configuration exists in its state from the start and is kept when empty, while
under the default config every empty queue is forgotten.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import gc
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sepp.core.config import CoreConfig
from sepp.core.snapshot import JOB_ROW_FIELDS
from sepp.core.state import State
from sepp.storage.fs import RealFileSystem
from sepp.storage.snapshots import SnapshotError, load_snapshot

from .datadir import ERROR, WARNING, DataDir, Problem, SnapshotFile

__all__ = [
    "Base",
    "SnapshotError",
    "as_fallback",
    "choose_base",
    "comparable",
    "describe_difference",
    "load_snapshot_file",
    "paused_gc",
    "snapshot_problem",
]

_FS = RealFileSystem()


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a replay builds millions of long-lived
    objects (it would rescan them again and again: `Engine.open` does the same and
    measured half the replay speed with it on); its state is restored after.

    Everything built meanwhile is still in the youngest generation, so the first
    collection after `gc.enable()` would traverse all of it (~60 ms for a state of
    100,000 jobs). It is moved to the oldest generation instead -- where it would
    end up after surviving two collections -- by freezing and unfreezing the heap
    (both O(1)); a process that keeps a frozen heap of its own (`Engine.open`
    freezes) just has it frozen with the rest."""
    enabled = gc.isenabled()
    frozen_before = gc.get_freeze_count()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            if not frozen_before:
                gc.unfreeze()
            gc.enable()


def load_snapshot_file(snapshot: SnapshotFile) -> State:
    """The state a snapshot file holds; SnapshotError if it is not usable."""
    state, _last_seq = load_snapshot(_FS, snapshot.path, CoreConfig())
    return state


def snapshot_problem(snapshot: SnapshotFile, exc: SnapshotError) -> Problem:
    return Problem(
        ERROR, "snapshot-unusable", snapshot.rel, exc.offset, snapshot.last_seq, exc.reason
    )


@dataclass
class Base:
    """Where a replay starts: `state` holds every record up to `seq` (0 and an empty
    state, or a snapshot's). `problems` are the snapshots found unusable on the way
    and, if no start was possible, why (then `state` is None)."""

    state: State | None
    seq: int
    snapshot: SnapshotFile | None = None
    problems: list[Problem] = field(default_factory=list)


def choose_base(data_dir: DataDir, *, target_seq: int | None = None, newest: bool = True) -> Base:
    """The starting point of a replay up to `target_seq` (None: the end of the log).

    A snapshot at S can start a replay if S <= target_seq and the log reaches back to
    it (the first segment starts at or before S + 1), as in recovery. `newest` picks
    the newest such snapshot (fewest records to apply); otherwise the oldest (so
    every later snapshot can be checked against the replay). An empty state at seq 0
    is a start when the log begins at seq 1 (or there is no log), and is preferred
    over snapshots when `newest` is false."""
    log_first = data_dir.segments[0].first_seq if data_dir.segments else None
    empty_ok = log_first is None or log_first == 1
    candidates = [
        snap
        for snap in data_dir.snapshots
        if (target_seq is None or snap.last_seq <= target_seq)
        and (log_first is None or snap.last_seq + 1 >= log_first)
    ]
    if not newest and empty_ok:
        return Base(State(CoreConfig()), 0)
    problems: list[Problem] = []
    for snap in reversed(candidates) if newest else candidates:
        try:
            state = load_snapshot_file(snap)
        except SnapshotError as exc:
            problems.append(snapshot_problem(snap, exc))
            continue
        except FileNotFoundError:
            continue  # deleted by a live server's retention since the listing
        return Base(state, snap.last_seq, snap, problems)
    if empty_ok:
        return Base(State(CoreConfig()), 0, None, problems)
    first = data_dir.segments[0]  # there is a log: empty_ok covers the case without one
    problems.append(
        Problem(
            ERROR,
            "log-start",
            first.rel,
            0,
            1,
            f"the log starts at seq {first.first_seq} and no usable snapshot covers seqs "
            f"1..{first.first_seq - 1}"
            + (f" at or before seq {target_seq}" if target_seq is not None else ""),
        )
    )
    return Base(None, 0, None, problems)


def as_fallback(problems: list[Problem]) -> list[Problem]:
    """`choose_base`'s problems for a command that, like recovery, just falls back
    to an older start: a snapshot it skipped is a warning there (verify keeps the
    error: the file is damaged all the same)."""
    return [
        Problem(WARNING, p.kind, p.file, p.offset, p.seq, f"{p.reason} (skipped)")
        if p.kind == "snapshot-unusable"
        else p
        for p in problems
    ]


# ---------------------------------------------------------------- comparing


_ORDER = ("clock_ms", "jobs", "ready", "counts", "dedup", "dead", "queue_dead_order")


def comparable(canonical: dict[str, Any]) -> dict[str, Any]:
    """`canonical` without the queues that hold nothing (see the module docstring)."""
    counts = canonical["counts"]
    empty = {name for name, numbers in counts.items() if not any(numbers)}
    out = dict(canonical)
    out["counts"] = {name: numbers for name, numbers in counts.items() if name not in empty}
    out["ready"] = {
        name: order
        for name, order in canonical["ready"].items()
        if not (name in empty and not order)
    }
    out["jobs"] = {job_id: _as_stored(row) for job_id, row in canonical["jobs"].items()}
    out["dead"] = [(entry[0], _as_stored(entry[1]), *entry[2:]) for entry in canonical["dead"]]
    return out


_CUSTOM = JOB_ROW_FIELDS.index("custom")


class StoredFloat(float):
    """A float compared as the format stores it: its 8 bytes (a msgpack float 64).
    As Python values NaN != NaN, so a job whose custom map holds a NaN made a
    snapshot differ from the log it was written from (issue 13 §7); bit for bit,
    the same NaN is equal to itself and 0.0 differs from -0.0, as on disk."""

    __slots__ = ()

    def _bits(self) -> bytes:
        return struct.pack(">d", self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and self._bits() == struct.pack(">d", other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._bits())


def _as_stored(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A job tuple whose custom map's floats compare bit for bit."""
    custom = row[_CUSTOM]
    if not custom or not any(type(v) is float for v in custom.values()):
        return row
    stored = {k: StoredFloat(v) if type(v) is float else v for k, v in custom.items()}
    return (*row[:_CUSTOM], stored, *row[_CUSTOM + 1 :])


def describe_difference(snapshot: dict[str, Any], log: dict[str, Any]) -> str:
    """How two comparable canonical states differ, in one line (first difference of
    each part): `jobs: 1 only in the snapshot (first <id>); counts: 1 differ (first
    emails: (3, 0, 1, 0) in the snapshot, (4, 0, 0, 0) in the log)`."""
    parts = []
    for key in (*_ORDER, *sorted((set(snapshot) | set(log)) - set(_ORDER))):
        a, b = snapshot.get(key), log.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            parts.append(f"{key}: {_dict_difference(key, a, b)}")
        elif key == "dead" and isinstance(a, list) and isinstance(b, list):
            position = next(
                (i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))
            )
            parts.append(
                f"dead: {len(a)} in the snapshot, {len(b)} in the log, "
                f"first difference at position {position}"
            )
        else:
            parts.append(f"{key}: {a!r:.80} in the snapshot, {b!r:.80} in the log")
    return "; ".join(parts) if parts else "no difference"


def _dict_difference(key: str, a: dict[Any, Any], b: dict[Any, Any]) -> str:
    only_a = sorted(set(a) - set(b), key=repr)
    only_b = sorted(set(b) - set(a), key=repr)
    differ = sorted((k for k in set(a) & set(b) if a[k] != b[k]), key=repr)
    details = []
    if only_a:
        details.append(f"{len(only_a)} only in the snapshot (first {_key(only_a[0])})")
    if only_b:
        details.append(f"{len(only_b)} only in the log (first {_key(only_b[0])})")
    if differ:
        first = differ[0]
        details.append(
            f"{len(differ)} differ (first {_key(first)}: {_value_difference(key, a[first], b[first])})"
        )
    return ", ".join(details)


def _key(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value)
    return str(value)


def _value_difference(key: str, a: Any, b: Any) -> str:
    if key == "jobs" and isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        # A job's canonical tuple lists the fields of a snapshot job row; name
        # them when the two layouts agree, else number them.
        names = (
            JOB_ROW_FIELDS
            if len(a) == len(JOB_ROW_FIELDS)
            else tuple(f"field {i}" for i in range(len(a)))
        )
        for name, x, y in zip(names, a, b):
            if x != y:
                return f"{name} {x!r:.40} in the snapshot, {y!r:.40} in the log"
    return f"{a!r:.80} in the snapshot, {b!r:.80} in the log"
