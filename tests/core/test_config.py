"""`validate_config`: each cross-validation rule of sepp-semantics.md §17 that
applies to CoreConfig raises ConfigError naming the offending key, globally and
per queue; configurations at the edge of every rule are accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from sepp.core import ConfigError, CoreConfig, Limits, QueuePolicy, validate_config
from sepp.core.config import JOB_ROW_OVERHEAD_BYTES, SNAPSHOT_ROW_BYTES_MAX

MIB = 1024 * 1024


def g(**overrides: Any) -> CoreConfig:
    """Global ([limits]) values of the per-queue settings."""
    return CoreConfig(defaults=QueuePolicy(**overrides))


def q(**overrides: Any) -> CoreConfig:
    """A declared queue `q` with overrides."""
    return CoreConfig().with_queue("q", **overrides)


def lim(**limits: Any) -> CoreConfig:
    return CoreConfig(limits=Limits(**limits))


INVALID_ROWS = [
    # default_max_attempts <= max_attempts_ceiling
    pytest.param(g(default_max_attempts=101), "limits.default_max_attempts", id="global default_max_attempts above the ceiling"),
    pytest.param(q(default_max_attempts=6, max_attempts_ceiling=5), "queues.q.default_max_attempts", id="queue default_max_attempts above its ceiling"),
    pytest.param(q(max_attempts_ceiling=2), "queues.q.default_max_attempts", id="a queue ceiling below the inherited default"),
    pytest.param(g(default_max_attempts=0), "limits.default_max_attempts", id="default_max_attempts 0"),
    pytest.param(g(max_attempts_ceiling=0, default_max_attempts=0), "limits.max_attempts_ceiling", id="max_attempts_ceiling 0"),
    # retry_delay_ms <= retry_delay_max_ms, retry_delay_max_ms >= 1
    pytest.param(g(retry_delay_ms=2_000, retry_delay_max_ms=1_000), "limits.retry_delay_ms", id="global retry_delay_ms above retry_delay_max_ms"),
    pytest.param(q(retry_delay_ms=5_000, retry_delay_max_ms=4_000), "queues.q.retry_delay_ms", id="queue retry_delay_ms above its retry_delay_max_ms"),
    pytest.param(q(retry_delay_max_ms=10, retry_delay_ms=11), "queues.q.retry_delay_ms", id="a queue max below its delay"),
    pytest.param(g(retry_delay_ms=-1), "limits.retry_delay_ms", id="a negative retry_delay_ms"),
    pytest.param(g(retry_delay_max_ms=0, retry_delay_ms=0), "limits.retry_delay_max_ms", id="retry_delay_max_ms 0"),
    pytest.param(g(retry_backoff="linear"), "limits.retry_backoff", id="an unknown global retry_backoff"),
    pytest.param(q(retry_backoff="Exponential"), "queues.q.retry_backoff", id="retry_backoff is case-sensitive"),
    # max_payload_bytes <= max_message_bytes
    pytest.param(g(max_payload_bytes=16 * MIB + 1), "limits.max_payload_bytes", id="global max_payload_bytes above max_message_bytes"),
    pytest.param(lim(max_message_bytes=MIB - 1), "limits.max_payload_bytes", id="max_message_bytes below the default payload limit"),
    pytest.param(q(max_payload_bytes=16 * MIB + 1), "queues.q.max_payload_bytes", id="queue max_payload_bytes above max_message_bytes"),
    pytest.param(g(max_payload_bytes=-1), "limits.max_payload_bytes", id="a negative max_payload_bytes"),
    # default_priority 0-9
    pytest.param(g(default_priority=10), "limits.default_priority", id="global default_priority 10"),
    pytest.param(g(default_priority=-1), "limits.default_priority", id="global default_priority -1"),
    pytest.param(q(default_priority=10), "queues.q.default_priority", id="queue default_priority 10"),
    # queue names valid and within max_queue_name_bytes (1..65535)
    pytest.param(CoreConfig().with_queue(""), "queues..name", id="an empty queue name"),
    pytest.param(CoreConfig().with_queue("."), "queues...name", id="the queue name dot"),
    pytest.param(CoreConfig().with_queue(".."), "queues....name", id="the queue name dot dot"),
    pytest.param(CoreConfig().with_queue("a/b"), "queues.a/b.name", id="a queue name with a slash"),
    pytest.param(CoreConfig().with_queue("a\x01b"), "queues.a\x01b.name", id="a queue name with a control character"),
    pytest.param(CoreConfig().with_queue("a\x7f"), "queues.a\x7f.name", id="a queue name with DEL"),
    pytest.param(CoreConfig().with_queue("a\x85b"), "queues.a\x85b.name", id="a queue name with a C1 control character"),
    pytest.param(CoreConfig().with_queue("x" * 513), f"queues.{'x' * 513}.name", id="a queue name over the default 512 bytes"),
    pytest.param(CoreConfig(limits=Limits(max_queue_name_bytes=3)).with_queue("abcd"), "queues.abcd.name", id="a queue name over a lowered max_queue_name_bytes"),
    pytest.param(lim(max_queue_name_bytes=0), "limits.max_queue_name_bytes", id="max_queue_name_bytes 0"),
    pytest.param(lim(max_queue_name_bytes=65_536), "limits.max_queue_name_bytes", id="max_queue_name_bytes 65536"),
    # ranges of the other settings
    pytest.param(g(max_lease_duration_ms=0), "limits.max_lease_duration_ms", id="max_lease_duration_ms 0"),
    pytest.param(q(max_lease_duration_ms=0), "queues.q.max_lease_duration_ms", id="queue max_lease_duration_ms 0"),
    pytest.param(g(allowed_encodings=("json", "")), "limits.allowed_encodings", id="an empty allowed encoding"),
    pytest.param(q(allowed_job_types=("",)), "queues.q.allowed_job_types", id="an empty allowed job type"),
    pytest.param(g(max_schedule_horizon_ms=-1), "limits.max_schedule_horizon_ms", id="a negative horizon"),
    pytest.param(g(max_custom_entries=-1), "limits.max_custom_entries", id="negative max_custom_entries"),
    pytest.param(g(max_custom_total_bytes=-1), "limits.max_custom_total_bytes", id="negative max_custom_total_bytes"),
    pytest.param(g(max_custom_key_bytes=-1), "limits.max_custom_key_bytes", id="negative max_custom_key_bytes"),
    pytest.param(q(dedup_window_ms=-1), "queues.q.dedup_window_ms", id="a negative dedup window"),
    pytest.param(g(max_queue_depth=-1), "limits.max_queue_depth", id="a negative max_queue_depth"),
    pytest.param(CoreConfig(dead_letter_retention_ms=-1), "storage.dead_letter_retention_ms", id="a negative retention"),
    pytest.param(CoreConfig(sweep_limit=0), "storage.sweep_limit", id="sweep_limit 0"),
    pytest.param(lim(max_reserve_batch=0), "limits.max_reserve_batch", id="max_reserve_batch 0"),
    pytest.param(lim(max_reserve_queues=0), "limits.max_reserve_queues", id="max_reserve_queues 0"),
    pytest.param(lim(max_enqueue_batch=0), "limits.max_enqueue_batch", id="max_enqueue_batch 0"),
    pytest.param(lim(max_message_bytes=0), "limits.max_message_bytes", id="max_message_bytes 0"),
    pytest.param(lim(max_job_type_bytes=0), "limits.max_job_type_bytes", id="max_job_type_bytes 0"),
    pytest.param(lim(max_idempotency_key_bytes=0), "limits.max_idempotency_key_bytes", id="max_idempotency_key_bytes 0"),
    pytest.param(lim(max_wait_timeout_ms=-1), "limits.max_wait_timeout_ms", id="a negative max_wait_timeout_ms"),
    # One job must fit in one 64 MiB snapshot record (issue 13 §3).
    pytest.param(lim(max_message_bytes=64 * MIB), "limits.max_message_bytes", id="max_message_bytes of 64 MiB"),
    pytest.param(lim(max_message_bytes=60 * MIB, max_reason_bytes=2 * MIB), "limits.max_message_bytes", id="reasons that leave no room for a 60 MiB message"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "key"), INVALID_ROWS)
def test_an_invalid_setting_raises_config_error_naming_the_key(
    config: CoreConfig, key: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        validate_config(config)
    assert raised.value.key == key
    assert raised.value.problem
    assert str(raised.value).startswith(f"{key}: ")
    assert isinstance(raised.value, ValueError)


VALID_ROWS = [
    pytest.param(CoreConfig(), id="the defaults"),
    pytest.param(g(default_max_attempts=100), id="default_max_attempts equal to the ceiling"),
    pytest.param(q(max_attempts_ceiling=1, default_max_attempts=1), id="a queue ceiling of 1"),
    pytest.param(g(retry_delay_ms=3_600_000), id="retry_delay_ms equal to retry_delay_max_ms"),
    pytest.param(q(retry_backoff="exponential", retry_delay_ms=1, retry_delay_max_ms=1), id="exponential with the smallest delays"),
    pytest.param(g(max_payload_bytes=16 * MIB), id="max_payload_bytes equal to max_message_bytes"),
    pytest.param(g(max_payload_bytes=0), id="max_payload_bytes 0"),
    pytest.param(g(default_priority=9), id="default_priority 9"),
    pytest.param(q(default_priority=0), id="a queue default_priority 0"),
    pytest.param(lim(max_queue_name_bytes=1), id="max_queue_name_bytes 1"),
    pytest.param(lim(max_queue_name_bytes=65_535), id="max_queue_name_bytes 65535"),
    pytest.param(CoreConfig().with_queue("x" * 512), id="a queue name of 512 bytes"),
    pytest.param(CoreConfig().with_queue("emails.high-priority_2:é"), id="a queue name with dots and unicode"),
    pytest.param(g(allowed_encodings=()), id="an empty allowed_encodings list"),
    pytest.param(q(allowed_job_types=("email",), allowed_encodings=("json",)), id="allow-lists on a queue"),
    pytest.param(g(max_queue_depth=0), id="max_queue_depth 0"),
    pytest.param(g(max_schedule_horizon_ms=0, dedup_window_ms=0), id="a zero horizon and dedup window"),
    pytest.param(CoreConfig(dead_letter_retention_ms=604_800_000, sweep_limit=1, strict_queues=True), id="retention, a sweep limit of 1 and strict mode"),
    pytest.param(lim(max_message_bytes=SNAPSHOT_ROW_BYTES_MAX - 256 - 2 * 4096 - JOB_ROW_OVERHEAD_BYTES), id="the largest max_message_bytes whose jobs fit in a snapshot record"),
]  # fmt: skip


@pytest.mark.parametrize("config", VALID_ROWS)
def test_a_config_at_the_edge_of_every_rule_is_accepted(config: CoreConfig) -> None:
    validate_config(config)


def test_with_queue_merges_overrides_over_the_global_defaults() -> None:
    config = g(default_priority=3, retry_delay_ms=10).with_queue("q", retry_delay_ms=20)
    policy = config.policy("q")
    assert (policy.default_priority, policy.retry_delay_ms) == (3, 20)
    assert config.policy("undeclared") is config.defaults
    assert config.is_declared("q") and not config.is_declared("undeclared")


def test_the_snapshot_row_limit_is_the_format_record_limit_less_its_array_header() -> None:
    import msgpack

    from log_format import RECORD_BODY_BYTES_MAX

    header = msgpack.Packer().pack_array_header(2**32 - 1)
    assert RECORD_BODY_BYTES_MAX - len(header) == SNAPSHOT_ROW_BYTES_MAX
