"""The event envelope: the msgpack body of a command record (record kind 1).

Owns: the envelope layout `[envelope_version, time_ms, command_kind, events]`
(version 1) and `[2, time_ms, command_kind, events, synced_seq]` (version 2: what
sepp writes; `synced_seq` is the highest sequence number the writer knew to be
synced when it encoded the record, FORMAT.md 5.3 says why), the command kinds,
`encode_envelope` and `decode_envelope` (FORMAT.md "Envelope").

Promises: `decode_envelope` accepts exactly one msgpack array of that shape --
version 1 or 2, a non-negative int time, a known command kind, an array of event
arrays each holding at least a type id and a version, and for version 2 a
non-negative int `synced_seq` -- with no trailing bytes, and raises
`FormatError` for anything else, including every exception msgpack can raise on bad
input. It does *not* check each event's fields against the catalogue: that costs
microseconds per event and belongs to `sepp-log verify` (`catalogue.validate_event`);
replay gets its per-event check from `sepp.core.events.from_fields`. Bytes stay
`bytes`, strings stay `str` (msgpack bin and str types are kept apart).

`encode_envelope` checks its own arguments (a writer checks what it writes) so that
nothing it produces can later fail `decode_envelope`'s shape check.

Must not import: anything but the standard library, `msgpack` and `log_format`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from log_format._bytes import BytesLike
from log_format.errors import FormatError

__all__ = [
    "COMMAND_ACK",
    "COMMAND_DEAD_LETTER_JOBS",
    "COMMAND_DRAIN_DEAD_LETTERS",
    "COMMAND_ENQUEUE",
    "COMMAND_ENQUEUE_ATOMIC",
    "COMMAND_EXTEND",
    "COMMAND_KINDS",
    "COMMAND_KIND_NAMES",
    "COMMAND_LEADER_CHANGE",
    "COMMAND_NACK",
    "COMMAND_RELEASE",
    "COMMAND_REQUEUE_DEAD_LETTERS",
    "COMMAND_RESERVE",
    "COMMAND_SWEEP",
    "ENVELOPE_VERSION",
    "ENVELOPE_VERSION_1",
    "Envelope",
    "decode_envelope",
    "encode_envelope",
    "encode_envelope_parts",
]

# The version sepp writes: version 1 plus `synced_seq`. Version 1 (no synced_seq) is
# still read, and written by `encode_envelope` for a caller that knows no synced seq.
ENVELOPE_VERSION = 2
ENVELOPE_VERSION_1 = 1

COMMAND_ENQUEUE = 1  # best-effort batch: each job stands alone
COMMAND_ENQUEUE_ATOMIC = 2  # all jobs of the batch or none
COMMAND_RESERVE = 3
COMMAND_ACK = 4
COMMAND_NACK = 5
COMMAND_EXTEND = 6
COMMAND_DRAIN_DEAD_LETTERS = 7
COMMAND_SWEEP = 8  # the timer-driven tick: expiries and promotions
COMMAND_DEAD_LETTER_JOBS = 9  # admin
COMMAND_REQUEUE_DEAD_LETTERS = 10  # admin
COMMAND_RELEASE = 11  # an attempt handed back unused (delivered to nobody)
COMMAND_ADMIN = 12  # an operator's action (issue 15); its AdminAction event names it
COMMAND_LEADER_CHANGE = 13  # cluster mode: a new leader's fenced first record (issue 19)

COMMAND_KIND_NAMES = {
    COMMAND_ENQUEUE: "enqueue",
    COMMAND_ENQUEUE_ATOMIC: "enqueue_atomic",
    COMMAND_RESERVE: "reserve",
    COMMAND_ACK: "ack",
    COMMAND_NACK: "nack",
    COMMAND_EXTEND: "extend",
    COMMAND_DRAIN_DEAD_LETTERS: "drain_dead_letters",
    COMMAND_SWEEP: "sweep",
    COMMAND_DEAD_LETTER_JOBS: "dead_letter_jobs",
    COMMAND_REQUEUE_DEAD_LETTERS: "requeue_dead_letters",
    COMMAND_RELEASE: "release",
    COMMAND_ADMIN: "admin",
    COMMAND_LEADER_CHANGE: "leader_change",
}
COMMAND_KINDS = frozenset(COMMAND_KIND_NAMES)


class Envelope(NamedTuple):
    """A decoded command record body. `events` are the stored event lists,
    `[type_id, version, field...]`, unvalidated beyond their shape.

    A NamedTuple because one is built per record on the replay path."""

    time_ms: int
    command_kind: int
    events: list[list[Any]]
    # Version 2: the highest seq synced when the record was written; None: version 1
    # (the record does not say).
    synced_seq: int | None = None


# Everything msgpack can raise on bad input: its own exceptions (ExtraData,
# FormatError, StackError, OutOfData, BufferFull all derive from UnpackException or
# ValueError), ValueError for limits and bad timestamps, UnicodeDecodeError (a
# ValueError) for bad UTF-8, TypeError for an unhashable map key, OverflowError, and
# RecursionError from the pure-Python fallback msgpack uses without its C extension.
_MSGPACK_ERRORS = (
    msgpack.UnpackException,
    ValueError,
    TypeError,
    OverflowError,
    RecursionError,
)

_tuple_new = tuple.__new__
_unpackb = msgpack.unpackb
_local = threading.local()


def _reject_ext(code: int, data: bytes) -> Any:
    # The envelope uses no msgpack extension types; rejecting them here keeps
    # ExtType objects out of events. (Timestamps, ext -1, msgpack decodes itself;
    # `validate_event` rejects them as a wrong field type.)
    raise FormatError(f"msgpack extension type {code} in envelope")


def _packer() -> Callable[[Any], bytes]:
    # A Packer is ~40% faster than packb (which builds one per call) but is not
    # safe to share between threads, so each thread gets its own.
    try:
        pack: Callable[[Any], bytes] = _local.pack
    except AttributeError:
        pack = _local.pack = msgpack.Packer(use_bin_type=True).pack
    return pack


# msgpack's Packer never shrinks its buffer: one 16 MiB enqueue would leave its
# thread's Packer holding 16 MiB for good. A body past PACKER_BUFFER_BYTES_KEPT
# gets the thread a fresh Packer after it.
PACKER_BUFFER_BYTES_KEPT = 1 << 20


def _packed(value: object) -> bytes:
    data = _packer()(value)
    if len(data) > PACKER_BUFFER_BYTES_KEPT:
        _local.pack = msgpack.Packer(use_bin_type=True).pack
    return data


# `encode_envelope_parts` leaves a bytes field at least this long out of the
# packer: it becomes a part of its own, after its msgpack bin header.
ENVELOPE_PART_BYTES_MIN = 64 * 1024


def _bin_header(size: int) -> bytes:
    """msgpack's header for a bin of `size` bytes (what use_bin_type packs)."""
    if size < 0x100:
        return bytes((0xC4, size))
    if size < 0x10000:
        return bytes((0xC5, size >> 8, size & 0xFF))
    return b"\xc6" + size.to_bytes(4, "big")


def encode_envelope_parts(
    time_ms: object, command_kind: object, events: object, synced_seq: object = None
) -> list[bytes]:
    """`encode_envelope`'s body as a list of parts whose concatenation is exactly
    that body: one part, unless an event field is a bytes object of at least
    `ENVELOPE_PART_BYTES_MIN`; each such field is a part of its own, the very
    object given (not copied), so a 1 MiB payload is not copied into the packer's
    buffer and out again (into fresh memory each time: its page faults cost the
    event loop ~3 ms per MiB under load). Raises as `encode_envelope`."""
    if type(events) is not list or not _has_large_bytes(events):
        return [encode_envelope(time_ms, command_kind, events, synced_seq)]
    # The envelope around an empty events array checks time, kind and synced_seq:
    # [version, time, kind, 0x90 (no events)] + [synced_seq].
    outer = encode_envelope(time_ms, command_kind, _NO_EVENTS, synced_seq)
    pack = _packer()
    version = ENVELOPE_VERSION_1 if synced_seq is None else ENVELOPE_VERSION
    head = (
        _array_header(4 if synced_seq is None else 5)
        + pack(version)
        + pack(time_ms)
        + pack(command_kind)
    )
    tail = b"" if synced_seq is None else pack(synced_seq)
    if outer != head + b"\x90" + tail:  # pragma: no cover - a bug here
        raise RuntimeError("envelope parts disagree with encode_envelope")
    parts: list[bytes] = []
    small: list[bytes] = [head, _array_header(len(events))]
    for event in events:
        if type(event) is not list or len(event) < 2:
            raise ValueError(f"an event must be a list [type_id, version, ...]: {event!r:.80}")
        small.append(_array_header(len(event)))
        for field in event:
            if type(field) is bytes and len(field) >= ENVELOPE_PART_BYTES_MIN:
                small.append(_bin_header(len(field)))
                parts.append(b"".join(small))
                parts.append(field)
                small = []
            else:
                small.append(pack(field))
    small.append(tail)
    parts.append(b"".join(small))
    return parts


_NO_EVENTS: list[Any] = []


def _array_header(size: int) -> bytes:
    """msgpack's header for an array of `size` items."""
    if size < 0x10:
        return bytes((0x90 | size,))
    if size < 0x10000:
        return bytes((0xDC, size >> 8, size & 0xFF))
    return b"\xdd" + size.to_bytes(4, "big")


def _has_large_bytes(events: list[Any]) -> bool:
    for event in events:
        if type(event) is list:
            for field in event:
                if type(field) is bytes and len(field) >= ENVELOPE_PART_BYTES_MIN:
                    return True
    return False


def encode_envelope(
    time_ms: object, command_kind: object, events: object, synced_seq: object = None
) -> bytes:
    """The body of one command record: all events of one command, in order.

    `time_ms` an int >= 0, `command_kind` a known command kind, `events` a list of
    event lists; typed `object` because it checks them itself (a compiled build
    would convert a declared int before the check: True to 1). `synced_seq`: the
    highest seq known synced when the record is written (an int >= 0, below the
    record's own seq: the caller's promise) gives a version 2 envelope; None a
    version 1 envelope, which claims nothing. Raises ValueError for a bad time,
    command kind or synced_seq or an event that is not a list of at least
    [type_id, version]; msgpack's TypeError / OverflowError for values it cannot
    encode. Field values are not checked against the catalogue here."""
    if type(time_ms) is not int or time_ms < 0:
        raise ValueError(f"time_ms must be a non-negative int, got {time_ms!r:.40}")
    if type(command_kind) is not int or command_kind not in COMMAND_KINDS:
        raise ValueError(f"unknown command kind {command_kind!r:.40}")
    if type(events) is not list:
        raise ValueError("events must be a list of event lists")
    for event in events:
        if type(event) is not list or len(event) < 2:
            raise ValueError(f"an event must be a list [type_id, version, ...]: {event!r:.80}")
    if synced_seq is None:
        return _packed([ENVELOPE_VERSION_1, time_ms, command_kind, events])
    if type(synced_seq) is not int or synced_seq < 0:
        raise ValueError(f"synced_seq must be a non-negative int, got {synced_seq!r:.40}")
    return _packed([ENVELOPE_VERSION, time_ms, command_kind, events, synced_seq])


def decode_envelope(body: BytesLike) -> Envelope:
    """Decode a command record body strictly; FormatError on anything else."""
    try:
        obj = _unpackb(body, raw=False, strict_map_key=False, ext_hook=_reject_ext)
    except FormatError:
        raise
    except msgpack.ExtraData as exc:
        raise FormatError("trailing bytes after envelope") from exc
    except _MSGPACK_ERRORS as exc:
        raise FormatError("envelope is not valid msgpack") from exc
    if type(obj) is not list or not 4 <= len(obj) <= 5:
        raise FormatError("envelope is not an array of 4 or 5 elements")
    version = obj[0]
    # `type(x) is int` and not isinstance: msgpack's true/false decode to bool, a
    # subclass of int, and must not pass for a number.
    if type(version) is not int or not ENVELOPE_VERSION_1 <= version <= ENVELOPE_VERSION:
        raise FormatError(f"unsupported envelope version {version!r:.40}")
    size = 4 if version == ENVELOPE_VERSION_1 else 5
    if len(obj) != size:
        raise FormatError(f"envelope version {version} is not an array of {size} elements")
    time_ms = obj[1]
    command_kind = obj[2]
    events = obj[3]
    synced_seq = obj[4] if size == 5 else None
    if type(time_ms) is not int or time_ms < 0:
        raise FormatError(f"bad envelope time_ms {time_ms!r:.40}")
    if type(command_kind) is not int or command_kind not in COMMAND_KINDS:
        raise FormatError(f"unknown command kind {command_kind!r:.40}")
    if type(events) is not list:
        raise FormatError("envelope events is not an array")
    for event in events:
        if type(event) is not list or len(event) < 2:
            raise FormatError("event is not an array of at least 2 elements")
    if size == 5 and (type(synced_seq) is not int or synced_seq < 0):
        raise FormatError(f"bad envelope synced_seq {synced_seq!r:.40}")
    envelope: Envelope = _tuple_new(Envelope, (time_ms, command_kind, events, synced_seq))
    return envelope
