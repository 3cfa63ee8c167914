"""Structured logs: one JSON object per line with SEPP_LOGGING__FORMAT=json, one
line per connection problem and per storage event."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable
from typing import Any


def _lines(server: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log().splitlines() if line.strip()]


def test_json_logs_are_one_object_per_line_with_the_documented_fields(
    server_factory: Callable[..., Any],
) -> None:
    server = server_factory(env={"SEPP_LOGGING__FORMAT": "json"})
    from sepp import EnqueueRequest
    from sepp.client.sync import SyncSeppClient

    client = SyncSeppClient.connect(server.address)
    client.enqueue(EnqueueRequest("q", "t"))
    client.close()
    # A connection problem: a frame far over the limit.
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(struct.pack(">I", 2**31))
        sock.settimeout(10)
        while sock.recv(4096):
            pass
    assert server.stop() == 0
    lines = _lines(server)
    assert lines, "no log lines"
    for entry in lines:
        assert {"timestamp", "level", "target", "message"} <= set(entry)
        assert entry["timestamp"].endswith("Z")
    messages = [e["message"] for e in lines]
    assert any(m.startswith("recovered ") for m in messages)
    assert any(m.startswith("listening on ") for m in messages)
    problems = [e for e in lines if e["level"] == "warning" and "frame of" in e["message"]]
    assert len(problems) == 1 and problems[0]["target"] == "sepp.server"
    # Storage events: the final snapshot at shutdown.
    assert any(e["target"] == "sepp.storage" and "published" in e["message"] for e in lines)


def test_text_logs_by_default(server_factory: Callable[..., Any]) -> None:
    server = server_factory()
    assert server.stop() == 0
    text = server.log()
    assert "INFO" in text and "sepp.server: listening on" in text
