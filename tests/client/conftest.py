"""Fixtures of the client tests, and a runner for ``async def`` tests.

The repository has no asyncio pytest plugin, so `pytest_pyfunc_call` below runs
coroutine tests in this directory with `asyncio.run`, under a hard timeout so a
hang fails the test instead of the run. Everything the test awaits happens on
that one loop: the fake server, the client and the worker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import pytest

from tests.client.fakeserver import FakeServer

TEST_TIMEOUT_S = 15.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    function = pyfuncitem.obj
    if not inspect.iscoroutinefunction(function):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def main() -> Any:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            return await function(**kwargs)

    asyncio.run(main())
    return True


@pytest.fixture
def fake() -> FakeServer:
    """A fake server, not yet listening: ``async with fake: ...``."""
    return FakeServer()


@pytest.fixture(autouse=True)
def _client_debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sepp.client")
