"""Masked CRC32C: LevelDB's masking, with the worked example of FORMAT.md."""

from __future__ import annotations

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from log_format import CRC_MASK_DELTA, masked_crc32c, unmask_crc


def test_crc32c_of_check_string_is_the_castagnoli_check_value() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_masked_crc_of_check_string_matches_format_md_worked_example() -> None:
    assert masked_crc32c(b"123456789") == 0xC78AB0E5
    assert unmask_crc(0xC78AB0E5) == 0xE3069283


def test_masked_crc_of_empty_input_is_the_mask_delta() -> None:
    assert masked_crc32c(b"") == CRC_MASK_DELTA == 0xA282EAD8


def test_masked_crc_of_twenty_zero_bytes_is_not_zero() -> None:
    # A zero-filled record header must never pass its own checksum.
    assert masked_crc32c(bytes(20)) == 0x4F006462


def test_masked_crc_accepts_memoryview_slices() -> None:
    data = b"xx123456789yy"
    assert masked_crc32c(memoryview(data)[2:11]) == 0xC78AB0E5


@given(st.binary(max_size=64))
def test_unmask_inverts_mask(data: bytes) -> None:
    assert unmask_crc(masked_crc32c(data)) == crc32c.crc32c(data)


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_unmask_stays_within_u32(masked: int) -> None:
    assert 0 <= unmask_crc(masked) < 2**32
