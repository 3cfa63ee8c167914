"""Frames: a 4-byte big-endian length, then that many bytes of msgpack.

Owns: `FrameReader` (bytes in, whole frames out, the size limit checked from the
length prefix before anything is buffered for the frame) and `encode_frame`.

Promises: a frame longer than `frame_bytes_max` raises `FrameTooLarge` as soon as
its 4-byte prefix has arrived, without waiting for or allocating its body; a
zero-length frame raises `ProtocolViolation`. A frame body of at least
`PARTS_FRAME_BYTES_MIN` that arrives over several reads is kept as the reads
themselves and joined once when complete (one copy of the body, not the three of
growing a buffer, slicing it and converting the slice: an 8 MiB frame cost the
event loop ~9 ms that way). Nothing here touches a socket.

Must not import: asyncio, socket, sepp.core.
"""

from __future__ import annotations

import struct

from sepp.protocol.errors import FrameTooLarge, FramingError, ProtocolViolation

LENGTH_PREFIX = struct.Struct(">I")
LENGTH_PREFIX_BYTES = 4
# The reference's max_message_bytes default: one whole request on the wire.
FRAME_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
FRAME_BYTES_CEILING = 2**31 - 1
# A frame body at least this long that is not complete in the buffer is gathered
# as a list of reads (joined once) instead of in the buffer.
PARTS_FRAME_BYTES_MIN = 64 * 1024


def encode_frame(body: bytes) -> bytes:
    return LENGTH_PREFIX.pack(len(body)) + body


class FrameReader:
    """Accumulates received bytes and cuts them into frames."""

    __slots__ = ("_broken", "_buffer", "_need", "_parts", "_parts_bytes", "frame_bytes_max")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        if not 1 <= frame_bytes_max <= FRAME_BYTES_CEILING:
            raise ValueError(f"frame_bytes_max must be in 1..{FRAME_BYTES_CEILING}")
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        # Length of the frame being received, once its prefix was read.
        self._need = -1
        # The received part of a large frame body (`_need` bytes long), as the
        # reads that brought it (see `PARTS_FRAME_BYTES_MIN`); `_buffer` is empty
        # meanwhile. Held only as immutable bytes (a caller may reuse its buffer).
        self._parts: list[bytes | bytearray | memoryview] = []
        self._parts_bytes = 0
        # A framing error met after complete frames in the same feed: those frames
        # are returned first (they are valid requests and must be answered), and
        # the error is raised by `raise_pending` / the next `feed`. Kept as the
        # (length, limit) it is made from, and raised as a new exception each time:
        # a kept exception holds, through its traceback, the frame that raised it
        # and so this reader -- a cycle only the garbage collector can free, and
        # the server's collector policy may never look at it (gcpolicy).
        self._broken: tuple[int, int] | None = None

    def raise_pending(self) -> None:
        """Raise the framing error found behind the frames last returned, if any."""
        broken = self._broken
        if broken is not None:
            raise _framing_error(broken[0], broken[1])

    @property
    def buffered(self) -> int:
        return len(self._buffer) + self._parts_bytes

    def feed(self, data: bytes | bytearray | memoryview, frames_max: int = 0) -> list[bytes]:
        """Add received bytes; return every frame body now complete, in order.
        Raises FrameTooLarge / ProtocolViolation when the stream breaks framing
        (the connection must then be closed: the byte stream cannot be resynced);
        when complete frames precede the break, they are returned and the error
        waits for `raise_pending()`.

        `frames_max` > 0: return at most that many frames and leave the rest
        buffered, its length prefixes not yet checked (`feed(b"")` goes on): a
        server takes a connection's frames one at a time until its hello
        succeeds, so a frame behind the hello is judged by the limit that holds
        once the hello is answered (`frame_bytes_max` may be raised in between)."""
        self.raise_pending()
        buffer = self._buffer
        frames: list[bytes] = []
        if self._parts:
            rest = self._add_part(data)
            if rest is None:
                return frames
            # The large frame is complete: it goes first, the bytes behind it
            # are cut into frames as usual.
            frames.append(b"".join(self._parts))
            self._parts = []
            self._parts_bytes = 0
            self._need = -1
            if frames_max == 1:
                buffer += rest
                return frames
            data = rest
        elif not buffer and self._need < 0 and len(data) > LENGTH_PREFIX_BYTES:
            # The usual read: exactly one whole frame (a client with one request
            # in flight), taken without copying it through the buffer.
            (need,) = LENGTH_PREFIX.unpack_from(data)
            if len(data) - LENGTH_PREFIX_BYTES == need and 0 < need <= self.frame_bytes_max:
                return [bytes(data[LENGTH_PREFIX_BYTES:])]
        buffer += data
        pos = 0
        end = len(buffer)
        need = self._need
        while True:
            if need < 0:
                if end - pos < LENGTH_PREFIX_BYTES:
                    break
                (need,) = LENGTH_PREFIX.unpack_from(buffer, pos)
                if need > self.frame_bytes_max or need == 0:
                    del buffer[:]
                    self._need = -1
                    if frames:
                        self._broken = (need, self.frame_bytes_max)
                        return frames
                    raise _framing_error(need, self.frame_bytes_max)
                pos += LENGTH_PREFIX_BYTES
            if end - pos < need:
                if need >= PARTS_FRAME_BYTES_MIN:
                    # The start of a large frame: kept as parts from now on.
                    if end > pos:
                        self._parts.append(buffer[pos:end])
                        self._parts_bytes = end - pos
                    pos = end
                break
            frames.append(bytes(buffer[pos : pos + need]))
            pos += need
            need = -1
            if len(frames) == frames_max:
                break
        if pos:
            del buffer[:pos]
        self._need = need
        return frames

    def _add_part(self, data: bytes | bytearray | memoryview) -> memoryview | None:
        """Add `data` to the large frame being gathered. Returns None while the
        frame is incomplete, else the bytes of `data` behind its end."""
        missing = self._need - self._parts_bytes
        size = len(data)
        if type(data) is not bytes:
            # Another object's buffer may be reused after this call: copy it.
            data = bytes(data)
        if size < missing:
            self._parts.append(data)
            self._parts_bytes += size
            return None
        view = memoryview(data)
        self._parts.append(view[:missing])
        self._parts_bytes += missing
        return view[missing:]


def _framing_error(length: int, limit: int) -> FramingError:
    """The error for a length prefix of `length` under `limit` (0: zero-length)."""
    if length == 0:
        return ProtocolViolation("zero-length frame")
    return FrameTooLarge(length, limit)
