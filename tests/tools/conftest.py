"""Fixtures for the `sepp-log` tests: data directories written by the real storage
engine, built fresh for each test (they take milliseconds) in tmp_path."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.tools.helpers import LiveLog, random_log, scripted_log


@pytest.fixture
def scripted(tmp_path: Path) -> LiveLog:
    """The 40-record scripted history (tests/tools/helpers.py), engine closed:
    segments 1..12, 13..24, 25..40."""
    live = scripted_log(tmp_path / "data")
    live.close()
    return live


@pytest.fixture
def mixed(tmp_path: Path, rng: random.Random) -> LiveLog:
    """A seeded mixed workload of 400 commands with a snapshot every 60 and
    retention on: the log starts after seq 1, several snapshots, many segments."""
    live = random_log(tmp_path / "mixed", rng, commands=400, snapshot_every=60)
    live.close()
    return live
