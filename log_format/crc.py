"""Masked CRC32C, exactly as LevelDB's `util/crc32c.h` defines it.

Owns: `masked_crc32c` and `unmask_crc`, and the constants they use.

Promises: `masked_crc32c(data)` is the value stored in every checksum field of a
sepp file, and `unmask_crc(masked_crc32c(d)) == crc32c(d)`.

Why masked: a CRC computed over bytes that themselves contain CRCs (a record stored
inside a payload, a log inside a snapshot) is weak; rotating and adding a constant
breaks that self-similarity (LevelDB's reasoning, kept so the format is familiar).

Must not import: anything but the standard library and `crc32c`.
"""

from __future__ import annotations

from crc32c import crc32c

__all__ = ["CRC_MASK_DELTA", "masked_crc32c", "masked_crc32c_parts", "unmask_crc"]

CRC_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC32C of `data`: rotate right by 15 bits, add 0xA282EAD8 (mod 2**32)."""
    crc: int = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA) & _U32


def masked_crc32c_parts(parts: list[bytes]) -> int:
    """`masked_crc32c` of the concatenation of `parts`, without concatenating them."""
    crc: int = 0
    for part in parts:
        crc = crc32c(part, crc)
    return (((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA) & _U32


def unmask_crc(masked: int) -> int:
    """Invert `masked_crc32c`'s masking: the plain CRC32C."""
    rot = (masked - CRC_MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32
