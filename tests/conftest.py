"""Shared test settings: one seed for every randomized test.

`SEPP_SEED=1234 pytest ...` replays a run; without it a fresh seed is drawn and
printed in the report header, so any failure can be reproduced with one command.
Hypothesis is forced to the same seed; its example database is off so a run
depends on nothing but the seed and the code.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# In CI (CI=true) a skip fails unless its reason is on tests/ci_skips.py's list.
from tests.ci_skips import pytest_runtest_makereport  # noqa: F401 - a pytest hook

SEED = int(os.environ.get("SEPP_SEED") or random.SystemRandom().randrange(2**32))

settings.register_profile(
    "sepp",
    deadline=None,  # shared, noisy machines: speed is checked by benchmarks, not tests
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("sepp")


def pytest_report_header(config: pytest.Config) -> str:
    return f"SEPP_SEED={SEED} (replay with: SEPP_SEED={SEED} pytest ...)"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import core

    if config.getoption("hypothesis_seed", None) is None:
        core.global_force_seed = SEED  # type: ignore[attr-defined]


@pytest.fixture
def in_process_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For a server run in process (tests/inprocess.py): run where there is no
    ./sepp.toml (load_config reads it when present), and put back the process-wide
    GC tuning SeppServer.start applies."""
    import gc

    monkeypatch.chdir(tmp_path)
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.fixture
def seed() -> int:
    return SEED


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A Random seeded from SEPP_SEED and the test's name, so each test draws its
    own stream and the whole run replays from one number."""
    return random.Random(f"{SEED}:{request.node.nodeid}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and report.when == "call":
        report.sections.append(("seed", f"replay with SEPP_SEED={SEED}"))


# -- a real `sepp serve` process ----------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    """A `sepp serve` child process on 127.0.0.1:0. Started and stopped by PID;
    its stderr (the log) is kept in a file for failure reports."""

    def __init__(
        self,
        data_dir: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env
        self.log_path = log_path or data_dir.parent / f"{data_dir.name}-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        env = dict(os.environ)
        env.pop("SEPP_CONFIG", None)
        # No admin listener unless the test asks for one (--admin-listen wins over
        # the environment): its default port 9465 is one per machine.
        env.setdefault("SEPP_ADMIN__LISTEN_ADDR", "off")
        env.update(self.env or {})
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sepp.server.cli",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(self.data_dir),
                *self.args,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            cwd=str(self.data_dir.parent),
        )
        log.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError(f"server did not start; log:\n{self.log()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    continue
                line += chunk
        text = line.decode().strip()
        if not text.startswith("sepp listening on "):
            self.kill()
            raise RuntimeError(f"unexpected first line {text!r}; log:\n{self.log()}")
        self.host, _, port = text.removeprefix("sepp listening on ").rpartition(":")
        self.port = int(port)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._close_pipes()
        return code

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start real servers: `server_factory(args=[...], env={...}, data_dir=...)`.
    Every server still running at the end of the test is killed by PID."""
    started: list[ServerProcess] = []

    def factory(
        args: Sequence[str] = (), env: dict[str, str] | None = None, data_dir: Path | None = None
    ) -> ServerProcess:
        server = ServerProcess(data_dir or tmp_path / f"data{len(started)}", args, env)
        started.append(server)
        return server.start()

    yield factory
    for server in started:
        server.kill()


@pytest.fixture
def sepp_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory()
