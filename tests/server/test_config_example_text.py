"""What `sepp config example` says about [[queues]] and retries is true (issue 12,
section 5): every [limits] key it names as per-queue is accepted in a [[queues]]
table and reaches that queue, every key it names as global-only is refused there
with a message saying so, and it states the retry defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sepp.core.config import ConfigError
from sepp.server.config import SCHEMA, _toml_value, example_config, load_config

LIMITS = SCHEMA["limits"]


def _prose() -> str:
    """The closing comment of the example, as one line of text."""
    text = example_config()
    tail = text[text.index("# Declared queues") :]
    return " ".join(line.lstrip("# ").strip() for line in tail.splitlines())


def _names(after: str, until: str) -> list[str]:
    prose = _prose()
    start = prose.index(after) + len(after)
    listed = prose[start : prose.index(until, start)]
    return [name.strip() for name in listed.split(",") if name.strip()]


PER_QUEUE = _names("keys for one queue:", ";")
GLOBAL_ONLY = _names("are global only:", ".")


def _value(name: str) -> object:
    key = LIMITS[name]
    if key.default is not None:
        return key.default
    if key.kind == "opt_rate_limit":
        return {"jobs": 7, "per_ms": 7}
    return ["application/json"] if key.kind == "opt_str_list" else 7


def test_the_example_names_every_limits_key_once_as_per_queue_or_global() -> None:
    assert sorted(PER_QUEUE + GLOBAL_ONLY) == sorted(LIMITS)
    assert "max_reserve_batch" in GLOBAL_ONLY


@pytest.mark.parametrize("name", PER_QUEUE)
def test_a_key_the_example_calls_per_queue_is_accepted_in_a_queues_table(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "sepp.toml"
    value = _value(name)
    path.write_text(f'[[queues]]\nname = "emails"\n{name} = {_toml_value(value)}\n')
    config = load_config(str(path), env={})
    policy = config.core_config().policy("emails")
    if name == "rate_limit":  # one table in the file, two fields in the policy
        assert {"jobs": policy.rate_limit_jobs, "per_ms": policy.rate_limit_per_ms} == value
        return
    got = getattr(policy, name)
    assert (list(got) if isinstance(got, tuple) else got) == value


@pytest.mark.parametrize("name", GLOBAL_ONLY)
def test_a_key_the_example_calls_global_is_refused_per_queue_saying_so(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / "sepp.toml"
    path.write_text(f'[[queues]]\nname = "emails"\n{name} = {_toml_value(LIMITS[name].default)}\n')
    with pytest.raises(ConfigError, match=rf"queues\.emails\.{name}.*cannot be set per queue"):
        load_config(str(path), env={})


def test_the_example_states_the_retry_defaults_and_the_jitter() -> None:
    prose = _prose()
    assert re.search(r"retried at once by default \(retry_delay_ms = 0\)", prose)
    assert "After default_max_attempts (3) attempts the job is dead-lettered" in prose
    assert "dead letters are dropped unless storage.dead_letter_retention_ms is set" in prose
    assert "jitter of up to a quarter" in prose
