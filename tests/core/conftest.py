"""The core tests' job ids come from the run's seed (tests/core/helpers.py)."""

from __future__ import annotations

import pytest

from tests.core import helpers


@pytest.fixture(autouse=True)
def _seeded_job_ids(request: pytest.FixtureRequest, seed: int) -> None:
    """Each test draws its own id stream from SEPP_SEED and its id, so it replays
    alone or in the whole run alike."""
    helpers.seed_ids(f"{seed}:{request.node.nodeid}")
