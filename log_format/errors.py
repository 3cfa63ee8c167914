"""The one typed error of the on-disk format.

Owns: `FormatError`, raised by every *decoder* in `log_format` (file headers, the
event envelope, catalogue validation) when the bytes or values it is given do not
follow FORMAT.md.

Promises: a decoder fed arbitrary input either returns a value or raises
`FormatError` -- never `struct.error`, `IndexError`, a msgpack exception or anything
else (the h11 rule, enforced by the hypothesis tests). `reason` is a short, stable
string that tests and operators can match; `offset`, when known, is the byte offset
of the problem within the buffer that was decoded.

What does *not* raise it: the record scanner, which never raises on damage but
classifies it (`TornTail`, `Corruption`), and the encoders, which raise `ValueError`
or `TypeError` for caller bugs (a writer checks what it writes).

Must not import: anything outside the standard library.
"""

from __future__ import annotations

__all__ = ["FormatError"]


class FormatError(ValueError):
    """Bytes (or a decoded value) that do not follow the sepp on-disk format."""

    def __init__(self, reason: str, *, offset: int | None = None) -> None:
        self.reason = reason
        self.offset = offset
        super().__init__(reason if offset is None else f"{reason} (at offset {offset})")
