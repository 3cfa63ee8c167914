"""Helpers for the gRPC front's tests: a server (in process, or a real `sepp serve`
with --grpc-listen), channels and stubs built from our own generated messages, the
official client's virtual environment, and the switch for the long keepalive test.

`async def` tests in this folder run on a fresh event loop (`asyncio.run`) under a
hard timeout, like tests/server. Waiting is "poll with a deadline" or "wait for an
event", never a fixed sleep (the keepalive test idles on purpose: idling is what
it tests).

The official client (sepp-py 0.1.0 from PyPI) imports as `sepp` too, so it lives
in a virtual environment of its own, `.venv-official` at the repository root
(SEPP_OFFICIAL_VENV names another), created on first use and reused after
(`official_client`).

SEPP_GRPC_LONG_TESTS=0 deselects the tests marked `grpc_long` (the keepalive test,
whose probe idles 170 s): .ci/run sets it for its second pass, so they run once
per CI run, in the first pass. Deselected, not skipped: a skip in CI is a failure.
The keepalive probe (keepalive_probe.py) is a child process started at collection
when its test is selected: it idles while the other tests run, so the run waits
for it only if the suite is shorter than its idle time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="the gRPC front needs the extra sepp[grpc]")

import grpc
import grpc.aio

from sepp.grpc.front import SERVICE_NAME
from sepp.grpc.v1 import queue_pb2 as pb
from sepp.server.server import SeppServer
from tests.ci_skips import in_ci
from tests.conftest import REPO_ROOT, ServerProcess
from tests.inprocess import in_process, in_process_config

TEST_TIMEOUT_S = 240.0
LONG_TESTS_ENV = "SEPP_GRPC_LONG_TESTS"

# The official client's channel options (sepp-py 0.1.0, client.py _CHANNEL_OPTIONS).
OFFICIAL_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


# -- running async tests, the long-test switch ------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"grpc_long: runs over a minute; deselected when {LONG_TESTS_ENV}=0 "
        "(.ci/run's second pass)",
    )
    config.addinivalue_line(
        "markers",
        "keepalive_probe: reads the keepalive probe started at collection (conftest)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long = [item for item in items if item.get_closest_marker("grpc_long") is not None]
    if long and os.environ.get(LONG_TESTS_ENV, "1") == "0":
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if item.get_closest_marker("grpc_long") is None]
        return
    if any(item.get_closest_marker("keepalive_probe") is not None for item in items):
        start_keepalive_probe()


# -- the keepalive probe: idles in a child process while the other tests run ---------------

# Over the official client's 30 s ping interval the gRPC core's default policy (pings
# without calls refused while idle, 2 strikes) drops the connection with GOAWAY
# "too_many_pings" after ~150 s idle (measured with grpcio 1.85); 170 s catches it.
KEEPALIVE_IDLE_S = 170.0
_probe: dict[str, Any] = {}


def start_keepalive_probe() -> None:
    """Start tests/grpc/keepalive_probe.py (once per session): it idles for
    KEEPALIVE_IDLE_S while the suite runs, and test_keepalive.py reads its answer."""
    if _probe:
        return
    workdir = Path(tempfile.mkdtemp(prefix="sepp-keepalive-"))
    out = workdir / "result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    log = open(workdir / "probe.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tests.grpc.keepalive_probe",
            "--idle", str(KEEPALIVE_IDLE_S), "--out", str(out),
        ],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    _probe.update(proc=proc, out=out, log=workdir / "probe.log", started=time.monotonic())


def keepalive_probe_result(timeout: float) -> dict[str, Any]:
    """The probe's answer, waiting for it (the probe was started at collection)."""
    if not _probe:
        start_keepalive_probe()
    proc: subprocess.Popen[bytes] = _probe["proc"]
    remaining = _probe["started"] + KEEPALIVE_IDLE_S + timeout - time.monotonic()
    try:
        proc.wait(max(remaining, 1.0))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out: Path = _probe["out"]
    log: Path = _probe["log"]
    if not out.exists():
        raise AssertionError(f"the keepalive probe gave no answer; its log:\n{log.read_text()}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["log"] = log.read_text(errors="replace")
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    proc = _probe.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()  # by PID: the session ended before its test read it
        proc.wait()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), TEST_TIMEOUT_S))
    return True


# -- servers -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def grpc_server(**env: str) -> AsyncIterator[SeppServer]:
    """An in-process server with the gRPC front on 127.0.0.1:0 (`env` as for
    tests/inprocess.in_process_config)."""
    env.setdefault("grpc__listen_addr", "127.0.0.1:0")
    async with in_process(in_process_config(**env)) as server:
        yield server


def grpc_address(server: SeppServer) -> str:
    assert server.grpc_address is not None
    host, port = server.grpc_address
    return f"{host}:{port}"


def read_grpc_line(server: ServerProcess, timeout: float = 30.0) -> str:
    """After ServerProcess.start: the `sepp grpc on HOST:PORT` line's address."""
    proc = server.proc
    assert proc is not None and proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            raise RuntimeError(f"no `sepp grpc on` line; log:\n{server.log()}")
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            continue
        line += chunk
        if line.endswith(b"\n"):
            text = line.decode().strip()
            line = b""
            if text.startswith("sepp grpc on "):
                return text.removeprefix("sepp grpc on ")


@pytest.fixture
def grpc_process(
    server_factory: Callable[..., ServerProcess],
) -> Callable[..., tuple[ServerProcess, str]]:
    """A real `sepp serve --grpc-listen 127.0.0.1:0`: (process, gRPC address)."""

    def start(args: tuple[str, ...] = (), **kwargs: Any) -> tuple[ServerProcess, str]:
        server = server_factory(args=["--grpc-listen", "127.0.0.1:0", *args], **kwargs)
        return server, read_grpc_line(server)

    return start


# -- stubs from our own messages -------------------------------------------------------------


class Stub:
    """The eight QueueService methods on a channel, as unary-unary callables."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        def method(name: str, request: Any, response: Any) -> Any:
            return channel.unary_unary(
                f"/{SERVICE_NAME}/{name}",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            )

        self.EnqueueBatch = method("EnqueueBatch", pb.EnqueueBatchRequest, pb.EnqueueBatchResponse)
        self.EnqueueAtomic = method(
            "EnqueueAtomic", pb.EnqueueBatchRequest, pb.EnqueueAtomicResponse
        )
        self.Reserve = method("Reserve", pb.ReserveRequest, pb.ReserveResponse)
        self.Ack = method("Ack", pb.AckRequest, pb.AckResponse)
        self.Nack = method("Nack", pb.NackRequest, pb.NackResponse)
        self.Extend = method("Extend", pb.ExtendRequest, pb.ExtendResponse)
        self.DrainDeadLetters = method(
            "DrainDeadLetters", pb.DrainDeadLettersRequest, pb.DrainDeadLettersResponse
        )
        self.GetServerInfo = method(
            "GetServerInfo", pb.GetServerInfoRequest, pb.GetServerInfoResponse
        )


@contextlib.asynccontextmanager
async def stub_for(address: str, **kwargs: Any) -> AsyncIterator[Stub]:
    """A plaintext channel to `address` (kwargs: options=..., credentials=...)."""
    credentials = kwargs.pop("credentials", None)
    options = kwargs.pop("options", OFFICIAL_CHANNEL_OPTIONS)
    if credentials is None:
        channel = grpc.aio.insecure_channel(address, options=options)
    else:
        channel = grpc.aio.secure_channel(address, credentials, options=options)
    try:
        yield Stub(channel)
    finally:
        await channel.close()


def job(queue: str, job_type: str = "t", **fields: Any) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, job_type=job_type, **fields)


def lease(seconds: float = 60.0) -> Any:
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


async def enqueue_one(stub: Stub, request: pb.EnqueueRequest) -> str:
    response = await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[request]))
    result = response.results[0]
    assert result.WhichOneof("outcome") == "success", result
    return str(result.success.job_id)


async def reserve(
    stub: Stub, queue: str, max_jobs: int = 1, wait_s: float = 0.0, lease_s: float = 60.0
) -> list[pb.Job]:
    response = await stub.Reserve(
        pb.ReserveRequest(
            queues=[queue], lease_duration=lease(lease_s), wait_timeout=lease(wait_s),
            max_jobs=max_jobs,
        )
    )  # fmt: skip
    return list(response.jobs)


async def status_of_call(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value.code(), raised.value.details() or ""


# -- the official client's virtual environment ------------------------------------------------

OFFICIAL_VERSION = "0.1.0"
# The official client's integration suite needs (its dependency group `dev`, the part
# the suite imports: pytest-asyncio for asyncio_mode = auto, pytest-timeout for its
# `timeout` setting, testcontainers for its conftest's import).
OFFICIAL_TEST_DEPS = (
    "pytest>=9.1.1",
    "pytest-asyncio>=1.4.0",
    "pytest-timeout>=2.4.0",
    "testcontainers>=4.14.2",
)


@dataclass(frozen=True)
class OfficialClient:
    python: Path  # the venv's interpreter
    sdist: Path  # the unpacked sdist: tests/integration, pyproject.toml (its pytest config)
    queue_pb2: Path  # the installed sepp/v1/queue_pb2.py


def _run(args: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")


def ensure_official_client(venv: Path) -> OfficialClient:
    """The venv with sepp-py OFFICIAL_VERSION and its test deps, and its sdist
    unpacked inside it; built once (a marker file records a finished build)."""
    marker = venv / f"sepp-py-{OFFICIAL_VERSION}.ready"
    sdist = venv / f"sepp_py-{OFFICIAL_VERSION}"
    python = venv / "bin" / "python"
    if not marker.exists():
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
        _run([*pip, "install", f"sepp-py=={OFFICIAL_VERSION}", *OFFICIAL_TEST_DEPS])
        downloads = venv / "downloads"
        _run(
            [
                *pip, "download", "--no-deps", "--no-binary", ":all:",
                f"sepp-py=={OFFICIAL_VERSION}", "-d", str(downloads),
            ]
        )  # fmt: skip
        import tarfile

        with tarfile.open(downloads / f"sepp_py-{OFFICIAL_VERSION}.tar.gz") as archive:
            archive.extractall(venv, filter="data")
        marker.write_text("ok\n")
    found = list((venv / "lib").glob("python*/site-packages/sepp/v1/queue_pb2.py"))
    if not found or not (sdist / "tests" / "integration").is_dir():
        raise RuntimeError(f"{venv} holds no sepp-py {OFFICIAL_VERSION}: delete it and rerun")
    return OfficialClient(python=python, sdist=sdist, queue_pb2=found[0])


@pytest.fixture(scope="session")
def official_client() -> Iterator[OfficialClient]:
    venv = Path(os.environ.get("SEPP_OFFICIAL_VENV") or REPO_ROOT / ".venv-official")
    try:
        client = ensure_official_client(venv)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        if in_ci():
            raise
        pytest.skip(f"cannot build the official client's environment: {exc}")
    yield client
