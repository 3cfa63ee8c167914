"""The test-only fault hook of the server (`sepp/server/faults.py`): inert without
its variable, exact about which hit kills, and loud about a malformed value."""

from __future__ import annotations

import signal

import pytest

from sepp.server import faults


def test_without_the_variable_there_is_no_hook() -> None:
    assert faults.crash_hook_from_env({}) is None
    assert faults.crash_hook_from_env({faults.ENV_CRASH_AT: "  "}) is None


def test_the_hook_kills_at_exactly_the_nth_hit_of_its_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    hook = faults.crash_hook_from_env(
        {faults.ENV_CRASH_AT: "wal.after_write:3,snapshot.published:1"}
    )
    assert hook is not None
    for _ in range(2):
        hook("wal.after_write")
        hook("wal.after_sync")
    assert kills == []
    hook("wal.after_write")
    assert [sig for _pid, sig in kills] == [signal.SIGKILL]
    hook("snapshot.published")
    assert len(kills) == 2


@pytest.mark.parametrize("value", ["wal.after_write", "wal.after_write:0", ":3", "x:y", "a:1,b"])
def test_a_malformed_value_is_an_error_not_a_silent_no_op(value: str) -> None:
    with pytest.raises(ValueError, match="SEPP_FAULT_CRASH_AT"):
        faults.crash_hook_from_env({faults.ENV_CRASH_AT: value})


def test_hook_points_lists_exactly_the_points_storage_calls() -> None:
    """The harness and the simulation crash at each of HOOK_POINTS; a point added
    to storage without being listed would never be tested."""
    import re
    from pathlib import Path

    from sepp.storage import HOOK_POINTS

    storage = Path(__file__).resolve().parents[2] / "sepp" / "storage"
    called = set()
    for path in storage.glob("*.py"):
        called |= set(re.findall(r'_hook\("([a-z_.]+)"\)', path.read_text()))
    assert called == set(HOOK_POINTS)
    assert len(HOOK_POINTS) == len(set(HOOK_POINTS))
