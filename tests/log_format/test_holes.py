"""`unsynced_hole` (FORMAT.md 5.4): checksum damage followed by valid records is a
hole in the unsynced tail only when every valid record after it says the damaged
record had not been synced when it was written."""

from __future__ import annotations

import pytest

from log_format import (
    RECORD_HEADER_BYTES,
    Corruption,
    UnsyncedHole,
    encode_envelope,
    scan_records,
    unsynced_hole,
)


def bodies(claims: list[int | None]) -> list[bytes]:
    """One record body per claim: a version 2 envelope claiming that synced_seq,
    or (None) a version 1 envelope that claims nothing."""
    return [
        encode_envelope(1000 + i, 1, [[7, 1, f"job-{i}"]], claim) for i, claim in enumerate(claims)
    ]


def zero_page(data: bytes, start: int, end: int) -> bytes:
    return data[:start] + bytes(end - start) + data[end:]


def terminal(data: bytes) -> object:
    return list(scan_records(data, expected_seq=1))[-1]


def test_zeros_before_records_that_claim_less_is_an_unsynced_hole(kit) -> None:
    # Seqs 1..3 synced (claims 0..), 4..8 written after: they claim 3.
    built = kit.segment(bodies([None, 0, 1, 3, 3, 3, 3, 3]))
    data = zero_page(built.data, built.offsets[4], built.offsets[6])  # seqs 5, 6 lost
    assert terminal(data) == Corruption(built.offsets[4], None, "bad header checksum")
    hole = unsynced_hole(data, offset=built.offsets[4], seq=5)
    assert hole == UnsyncedHole(offset=built.offsets[4], seq=5, records=2, synced_seq=3)


def test_a_torn_body_before_records_that_claim_less_is_an_unsynced_hole(kit) -> None:
    built = kit.segment(bodies([None, 0, 1, 1, 1, 1]))
    cut = built.offsets[3] + RECORD_HEADER_BYTES + 3  # the header survived, the body not
    data = zero_page(built.data, cut, built.offsets[4])
    assert terminal(data) == Corruption(built.offsets[3], 4, "bad body checksum")
    assert unsynced_hole(data, offset=built.offsets[3], seq=4) == UnsyncedHole(
        built.offsets[3], 4, 2, 1
    )


def test_a_record_after_the_hole_that_claims_it_synced_makes_it_corruption(kit) -> None:
    built = kit.segment(bodies([None, 0, 1, 1, 1, 4]))  # seq 6 says seq 4 was synced
    data = zero_page(built.data, built.offsets[3], built.offsets[4])
    assert unsynced_hole(data, offset=built.offsets[3], seq=4) is None


def test_evidence_behind_a_second_hole_still_counts(kit) -> None:
    # Seq 8, behind a second hole, says seq 4 was synced: the first hole is damage.
    built = kit.segment(bodies([None, 0, 1, 1, 1, 1, 1, 5]))
    data = zero_page(built.data, built.offsets[3], built.offsets[4])
    data = zero_page(data, built.offsets[5], built.offsets[7])
    assert unsynced_hole(data, offset=built.offsets[3], seq=4) is None
    # Without seq 8's claim the same two holes are unsynced tail.
    calm = kit.segment(bodies([None, 0, 1, 1, 1, 1, 1, 3]))
    data = zero_page(calm.data, calm.offsets[3], calm.offsets[4])
    data = zero_page(data, calm.offsets[5], calm.offsets[7])
    assert unsynced_hole(data, offset=calm.offsets[3], seq=4) == UnsyncedHole(
        calm.offsets[3], 4, 2, 3
    )


@pytest.mark.parametrize("where", ["header", "body"])
def test_records_after_the_hole_that_claim_nothing_make_it_corruption(kit, where: str) -> None:
    built = kit.segment(bodies([None, 0, 1, 1, None, 1]))  # seq 5: a version 1 envelope
    at = built.offsets[3] + (2 if where == "header" else RECORD_HEADER_BYTES + 2)
    data = kit.flip_bit(built.data, at)
    assert unsynced_hole(data, offset=built.offsets[3], seq=4) is None


def test_records_whose_body_is_not_an_envelope_claim_nothing(kit) -> None:
    built = kit.segment([*bodies([None, 0, 1]), b"not an envelope"])
    data = zero_page(built.data, built.offsets[2], built.offsets[3])
    assert unsynced_hole(data, offset=built.offsets[2], seq=3) is None


def test_no_hole_without_damage_or_without_a_valid_record_after_it(kit) -> None:
    built = kit.segment(bodies([None, 0, 1, 1]))
    assert unsynced_hole(built.data, offset=built.offsets[2], seq=3) is None  # no damage
    torn = zero_page(built.data, built.offsets[3], len(built.data))  # a zero-filled tail
    assert unsynced_hole(torn, offset=built.offsets[3], seq=4) is None


def test_a_checksummed_header_that_no_crash_writes_is_never_a_hole(kit) -> None:
    built = kit.segment(bodies([None, 0, 1, 1, 1]))
    gap = kit.patch_record_header(built.data, built.offsets[2], seq=9)
    assert unsynced_hole(gap, offset=built.offsets[2], seq=3) is None


def test_snapshot_records_never_make_a_hole(kit) -> None:
    built = kit.segment(bodies([None, 0, 1, 1]))
    data = zero_page(built.data, built.offsets[1], built.offsets[2])
    assert unsynced_hole(data, offset=built.offsets[1], seq=2, kinds={16, 17, 18, 19, 20}) is None
