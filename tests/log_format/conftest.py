"""Shared builders for the log_format tests: segments made of real records, and the
byte surgery the behaviour tests perform on them. Exposed as one session-scoped
fixture (`kit`) so hypothesis tests can use it too. (Seeds: tests/conftest.py.)"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    encode_record,
    encode_segment_header,
    encode_snapshot_header,
    masked_crc32c,
)


@dataclass(frozen=True)
class Built:
    """A built file: its bytes and the offset of each record (plus the end)."""

    data: bytes
    offsets: list[int]

    @property
    def end(self) -> int:
        return len(self.data)


class Kit:
    @staticmethod
    def bodies(n: int, size: int = 20) -> list[bytes]:
        return [bytes([65 + i % 26]) * (size + i) for i in range(n)]

    @staticmethod
    def segment(
        bodies: list[bytes],
        *,
        first_seq: int = 1,
        seqs: list[int] | None = None,
        kinds: list[int] | None = None,
        snapshot: bool = False,
    ) -> Built:
        header = encode_snapshot_header(0) if snapshot else encode_segment_header(first_seq)
        parts = [header]
        offsets = []
        pos = FILE_HEADER_BYTES
        for i, body in enumerate(bodies):
            seq = seqs[i] if seqs is not None else first_seq + i
            kind = kinds[i] if kinds is not None else RECORD_KIND_COMMAND
            record = encode_record(seq, kind, body)
            offsets.append(pos)
            parts.append(record)
            pos += len(record)
        return Built(b"".join(parts), offsets)

    @staticmethod
    def flip_bit(data: bytes, pos: int, bit: int = 0) -> bytes:
        buf = bytearray(data)
        buf[pos] ^= 1 << bit
        return bytes(buf)

    @staticmethod
    def patch_record_header(
        data: bytes,
        off: int,
        *,
        body_len: int | None = None,
        kind_word: int | None = None,
        seq: int | None = None,
        fix_crc: bool = True,
    ) -> bytes:
        """Rewrite fields of the record header at `off`; with fix_crc the header
        checksum is recomputed, so the header is 'written on purpose'."""
        buf = bytearray(data)
        _h_crc, b_crc, b_len, k_word, r_seq = struct.unpack_from("<IIIIQ", buf, off)
        b_len = b_len if body_len is None else body_len
        k_word = k_word if kind_word is None else kind_word
        r_seq = r_seq if seq is None else seq
        struct.pack_into("<IIIQ", buf, off + 4, b_crc, b_len, k_word, r_seq)
        if fix_crc:
            struct.pack_into("<I", buf, off, masked_crc32c(bytes(buf[off + 4 : off + 24])))
        return bytes(buf)


@pytest.fixture(scope="session")
def kit() -> Kit:
    return Kit()
