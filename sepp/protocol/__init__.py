"""sepp's wire protocol, sans-I/O: frames, messages, error codes.

Bytes in, typed values out, and back; no sockets and no asyncio, so the server
and the client share it and tests join both ends in memory. PROTOCOL.md, next to
this file, is the specification.
"""

from sepp.protocol.errors import (
    ERROR_CODES,
    FAILED_PRECONDITION,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    OK,
    RESOURCE_EXHAUSTED,
    RETRYABLE_CODES,
    UNAUTHENTICATED,
    UNAVAILABLE,
    FrameTooLarge,
    FramingError,
    ProtocolError,
    ProtocolViolation,
)
from sepp.protocol.framing import FRAME_BYTES_MAX_DEFAULT, FrameReader, encode_frame
from sepp.protocol.messages import (
    PROTOCOL_VERSION,
    Request,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

__all__ = [
    "ERROR_CODES",
    "FAILED_PRECONDITION",
    "FRAME_BYTES_MAX_DEFAULT",
    "INTERNAL",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "OK",
    "PROTOCOL_VERSION",
    "RESOURCE_EXHAUSTED",
    "RETRYABLE_CODES",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "FrameReader",
    "FrameTooLarge",
    "FramingError",
    "ProtocolError",
    "ProtocolViolation",
    "Request",
    "Response",
    "decode_request",
    "decode_response",
    "encode_frame",
    "encode_request",
    "encode_response",
]
