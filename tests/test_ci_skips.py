"""tests/ci_skips.py: in CI (CI=true) a skip fails unless its reason is allowed;
outside CI a skip stays a skip. Driven through a real pytest run of a small
generated test file, with the plugin loaded by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_skips import ALLOWED_IN_CI, allowed_reason, in_ci

REPO = Path(__file__).resolve().parent.parent

SAMPLE = """
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="needs a thing CI has")
def test_skipped_by_mark():
    pass

def test_skipped_in_the_body():
    pytest.skip("needs another thing CI has")

def test_skipped_for_an_allowed_reason():
    pytest.skip("mounting a tmpfs needs root")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_to_fail():
    raise AssertionError
"""


def run_sample(tmp_path: Path, ci: str | None) -> dict[str, str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    plugins = ["-p", "tests.ci_skips", "-p", "no:cacheprovider"]
    where = ["--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, "-rA", "-q", *where],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes: dict[str, str] = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "XFAIL", "ERROR") and "::" in rest:
            name = rest.split("::", 1)[1].split(" ", 1)[0]
            outcomes[name] = word
        elif word == "SKIPPED" and "test_sample.py" in rest:
            # "SKIPPED [1] test_sample.py:7: reason" names no test: count them.
            outcomes[f"skip:{rest.rsplit(': ', 1)[-1]}"] = word
    outcomes["returncode"] = str(done.returncode)
    outcomes["output"] = done.stdout
    return outcomes


def test_in_ci_a_skip_fails_unless_its_reason_is_allowed(tmp_path: Path) -> None:
    outcomes = run_sample(tmp_path, "true")
    assert outcomes["test_runs"] == "PASSED"
    # A skip mark acts in the setup phase: its failure shows as an error.
    assert outcomes["test_skipped_by_mark"] == "ERROR"
    assert outcomes["test_skipped_in_the_body"] == "FAILED"
    assert outcomes["skip:mounting a tmpfs needs root"] == "SKIPPED"
    assert outcomes["test_expected_to_fail"] == "XFAIL"
    assert outcomes["returncode"] == "1"
    assert "skipped in CI (CI=true), which counts as a failure" in outcomes["output"]
    assert "needs another thing CI has" in outcomes["output"]


def test_outside_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    outcomes = run_sample(tmp_path, None)
    skipped = {k for k, v in outcomes.items() if v == "SKIPPED"}
    assert skipped == {
        "skip:needs a thing CI has",
        "skip:needs another thing CI has",
        "skip:mounting a tmpfs needs root",
    }
    assert outcomes["returncode"] == "0"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("True", True), ("1", True), ("", False), ("false", False), ("0", False)],
)
def test_ci_is_recognised_by_its_environment_variable(value: str, expected: bool) -> None:
    assert in_ci({"CI": value}) is expected


def test_every_allowed_reason_says_why() -> None:
    assert ALLOWED_IN_CI
    for pattern, why in ALLOWED_IN_CI.items():
        assert len(why) > 40, pattern
    assert allowed_reason("Skipped: mount not permitted here: permission denied")
    assert allowed_reason("Skipped: needs openssl") is None
    assert allowed_reason("Skipped: SEPP_EXPECT_BUILD not set") is None
