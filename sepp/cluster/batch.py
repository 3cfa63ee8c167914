"""The cluster batch: one replicated-log message per group commit.

Owns: `encode_batch`, `decode_batch`, `Batch`, `ChainTip` (what a reader knows
of the log so far: the last batch's hash, the next record seq, the epoch and
time) and `check_batch`, which classifies a message against it (`BATCH_OK`,
`BATCH_BAD_CHECKSUM`, `BATCH_MALFORMED`, `BATCH_BROKEN_CHAIN`, `BATCH_SEQ_GAP`,
`BATCH_EPOCH_BACKWARDS`, `BATCH_TIME_BACKWARDS`), leaving the decision to the
caller (log_format/FORMAT.md "Cluster batch").

The layout: a 4-byte little-endian masked CRC32C of the rest, then one msgpack
array `[1, epoch, first_seq, last_seq, time_ms, prev_hash, records]`. `records`
are the exact bytes the engine would write to its segment for that group
commit -- back-to-back WAL records (FORMAT.md section 4), each with its own
checksums and seq -- so a follower applies them through the replay path. A
batch's hash is blake2b-128 of its msgpack body (which holds `prev_hash`): the
next batch carries it as its `prev_hash`, a chain over the whole log.

Promises: `decode_batch` raises only `BatchError` (with its `status`);
`check_batch` never raises. Neither applies anything.

Must not import: asyncio, sockets, sepp.server.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from log_format import masked_crc32c

BATCH_VERSION = 1
# The first batch's prev_hash, and the hash length.
HASH_BYTES = 16
GENESIS_HASH = bytes(HASH_BYTES)
CRC_BYTES = 4

BATCH_OK = "ok"
BATCH_BAD_CHECKSUM = "bad_checksum"
BATCH_MALFORMED = "malformed"
BATCH_BROKEN_CHAIN = "broken_chain"
BATCH_SEQ_GAP = "seq_gap"
BATCH_EPOCH_BACKWARDS = "epoch_backwards"
BATCH_TIME_BACKWARDS = "time_backwards"

_CRC = struct.Struct("<I")


class BatchError(ValueError):
    """A message that is not a well-formed batch (`status` says how)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch. `hash` is its own chain hash (the next one's prev_hash)."""

    epoch: int
    first_seq: int
    last_seq: int
    time_ms: int
    prev_hash: bytes
    records: bytes
    hash: bytes


@dataclass(frozen=True, slots=True)
class ChainTip:
    """What a reader (or the leader) knows of the log after its last batch."""

    hash: bytes = GENESIS_HASH
    next_seq: int = 1
    epoch: int = 0
    time_ms: int = 0

    def after(self, batch: Batch) -> ChainTip:
        return ChainTip(batch.hash, batch.last_seq + 1, batch.epoch, batch.time_ms)


def chain_hash(body: bytes | memoryview) -> bytes:
    return hashlib.blake2b(body, digest_size=HASH_BYTES).digest()


def encode_batch(
    *,
    epoch: int,
    first_seq: int,
    last_seq: int,
    time_ms: int,
    prev_hash: bytes,
    records: bytes,
) -> tuple[bytes, bytes]:
    """The message for one group commit, and its chain hash."""
    if epoch < 1 or first_seq < 1 or last_seq < first_seq or time_ms < 0:
        raise ValueError(f"bad batch header: epoch {epoch}, seqs {first_seq}..{last_seq}")
    if len(prev_hash) != HASH_BYTES or not records:
        raise ValueError("a batch needs a 16-byte prev_hash and at least one record")
    body = msgpack.packb(
        [BATCH_VERSION, epoch, first_seq, last_seq, time_ms, prev_hash, records],
        use_bin_type=True,
    )
    return _CRC.pack(masked_crc32c(body)) + body, chain_hash(body)


def _is_uint(value: Any) -> bool:
    return type(value) is int and value >= 0


def decode_batch(message: bytes | memoryview) -> Batch:
    """Check the message's CRC and shape. Raises BatchError."""
    view = memoryview(message)
    if len(view) < CRC_BYTES + 1:
        raise BatchError(BATCH_MALFORMED, f"message of {len(view)} bytes is too short")
    body = view[CRC_BYTES:]
    (stored,) = _CRC.unpack_from(view, 0)
    if masked_crc32c(body) != stored:
        raise BatchError(BATCH_BAD_CHECKSUM, "batch checksum mismatch")
    try:
        fields = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many kinds on bad input
        raise BatchError(BATCH_MALFORMED, f"batch body is not valid msgpack: {exc}") from exc
    if type(fields) is not list or len(fields) != 7:
        raise BatchError(BATCH_MALFORMED, "batch body is not an array of 7 elements")
    version, epoch, first_seq, last_seq, time_ms, prev_hash, records = fields
    if version != BATCH_VERSION or type(version) is not int:
        raise BatchError(BATCH_MALFORMED, f"unsupported batch version {version!r:.20}")
    if not all(_is_uint(v) for v in (epoch, first_seq, last_seq, time_ms)):
        raise BatchError(BATCH_MALFORMED, "batch header fields are not non-negative integers")
    if first_seq < 1 or last_seq < first_seq:
        raise BatchError(BATCH_MALFORMED, f"bad batch seqs {first_seq}..{last_seq}")
    if type(prev_hash) is not bytes or len(prev_hash) != HASH_BYTES:
        raise BatchError(BATCH_MALFORMED, "batch prev_hash is not 16 bytes")
    if type(records) is not bytes or not records:
        raise BatchError(BATCH_MALFORMED, "batch records are not a non-empty byte string")
    return Batch(epoch, first_seq, last_seq, time_ms, prev_hash, records, chain_hash(body))


@dataclass(frozen=True, slots=True)
class BatchCheck:
    status: str
    reason: str
    batch: Batch | None = None

    @property
    def ok(self) -> bool:
        return self.status == BATCH_OK


def check_batch(message: bytes | memoryview, tip: ChainTip) -> BatchCheck:
    """Classify `message` as the batch after `tip` (never raises).

    | what the message holds | status |
    | --- | --- |
    | a CRC that does not match its body | bad_checksum |
    | a body that is not a version-1 batch | malformed |
    | an epoch below tip.epoch (whatever its chain) | epoch_backwards |
    | prev_hash other than tip.hash | broken_chain |
    | first_seq other than tip.next_seq | seq_gap |
    | a time below tip.time_ms | time_backwards |
    | otherwise | ok |

    `epoch_backwards` is checked before the chain: a deposed leader's pipelined
    append that landed on its successor's batch chains onto its own lost batch,
    and readers skip it (sepp/cluster/logengine.py).
    """
    try:
        batch = decode_batch(message)
    except BatchError as exc:
        return BatchCheck(exc.status, exc.reason)
    if batch.epoch < tip.epoch:
        return BatchCheck(
            BATCH_EPOCH_BACKWARDS, f"epoch {batch.epoch} after epoch {tip.epoch}", batch
        )
    if batch.prev_hash != tip.hash:
        return BatchCheck(
            BATCH_BROKEN_CHAIN,
            f"prev_hash {batch.prev_hash.hex()} is not the last batch's hash {tip.hash.hex()}",
            batch,
        )
    if batch.first_seq != tip.next_seq:
        return BatchCheck(
            BATCH_SEQ_GAP,
            f"batch starts at record seq {batch.first_seq}, expected {tip.next_seq}",
            batch,
        )
    if batch.time_ms < tip.time_ms:
        return BatchCheck(
            BATCH_TIME_BACKWARDS, f"time {batch.time_ms} after time {tip.time_ms}", batch
        )
    return BatchCheck(BATCH_OK, "", batch)
