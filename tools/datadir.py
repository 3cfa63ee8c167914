"""A data directory as the tools see it: its segment and snapshot files, listed
read-only, and the `Problem` every command reports damage with.

Owns: `DataDir` (`open_data_dir`), `SegmentFile`, `SnapshotFile`, `Problem` and its
human form, and the listing order that makes reading a live directory safe.

Promises: nothing here creates, changes or deletes a file (`sepp.storage`'s
`recover()` does all three, which is why the tools never call it on an operator's
directory). The listing takes snapshots first, then segments: the engine publishes
a snapshot only after the log up to its sequence number is durable, so every
snapshot listed is backed by segments that are listed after it -- a running server
never makes a tool report "snapshot newer than the log".

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from log_format import parse_segment_file_name, parse_snapshot_file_name
from sepp.storage.recovery import SNAPSHOT_DIR, SNAPSHOT_TMP_SUFFIX, WAL_DIR

from .output import UsageError

__all__ = [
    "ERROR",
    "INFO",
    "WARNING",
    "DataDir",
    "Problem",
    "SegmentFile",
    "SnapshotFile",
    "open_data_dir",
]

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong (or worth knowing) in a data directory.

    `severity` is "error" (exit code 1), "warning" (reported, exit code 0: what
    recovery repairs by itself, such as a torn tail) or "info". `kind` is a stable
    word for scripts (`corruption`, `torn-tail`, `sequence-gap`, `bad-header`,
    `decode`, `event`, `time`, `apply`, `invariant`, `snapshot-mismatch`,
    `snapshot-unusable`, `snapshot-ahead`, `snapshot-unchecked`, `log-start`,
    `temp-file`, `ignored-file`, `io`, `damaged-history`). `file` is relative to
    the data directory; `offset` is a byte offset in it; `seq` the sequence number
    concerned (for a snapshot, its last_seq)."""

    severity: str
    kind: str
    file: str | None
    offset: int | None
    seq: int | None
    reason: str

    def human(self) -> str:
        """`ERROR corruption: wal/00000000000000000001.log offset 4096 seq 17: bad body checksum`"""
        where = []
        if self.file is not None:
            where.append(self.file)
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        located = f" {' '.join(where)}:" if where else ""
        return f"{self.severity.upper()} {self.kind}:{located} {self.reason}"

    def data(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "kind": self.kind,
            "file": self.file,
            "offset": self.offset,
            "seq": self.seq,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A file in `wal/` with a segment name; `first_seq` is the name's word (its
    header is checked when it is read)."""

    first_seq: int
    path: str
    rel: str
    size: int


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    last_seq: int
    path: str
    rel: str
    size: int


@dataclass
class DataDir:
    root: str
    segments: list[SegmentFile] = field(default_factory=list)
    snapshots: list[SnapshotFile] = field(default_factory=list)
    # Snapshot temp files (a publication that never finished; recovery deletes them).
    temp_files: list[str] = field(default_factory=list)
    # Other files in wal/ or snapshots/ (recovery ignores them).
    ignored_files: list[str] = field(default_factory=list)

    @property
    def log_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def listing_problems(self) -> list[Problem]:
        """Warnings about files recovery would delete or ignore."""
        problems = [
            Problem(
                WARNING,
                "temp-file",
                rel,
                None,
                None,
                "leftover snapshot temp file (a snapshot that was never published); "
                "recovery deletes it",
            )
            for rel in self.temp_files
        ]
        problems.extend(
            Problem(
                WARNING, "ignored-file", rel, None, None, "not a segment or snapshot name; ignored"
            )
            for rel in self.ignored_files
        )
        return problems


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:  # deleted since the listing (live retention)
        return 0


def open_data_dir(root: str) -> DataDir:
    """List a data directory without changing it. UsageError if `root` is not a
    directory or holds neither `wal/` nor `snapshots/`."""
    if not os.path.isdir(root):
        raise UsageError(f"{root}: no such directory")
    wal_dir = os.path.join(root, WAL_DIR)
    snap_dir = os.path.join(root, SNAPSHOT_DIR)
    if not os.path.isdir(wal_dir) and not os.path.isdir(snap_dir):
        raise UsageError(f"{root}: not a sepp data directory (no {WAL_DIR}/ or {SNAPSHOT_DIR}/)")
    data_dir = DataDir(root)
    # Snapshots first: see the module docstring.
    if os.path.isdir(snap_dir):
        for name in sorted(os.listdir(snap_dir)):
            path = os.path.join(snap_dir, name)
            last_seq = parse_snapshot_file_name(name)
            if last_seq is not None:
                data_dir.snapshots.append(
                    SnapshotFile(last_seq, path, data_dir.rel(path), _size(path))
                )
            elif name.endswith(SNAPSHOT_TMP_SUFFIX):
                data_dir.temp_files.append(data_dir.rel(path))
            else:
                data_dir.ignored_files.append(data_dir.rel(path))
    if os.path.isdir(wal_dir):
        for name in sorted(os.listdir(wal_dir)):
            path = os.path.join(wal_dir, name)
            first_seq = parse_segment_file_name(name)
            if first_seq is None:
                data_dir.ignored_files.append(data_dir.rel(path))
            else:
                data_dir.segments.append(
                    SegmentFile(first_seq, path, data_dir.rel(path), _size(path))
                )
    data_dir.segments.sort(key=lambda s: s.first_seq)
    data_dir.snapshots.sort(key=lambda s: s.last_seq)
    return data_dir
