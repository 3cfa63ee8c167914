"""Protocol error codes and the exceptions of the sans-I/O layer.

Owns: the error codes every response may carry (`ERROR_CODES`, the reference's
gRPC status names in lowercase), `ProtocolError` (a request is malformed: the
server answers it with `invalid_argument` and carries on) and `FramingError`
(the byte stream itself is broken: the connection must be closed).

Must not import: asyncio, socket, sepp.core.
"""

from __future__ import annotations

OK = "ok"
INVALID_ARGUMENT = "invalid_argument"
NOT_FOUND = "not_found"
FAILED_PRECONDITION = "failed_precondition"
UNAUTHENTICATED = "unauthenticated"
PERMISSION_DENIED = "permission_denied"
RESOURCE_EXHAUSTED = "resource_exhausted"
UNAVAILABLE = "unavailable"
INTERNAL = "internal"

ERROR_CODES = (
    INVALID_ARGUMENT,
    NOT_FOUND,
    FAILED_PRECONDITION,
    UNAUTHENTICATED,
    PERMISSION_DENIED,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    INTERNAL,
)
STATUSES = (OK, *ERROR_CODES)
# Codes a client may retry automatically (with backoff) when the operation is
# safe to repeat; the reference's guidance (sepp-semantics.md §15).
RETRYABLE_CODES = frozenset({RESOURCE_EXHAUSTED, UNAVAILABLE})

# Detail reasons carried next to a code, where one code covers several cases.
REASON_ATTEMPT_MISMATCH = "attempt_mismatch"
REASON_UNKNOWN_QUEUE = "unknown_queue"
REASON_QUEUE_IN_USE = "queue_in_use"
REASON_FRAME_TOO_LARGE = "frame_too_large"
REASON_OVERLOADED = "overloaded"
REASON_SHUTTING_DOWN = "shutting_down"
REASON_STORAGE_FAILED = "storage_failed"
# Cluster mode (issue 19): a node that is not the serving leader refuses every
# operation but hello / health / server_info before doing anything, with
# ``leader`` ("host:port" or nil) and, for a request a deposed leader cannot
# vouch for, ``outcome_unknown: true``.
REASON_NOT_LEADER = "not_leader"


class ProtocolError(ValueError):
    """A well-framed message that does not follow the protocol (wrong types,
    missing fields, unknown operation). Answered with `code`; the connection
    stays usable."""

    def __init__(self, message: str, code: str = INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class FramingError(ValueError):
    """The byte stream cannot be cut into frames any more. Close the connection."""


class FrameTooLarge(FramingError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class ProtocolViolation(FramingError):
    """Framing is intact but the stream is unusable (zero-length frame, a frame
    that is not a msgpack array of the right shape, a request before hello)."""
