"""In CI a skip is a failure, except for the few listed here with their reason.

A skipped test is green, so a test that skips where it could run hides exactly
what it was written to catch: a broken import, AIO missing (the default sync path
of a production server untested), uvloop missing (the default event loop), no
openssl (TLS untested). With `CI` set to true in the environment (CI services set
it; `.ci/run` sets it too) every skip whose reason is not matched by
`ALLOWED_IN_CI` is reported as a failure naming the reason. Outside CI a skip
stays a skip: a developer's machine may lack what CI has.

An entry belongs on the list only when CI's own machine may legitimately be
unable to run the test (not merely slow or unconfigured), and the reason says
what covers the same promise elsewhere.

Loaded by tests/conftest.py (its hook is re-exported there); also usable as a
plugin on its own (`-p tests.ci_skips`), which is how its own test drives it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Mapping

import pytest

# Reason (a regular expression, searched in the skip message) -> why CI may skip it.
ALLOWED_IN_CI: dict[str, str] = {
    r"mounting a (size-limited file system|tmpfs) needs root": (
        "a real size-limited mount needs root, which a CI runner need not grant; "
        "the same full-disk faults run through FaultyFileSystem in every pass"
    ),
    r"mount not permitted here": (
        "the runner forbids mounts even to root (an unprivileged container); "
        "FaultyFileSystem covers the same faults"
    ),
    r"cannot make an ext4 image": (
        "mkfs.ext4 is not part of every runner image; the tmpfs variant and "
        "FaultyFileSystem cover the same faults"
    ),
}


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """CI services set CI=true (GitHub Actions, GitLab, most others)."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in ("true", "1", "yes")


def allowed_reason(message: str) -> str | None:
    """Why a skip with this message may stay a skip in CI, or None."""
    for pattern, why in ALLOWED_IN_CI.items():
        if re.search(pattern, message):
            return why
    return None


def _skip_message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return
    message = _skip_message(report)
    if allowed_reason(message) is not None:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in CI (CI=true), which counts as a failure: {message}\n"
        "CI's machine can run this test: install what it needs, or, if a runner "
        "legitimately cannot, add its reason to ALLOWED_IN_CI in tests/ci_skips.py."
    )
