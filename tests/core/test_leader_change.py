"""decide's ChangeLeader table (cluster mode, issue 19), one test per row."""

from __future__ import annotations

from sepp.core.commands import ChangeLeader
from sepp.core.config import CoreConfig
from sepp.core.decide import (
    LEADER_ADDRESS_BYTES_MAX,
    NODE_ID_BYTES_MAX,
    Decision,
    decide,
)
from sepp.core.events import LeaderChanged
from sepp.core.results import InvalidArgument, LeaderChangeResult
from sepp.core.state import State

NOW = 1_700_000_000_000


def run(**fields: object) -> object:
    command = ChangeLeader(**{"epoch": 2, "node_id": "n2", "address": "h:2", **fields})  # type: ignore[arg-type]
    return decide(State(CoreConfig()), command, NOW)


def test_row_an_epoch_that_is_not_an_int_of_at_least_1_is_invalid() -> None:
    for epoch in (0, -1, True, "2", None):
        assert isinstance(run(epoch=epoch), InvalidArgument), epoch


def test_row_a_node_id_empty_not_a_str_or_too_long_is_invalid() -> None:
    for node_id in ("", None, 7, "n" * (NODE_ID_BYTES_MAX + 1)):
        assert isinstance(run(node_id=node_id), InvalidArgument), node_id
    assert isinstance(run(node_id="n" * NODE_ID_BYTES_MAX), Decision)


def test_row_an_address_not_a_str_or_too_long_is_invalid() -> None:
    for address in (None, 7, "a" * (LEADER_ADDRESS_BYTES_MAX + 1)):
        assert isinstance(run(address=address), InvalidArgument), address


def test_row_otherwise_one_leader_changed_event_at_now() -> None:
    decision = run()
    assert isinstance(decision, Decision)
    assert decision.events == (LeaderChanged(epoch=2, node_id="n2", address="h:2"),)
    assert decision.time_ms == NOW
    assert decision.reply == LeaderChangeResult(epoch=2)
    assert decision.woken == frozenset()
