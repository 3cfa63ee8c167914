"""The settings the state machine decides with: global limits, per-queue policies,
strict mode and dead-letter retention.

Owns: `Limits` (whole-request and name limits, not per queue), `QueuePolicy` (the
effective per-queue settings, global defaults merged with a `[[queues]]` override),
`CoreConfig` and its validation rules (`ConfigError`).

Promises: every limit carries its unit in its name; the defaults are the reference
server's (sepp-semantics.md §12, §16, §17). `decide` reads the config; `apply` reads
only which queues are declared (`State.declared`: kept even when they hold nothing,
while other empty queues are forgotten) and a delivered queue's rate limit (which
deliveries its rate window keeps, issue 17), so a log replays to the same jobs, keys
and dead letters under any config, the empty declared queues aside, and to the same
rate windows under the same config.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sepp.core.errors import ConfigError as ConfigError

RETRY_BACKOFF_NONE = "none"
RETRY_BACKOFF_EXPONENTIAL = "exponential"

# The 16-bit length prefix of the reference's on-disk keys; kept as the hard ceiling
# so a config that works here also works there.
QUEUE_NAME_BYTES_CEILING = 65535

# One job must fit in one snapshot record (log_format RECORD_BODY_BYTES_MAX, 64 MiB,
# less the 5 bytes of the record's array header; tests/core/test_config.py checks the
# number against log_format): a job's row holds what at most three requests brought
# -- its enqueue (within limits.max_message_bytes), the reserve that named its worker
# (max_worker_id_bytes) and the nacks that gave its last reason and its dead-letter
# reason (max_reason_bytes each; a dead letter has no worker) -- plus the ids, times
# and counters the server adds (JOB_ROW_OVERHEAD_BYTES, generously). A config whose
# largest job could not be snapshotted is refused (issue 13 §3).
SNAPSHOT_ROW_BYTES_MAX = 64 * 1024 * 1024 - 5
JOB_ROW_OVERHEAD_BYTES = 1024

# Bounds on the msgpack size of what an answer carries (PROTOCOL.md 5.2, 5.6;
# decide.job_answer_bytes). The fixed part of a delivered job: its 12 keys and map
# headers, the id, six integers at 9 bytes each, and a 5-byte header for each string
# and the payload (296 bytes; tests/server/test_answer_caps.py checks the bound
# against the real encoding).
JOB_ANSWER_FIXED_BYTES = 320
# A custom entry beyond its key's and string value's own bytes: two 5-byte
# headers, or a key header and a 9-byte number.
CUSTOM_ENTRY_FIXED_BYTES = 14
# A drained record beyond its job and its last reason: 5 keys, the cause, two
# integers and a header for the reason (92 bytes).
DEAD_LETTER_ANSWER_FIXED_BYTES = 128
# Room a reserve or drain answer keeps for its envelope: [request_id, "ok",
# {"jobs" | "records": [...], "too_large": [...]}] headers (42 bytes at most).
ANSWER_ENVELOPE_BYTES_MAX = 128

# Rate limits (issue 17): the window keeps the times of at most
# RATE_LIMIT_JOBS_MAX deliveries per limited queue (runs of equal times share an
# entry), over at most RATE_LIMIT_PER_MS_MAX (a day).
RATE_LIMIT_JOBS_MAX = 100_000
RATE_LIMIT_PER_MS_MAX = 86_400_000
# A queue's weight in a fair reserve: its turn lasts at most this many deliveries.
WEIGHT_MAX = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Limits that apply to whole requests and to names; not overridable per queue."""

    max_reserve_batch: int = 256
    max_reserve_queues: int = 32
    max_wait_timeout_ms: int = 300_000
    max_enqueue_batch: int = 256
    max_message_bytes: int = 16 * 1024 * 1024
    max_queue_name_bytes: int = 512
    max_job_type_bytes: int = 256
    max_idempotency_key_bytes: int = 256
    # Client-supplied strings that had no bound before (issue 13: a 15 MiB traceparent
    # on 40 jobs made a 600 MiB reserve answer). Each is refused past its limit, in
    # UTF-8 bytes: a job's as an invalid_request rejection, a command's as
    # invalid_argument.
    # traceparent + tracestate together (W3C: a traceparent is 55 bytes, tracestate
    # is propagated up to 512 characters).
    max_trace_context_bytes: int = 2048
    # A payload's encoding (a media type: RFC 6838 allows 127 + 1 + 127 characters).
    max_encoding_bytes: int = 256
    max_worker_id_bytes: int = 256
    # A nack's reason and an operator's dead-letter reason (kept as last_reason).
    max_reason_bytes: int = 4096
    # Queue names one queue_stats request may list (after removing repeats).
    max_stats_queues: int = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePolicy:
    """The effective settings of one queue."""

    max_lease_duration_ms: int = 300_000
    default_max_attempts: int = 3
    max_attempts_ceiling: int = 100
    default_priority: int = 0
    retry_delay_ms: int = 0
    retry_backoff: str = RETRY_BACKOFF_NONE
    retry_delay_max_ms: int = 3_600_000
    max_payload_bytes: int = 1_048_576
    # None = any encoding; () = no job with a payload is accepted.
    allowed_encodings: tuple[str, ...] | None = None
    # None = any job type. Only ever set per queue.
    allowed_job_types: tuple[str, ...] | None = None
    max_schedule_horizon_ms: int = 2_592_000_000
    max_custom_entries: int = 64
    max_custom_total_bytes: int = 16_384
    max_custom_key_bytes: int = 256
    dedup_window_ms: int = 86_400_000
    # None = unlimited; 0 rejects every enqueue.
    max_queue_depth: int | None = None
    # Jobs of the queue leased at once, across all workers (issue 17); None =
    # unlimited. A reserve at the cap gets fewer jobs (or waits), never an error.
    max_in_flight: int | None = None
    # Deliveries of the queue's jobs (lease grants, redeliveries included) in any
    # window of rate_limit_per_ms milliseconds: at most rate_limit_jobs (issue 17).
    # Set together or not at all (the file's `rate_limit = { jobs, per_ms }`);
    # None = unlimited. A reserve at the limit gets fewer jobs (or waits).
    rate_limit_jobs: int | None = None
    rate_limit_per_ms: int | None = None
    # The queue's share in a fair reserve (order "fair", issue 17): when its turn
    # comes it is served up to `weight` times in a row (weighted round robin).
    weight: int = 1


POLICY_KEYS = tuple(f.name for f in dataclasses.fields(QueuePolicy))


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreConfig:
    limits: Limits = field(default_factory=Limits)
    # The global values of the per-queue settings ([limits] plus storage.dedup_window_ms).
    defaults: QueuePolicy = field(default_factory=QueuePolicy)
    # Declared queues ([[queues]]), each with its merged, effective policy.
    queues: Mapping[str, QueuePolicy] = field(default_factory=dict)
    strict_queues: bool = False
    # 0 = the dead-letter store is off: dead jobs are dropped on the spot.
    dead_letter_retention_ms: int = 0
    # Entries handled per sweep phase; also the scan cap of a filtered drain.
    sweep_limit: int = 10_000

    def policy(self, queue: str) -> QueuePolicy:
        return self.queues.get(queue, self.defaults)

    def is_declared(self, queue: str) -> bool:
        return queue in self.queues

    def with_queue(self, name: str, **overrides: Any) -> CoreConfig:
        """A copy with `name` declared, its policy = global defaults + overrides."""
        queues = dict(self.queues)
        queues[name] = dataclasses.replace(self.defaults, **overrides)
        return dataclasses.replace(self, queues=queues)


def validate_config(config: CoreConfig) -> None:
    """Raise ConfigError for the first setting that is out of range or contradicts
    another (the cross-validation rules of sepp-semantics.md §17)."""
    lim = config.limits
    for name in (
        "max_reserve_batch",
        "max_reserve_queues",
        "max_enqueue_batch",
        "max_message_bytes",
        "max_job_type_bytes",
        "max_idempotency_key_bytes",
        "max_trace_context_bytes",
        "max_encoding_bytes",
        "max_worker_id_bytes",
        "max_reason_bytes",
        "max_stats_queues",
    ):
        if getattr(lim, name) < 1:
            raise ConfigError(f"limits.{name}", "must be at least 1")
    row_bytes_max = (
        lim.max_message_bytes
        + lim.max_worker_id_bytes
        + 2 * lim.max_reason_bytes
        + JOB_ROW_OVERHEAD_BYTES
    )
    if row_bytes_max > SNAPSHOT_ROW_BYTES_MAX:
        room = (
            SNAPSHOT_ROW_BYTES_MAX
            - lim.max_worker_id_bytes
            - 2 * lim.max_reason_bytes
            - JOB_ROW_OVERHEAD_BYTES
        )
        raise ConfigError(
            "limits.max_message_bytes",
            f"must be at most {max(room, 0)} with these max_worker_id_bytes and "
            "max_reason_bytes: one job (what its enqueue, reserve and two nacks "
            "brought) must fit in one 64 MiB snapshot record",
        )
    if lim.max_wait_timeout_ms < 0:
        raise ConfigError("limits.max_wait_timeout_ms", "must not be negative")
    if not 1 <= lim.max_queue_name_bytes <= QUEUE_NAME_BYTES_CEILING:
        raise ConfigError(
            "limits.max_queue_name_bytes", f"must be between 1 and {QUEUE_NAME_BYTES_CEILING}"
        )
    if config.dead_letter_retention_ms < 0:
        raise ConfigError("storage.dead_letter_retention_ms", "must not be negative")
    if config.sweep_limit < 1:
        raise ConfigError("storage.sweep_limit", "must be at least 1")
    _validate_policy("limits", config.defaults, lim)
    for name, policy in config.queues.items():
        problem = queue_name_problem(name, lim.max_queue_name_bytes)
        if problem is not None:
            raise ConfigError(f"queues.{name}.name", problem)
        _validate_policy(f"queues.{name}", policy, lim)


def _validate_policy(prefix: str, p: QueuePolicy, lim: Limits) -> None:
    if p.max_lease_duration_ms < 1:
        raise ConfigError(f"{prefix}.max_lease_duration_ms", "must be at least 1")
    if p.max_attempts_ceiling < 1:
        raise ConfigError(f"{prefix}.max_attempts_ceiling", "must be at least 1")
    if not 1 <= p.default_max_attempts <= p.max_attempts_ceiling:
        raise ConfigError(
            f"{prefix}.default_max_attempts",
            f"must be between 1 and max_attempts_ceiling ({p.max_attempts_ceiling})",
        )
    if not 0 <= p.default_priority <= 9:
        raise ConfigError(f"{prefix}.default_priority", "must be between 0 and 9")
    if p.retry_backoff not in (RETRY_BACKOFF_NONE, RETRY_BACKOFF_EXPONENTIAL):
        raise ConfigError(f"{prefix}.retry_backoff", 'must be "none" or "exponential"')
    if p.retry_delay_max_ms < 1:
        raise ConfigError(f"{prefix}.retry_delay_max_ms", "must be at least 1")
    if not 0 <= p.retry_delay_ms <= p.retry_delay_max_ms:
        raise ConfigError(
            f"{prefix}.retry_delay_ms",
            f"must be between 0 and retry_delay_max_ms ({p.retry_delay_max_ms})",
        )
    if not 0 <= p.max_payload_bytes <= lim.max_message_bytes:
        raise ConfigError(
            f"{prefix}.max_payload_bytes",
            f"must be between 0 and limits.max_message_bytes ({lim.max_message_bytes})",
        )
    for name in ("allowed_encodings", "allowed_job_types"):
        values = getattr(p, name)
        if values is not None and any(not isinstance(v, str) or not v for v in values):
            raise ConfigError(f"{prefix}.{name}", "entries must be non-empty strings")
    if p.max_schedule_horizon_ms < 0:
        raise ConfigError(f"{prefix}.max_schedule_horizon_ms", "must not be negative")
    for name in ("max_custom_entries", "max_custom_total_bytes", "max_custom_key_bytes"):
        if getattr(p, name) < 0:
            raise ConfigError(f"{prefix}.{name}", "must not be negative")
    if p.dedup_window_ms < 0:
        raise ConfigError(f"{prefix}.dedup_window_ms", "must not be negative")
    if p.max_queue_depth is not None and p.max_queue_depth < 0:
        raise ConfigError(f"{prefix}.max_queue_depth", "must not be negative")
    if p.max_in_flight is not None and p.max_in_flight < 1:
        raise ConfigError(f"{prefix}.max_in_flight", "must be at least 1")
    jobs, per_ms = p.rate_limit_jobs, p.rate_limit_per_ms
    if (jobs is None) != (per_ms is None):
        raise ConfigError(f"{prefix}.rate_limit", "jobs and per_ms are set together or not at all")
    if jobs is not None and not 1 <= jobs <= RATE_LIMIT_JOBS_MAX:
        raise ConfigError(
            f"{prefix}.rate_limit.jobs", f"must be between 1 and {RATE_LIMIT_JOBS_MAX}"
        )
    if per_ms is not None and not 1 <= per_ms <= RATE_LIMIT_PER_MS_MAX:
        raise ConfigError(
            f"{prefix}.rate_limit.per_ms", f"must be between 1 and {RATE_LIMIT_PER_MS_MAX}"
        )
    if not 1 <= p.weight <= WEIGHT_MAX:
        raise ConfigError(f"{prefix}.weight", f"must be between 1 and {WEIGHT_MAX}")


def queue_name_problem(name: object, max_bytes: int) -> str | None:
    """Why `name` is not a valid queue name, or None. Length is reported apart
    (it is its own rejection, QueueNameTooLong)."""
    if not isinstance(name, str) or not name:
        return "queue name must be a non-empty string"
    if name in (".", ".."):
        return "queue name must not be '.' or '..'"
    if "/" in name:
        return "queue name must not contain '/'"
    # C0, DEL and C1 (U+0080-U+009F): the same set the enqueue path refuses, so a
    # declared queue can always receive jobs.
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        return "queue name must not contain control characters"
    if len(name.encode()) > max_bytes:
        return f"queue name is longer than {max_bytes} bytes"
    return None
