"""The cluster batch (log_format/FORMAT.md "Cluster batch"): its bytes, and
`check_batch`'s decision table, one test per row."""

from __future__ import annotations

import struct

import msgpack
import pytest

from log_format import RECORD_KIND_COMMAND, encode_envelope, encode_record, masked_crc32c
from sepp.cluster.batch import (
    BATCH_BAD_CHECKSUM,
    BATCH_BROKEN_CHAIN,
    BATCH_EPOCH_BACKWARDS,
    BATCH_MALFORMED,
    BATCH_OK,
    BATCH_SEQ_GAP,
    BATCH_TIME_BACKWARDS,
    GENESIS_HASH,
    BatchError,
    ChainTip,
    chain_hash,
    check_batch,
    decode_batch,
    encode_batch,
)


def records(first: int, count: int) -> bytes:
    return b"".join(
        encode_record(seq, RECORD_KIND_COMMAND, encode_envelope(1000 + seq, 8, []))
        for seq in range(first, first + count)
    )


def batch(*, first: int = 1, count: int = 2, epoch: int = 1, time_ms: int = 2000,
          prev: bytes = GENESIS_HASH) -> tuple[bytes, bytes]:  # fmt: skip
    return encode_batch(
        epoch=epoch,
        first_seq=first,
        last_seq=first + count - 1,
        time_ms=time_ms,
        prev_hash=prev,
        records=records(first, count),
    )


def test_a_batch_is_a_crc_then_a_msgpack_array_and_its_hash_covers_the_body() -> None:
    message, digest = batch()
    body = message[4:]
    assert struct.unpack("<I", message[:4])[0] == masked_crc32c(body)
    assert msgpack.unpackb(body) == [1, 1, 1, 2, 2000, GENESIS_HASH, records(1, 2)]
    assert digest == chain_hash(body) and len(digest) == 16
    decoded = decode_batch(message)
    assert (decoded.epoch, decoded.first_seq, decoded.last_seq, decoded.time_ms) == (1, 1, 2, 2000)
    assert decoded.records == records(1, 2) and decoded.hash == digest


def test_encode_batch_refuses_an_empty_or_inverted_batch() -> None:
    with pytest.raises(ValueError):
        encode_batch(epoch=1, first_seq=3, last_seq=2, time_ms=0, prev_hash=GENESIS_HASH,
                     records=b"x")  # fmt: skip
    with pytest.raises(ValueError):
        encode_batch(epoch=1, first_seq=1, last_seq=1, time_ms=0, prev_hash=GENESIS_HASH,
                     records=b"")  # fmt: skip


# -- check_batch, row by row ---------------------------------------------------------


def test_row_a_crc_that_does_not_match_is_bad_checksum() -> None:
    message = bytearray(batch()[0])
    message[-1] ^= 0x01
    check = check_batch(bytes(message), ChainTip())
    assert check.status == BATCH_BAD_CHECKSUM and check.batch is None


def test_row_a_body_that_is_not_a_version_1_batch_is_malformed() -> None:
    body = msgpack.packb([2, 1, 1, 1, 0, GENESIS_HASH, b"r"])
    message = struct.pack("<I", masked_crc32c(body)) + body
    check = check_batch(message, ChainTip())
    assert check.status == BATCH_MALFORMED and "version" in check.reason
    with pytest.raises(BatchError):
        decode_batch(b"\x00\x00")


def test_row_a_prev_hash_other_than_the_tips_is_a_broken_chain() -> None:
    first, digest = batch()
    second, _ = batch(first=3, prev=bytes(16 * [7]))
    tip = ChainTip().after(decode_batch(first))
    assert tip.hash == digest
    assert check_batch(second, tip).status == BATCH_BROKEN_CHAIN


def test_row_a_first_seq_other_than_the_next_is_a_seq_gap() -> None:
    first, digest = batch()
    tip = ChainTip().after(decode_batch(first))
    check = check_batch(batch(first=4, prev=digest)[0], tip)
    assert check.status == BATCH_SEQ_GAP and "expected 3" in check.reason


def test_row_an_epoch_below_the_tips_is_epoch_backwards() -> None:
    first, digest = batch(epoch=3)
    tip = ChainTip().after(decode_batch(first))
    assert check_batch(batch(first=3, epoch=2, prev=digest)[0], tip).status == (
        BATCH_EPOCH_BACKWARDS
    )


def test_row_a_time_below_the_tips_is_time_backwards() -> None:
    first, digest = batch(time_ms=5000)
    tip = ChainTip().after(decode_batch(first))
    assert check_batch(batch(first=3, time_ms=4999, prev=digest)[0], tip).status == (
        BATCH_TIME_BACKWARDS
    )


def test_row_otherwise_the_batch_is_ok() -> None:
    first, digest = batch()
    tip = ChainTip().after(decode_batch(first))
    check = check_batch(batch(first=3, epoch=2, time_ms=2000, prev=digest)[0], tip)
    assert check.status == BATCH_OK and check.ok
    assert check.batch is not None and check.batch.first_seq == 3
