"""File names and the 32-byte file headers of segment and snapshot files.

Owns: the naming rule of `DATA_DIR/wal/<first_seq:020d>.log` and
`DATA_DIR/snapshots/<last_seq:020d>.snap`, and the encoding and decoding of the two
file headers (same layout, different magic; see FORMAT.md "File headers").

Promises: `encode_*_header` produces exactly the bytes FORMAT.md describes (golden
tests freeze them); `decode_*_header` returns a header or raises `FormatError` with
one of a fixed set of reasons, for any input whatsoever. The parse functions return
None for every name that is not exactly one a sepp writer would create, so a stray
`.tmp` file or an editor backup is never mistaken for part of the log.

Must not import: anything but the standard library, `crc32c` and `log_format`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from log_format._bytes import BytesLike, byte_view
from log_format.crc import masked_crc32c
from log_format.errors import FormatError

__all__ = [
    "FILE_HEADER_BYTES",
    "FORMAT_VERSION",
    "SEGMENT_FILE_SUFFIX",
    "SEGMENT_MAGIC",
    "SNAPSHOT_FILE_SUFFIX",
    "SNAPSHOT_MAGIC",
    "SegmentHeader",
    "SnapshotHeader",
    "decode_segment_header",
    "decode_snapshot_header",
    "encode_segment_header",
    "encode_snapshot_header",
    "parse_segment_file_name",
    "parse_snapshot_file_name",
    "segment_file_name",
    "snapshot_file_name",
]

SEGMENT_MAGIC = b"SEPPWAL\x00"
SNAPSHOT_MAGIC = b"SEPPSNAP"
# The version of the framing (headers and records). A reader refuses any other
# value: a new framing is a new number, never a silent reinterpretation.
FORMAT_VERSION = 1
FILE_HEADER_BYTES = 32
SEGMENT_FILE_SUFFIX = ".log"
SNAPSHOT_FILE_SUFFIX = ".snap"

_SEQ_DIGITS = 20  # 2**64 - 1 has 20 decimal digits, so every u64 fits.
_U64_MAX = 2**64 - 1

# magic, version, flags, reserved, number (first_seq or last_seq) -- the 24 bytes
# the header checksum covers; then the checksum and a trailing reserved word.
_COVERED = struct.Struct("<8sHHIQ")
_HEADER = struct.Struct("<8sHHIQII")
_CRC_AT = _COVERED.size  # 24


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """A decoded segment header; `first_seq` is the sequence number of the segment's
    first record (>= 1)."""

    version: int
    flags: int
    first_seq: int


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """A decoded snapshot header; `last_seq` is the log sequence number whose state
    the snapshot holds (0 for the state of an empty log)."""

    version: int
    flags: int
    last_seq: int


# ---------------------------------------------------------------- file names


def _file_name(number: int, suffix: str, what: str, lowest: int) -> str:
    if type(number) is not int or not lowest <= number <= _U64_MAX:
        raise ValueError(f"{what} must be an int in {lowest}..2**64-1, got {number!r}")
    return f"{number:0{_SEQ_DIGITS}d}{suffix}"


def _parse_file_name(name: str, suffix: str) -> int | None:
    digits = name[: -len(suffix)]
    # str.isdigit() accepts non-ASCII digits ("٣"); only ASCII 0-9 are ours.
    if (
        len(name) != _SEQ_DIGITS + len(suffix)
        or not name.endswith(suffix)
        or not digits.isascii()
        or not digits.isdigit()
    ):
        return None
    number = int(digits)
    return number if number <= _U64_MAX else None


def segment_file_name(first_seq: int) -> str:
    """`00000000000000000001.log` for first_seq 1; lexicographic order is log order."""
    return _file_name(first_seq, SEGMENT_FILE_SUFFIX, "first_seq", 1)


def parse_segment_file_name(name: str) -> int | None:
    """first_seq from a segment file name, or None unless `name` is exactly 20 ASCII
    digits + `.log` with a value in 1..2**64-1."""
    number = _parse_file_name(name, SEGMENT_FILE_SUFFIX)
    return number if number else None


def snapshot_file_name(last_seq: int) -> str:
    """`00000000000000000042.snap` for last_seq 42 (0 is allowed: an empty log)."""
    return _file_name(last_seq, SNAPSHOT_FILE_SUFFIX, "last_seq", 0)


def parse_snapshot_file_name(name: str) -> int | None:
    """last_seq from a snapshot file name, or None unless `name` is exactly 20 ASCII
    digits + `.snap` with a value in 0..2**64-1."""
    return _parse_file_name(name, SNAPSHOT_FILE_SUFFIX)


# ---------------------------------------------------------------- headers


def _encode_header(magic: bytes, number: int) -> bytes:
    covered = _COVERED.pack(magic, FORMAT_VERSION, 0, 0, number)
    return covered + struct.pack("<II", masked_crc32c(covered), 0)


def _decode_header(buf: BytesLike, magic: bytes) -> tuple[int, int, int]:
    """(version, flags, number) of a valid header, or FormatError.

    Check order matters for the reason reported: the checksum is checked before the
    fields it covers, so a flipped bit in the version field reads "bad header
    checksum", not "unsupported format version" (which is kept for real, checksummed
    headers written by another version of sepp)."""
    view = byte_view(buf)
    if len(view) < FILE_HEADER_BYTES:
        raise FormatError("truncated header", offset=0)
    got_magic, version, flags, reserved, number, crc, reserved2 = _HEADER.unpack_from(view, 0)
    if got_magic != magic:
        raise FormatError("bad magic", offset=0)
    if masked_crc32c(view[:_CRC_AT]) != crc:
        raise FormatError("bad header checksum", offset=_CRC_AT)
    if version != FORMAT_VERSION:
        raise FormatError(f"unsupported format version {version}", offset=8)
    if flags != 0:
        raise FormatError("nonzero flags", offset=10)
    if reserved != 0:
        raise FormatError("nonzero reserved bytes", offset=12)
    if reserved2 != 0:
        raise FormatError("nonzero reserved bytes", offset=28)
    return version, flags, number


def encode_segment_header(first_seq: int) -> bytes:
    """The 32-byte header of a segment whose first record has seq `first_seq`."""
    if type(first_seq) is not int or not 1 <= first_seq <= _U64_MAX:
        raise ValueError(f"first_seq must be an int in 1..2**64-1, got {first_seq!r}")
    return _encode_header(SEGMENT_MAGIC, first_seq)


def decode_segment_header(buf: BytesLike) -> SegmentHeader:
    """Decode the first 32 bytes of `buf` (anything after them is ignored).

    Raises FormatError with reason "truncated header", "bad magic", "bad header
    checksum", "unsupported format version N", "nonzero flags", "nonzero reserved
    bytes" or "first_seq is 0"."""
    version, flags, first_seq = _decode_header(buf, SEGMENT_MAGIC)
    if first_seq == 0:
        raise FormatError("first_seq is 0", offset=16)
    return SegmentHeader(version=version, flags=flags, first_seq=first_seq)


def encode_snapshot_header(last_seq: int) -> bytes:
    """The 32-byte header of a snapshot of the state at log sequence `last_seq`."""
    if type(last_seq) is not int or not 0 <= last_seq <= _U64_MAX:
        raise ValueError(f"last_seq must be an int in 0..2**64-1, got {last_seq!r}")
    return _encode_header(SNAPSHOT_MAGIC, last_seq)


def decode_snapshot_header(buf: BytesLike) -> SnapshotHeader:
    """Decode the first 32 bytes of `buf`; the same reasons as `decode_segment_header`
    except that last_seq 0 is valid."""
    version, flags, last_seq = _decode_header(buf, SNAPSHOT_MAGIC)
    return SnapshotHeader(version=version, flags=flags, last_seq=last_seq)
