"""sepp, a durable job queue.

The client API (`SeppClient`, `Worker`, ...) is re-exported here lazily, on
first attribute access, so that importing `sepp.core` or `sepp.storage` never
loads the client (and asyncio) with it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from log_format._compiled import guard as _guard
from sepp._version import __version__

# Before any compiled module of sepp loads: refuse a stale compiled build, honour
# SEPP_PURE (log_format/_compiled.py).
_guard("sepp", os.path.dirname(os.path.abspath(__file__)))

if TYPE_CHECKING:
    from sepp.client import (
        AttemptMismatchError,
        BatchResultCountMismatchError,
        BatchValidationError,
        ClientClosedError,
        ClientError,
        ConnectError,
        CustomEntriesTooMany,
        CustomKeyTooLong,
        CustomMapTooLarge,
        DeadLetterCause,
        DeadLetterRecord,
        DuplicateHandlerError,
        EmptyBatchError,
        EncodingNotAllowed,
        EnqueueAck,
        EnqueueRequest,
        HandlerError,
        HealthStatus,
        IdempotencyKeyTooLong,
        InvalidApiKeyError,
        InvalidRequest,
        InvalidRequestError,
        Job,
        JobConversionError,
        JobCtx,
        JobNotFoundError,
        JobRejectedError,
        JobRejection,
        JobTypeNameTooLong,
        JobTypeNotAllowed,
        JobValidationError,
        LeaseError,
        MalformedJobError,
        MalformedResponseError,
        MalformedServerInfoError,
        MessageTooLargeError,
        OverloadedError,
        Payload,
        PayloadTooLarge,
        Primitive,
        Priority,
        PriorityOutOfRangeError,
        QueueClosing,
        QueueFull,
        QueueNameTooLong,
        QueueStats,
        ReserveError,
        ReserveOptions,
        RetryDirective,
        RetryPolicy,
        ScheduledTooFar,
        SeppClient,
        SeppError,
        ServerInfo,
        ServerInfoError,
        ServerInternalError,
        ShutdownHandle,
        SyncSeppClient,
        TraceContext,
        TraceContextError,
        TransportError,
        UnauthenticatedError,
        UndecodableDeadLetter,
        UndecodableDeadLetterError,
        UndecodableJob,
        UndecodableJobError,
        UnexpectedStatusError,
        UnknownQueue,
        UnknownQueuesError,
        UnknownRejection,
        UnsupportedProtocolError,
        Worker,
        WorkerMetrics,
    )

__all__ = [
    "AttemptMismatchError",
    "BatchResultCountMismatchError",
    "BatchValidationError",
    "ClientClosedError",
    "ClientError",
    "ConnectError",
    "CustomEntriesTooMany",
    "CustomKeyTooLong",
    "CustomMapTooLarge",
    "DeadLetterCause",
    "DeadLetterRecord",
    "DuplicateHandlerError",
    "EmptyBatchError",
    "EncodingNotAllowed",
    "EnqueueAck",
    "EnqueueRequest",
    "HandlerError",
    "HealthStatus",
    "IdempotencyKeyTooLong",
    "InvalidApiKeyError",
    "InvalidRequest",
    "InvalidRequestError",
    "Job",
    "JobConversionError",
    "JobCtx",
    "JobNotFoundError",
    "JobRejectedError",
    "JobRejection",
    "JobTypeNameTooLong",
    "JobTypeNotAllowed",
    "JobValidationError",
    "LeaseError",
    "MalformedJobError",
    "MalformedResponseError",
    "MalformedServerInfoError",
    "MessageTooLargeError",
    "OverloadedError",
    "Payload",
    "PayloadTooLarge",
    "Primitive",
    "Priority",
    "PriorityOutOfRangeError",
    "QueueClosing",
    "QueueFull",
    "QueueNameTooLong",
    "QueueStats",
    "ReserveError",
    "ReserveOptions",
    "RetryDirective",
    "RetryPolicy",
    "ScheduledTooFar",
    "SeppClient",
    "SeppError",
    "ServerInfo",
    "ServerInfoError",
    "ServerInternalError",
    "ShutdownHandle",
    "SyncSeppClient",
    "TraceContext",
    "TraceContextError",
    "TransportError",
    "UnauthenticatedError",
    "UndecodableDeadLetter",
    "UndecodableDeadLetterError",
    "UndecodableJob",
    "UndecodableJobError",
    "UnexpectedStatusError",
    "UnknownQueue",
    "UnknownQueuesError",
    "UnknownRejection",
    "UnsupportedProtocolError",
    "Worker",
    "WorkerMetrics",
    "__version__",
]

_LAZY = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    # PEP 562: called only for names not found normally, i.e. on first use.
    if name in _LAZY:
        value = getattr(importlib.import_module("sepp.client"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sepp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
