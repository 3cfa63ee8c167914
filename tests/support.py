"""Helpers shared by test packages that have no conftest in common: waiting with a
deadline, a self-signed TLS certificate and a transport that keeps its writes."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sepp.protocol.framing import FRAME_BYTES_CEILING, FrameReader

# How long one answer may take. Generous: the machine is shared and slow at times;
# a test only waits this long when something is already broken.
ANSWER_TIMEOUT_S = 15.0


async def wait_until(
    predicate: Callable[[], Any], timeout: float = ANSWER_TIMEOUT_S, what: str = "condition"
) -> Any:
    """Poll `predicate` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def self_signed_certificate(cert: Path, key: Path) -> tuple[Path, Path]:
    """Write a self-signed certificate for 127.0.0.1 and localhost (needs openssl):
    (cert, key)."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


class RecordedWrites:
    """Stands in for an asyncio transport: passes everything through and keeps
    the bytes of each `write` or `writelines` call, in order, to show how answers
    or requests were grouped into system calls (`lines`: the parts each
    `writelines` call was given, the objects themselves)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.writes: list[bytes] = []
        self.lines: list[list[bytes]] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        parts = list(parts)
        self.lines.append(parts)
        self.writes.append(b"".join(parts))
        self._transport.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def frames(self) -> list[list[bytes]]:
        """The frames of each write (every write must carry whole frames)."""
        grouped = []
        for data in self.writes:
            reader = FrameReader(FRAME_BYTES_CEILING)
            grouped.append(reader.feed(data))
            assert not reader.buffered, "a write ended inside a frame"
        return grouped


def record_server_writes(server: Any) -> RecordedWrites:
    """Put a `RecordedWrites` between an in-process server and its one client."""
    (conn,) = server.connections
    recorded = RecordedWrites(conn.transport)
    conn.transport = recorded
    return recorded


def record_client_writes(client: Any) -> RecordedWrites:
    """Put a `RecordedWrites` between a connected `SeppClient` and its socket."""
    connection = client._connection
    assert connection is not None
    recorded = RecordedWrites(connection._transport)
    connection._transport = recorded
    return recorded
