"""A fake three-node sepp cluster for the client's failover tests.

No cluster processes and no JetStream: every node is a `FakeServer` (a real
listener on 127.0.0.1:0 speaking the protocol through `sepp.protocol`) whose
``hello`` answer carries the ``cluster`` map of the issue 19 wire contract. What
the nodes share is one real sepp server run in process (tests/inprocess.py), the
stand-in for the replicated log: the node that is leader passes every request on
to it over its own connection and hands back the answer, so an enqueue done
through one leader is seen (and deduplicated, and acked) through the next. The
other nodes refuse everything but ``hello`` / ``health`` / ``server_info``
(which every node answers, with its own ``cluster`` map) with ``unavailable``,
reason ``not_leader`` and the leader's address (nil while none is known).

Scripting a failover: ``node.fault(op, kind, then=...)`` makes the node's next
`op` fail once --

* ``"drop_before"``: the connection is dropped before the request is passed on
  (not done, but the client cannot know);
* ``"drop_after"``: passed on (done), then the connection is dropped without
  an answer;
* ``"unknown_after"``: passed on (done), then answered ``not_leader`` with
  ``outcome_unknown: true`` (a deposed leader that cannot vouch for it);

and `then` (e.g. ``lambda: cluster.elect(b)``) runs at that moment, before the
client sees anything. ``cluster.elect(node)`` makes `node` the leader (None: no
leader known, every node a candidate).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from sepp.client._connection import Connection, Endpoint
from sepp.protocol import OK, Request
from sepp.protocol.errors import REASON_NOT_LEADER, UNAVAILABLE
from tests.client.fakeserver import DROP, FakeConnection, FakeServer, Reply, error
from tests.inprocess import address_of, in_process, in_process_config

# The operations a node passes on to the shared server when it leads (hello and
# health are its own; withdraw is mapped onto the passed-on reserve).
FORWARDED_OPS = (
    "enqueue",
    "reserve",
    "ack",
    "nack",
    "extend",
    "release",
    "settle",
    "server_info",
    "queue_stats",
)
FORWARD_TIMEOUT_S = 30.0
FAULT_KINDS = ("drop_before", "drop_after", "unknown_after")


class FakeNode:
    """One node: a `FakeServer` with a role, passing requests on while it leads."""

    def __init__(self, cluster: FakeCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.server = FakeServer()
        self._backend: Connection | None = None
        # op -> (kind, then): the next request of that op fails so, once.
        self._faults: dict[str, tuple[str, Callable[[], None] | None]] = {}
        # Requests this node passed on, by op (what reached the shared server).
        self.forwarded: list[str] = []
        # Requests it refused as not the leader, by op.
        self.refused: list[str] = []
        # Per client connection: its reserve request id -> the passed-on id.
        self._reserve_ids: dict[tuple[int, int], int] = {}
        for op in FORWARDED_OPS:
            self.server.on(op, self._handle)
        self.server.on("withdraw", self._withdraw)

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def hellos(self) -> int:
        return self.server.hellos

    def fault(self, op: str, kind: str, then: Callable[[], None] | None = None) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(kind)
        self._faults[op] = (kind, then)

    def set_role(self, role: str, leader: str | None) -> None:
        self.server.hello_extra["cluster"] = {
            "role": role,
            "node_id": self.name,
            "epoch": self.cluster.epoch,
            "leader": leader,
        }

    @property
    def leads(self) -> bool:
        return self.cluster.leader is self

    async def _backend_connection(self) -> Connection:
        if self._backend is None or self._backend.closed:
            host, port = self.cluster.backend_address.rsplit(":", 1)
            self._backend = await Connection.open(
                Endpoint(self.cluster.backend_address, host, int(port)),
                hello={"protocol": 1, "client": f"fake-node-{self.name}"},
                timeout=FORWARD_TIMEOUT_S,
                receive_bytes_max=64 * 1024 * 1024,
            )
        return self._backend

    def _not_leader(self, outcome_unknown: bool = False) -> Reply:
        leader = self.cluster.leader
        details: dict[str, Any] = {
            "reason": REASON_NOT_LEADER,
            "leader": None if leader is None else leader.address,
        }
        if outcome_unknown:
            details["outcome_unknown"] = True
        return error(UNAVAILABLE, f"node {self.name} is not the leader", **details)

    async def _handle(self, conn: FakeConnection, request: Request) -> Reply | object:
        if request.op == "server_info":
            # Answered by every node, with its own cluster map.
            backend = await self._backend_connection()
            response = await backend.request("server_info", {}, timeout=FORWARD_TIMEOUT_S)
            return response.status, {**response.body, **self.server.hello_extra}
        if not self.leads:
            self.refused.append(request.op)
            return self._not_leader()
        kind, then = self._faults.pop(request.op, (None, None))
        if kind is not None and then is not None:
            then()
        if kind == "drop_before":
            return DROP
        backend = await self._backend_connection()
        request_id, future = backend.send(request.op, request.body, timeout=FORWARD_TIMEOUT_S)
        self.forwarded.append(request.op)
        self.server.notify()
        key = (id(conn), request.id)
        if request.op == "reserve":
            self._reserve_ids[key] = request_id
        try:
            response = await future
        finally:
            self._reserve_ids.pop(key, None)
        if kind == "drop_after":
            return DROP
        if kind == "unknown_after":
            return self._not_leader(outcome_unknown=True)
        return response.status, response.body

    async def _withdraw(self, conn: FakeConnection, request: Request) -> Reply:
        if not self.leads:
            self.refused.append(request.op)
            return self._not_leader()
        passed_on = self._reserve_ids.get((id(conn), request.body.get("request_id", -1)))
        if passed_on is None or self._backend is None or self._backend.closed:
            return OK, {"withdrawn": False}
        response = await self._backend.request(
            "withdraw", {"request_id": passed_on}, timeout=FORWARD_TIMEOUT_S
        )
        return response.status, response.body

    def stop_leading(self) -> None:
        """Withdraw the reserves this node passed on that are still parked: a
        node that no longer leads hands out no job (in a real cluster it could
        not lease one), even to a client connection already gone."""
        backend = self._backend
        if backend is None or backend.closed:
            return
        for passed_on in list(self._reserve_ids.values()):
            _, future = backend.send(
                "withdraw", {"request_id": passed_on}, timeout=FORWARD_TIMEOUT_S
            )
            future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def close(self) -> None:
        if self._backend is not None:
            await self._backend.close()


class FakeCluster:
    """Three `FakeNode`s in front of one in-process sepp server."""

    def __init__(self, size: int = 3) -> None:
        self.nodes = [FakeNode(self, name) for name in "abcdefg"[:size]]
        self.leader: FakeNode | None = None
        self.epoch = 0
        self.backend_address = ""

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes]

    def elect(self, leader: FakeNode | None) -> None:
        """`leader` leads from now on (None: no leader known; every node a
        candidate). Connections stay open: nodes that stopped leading refuse."""
        if self.leader is not None and self.leader is not leader:
            self.leader.stop_leading()
        self.leader = leader
        self.epoch += 1
        for node in self.nodes:
            if node is leader:
                node.set_role("leader", node.address)
            elif leader is None:
                node.set_role("candidate", None)
            else:
                node.set_role("follower", leader.address)

    def advertise_batches(self, hello: dict[str, Any]) -> None:
        """Give every node's hello the batch limits `hello` advertises (the
        client then coalesces enqueues and settles)."""
        for node in self.nodes:
            for name in ("max_enqueue_batch", "max_settle_batch"):
                if name in hello:
                    node.server.hello_extra[name] = hello[name]


@contextlib.asynccontextmanager
async def fake_cluster(*, batches: bool = True, **env: str) -> AsyncIterator[FakeCluster]:
    """A started cluster whose first node leads. `batches`: advertise the
    shared server's batch limits in every node's hello."""
    async with in_process(in_process_config(**env)) as backend:
        cluster = FakeCluster()
        cluster.backend_address = address_of(backend)
        async with contextlib.AsyncExitStack() as stack:
            for node in cluster.nodes:
                await stack.enter_async_context(node.server)
                stack.push_async_callback(node.close)
            cluster.elect(cluster.nodes[0])
            if batches:
                probe = await cluster.nodes[0]._backend_connection()
                assert probe.handshake is not None
                cluster.advertise_batches(
                    {
                        "max_enqueue_batch": probe.handshake.max_enqueue_batch,
                        "max_settle_batch": probe.handshake.max_settle_batch,
                    }
                )
            yield cluster


async def closed_port_address() -> str:
    """An address on 127.0.0.1 where nothing listens (a port just released)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return f"127.0.0.1:{port}"
