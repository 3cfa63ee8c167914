"""A large message must not leave its size behind: msgpack's Packer never shrinks
its buffer, so the wire encoder and the log's envelope encoder replace a Packer
after a message past PACKER_BUFFER_BYTES_KEPT (issue 13: RSS stayed ~23 MiB above
idle after a drain of 1 MiB dead letters)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from log_format import envelope
from sepp.protocol import messages

BIG = 8 << 20


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def _held_after(encode: Callable[[bytes], bytes]) -> int:
    encode(b"small")  # the encoder's buffer exists before the baseline
    base = tracemalloc.get_traced_memory()[0]
    data = encode(b"y" * BIG)
    assert len(data) > BIG
    del data
    return tracemalloc.get_traced_memory()[0] - base


@pytest.mark.usefixtures("traced")
def test_a_large_wire_message_leaves_no_large_buffer_behind() -> None:
    held = _held_after(lambda blob: messages.pack({"data": blob}))
    assert held < messages.PACKER_BUFFER_BYTES_KEPT, held


@pytest.mark.usefixtures("traced")
def test_a_large_log_record_leaves_no_large_buffer_behind() -> None:
    held = _held_after(lambda blob: envelope.encode_envelope(1, 1, [[1, blob]], 0))
    assert held < envelope.PACKER_BUFFER_BYTES_KEPT, held
