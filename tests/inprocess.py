"""A SeppServer run inside the test's own event loop, on the fake file system.

For tests that need what only the server's own state shows (its parked reserves,
its storage failing through the seam, its descriptor accounting). Modules that use
it also use the ``in_process_env`` fixture (tests/conftest.py): it runs the test
where no ./sepp.toml can be read and puts back the process-wide GC tuning that
``SeppServer.start`` applies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from sepp.server.config import ServerConfig, load_config
from sepp.server.server import SeppServer
from sepp.storage.faultfs import FaultyFileSystem

DATA_DIR = "/sepp-data"
STOP_TIMEOUT_S = 30


def in_process_config(**env: str) -> ServerConfig:
    """The defaults on 127.0.0.1:0 and DATA_DIR; `env` as SEPP_* variables
    (``storage__persist_mode="buffer"`` is ``SEPP_STORAGE__PERSIST_MODE``)."""
    environment = {f"SEPP_{name.upper()}": value for name, value in env.items()}
    # No admin listener unless asked for (admin__listen_addr="127.0.0.1:0").
    environment.setdefault("SEPP_ADMIN__LISTEN_ADDR", "off")
    return load_config(
        None,
        env=environment,
        overrides={("server", "data_dir"): DATA_DIR, ("server", "listen_addr"): "127.0.0.1:0"},
    )


@contextlib.asynccontextmanager
async def in_process(
    config: ServerConfig, fs: FaultyFileSystem | None = None
) -> AsyncIterator[SeppServer]:
    """A started server, shut down (unless the test already stopped it) on exit."""
    server = SeppServer(config, fs=FaultyFileSystem() if fs is None else fs)
    await server.start()
    try:
        yield server
    finally:
        if not server.stopping:
            await server.shutdown()
        await asyncio.wait_for(server.wait_stopped(), STOP_TIMEOUT_S)


def address_of(server: SeppServer) -> str:
    assert server.address is not None
    return f"{server.address[0]}:{server.address[1]}"
