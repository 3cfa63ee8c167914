"""The operator commands of `sepp` (info, stats, enqueue, dead-letters drain)
against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def sepp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sepp.server.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
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
    # JSON lines, one record each (test_operator_admin_cli.py tests the drain).
    records = [json.loads(line) for line in drained.stdout.splitlines()]
    assert [(r["queue"], r["dead_letter_cause"], r["final_attempt"]) for r in records] == [
        ("q", "lease_expired", 1)
    ]
    assert sepp("dead-letters", "drain", "--addr", server.address, "--json").stdout == ""


def test_an_unreachable_server_exits_1_with_a_message() -> None:
    result = sepp("info", "--addr", "127.0.0.1:1")
    assert result.returncode == 1
    assert "127.0.0.1:1" in result.stderr


def test_a_wrong_api_key_exits_1(server_factory: Callable[..., Any]) -> None:
    server = server_factory(env={"SEPP_AUTH__API_KEYS": '[{name = "a", key = "s3cret"}]'})
    assert sepp("info", "--addr", server.address, "--api-key", "nope").returncode == 1
    assert sepp("info", "--addr", server.address, "--api-key", "s3cret").returncode == 0


def test_the_api_key_can_come_from_a_file_instead_of_the_command_line(
    server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    # `--api-key KEY` shows the key to every user in the process list (issue 13 §6).
    server = server_factory(env={"SEPP_AUTH__API_KEYS": '[{name = "a", key = "s3cret"}]'})
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("s3cret\n")
    bad.write_text("nope\n")
    assert sepp("info", "--addr", server.address, "--api-key-file", str(good)).returncode == 0
    assert sepp("info", "--addr", server.address, "--api-key-file", str(bad)).returncode == 1
    from_env = sepp("info", "--addr", server.address, env={"SEPP_API_KEY_FILE": str(good)})
    assert from_env.returncode == 0, from_env.stderr
    # A flag beats the environment.
    flag = sepp("info", "--addr", server.address, "--api-key-file", str(good),
                env={"SEPP_API_KEY": "nope"})  # fmt: skip
    assert flag.returncode == 0, flag.stderr


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["--api-key-file", "{missing}"], {}, 1, "cannot read {missing}: No such file"),
        (["--api-key-file", "{empty}"], {}, 2, "{empty} holds no key"),
        (["--api-key", "k", "--api-key-file", "{empty}"], {}, 2, "not both"),
        ([], {"SEPP_API_KEY": "k", "SEPP_API_KEY_FILE": "{empty}"}, 2, "not both"),
    ],
    ids=["missing file", "empty file", "both flags", "both variables"],
)
def test_an_api_key_file_that_cannot_be_used_is_one_line_and_no_connection(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: dict[str, str],
    code: int,
    message: str,
) -> None:
    from sepp.server.cli import main

    names = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    (tmp_path / "empty").write_text("\n")
    monkeypatch.delenv("SEPP_API_KEY", raising=False)
    monkeypatch.delenv("SEPP_API_KEY_FILE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(**names))
    # Port 1: nothing listens there, so reaching the server would be exit 1 too;
    # the message shows the command stopped at the key.
    argv = ["info", "--addr", "127.0.0.1:1", *(a.format(**names) for a in args)]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message.format(**names) in err
    assert "cannot reach" not in err
