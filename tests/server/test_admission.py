"""Admission without sockets (issue 13 §2, §5, §6): the decision table, one test per
row; the descriptor bound; raising RLIMIT_NOFILE at startup; the parked-reserve
wait list; the rate-limited warnings."""

from __future__ import annotations

import logging

import pytest

from sepp.server import admission
from sepp.server.admission import (
    ADMIT,
    ADMIT_EVICTING_OLDEST,
    REFUSE_CONNECTIONS,
    REFUSE_DESCRIPTORS,
    REFUSE_SHUTTING_DOWN,
    STORAGE_DESCRIPTORS_PEAK,
    RateLimitedLog,
    WaitList,
    admit,
    connections_for_descriptors,
    raise_descriptor_limit,
)
from sepp.server.config import SCHEMA

resource = pytest.importorskip("resource")


def decide(**fields: object) -> str:
    values: dict[str, object] = {
        "stopping": False,
        "connections": 10,
        "unauthenticated": 2,
        "max_connections": 100,
        "max_unauthenticated": 8,
        "descriptor_connections": 1000,
    }
    values.update(fields)
    return admit(**values)  # type: ignore[arg-type]


# -- the decision table, one test per row -------------------------------------------


def test_row1_a_stopping_server_refuses_every_connection():
    assert decide(stopping=True) == REFUSE_SHUTTING_DOWN
    assert decide(stopping=True, connections=0, unauthenticated=0) == REFUSE_SHUTTING_DOWN


def test_row2_below_every_cap_a_connection_is_admitted():
    assert decide() == ADMIT
    assert decide(connections=99, unauthenticated=7) == ADMIT


def test_row3_a_full_unauthenticated_cap_admits_and_closes_the_oldest_unauthenticated():
    assert decide(unauthenticated=8) == ADMIT_EVICTING_OLDEST
    assert decide(unauthenticated=9) == ADMIT_EVICTING_OLDEST


def test_row4_a_full_connection_cap_with_unauthenticated_connections_closes_the_oldest():
    assert decide(connections=100, unauthenticated=1) == ADMIT_EVICTING_OLDEST
    assert decide(connections=5, unauthenticated=1, descriptor_connections=5) == (
        ADMIT_EVICTING_OLDEST
    )


def test_row5_a_full_descriptor_bound_with_every_connection_authenticated_refuses():
    # A small configured limit: 2 connections fit beside the reserve.
    bound = connections_for_descriptors(soft_limit=100, open_now=34, reserved=64)
    assert bound == 2
    assert decide(connections=1, unauthenticated=0, descriptor_connections=bound) == ADMIT
    assert decide(connections=2, unauthenticated=0, descriptor_connections=bound) == (
        REFUSE_DESCRIPTORS
    )


def test_row6_a_full_connection_cap_with_every_connection_authenticated_refuses():
    assert decide(connections=100, unauthenticated=0) == REFUSE_CONNECTIONS


# -- the descriptor bound ---------------------------------------------------------


def test_the_descriptor_bound_keeps_the_reserve_free_and_is_never_negative():
    assert connections_for_descriptors(1024, 40, 64) == 1024 - 40 - 64
    assert connections_for_descriptors(100, 40, 64) == 0
    assert connections_for_descriptors(None, 40, 64) >= 2**62
    assert connections_for_descriptors(1024, None, 64) >= 2**62


def test_the_reserve_default_covers_what_storage_needs_at_once():
    key = SCHEMA["server"]["descriptors_reserved"]
    assert key.minimum == STORAGE_DESCRIPTORS_PEAK
    assert key.default >= STORAGE_DESCRIPTORS_PEAK


def test_open_descriptors_counts_a_descriptor_opened_here(tmp_path):
    before = admission.open_descriptors()
    if before is None:
        pytest.skip("this OS lists no open descriptors")
    with open(tmp_path / "f", "wb"):
        assert admission.open_descriptors() == before + 1


# -- raising RLIMIT_NOFILE at startup ------------------------------------------------


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse
        self.calls: list[tuple[int, int]] = []

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        self.calls.append(limits)
        if self.refuse:
            raise ValueError("not allowed")
        self.soft, self.hard = limits


def test_the_soft_descriptor_limit_is_raised_to_the_hard_limit():
    limits = FakeLimits(1024, 524288)
    result = raise_descriptor_limit(limits.get, limits.set)
    assert limits.calls == [(524288, 524288)]
    assert (result.soft_before, result.soft, result.hard) == (1024, 524288, 524288)
    assert result.describe() == (
        "descriptor limit: raised soft RLIMIT_NOFILE from 1024 to 524288 (hard 524288)"
    )


def test_an_unlimited_hard_limit_raises_the_soft_limit_to_the_kernels_usual_ceiling():
    limits = FakeLimits(1024, resource.RLIM_INFINITY)
    result = raise_descriptor_limit(limits.get, limits.set)
    assert limits.calls == [(admission.DESCRIPTORS_TARGET_UNLIMITED, resource.RLIM_INFINITY)]
    assert result.soft == admission.DESCRIPTORS_TARGET_UNLIMITED


def test_a_soft_limit_already_at_the_hard_limit_is_left_alone():
    limits = FakeLimits(4096, 4096)
    result = raise_descriptor_limit(limits.get, limits.set)
    assert limits.calls == []
    assert result.describe() == "descriptor limit: soft RLIMIT_NOFILE 4096 (hard 4096)"


def test_a_refused_raise_keeps_the_soft_limit_and_says_why():
    limits = FakeLimits(1024, 4096, refuse=True)
    result = raise_descriptor_limit(limits.get, limits.set)
    assert (result.soft, result.error) == (1024, "not allowed")
    assert "raising it failed: not allowed" in result.describe()


# -- the parked-reserve wait list ------------------------------------------------------


class Counted:
    """An item that counts how often it is compared by equality: a list scan
    compares every item it passes; a hash lookup finds the item by identity."""

    comparisons = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:
        Counted.comparisons += 1
        return self is other

    __hash__ = object.__hash__


def test_removing_from_the_wait_list_keeps_the_order_of_the_rest():
    waiters: WaitList[int] = WaitList()
    for n in range(10):
        waiters.append(n)
    for n in (0, 5, 9, 3):
        waiters.remove(n)
    waiters.remove(42)  # absent: nothing happens
    assert list(waiters) == [1, 2, 4, 6, 7, 8]
    assert waiters.first() == 1
    waiters.append(0)
    assert list(waiters) == [1, 2, 4, 6, 7, 8, 0]
    assert len(waiters) == 7


def test_removing_any_waiter_compares_no_other_waiter():
    items = [Counted(n) for n in range(10_000)]
    waiters: WaitList[Counted] = WaitList()
    for item in items:
        waiters.append(item)
    Counted.comparisons = 0
    for item in reversed(items[1:]):  # the worst case for a scan: from the far end
        waiters.remove(item)
    assert Counted.comparisons == 0
    assert waiters.first() is items[0]
    assert len(waiters) == 1


def test_an_empty_wait_list_is_false_and_has_no_first():
    waiters: WaitList[int] = WaitList()
    assert not waiters
    with pytest.raises(IndexError):
        waiters.first()


# -- rate-limited warnings -----------------------------------------------------------


def test_a_warning_kind_is_logged_once_per_interval_and_says_how_many_were_held_back(caplog):
    now = [100.0]
    logger = logging.getLogger("sepp.tests.ratelimit")
    warn = RateLimitedLog(logger, interval_s=1.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="sepp.tests.ratelimit"):
        assert warn.warning("hello_failed", "closing %s", "a") is True
        for _ in range(50):
            assert warn.warning("hello_failed", "closing %s", "b") is False
        # Another kind has its own budget.
        assert warn.warning("no_hello", "no hello from %s", "c") is True
        now[0] += 1.0
        assert warn.warning("hello_failed", "closing %s", "d") is True
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "closing a",
        "no hello from c",
        "closing d (50 similar line(s) held back in the last 1s)",
    ]
