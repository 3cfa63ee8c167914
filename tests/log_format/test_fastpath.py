"""ValidEnvelopes, the replay fast path: it must yield exactly the envelopes that
scan_records + decode_envelope accept, in order, and stop where they stop."""

from __future__ import annotations

import random

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from log_format import (
    FILE_HEADER_BYTES,
    FormatError,
    Record,
    ValidEnvelopes,
    decode_envelope,
    encode_envelope,
    scan_records,
)


def envelope_bodies(n: int) -> list[bytes]:
    # Both envelope versions: version 2 (with a synced_seq) on every other record.
    return [
        encode_envelope(
            1000 + i, 1, [[3, 1, f"job-{i}", 1, None], [7, 1, f"job-{i}"]], i if i % 2 else None
        )
        for i in range(n)
    ]


def reference(data: bytes) -> tuple[list[list[object]], int, int]:
    """What the slow path accepts: the leading valid records whose envelope decodes,
    and the offset / seq of the first one that is not."""
    accepted = []
    offset, seq = FILE_HEADER_BYTES, 1
    for item in scan_records(data, start_offset=FILE_HEADER_BYTES, expected_seq=1):
        if type(item) is not Record:
            return accepted, offset, seq
        try:
            env = decode_envelope(item.body)
        except FormatError:
            return accepted, item.offset, item.seq
        if env.synced_seq is None:
            accepted.append([1, env.time_ms, env.command_kind, env.events])
        else:
            accepted.append([2, env.time_ms, env.command_kind, env.events, env.synced_seq])
        offset, seq = item.offset + 24 + len(item.body), item.seq + 1
    return accepted, offset, seq


def fast(data: bytes) -> tuple[list[list[object]], int, int]:
    run = ValidEnvelopes(data, start_offset=FILE_HEADER_BYTES, expected_seq=1)
    return list(run), run.offset, run.seq


def test_a_valid_segment_is_read_whole(kit) -> None:
    built = kit.segment(envelope_bodies(20))
    envelopes, offset, seq = fast(built.data)
    assert (envelopes, offset, seq) == reference(built.data)
    assert len(envelopes) == 20 and offset == built.end and seq == 21


def test_it_stops_at_a_torn_tail(kit) -> None:
    built = kit.segment(envelope_bodies(5))
    data = built.data[:-3]
    assert fast(data) == reference(data)
    assert fast(data)[1:] == (built.offsets[4], 5)


def test_it_stops_at_a_flipped_bit_and_leaves_classification_to_the_scanner(kit) -> None:
    built = kit.segment(envelope_bodies(6))
    data = kit.flip_bit(built.data, built.offsets[3] + 30)
    assert fast(data) == reference(data)
    assert fast(data)[1:] == (built.offsets[3], 4)


def test_it_stops_at_a_checksummed_record_whose_envelope_does_not_decode(kit) -> None:
    bodies = envelope_bodies(4)
    bodies[2] = b"\x93\x01\x02\x03"  # a valid msgpack array, but not an envelope
    built = kit.segment(bodies)
    assert fast(built.data) == reference(built.data)
    assert fast(built.data)[1:] == (built.offsets[2], 3)


def test_closing_early_names_the_record_being_handled(kit) -> None:
    built = kit.segment(envelope_bodies(5))
    run = ValidEnvelopes(built.data, start_offset=FILE_HEADER_BYTES, expected_seq=1)
    envelopes = iter(run)
    for _ in range(3):
        next(envelopes)
    envelopes.close()
    assert (run.offset, run.seq) == (built.offsets[2], 3)


@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 10_000), max_size=4), st.integers(0, 400))
def test_after_any_damage_it_yields_what_the_slow_path_accepts(
    kit, seed: int, flips: list[int], cut: int
) -> None:
    rng = random.Random(seed)
    data = bytearray(kit.segment(envelope_bodies(rng.randrange(1, 12))).data)
    for flip in flips:
        pos = FILE_HEADER_BYTES + flip % max(1, len(data) - FILE_HEADER_BYTES)
        if pos < len(data):
            data[pos] ^= 1 << rng.randrange(8)
    damaged = bytes(data[: max(FILE_HEADER_BYTES, len(data) - cut)])
    assert fast(damaged) == reference(damaged)


def test_until_seq_stops_before_the_next_record_unread(kit) -> None:
    built = kit.segment(envelope_bodies(6))
    for until, taken in ((0, 0), (1, 1), (4, 4), (6, 6), (99, 6)):
        run = ValidEnvelopes(
            built.data, start_offset=FILE_HEADER_BYTES, expected_seq=1, until_seq=until
        )
        assert list(run) == reference(built.data)[0][:taken]
        assert (run.offset, run.seq) == ([*built.offsets, built.end][taken], taken + 1)
    # Nothing after the limit is looked at: damage there does not matter.
    damaged = kit.flip_bit(built.data, built.offsets[4] + 2)
    run = ValidEnvelopes(damaged, start_offset=FILE_HEADER_BYTES, expected_seq=1, until_seq=4)
    assert len(list(run)) == 4 and (run.offset, run.seq) == (built.offsets[4], 5)


def test_a_bool_or_a_float_does_not_pass_for_a_number_in_the_envelope(kit) -> None:
    bodies = envelope_bodies(4)
    envelope = msgpack.unpackb(bodies[1])
    for index, value in ((0, True), (0, 1.0), (1, True), (1, 1000.0), (2, True), (2, 1.0)):
        changed = list(envelope)
        changed[index] = value
        damaged = [*bodies[:1], msgpack.packb(changed), *bodies[2:]]
        built = kit.segment(damaged)
        assert fast(built.data) == reference(built.data)
        assert fast(built.data)[1:] == (built.offsets[1], 2), (index, value)


def test_a_version_2_envelope_with_a_bad_synced_seq_stops_the_run(kit) -> None:
    bodies = envelope_bodies(4)
    for synced_seq in (-1, True, None, 1.0):
        damaged = [*bodies[:2], msgpack.packb([2, 1000, 1, [], synced_seq]), *bodies[3:]]
        built = kit.segment(damaged)
        assert fast(built.data) == reference(built.data)
        assert fast(built.data)[1:] == (built.offsets[2], 3), synced_seq
