"""Cluster snapshots in the blob store (issue 19 item 4).

Owns: the blob (`encode_snapshot_blob` / `decode_snapshot_blob`), its name
(`snapshot_name`: the log sequence it covers, so names sort in log order),
`publish_snapshot` (put it, keep the `SNAPSHOTS_KEPT` newest, purge the log below
the oldest kept) and `load_newest_snapshot` (the newest blob that verifies, else
the one before it).

A blob: a 4-byte little-endian masked CRC32C of the rest, then one msgpack array
`[1, log_seq, epoch, time_ms, chain_hash, snapshot]`: the state after log message
`log_seq` -- `snapshot` is exactly a single-node snapshot file
(log_format/FORMAT.md section 8; its header's last_seq is the record seq) -- and
the chain tip after that message (the epoch, time and hash the next batch is
checked against, FORMAT.md section 11).

Promises: a blob is verified twice (its CRC, then every record of the snapshot
file through `load_snapshot`) before a state is built from it; a damaged newest
blob falls back to the older one, never to an empty state when a blob exists.
The log is purged only below the oldest kept snapshot, so a damaged newest one
still leaves a snapshot plus a log that covers everything.

Must not import: sepp.server, sockets.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import cast

import msgpack

from log_format import masked_crc32c
from sepp.cluster.batch import HASH_BYTES, ChainTip
from sepp.cluster.replog import BlobStore, ReplicatedLog
from sepp.core.config import CoreConfig
from sepp.core.state import State
from sepp.storage.fs import FileSystem
from sepp.storage.snapshots import SnapshotError, encode_snapshot, load_snapshot

log = logging.getLogger("sepp.cluster")

SNAPSHOT_BLOB_VERSION = 1
SNAPSHOT_PREFIX = "snapshot-"
# The newest two are kept; the log is purged below the older (issue 19).
SNAPSHOTS_KEPT = 2

_CRC = struct.Struct("<I")


class SnapshotBlobError(ValueError):
    """A snapshot blob that does not verify."""


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    state: State
    record_seq: int  # the last record the state holds
    log_seq: int  # the last log message it covers
    tip: ChainTip


def snapshot_name(log_seq: int) -> str:
    return f"{SNAPSHOT_PREFIX}{log_seq:020d}"


def parse_snapshot_name(name: str) -> int | None:
    digits = name[len(SNAPSHOT_PREFIX) :]
    if not name.startswith(SNAPSHOT_PREFIX) or len(digits) != 20 or not digits.isdigit():
        return None
    return int(digits)


def encode_snapshot_blob(state: State, record_seq: int, log_seq: int, tip: ChainTip) -> bytes:
    snapshot = b"".join(encode_snapshot(state, record_seq))
    body: bytes = msgpack.packb(
        [SNAPSHOT_BLOB_VERSION, log_seq, tip.epoch, tip.time_ms, tip.hash, snapshot],
        use_bin_type=True,
    )
    return _CRC.pack(masked_crc32c(body)) + body


class _OneFile:
    """The one read `load_snapshot` makes, served from memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, path: str) -> bytes:
        return self.data


def decode_snapshot_blob(blob: bytes, config: CoreConfig) -> LoadedSnapshot:
    """Verify a blob and rebuild its state. Raises SnapshotBlobError."""
    if len(blob) < 5 or _CRC.unpack_from(blob, 0)[0] != masked_crc32c(blob[4:]):
        raise SnapshotBlobError("snapshot blob checksum mismatch")
    try:
        fields = msgpack.unpackb(blob[4:], raw=False)
    except Exception as exc:  # msgpack raises many kinds on bad input
        raise SnapshotBlobError(f"snapshot blob does not decode: {exc}") from exc
    if type(fields) is not list or len(fields) != 6 or fields[0] != SNAPSHOT_BLOB_VERSION:
        raise SnapshotBlobError("not a version-1 snapshot blob")
    _, log_seq, epoch, time_ms, chain, snapshot = fields
    if not all(type(v) is int and v >= 0 for v in (log_seq, epoch, time_ms)):
        raise SnapshotBlobError("snapshot blob header fields are not non-negative integers")
    if type(chain) is not bytes or len(chain) != HASH_BYTES or type(snapshot) is not bytes:
        raise SnapshotBlobError("snapshot blob hash or body malformed")
    try:
        state, record_seq = load_snapshot(
            cast(FileSystem, _OneFile(snapshot)), "snapshot-blob", config
        )
    except SnapshotError as exc:
        raise SnapshotBlobError(f"snapshot in blob is damaged: {exc}") from exc
    return LoadedSnapshot(
        state, record_seq, log_seq, ChainTip(chain, record_seq + 1, epoch, time_ms)
    )


async def snapshot_seqs(blobs: BlobStore) -> list[int]:
    """The log sequences of the stored snapshots, oldest first."""
    seqs = [parse_snapshot_name(name) for name in await blobs.names()]
    return sorted(seq for seq in seqs if seq is not None)


async def publish_snapshot(
    blobs: BlobStore, log_: ReplicatedLog, blob: bytes, log_seq: int
) -> list[int]:
    """Store `blob` (the state after message `log_seq`), delete all but the
    `SNAPSHOTS_KEPT` newest, purge the log below the oldest kept. Returns the
    sequences kept."""
    await blobs.put(snapshot_name(log_seq), blob)
    seqs = await snapshot_seqs(blobs)
    kept = seqs[-SNAPSHOTS_KEPT:]
    for seq in seqs[: len(seqs) - len(kept)]:
        await blobs.delete(snapshot_name(seq))
    if len(kept) == SNAPSHOTS_KEPT:
        # Messages up to the oldest kept snapshot are in it (and in the newer).
        await log_.purge_below(kept[0] + 1)
    return kept


async def load_newest_snapshot(blobs: BlobStore, config: CoreConfig) -> LoadedSnapshot | None:
    """The newest snapshot that verifies (an older one if the newest is damaged);
    None when there is none at all. Raises SnapshotBlobError when snapshots exist
    and none verifies (the log below them may be purged: an operator's case)."""
    seqs = await snapshot_seqs(blobs)
    errors = []
    for seq in reversed(seqs):
        blob = await blobs.get(snapshot_name(seq))
        if blob is None:
            continue  # deleted meanwhile by a newer publish
        try:
            return decode_snapshot_blob(blob, config)
        except SnapshotBlobError as exc:
            log.error("snapshot %s is damaged, trying an older one: %s", snapshot_name(seq), exc)
            errors.append(f"{snapshot_name(seq)}: {exc}")
    if errors:
        raise SnapshotBlobError("no snapshot verifies: " + "; ".join(errors))
    return None
