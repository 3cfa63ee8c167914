"""Shared test settings: one seed for every randomized test.

`SEPP_SEED=1234 pytest ...` replays a run; without it a fresh seed is drawn and
printed in the report header, so any failure can be reproduced with one command.
Hypothesis is forced to the same seed; its example database is off so a run
depends on nothing but the seed and the code.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, settings

SEED = int(os.environ.get("SEPP_SEED") or random.SystemRandom().randrange(2**32))

settings.register_profile(
    "sepp",
    deadline=None,  # shared, noisy machines: speed is checked by benchmarks, not tests
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("sepp")


def pytest_report_header(config: pytest.Config) -> str:
    return f"SEPP_SEED={SEED} (replay with: SEPP_SEED={SEED} pytest ...)"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import core

    if config.getoption("hypothesis_seed", None) is None:
        core.global_force_seed = SEED  # type: ignore[attr-defined]


@pytest.fixture
def seed() -> int:
    return SEED


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A Random seeded from SEPP_SEED and the test's name, so each test draws its
    own stream and the whole run replays from one number."""
    return random.Random(f"{SEED}:{request.node.nodeid}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and report.when == "call":
        report.sections.append(("seed", f"replay with SEPP_SEED={SEED}"))
