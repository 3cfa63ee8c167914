"""`python -m tools.cluster`: up prints the servers' URLs and records their PIDs;
down stops exactly those PIDs, never a process that merely reuses one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import cluster as local_cluster


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cluster", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_up_prints_three_client_urls_and_down_stops_exactly_those_pids(tmp_path: Path) -> None:
    try:
        local_cluster.nats_server_binary()
    except local_cluster.ClusterError as exc:
        pytest.skip(f"nats-server is not installed: {exc}")
    up = _run("up", "--dir", str(tmp_path))
    assert up.returncode == 0, up.stderr
    recorded = local_cluster.load_cluster(tmp_path)
    try:
        assert ",".join(recorded.urls()) in up.stdout.splitlines()
        assert len(recorded.servers) == 3
        assert all(s.alive() for s in recorded.servers)
        config = Path(recorded.servers[0].config_path).read_text()
        assert "sync_interval: always" in config
        # Each server sized for its share of the machine (same environment here).
        expected = f"GOMAXPROCS={local_cluster.nats_env()['GOMAXPROCS']}".encode()
        for server in recorded.servers:
            assert expected in Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        again = _run("up", "--dir", str(tmp_path))
        assert again.returncode == 1
        assert "running" in again.stderr
    finally:
        down = _run("down", "--dir", str(tmp_path))
    assert down.returncode == 0, down.stderr
    assert not any(s.alive() for s in local_cluster.load_cluster(tmp_path).servers)


def test_down_leaves_alone_a_recorded_pid_that_runs_something_else(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        fake = {
            "dir": str(tmp_path),
            "servers": [
                {
                    "name": "n1",
                    "client_port": 1,
                    "cluster_port": 2,
                    "monitor_port": 3,
                    "config_path": str(tmp_path / "n1" / "nats.conf"),
                    "log_path": str(tmp_path / "n1" / "nats.log"),
                    "pid": bystander.pid,
                }
            ],
        }
        (tmp_path / local_cluster.CLUSTER_FILE).write_text(json.dumps(fake))
        down = _run("down", "--dir", str(tmp_path))
        assert down.returncode == 0, down.stderr
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_down_without_a_recorded_cluster_says_so(tmp_path: Path) -> None:
    down = _run("down", "--dir", str(tmp_path))
    assert down.returncode == 1
    assert "no cluster recorded" in down.stderr


def _exited_child(tmp_path: Path, code: int) -> int:
    """A child of this process (spawned as the tool spawns servers) that has exited
    and is not reaped yet: a zombie."""
    pid = local_cluster._spawn(
        [sys.executable, "-c", f"raise SystemExit({code})"], str(tmp_path / "child.log")
    )
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # wait for the exit, leave it unreaped
    return pid


def test_stopping_a_server_that_already_exited_reaps_it(tmp_path: Path) -> None:
    # A server that died without a wait in the tool stayed a zombie with an unwaited
    # Popen: one "ResourceWarning: subprocess N is still running" per test session.
    pid = _exited_child(tmp_path, 3)
    server = local_cluster.NatsServer(
        name="n1", client_port=1, cluster_port=2, monitor_port=3,
        config_path=str(tmp_path / "nats.conf"), log_path=str(tmp_path / "child.log"), pid=pid,
    )  # fmt: skip
    local_cluster.stop_cluster(local_cluster.JetStreamCluster(dir=str(tmp_path), servers=[server]))
    assert pid not in local_cluster._children
    assert local_cluster.exit_codes[pid] == 3


def test_starting_a_process_reaps_those_that_exited_before(tmp_path: Path) -> None:
    pid = _exited_child(tmp_path, 4)
    again = local_cluster._spawn([sys.executable, "-c", "pass"], str(tmp_path / "again.log"))
    try:
        assert pid not in local_cluster._children
        assert local_cluster.exit_codes[pid] == 4
    finally:
        os.waitid(os.P_PID, again, os.WEXITED | os.WNOWAIT)
        local_cluster._reap_exited()
    assert again not in local_cluster._children


def test_each_local_server_gets_a_third_of_the_cores_unless_gomaxprocs_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    assert local_cluster.nats_env(2)["GOMAXPROCS"] == "1"
    assert local_cluster.nats_env(12)["GOMAXPROCS"] == "4"
    assert local_cluster.nats_env(1)["GOMAXPROCS"] == "1"
    monkeypatch.setenv("GOMAXPROCS", "7")
    assert local_cluster.nats_env(2)["GOMAXPROCS"] == "7"
    assert local_cluster.nats_env(2)["PATH"] == os.environ["PATH"]
