"""Cluster mode in the server (issue 19): the server's side of a `ClusterNode`.

Owns: `ClusterBackend` (the replicated log, the lease and the blob store a node
runs on, and how to close them), `connect_backend` (JetStream, from [cluster]),
and `ClusterMode`, the node's `Serving`: when the node leads, the server gets a
commit pipeline over the node's engine whose group commits are fenced appends,
and the service opens on it; when it steps down, every request waiting for
durability is answered `unavailable` / `not_leader` (with `outcome_unknown`), the
service stops (parked reserves answered empty, no sweeps) and the native front
refuses everything but hello, health and server_info with the leader's address.

Promises: while `serving` is false nothing reaches the service through the native
front but hello / health / server_info (the wire contract of I19: refused before
anything is done, so any request may be retried at the leader).

Must not import: the admin or gRPC fronts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sepp.cluster.logengine import LogCommitter, NotLeader, state_hash
from sepp.cluster.metrics import ClusterMetricsView
from sepp.cluster.node import ROLE_CANDIDATE, ROLE_LEADER, ROLE_STOPPED, ClusterNode
from sepp.cluster.replog import BlobStore, Lease, ReplicatedLog
from sepp.server.config import ClusterSettings
from sepp.server.pipeline import CommitPipeline
from sepp.storage import Engine

if TYPE_CHECKING:
    from sepp.server.server import SeppServer

log = logging.getLogger("sepp.server")


@dataclass
class ClusterBackend:
    log: ReplicatedLog
    lease: Lease
    blobs: BlobStore | None = None
    # The node's timer (tests pass a manual clock's).
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        for close in self.closers:
            try:
                await close()
            except Exception as exc:  # closing is best effort
                log.warning("closing the cluster backend: %s", exc)


async def connect_backend(settings: ClusterSettings, names: Any = None) -> ClusterBackend:
    """The JetStream backend: connect, create what is missing, refuse a cluster
    that is not R3 with sync_interval: always (sepp/cluster/jetstream.py).
    `names`: the stream and buckets (`jetstream.ClusterNames`; tests use their
    own), default sepp's."""
    from sepp.cluster import jetstream

    credentials = nats_credentials(settings)
    nc = await jetstream.connect(settings.nats_urls, credentials)
    try:
        resources = await jetstream.ensure_cluster_resources(
            nc,
            names or jetstream.ClusterNames(),
            monitor_urls=settings.monitor_urls,
            lease_ttl_s=settings.lease_ttl_ms / 1000,
            # https monitoring URLs: checked against the same CA as the servers.
            monitor_tls=credentials.tls_context() if credentials.tls_ca_file else None,
        )
    except BaseException:
        await nc.close()
        raise
    return ClusterBackend(
        log=resources.log, lease=resources.lease, blobs=resources.blobs, closers=[nc.close]
    )


def nats_credentials(settings: ClusterSettings) -> Any:
    """[cluster]'s NATS credentials and TLS files as `jetstream.NatsCredentials`."""
    from sepp.cluster import jetstream

    return jetstream.NatsCredentials(
        user=settings.nats_user,
        password=settings.nats_password,
        token=settings.nats_token,
        creds_file=settings.creds_file,
        tls_ca_file=settings.tls_ca_file,
        tls_cert_file=settings.tls_cert_file,
        tls_key_file=settings.tls_key_file,
    )


class ClusterMode:
    """The server's `Serving` for its node."""

    def __init__(
        self,
        server: SeppServer,
        settings: ClusterSettings,
        backend: ClusterBackend,
    ) -> None:
        self.server = server
        self.settings = settings
        self.backend = backend
        # True while this node leads and its service answers commands.
        self.serving = False
        self.node = ClusterNode(
            node_id=settings.node_id,
            address=settings.advertise_addr,
            log_=backend.log,
            lease=backend.lease,
            config=server.core_config,
            clock_ms=server.clock,
            sleep=backend.sleep,
            renew_ms=settings.lease_renew_ms,
            lease_ttl_ms=settings.lease_ttl_ms,
            serving=self,
            on_role=self._role_changed,
            blobs=backend.blobs,
            snapshot_every=settings.snapshot_every_messages,
            appends_in_flight=settings.appends_in_flight,
        )
        server.service.cluster_metrics = self.metrics_view

    def metrics_view(self) -> ClusterMetricsView:
        """/metrics' reading of the node (sepp/admin/metrics.py renders it)."""
        node = self.node
        return ClusterMetricsView(
            role=self.info()["role"],
            epoch=node.epoch,
            log_seq=node.log_seq,
            appends_in_flight=node.appends_in_flight_now,
            counts=node.metrics,
        )

    def info(self) -> dict[str, Any]:
        """hello's and server_info's `cluster` (the wire contract)."""
        node = self.node
        role = node.role
        if role == ROLE_STOPPED:
            role = ROLE_CANDIDATE  # it serves nothing; "stopped" is not on the wire
        if role == ROLE_LEADER and not self.serving:
            role = ROLE_CANDIDATE  # appending its leader-change record
        return {
            "role": role,
            "node_id": node.node_id,
            "epoch": node.epoch,
            "leader": node.address if self.serving else node.leader,
        }

    def state_view(self) -> dict[str, Any]:
        """server_info's extra `cluster` fields: the last log message this node
        applied or appended (`log_seq`) and the digest of its state there
        (`state_hash`), read together; the nodes of a quiet cluster report
        equal pairs (the failover harness compares them)."""
        node = self.node
        return {"log_seq": node.log_seq, "state_hash": state_hash(node.engine.state)}

    def leader_address(self) -> str | None:
        return self.node.address if self.serving else self.node.leader

    def _role_changed(self, node: ClusterNode) -> None:
        if node.role == ROLE_STOPPED and node.failure is not None:
            # The log holds what this node cannot apply: it stops, exit code 3
            # (`storage failed`), rather than serve or follow a diverged state.
            self.serving = False
            self.server._storage_failed(node.failure)

    # -- Serving ------------------------------------------------------------------

    def lead(self, node: ClusterNode, engine: Engine, committer: LogCommitter) -> None:
        server = self.server
        loop = asyncio.get_running_loop()
        pipeline = CommitPipeline(
            engine,
            backlog_max=server.config.get("storage", "command_queue_capacity"),
            clock=server.clock,
            on_failure=self._lost,
            release_cork=server.release_cork,
        )
        pipeline.start_replicated(committer)
        server.engine, server.pipeline = engine, pipeline
        service = server.service
        service.stopping = False
        service.open(engine, pipeline, loop)
        self.serving = True
        log.info("node %s leads epoch %d", node.node_id, node.epoch)

    def _lost(self, exc: BaseException) -> None:
        # The committer failed: refuse at once; the node steps down next.
        self.serving = False

    def step_down(self, node: ClusterNode, error: BaseException) -> None:
        self.serving = False
        server = self.server
        if not isinstance(error, NotLeader):
            error = NotLeader(str(error), outcome_unknown=True)
        pipeline = server.pipeline
        if pipeline is not None:
            pipeline.abandon(error)
        service = server.service
        service.stop()  # no sweeps; parked reserves answered empty
        service.stopping = server.shutting_down
        # As before the first lead: the admin and gRPC fronts answer "not ready"
        # (503 / UNAVAILABLE) rather than read or change a stale state.
        service.engine = service.pipeline = None
        server.engine = server.pipeline = None

    async def stop(self) -> None:
        await self.node.stop()
        self.serving = False
        await self.backend.close()
