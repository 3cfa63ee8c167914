"""Answers written as parts (`messages.response_frame_parts`): the same bytes as the
whole frame, with every large bytes value left uncopied."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sepp.protocol import messages as pm
from sepp.protocol.errors import OK
from sepp.protocol.framing import FrameReader, encode_frame

LARGE = pm.SPLICE_BYTES_MIN


def _large(size: int, fill: int) -> bytes:
    return bytes([fill]) * size


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=40),
    # Around the threshold, and past each msgpack bin width (8, 16, 32 bits).
    st.builds(_large, st.sampled_from([LARGE - 1, LARGE, LARGE + 1, 70_000]), st.integers(0, 255)),
)
bodies = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=20), st.dictionaries(st.text(max_size=8), inner, max_size=20)
    ),
    max_leaves=40,
)


def _large_values(value: Any) -> list[bytes]:
    if isinstance(value, bytes):
        return [value] if len(value) >= LARGE else []
    if isinstance(value, dict):
        return [b for item in value.values() for b in _large_values(item)]
    if isinstance(value, list):
        return [b for item in value for b in _large_values(item)]
    return []


@settings(max_examples=150, deadline=None)
@given(
    body=st.dictionaries(st.text(max_size=8), bodies, max_size=6),
    request_id=st.integers(0, 2**64 - 1),
)
def test_the_parts_are_the_whole_frame_and_leave_large_values_uncopied(
    body: dict[str, Any], request_id: int
) -> None:
    parts = pm.response_frame_parts(request_id, OK, body)
    assert b"".join(parts) == encode_frame(pm.encode_response(request_id, OK, body))
    for value in _large_values(body):
        assert any(part is value for part in parts)


def test_a_reserve_answer_of_large_jobs_reads_back_as_sent(rng: random.Random) -> None:
    # Containers past the fix sizes (16+ entries: map16 / array16) and payloads
    # from 1 byte to 1 MiB, as a client's frame reader receives them, in pieces.
    jobs = [
        {
            "id": f"job-{i}",
            "payload": {
                "data": rng.randbytes(rng.choice([1, 300, LARGE, 1 << 20])),
                "encoding": "b",
            },
            "attempt": i,
            **{f"k{k}": k for k in range(16)},
        }
        for i in range(20)
    ]
    parts = pm.response_frame_parts(7, OK, {"jobs": jobs})
    stream = b"".join(parts)
    reader = FrameReader(64 << 20)
    frames: list[bytes] = []
    for start in range(0, len(stream), 100_003):
        frames.extend(reader.feed(stream[start : start + 100_003]))
    (frame,) = frames
    response = pm.decode_response(frame)
    assert response.id == 7 and response.status == OK
    assert response.body == {"jobs": jobs}
