"""The operator commands of `sepp` (info, stats, enqueue, dead-letters drain)
against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any


def sepp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sepp.server.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_enqueue_stats_and_dedup_through_the_cli(server_factory: Callable[..., Any]) -> None:
    server = server_factory()
    first = sepp(
        "enqueue",
        "emails",
        "send",
        "--payload",
        '{"to": 1}',
        "--priority",
        "7",
        "--key",
        "k1",
        "--addr",
        server.address,
        "--json",
    )
    assert first.returncode == 0, first.stderr
    ack = json.loads(first.stdout)
    again = json.loads(
        sepp(
            "enqueue",
            "emails",
            "send",
            "--payload",
            "x",
            "--key",
            "k1",
            "--addr",
            server.address,
            "--json",
        ).stdout
    )
    assert again == {"job_id": ack["job_id"], "deduplicated": True}
    stats = json.loads(sepp("stats", "--addr", server.address, "--json").stdout)
    assert [(s["name"], s["ready"], s["scheduled"]) for s in stats] == [("emails", 1, 0)]
    human = sepp("stats", "--addr", server.address)
    assert "emails" in human.stdout and human.returncode == 0


def test_delayed_enqueue_lands_scheduled(server_factory: Callable[..., Any]) -> None:
    server = server_factory()
    assert (
        sepp("enqueue", "later", "t", "--delay", "3600", "--addr", server.address).returncode == 0
    )
    stats = json.loads(sepp("stats", "later", "--addr", server.address, "--json").stdout)
    assert stats[0]["scheduled"] == 1 and stats[0]["ready"] == 0


def test_info_reports_the_servers_settings(server_factory: Callable[..., Any]) -> None:
    server = server_factory(env={"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "60000"})
    info = json.loads(sepp("info", "--addr", server.address, "--json").stdout)
    assert info["version"] and info["dead_letter_retention_enabled"] is True
    assert info["max_enqueue_batch"] == 256


def test_drain_prints_and_removes_dead_letters(server_factory: Callable[..., Any]) -> None:
    server = server_factory(env={"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "60000"})
    # max_attempts 1 and a 1 ms lease: the sweep dead-letters it (lease_expired).
    from datetime import timedelta

    from sepp import EnqueueRequest, ReserveOptions
    from sepp.client.sync import SyncSeppClient

    client = SyncSeppClient.connect(server.address)
    try:
        client.enqueue(EnqueueRequest("q", "t", max_attempts=1))
        jobs = client.reserve(ReserveOptions(["q"], timedelta(milliseconds=1)))
        assert jobs
        # Poll with a deadline (a count of polls would depend on how fast they run).
        deadline = time.monotonic() + 30
        while client.queue_stats(["q"])[0].dead_lettered != 1:
            assert time.monotonic() < deadline, "the lease never expired"
    finally:
        client.close()
    drained = sepp("dead-letters", "drain", "--addr", server.address, "--json")
    assert drained.returncode == 0, drained.stderr
    records = json.loads(drained.stdout)
    assert [(r["queue"], r["cause"], r["final_attempt"]) for r in records] == [
        ("q", "lease_expired", 1)
    ]
    assert (
        json.loads(sepp("dead-letters", "drain", "--addr", server.address, "--json").stdout) == []
    )


def test_an_unreachable_server_exits_1_with_a_message() -> None:
    result = sepp("info", "--addr", "127.0.0.1:1")
    assert result.returncode == 1
    assert "127.0.0.1:1" in result.stderr


def test_a_wrong_api_key_exits_1(server_factory: Callable[..., Any]) -> None:
    server = server_factory(env={"SEPP_AUTH__API_KEYS": '[{name = "a", key = "s3cret"}]'})
    assert sepp("info", "--addr", server.address, "--api-key", "nope").returncode == 1
    assert sepp("info", "--addr", server.address, "--api-key", "s3cret").returncode == 0
