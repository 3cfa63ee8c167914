"""Small helpers over byte buffers shared by the modules of `log_format`.

Owns: the `BytesLike` alias (what the decoders and the scanner accept), a view
normaliser and a zero test. Promises nothing beyond them; private to the package.

Must not import: anything but the standard library.
"""

from __future__ import annotations

import mmap
from typing import TypeAlias

# A whole file as bytes, or an mmap of it. Python 3.11 has no collections.abc.Buffer
# to say "any buffer"; these are the ones sepp uses.
BytesLike: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

_ZERO_CHUNK_BYTES = 1 << 20
_ZEROS = memoryview(bytes(_ZERO_CHUNK_BYTES))


def byte_view(buf: BytesLike) -> memoryview:
    """A flat, one-byte-per-item memoryview of `buf` (TypeError if it is no buffer
    or not contiguous): `len()` and slicing then count bytes."""
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def all_zero(view: memoryview, start: int, end: int) -> bool:
    """True when view[start:end] is non-empty and all zero bytes. Compares a chunk at
    a time, so a long tail of an mmap is never copied whole."""
    if start >= end:
        return False
    for pos in range(start, end, _ZERO_CHUNK_BYTES):
        stop = min(pos + _ZERO_CHUNK_BYTES, end)
        if view[pos:stop] != _ZEROS[: stop - pos]:
            return False
    return True
