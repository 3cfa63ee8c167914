"""Job ids in the core tests come from SEPP_SEED (ids break ties in the ready
order, so an unseeded id would make a run unrepeatable)."""

from __future__ import annotations

import uuid

import pytest

from tests.core.helpers import make_job, new_id, seed_ids


def test_a_tests_ids_are_drawn_from_the_seed_and_its_name(
    request: pytest.FixtureRequest, seed: int
) -> None:
    drawn = [new_id(), make_job().job_id, new_id()]
    seed_ids(f"{seed}:{request.node.nodeid}")
    assert [new_id(), make_job().job_id, new_id()] == drawn
    assert all(uuid.UUID(i).version == 4 for i in drawn)
    assert len(set(drawn)) == 3


def test_another_seed_draws_other_ids() -> None:
    seed_ids("1")
    one = [new_id() for _ in range(3)]
    seed_ids("2")
    assert [new_id() for _ in range(3)] != one
