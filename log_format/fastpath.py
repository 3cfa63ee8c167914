"""The replay fast path: the leading run of valid command records of a segment,
already decoded, for readers that apply millions of them.

Owns: `ValidEnvelopes`, an iterable over the envelopes of consecutive valid
command records (both checksums good, kind 1, contiguous sequence numbers, an
envelope of the right shape) starting at an offset.

Promises: it yields only what `scan_records` + `decode_envelope` would accept
(except that each event's own shape — a list of at least a type id and a version
— is left to the consumer, which checks it while building the event), and stops — without raising, without classifying — at the first thing that is not such
a record (or at the end of the buffer). The caller then asks `scan_records` to
classify from `offset` / `seq` (clean end, torn tail, corruption, or a valid record
whose envelope does not decode). So the classification rules live in one place and
this loop only has to be fast: it does the same header and checksum work as
`scan_records` with no per-record objects, and decodes the envelope inline
(replay of a one-event log runs ~30 % faster through it).

With `until_seq`, the run also stops (quietly, before reading its header) at the
first record past that seq: a reader that wants the log up to a point never reads
what follows it.

After the loop, `offset` and `seq` name the first record that was not yielded. A
consumer that stops early (an exception while handling an envelope, or a check of
its own that the envelope fails) calls the iterator's `close()`; `offset` and `seq`
then name the record it was handling.

Must not import: anything but the standard library, `msgpack`, `crc32c` and
`log_format`.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from typing import Any

import msgpack
from crc32c import crc32c

from log_format._bytes import BytesLike, byte_view
from log_format.crc import CRC_MASK_DELTA
from log_format.envelope import COMMAND_KINDS, ENVELOPE_VERSION, ENVELOPE_VERSION_1, _reject_ext
from log_format.records import RECORD_BODY_BYTES_MAX, RECORD_HEADER_BYTES, RECORD_KIND_COMMAND

# header_crc, body_crc, body_len, kind word (kind byte + 3 reserved zero bytes), seq
_HEADER = struct.Struct("<IIIIQ")
_MASK = 0xFFFFFFFF
_ROTATE = 0x100000001


class ValidEnvelopes:
    """`for envelope in ValidEnvelopes(buf, start_offset=32, expected_seq=n)`:
    each envelope is the decoded list `[version, time_ms, command_kind, events]`
    (version 1) or `[2, time_ms, command_kind, events, synced_seq]` (version 2): a
    consumer reads `[1]` and `[3]`, the same in both.
    `until_seq`: stop before any record with a later seq (None: no limit)."""

    __slots__ = ("_buf", "_until", "offset", "seq")

    def __init__(
        self,
        buf: BytesLike,
        *,
        start_offset: int,
        expected_seq: int,
        until_seq: int | None = None,
    ) -> None:
        self._buf = buf
        self._until = until_seq
        self.offset = start_offset
        self.seq = expected_seq

    def __iter__(self) -> Generator[list[Any], None, None]:
        view = byte_view(self._buf)
        end = len(view)
        off = self.offset
        seq = self.seq
        unpack_from = _HEADER.unpack_from
        unpackb = msgpack.unpackb
        crc = crc32c
        delta = CRC_MASK_DELTA
        mask = _MASK
        rotate = _ROTATE
        header_bytes = RECORD_HEADER_BYTES
        body_max = RECORD_BODY_BYTES_MAX
        kind_word = RECORD_KIND_COMMAND  # reserved bytes must be zero
        version = ENVELOPE_VERSION
        version_1 = ENVELOPE_VERSION_1
        kinds = COMMAND_KINDS
        reject_ext = _reject_ext
        # The seq limit costs one comparison per record; without one, `last` is past
        # any seq the buffer can hold (a record takes more than 16 bytes).
        last = self._until if self._until is not None else seq + (end >> 4)
        try:
            while seq <= last and off + header_bytes <= end:
                header_crc, body_crc, body_len, kind, found_seq = unpack_from(view, off)
                body_off = off + header_bytes
                # masked_crc32c inline: c * (2**32 + 1) >> 15 is c rotated right by
                # 15 in its low 32 bits, and the final `& mask` drops the rest.
                if (
                    ((crc(view[off + 4 : body_off]) * rotate >> 15) + delta) & mask != header_crc
                    or kind != kind_word
                    or found_seq != seq
                    or body_len > body_max
                ):
                    return
                body_end = body_off + body_len
                if body_end > end:
                    return
                body = view[body_off:body_end]
                if ((crc(body) * rotate >> 15) + delta) & mask != body_crc:
                    return
                try:
                    envelope = unpackb(body, raw=False, strict_map_key=False, ext_hook=reject_ext)
                    if type(envelope) is not list:
                        return
                    if len(envelope) == 5:
                        envelope_version, time_ms, command_kind, events, synced = envelope
                        # Version 2's synced_seq: a non-negative int (the reader's
                        # check; what it claims matters only next to damage).
                        if type(synced) is not int or synced < 0:
                            return
                        expected_version = version
                    else:
                        envelope_version, time_ms, command_kind, events = envelope
                        expected_version = version_1
                except Exception:
                    return  # scan_records + decode_envelope will say what is wrong
                # `type(x) is int`: msgpack's true/false (and floats) must not pass
                # for a version, a time or a command kind (as in decode_envelope).
                if (
                    type(envelope_version) is not int
                    or envelope_version != expected_version
                    or type(time_ms) is not int
                    or time_ms < 0
                    or type(command_kind) is not int
                    or command_kind not in kinds
                    or type(events) is not list
                ):
                    return
                yield envelope
                off = body_end
                seq += 1
        finally:
            self.offset = off
            self.seq = seq
