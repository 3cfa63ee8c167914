"""The failover harness (cluster mode, issue 19 item 7): a local cluster of three
JetStream servers and three sepp nodes under a seeded series of faults, with a
client-side ledger checking what was promised.

    python -m tools.failover --faults N [--seed S] [--kinds K,K...] [--dir DIR]
                             [--keep] [--verbose]

Prints each fault (with the seed), a table of the time from each fault to the
first acknowledged enqueue after it (p50 / p99 / max per kind), operations
checked and violations; exits 1 on any violation (the cluster's directory and
logs are kept then).

Owns: `FailoverHarness`, `FailoverOptions`, `FailoverReport`, the ledger
(`FailoverLedger`) and `TcpProxy` / `ProxyThread` (the partitions).

Setup: `tools.cluster.start_cluster` (three nats-servers), one TCP proxy per
(sepp node, nats server) pair in a thread of its own (so a busy harness loop
never holds up the nodes' NATS traffic), `start_sepp_nodes` with each node
connecting to the servers through its own three proxies. Cutting a proxy closes
its connections and refuses new ones until healed: cutting a node's three
proxies partitions that node from JetStream (no root, no firewall).

The workload (through the real client, `SeppClient.connect("h1:p,h2:p,h3:p")`):
producers enqueue jobs each with an idempotency key; workers reserve, then ack
(or now and then nack to the dead letters); a probe measures each fault. Faults
(`KINDS`, picked with the seeded RNG):

- kill_leader: kill -9 of the sepp leader (restarted after the measurement);
- pause_leader: SIGSTOP of the sepp leader, SIGCONT after the measurement (it
  wakes as a deposed leader: its appends are fenced);
- term_leader: SIGTERM of the leader (a planned handover), restarted after;
- kill_stream_leader / pause_stream_leader: kill -9 / SIGSTOP of the nats
  server leading the log stream (restarted / resumed after);
- kill_both: kill -9 of the sepp leader and of the stream leader at once;
- isolate_leader: the sepp leader's three proxies cut (it can neither append
  nor renew its lease: it steps down, another node leads), healed after;
- corrupt_block: a nats server that does not lead the stream is stopped, a
  block file of the stream in its store gets garbage written over its middle,
  and it is started again (JetStream must repair it from its peers, or sepp's
  checksums and hash chain must stop a node: never a divergence).

The measurement of a fault: from the moment the fault is done (the signal sent,
the proxies cut) to the first acknowledged enqueue of the probe (a fresh
idempotency key per try, the client retrying and reconnecting on its own).

The ledger and the checks (at the end, on a quiet cluster):
1. every acknowledged enqueue ends ready, scheduled, in flight (a lease taken by
   a worker whose ack was in doubt) or dead -- or done, if a worker's ack of it
   was sent: `get_job` at the leader finds it, else the ledger holds an ack;
2. no acknowledged ack is undone: the job is gone (`get_job` finds nothing)
   and was never delivered again after its ack was answered;
3. no job is held under one attempt by two workers: a (job id, attempt)
   delivered twice is a violation (the client never retries a reserve, and a
   reserve is answered only once its record is in the log);
4. an acknowledged idempotency key always names the same job id;
5. all nodes reach the same state hash at the same log sequence (server
   info's `cluster.log_seq` / `state_hash`), and no node stopped unless the
   harness corrupted a block file (then the node's log names the mismatch).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from sepp.client import RetryDirective, SeppClient
from sepp.client.errors import (
    AttemptMismatchError,
    JobNotFoundError,
    SeppError,
)
from sepp.client.types import ClusterInfo, EnqueueRequest, Job, Payload, ReserveOptions

from . import cluster as local_cluster
from .crash import _in_doubt

QUEUE = "failover"
STREAM = "sepp"
KINDS = (
    "kill_leader",
    "pause_leader",
    "term_leader",
    "kill_stream_leader",
    "pause_stream_leader",
    "kill_both",
    "isolate_leader",
    "corrupt_block",
)
# The kinds that count as "leader kills and pauses" in the target.
LEADER_KINDS = ("kill_leader", "pause_leader", "term_leader", "kill_both", "isolate_leader")
# How long the probe may take to see an acknowledged enqueue after a fault.
RECOVERY_DEADLINE_S = 60.0
# How long the cluster may take to settle (every node up, one leader) between faults.
SETTLE_DEADLINE_S = 60.0
# How long the nodes may take to agree on (log_seq, state_hash) at the end.
CONVERGE_DEADLINE_S = 60.0
# A probe try's deadline: short, so a paused leader costs one short wait.
PROBE_RPC_S = 1.0
PROBE_CONNECT_S = 1.0
# Workers' leases: long enough never to lapse in a run (a lapse is legal but
# makes "held twice" ambiguous only if two holders overlap, which a lapse excludes).
LEASE_S = 60
POLL_S = 0.05
DEAD_LETTER_SHARE = 0.05


def wall() -> float:
    return time.monotonic()


# ---------------------------------------------------------------- the proxies


class TcpProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<target>; `cut` closes every
    connection and refuses new ones (accepted, then closed) until `heal`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cut_off = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not self.cut_off:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def cut(self) -> None:
        self.cut_off = True
        for writer in list(self._writers):
            transport = writer.transport
            transport.abort()
        self._writers.clear()

    def heal(self) -> None:
        self.cut_off = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


class ProxyThread:
    """Proxies on an event loop of their own, in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def _run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def proxy(self, target_port: int) -> TcpProxy:
        proxy = TcpProxy(target_port)
        self._run(proxy.start())
        return proxy

    def cut(self, proxies: list[TcpProxy]) -> None:
        async def go() -> None:
            for p in proxies:
                p.cut()

        self._run(go())

    def heal(self, proxies: list[TcpProxy]) -> None:
        async def go() -> None:
            for p in proxies:
                p.heal()

        self._run(go())

    def close(self, proxies: list[TcpProxy]) -> None:
        """Close `proxies`, end what their connections still run, stop the loop
        and close it."""

        async def go() -> None:
            for p in proxies:
                await p.close()
            current = asyncio.current_task()
            rest = [task for task in asyncio.all_tasks() if task is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        with contextlib.suppress(Exception):  # cleanup: the run's verdict is already made
            self._run(go())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


# ---------------------------------------------------------------- the ledger


@dataclass
class FailoverReport:
    seed: int
    faults: list[tuple[str, float]] = field(default_factory=list)  # kind, seconds to recover
    enqueues_acked: int = 0
    acks_acked: int = 0
    dead_acked: int = 0
    deliveries: int = 0
    in_doubt: int = 0
    violations: list[str] = field(default_factory=list)
    # Stalls: the cluster did not recover (one leader every node follows, an
    # acknowledged enqueue) within the deadlines; the run repaired and went on.
    liveness: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    final_log_seq: int = 0
    final_state_hash: str = ""

    def table(self) -> str:
        rows = ["kind                   n   p50 s   p99 s   max s"]
        kinds = sorted({k for k, _ in self.faults}, key=KINDS.index)
        for kind in kinds:
            values = sorted(s for k, s in self.faults if k == kind)
            rows.append(
                f"{kind:<20} {len(values):>3} {percentile(values, 50):>7.2f} "
                f"{percentile(values, 99):>7.2f} {values[-1]:>7.2f}"
            )
        return "\n".join(rows)

    def summary(self) -> str:
        leader = sum(1 for k, _ in self.faults if k in LEADER_KINDS)
        lines = [
            self.table(),
            f"faults {len(self.faults)} (leader kills, pauses, handovers and isolations "
            f"{leader}); enqueues acknowledged {self.enqueues_acked}, acks acknowledged "
            f"{self.acks_acked}, dead-lettered {self.dead_acked}, deliveries "
            f"{self.deliveries}, in doubt {self.in_doubt}",
            f"final log_seq {self.final_log_seq} state_hash {self.final_state_hash} (all nodes)",
            *[f"note: {n}" for n in self.notes],
            f"liveness stalls {len(self.liveness)}",
            *[f"STALL: {v}" for v in self.liveness[:20]],
            f"violations {len(self.violations)}",
            *[f"VIOLATION: {v}" for v in self.violations[:20]],
            f"seed {self.seed}",
        ]
        return "\n".join(lines)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return float("nan")
    rank = max(1, -(-len(values) * pct // 100))
    return values[int(rank) - 1]


class FailoverLedger:
    def __init__(self, report: FailoverReport) -> None:
        self.report = report
        self.enqueued: dict[str, str] = {}  # key -> job id (acknowledged)
        self.acked: dict[str, float] = {}  # job id -> when its ack was answered
        self.ack_sent: set[str] = set()  # acks sent, answered or not
        self.dead: set[str] = set()
        self.held: set[tuple[str, int]] = set()  # (job id, attempt) delivered

    def violation(self, text: str) -> None:
        self.report.violations.append(text)

    def enqueue_acked(self, key: str, job_id: str) -> None:
        known = self.enqueued.get(key)
        if known is not None and known != job_id:
            self.violation(f"idempotency key {key} named {known}, now {job_id}")
        self.enqueued[key] = job_id
        self.report.enqueues_acked += 1

    def delivered(self, job: Job) -> None:
        ctx = job.ctx
        self.report.deliveries += 1
        pair = (ctx.id, ctx.attempt)
        if pair in self.held:
            self.violation(f"job {ctx.id} attempt {ctx.attempt} held by two workers")
        self.held.add(pair)
        if ctx.id in self.acked:
            self.violation(f"job {ctx.id} delivered again (attempt {ctx.attempt}) after its ack")

    def ack_answered(self, job_id: str) -> None:
        self.acked[job_id] = wall()
        self.report.acks_acked += 1


# ---------------------------------------------------------------- the harness


@dataclass
class FailoverOptions:
    faults: int = 10
    seed: int | None = None
    kinds: tuple[str, ...] = KINDS
    directory: str | None = None
    keep: bool = False
    verbose: bool = False
    producers: int = 2
    workers: int = 2
    # How long the cluster may take to settle before a stall is recorded.
    settle_deadline_s: float = SETTLE_DEADLINE_S
    # The faults in this order (then `faults` and `kinds` are not used).
    plan: tuple[str, ...] | None = None
    # Load between faults (seconds), drawn evenly from this range.
    between_s: tuple[float, float] = (0.3, 1.0)


class FailoverHarness:
    def __init__(self, options: FailoverOptions) -> None:
        self.options = options
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**32)
        self.seed = seed
        self.rng = random.Random(seed)  # the faults and the pauses between them
        self.work_rng = random.Random(seed + 1)  # the workload (its tasks interleave)
        self.report = FailoverReport(seed)
        self.ledger = FailoverLedger(self.report)
        self.cluster: local_cluster.JetStreamCluster | None = None
        self.proxies: dict[tuple[str, str], TcpProxy] = {}  # (sepp, nats) -> proxy
        self.proxy_thread: ProxyThread | None = None
        self.stopping = False
        self.corrupted = False
        self._keys = 0
        self._tmp: str | None = None
        self.last_views: list[ClusterInfo | None] = []
        self._rotation = 0

    def say(self, text: str) -> None:
        print(f"[failover seed={self.seed}] {text}", flush=True)

    def key(self, prefix: str) -> str:
        self._keys += 1
        return f"{prefix}{self._keys}"

    # -- the cluster -------------------------------------------------------------

    def setup(self) -> local_cluster.JetStreamCluster:
        directory = self.options.directory
        if directory is None:
            directory = self._tmp = tempfile.mkdtemp(prefix="sepp-failover-")
        cluster = local_cluster.start_cluster(directory)
        self.cluster = cluster  # stopped by teardown from here on
        self.proxy_thread = ProxyThread()
        urls: dict[str, list[str]] = {}
        for name in local_cluster.SEPP_NAMES:
            urls[name] = []
            for server in cluster.servers:
                proxy = self.proxy_thread.proxy(server.client_port)
                self.proxies[(name, server.name)] = proxy
                urls[name].append(proxy.url)
        local_cluster.start_sepp_nodes(cluster, nats_urls=urls)
        cluster.save()
        return cluster

    def teardown(self, failed: bool) -> None:
        if self.cluster is not None:
            local_cluster.stop_cluster(self.cluster)
        if self.proxy_thread is not None:
            self.proxy_thread.close(list(self.proxies.values()))
        if self.cluster is not None and not failed and not self.options.keep and self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
        elif self.cluster is not None:
            self.say(f"cluster directory kept: {self.cluster.dir}")

    async def node_info(self, address: str) -> ClusterInfo | None:
        """A node's `cluster` map from server_info (None if it does not answer)."""
        try:
            client = await SeppClient.connect(
                address,
                follow_leader=False,
                connect_timeout=timedelta(seconds=PROBE_CONNECT_S),
                rpc_timeout=timedelta(seconds=PROBE_RPC_S),
            )
        except SeppError:
            return None
        try:
            info = await client.get_server_info()
        except SeppError:
            return None
        finally:
            with contextlib.suppress(SeppError):
                await client.close()
        return info.cluster

    async def sepp_leader(self, *, all_agree: bool = False) -> str | None:
        """The name of the node that says it leads (the only one), else None;
        `all_agree`: and every other running node follows it."""
        assert self.cluster is not None
        leaders = []
        views: list[ClusterInfo | None] = []
        for node in self.cluster.sepp_nodes:
            info = await self.node_info(node.address) if node.alive() else None
            views.append(info)
            if info is not None and info.role == "leader":
                leaders.append(node)
        self.last_views = views
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        if all_agree and not all(v is not None and v.leader == leader.address for v in views):
            return None
        return leader.name

    async def settle(self) -> str:
        """Wait until every node and server runs, one sepp node leads and every
        node follows it. A cluster that does not get there within
        the settle deadline is a liveness stall (`report.liveness`): the nodes that do not follow
        are named, killed and started again (once), and the run goes on."""
        try:
            return await self._settle()
        except HarnessError as exc:
            self.report.liveness.append(str(exc))
        assert self.cluster is not None
        leader = next((v for v in self.last_views if v is not None and v.role == "leader"), None)
        for node, view in zip(self.cluster.sepp_nodes, self.last_views, strict=False):
            if view is None or leader is None or view.leader != leader.leader:
                self.say(f"  restarting {node.name}, stuck as {view}")
                if node.alive():
                    await asyncio.to_thread(self.cluster.sepp_kill, node.name)
                await asyncio.to_thread(self.cluster.sepp_restart, node.name)
        return await self._settle()

    async def _settle(self) -> str:
        assert self.cluster is not None
        cluster = self.cluster
        settle_s = self.options.settle_deadline_s
        deadline = wall() + settle_s
        await asyncio.to_thread(cluster.wait_meta_leader, SETTLE_DEADLINE_S)
        while True:
            leader = await self.sepp_leader(all_agree=True)
            stream_leader = await asyncio.to_thread(cluster.stream_leader, STREAM)
            if leader is not None and stream_leader is not None:
                return leader
            if wall() > deadline:
                raise HarnessError(
                    f"the cluster did not settle within {settle_s} s (one sepp "
                    f"leader every node follows): {self.last_views}"
                )
            await asyncio.sleep(POLL_S * 4)

    # -- the workload ----------------------------------------------------------------

    async def client(self, rpc_s: float = 10.0, connect_s: float = 10.0) -> SeppClient:
        """A client given the three addresses, each client in another order (a
        paused node costs a client whose list starts with it the whole
        connect timeout: a fleet of clients does not all start there)."""
        assert self.cluster is not None
        addresses = self.cluster.addresses().split(",")
        self._rotation += 1
        turn = self._rotation % len(addresses)
        return await SeppClient.connect(
            addresses[turn:] + addresses[:turn],
            connect_timeout=timedelta(seconds=connect_s),
            rpc_timeout=timedelta(seconds=rpc_s),
        )

    async def producer(self, index: int) -> None:
        client = await self.client()
        try:
            while not self.stopping:
                key = self.key(f"p{index}-")
                request = EnqueueRequest(
                    queue=QUEUE,
                    job_type="t",
                    payload=Payload(key.encode(), "text/plain"),
                    idempotency_key=key,
                )
                try:
                    ack = await client.enqueue(request)
                except SeppError as exc:
                    if _in_doubt(exc):
                        self.report.in_doubt += 1
                    await asyncio.sleep(POLL_S)
                    continue
                self.ledger.enqueue_acked(key, ack.job_id)
                await asyncio.sleep(self.work_rng.uniform(0, 0.02))
        finally:
            await client.close()

    async def worker(self, index: int) -> None:
        client = await self.client()
        opts = ReserveOptions(
            [QUEUE],
            lease_duration=timedelta(seconds=LEASE_S),
            wait_timeout=timedelta(milliseconds=500),
            worker_id=f"w{index}",
            max_jobs=4,
        )
        try:
            while not self.stopping:
                try:
                    jobs = await client.reserve(opts)
                except SeppError:
                    await asyncio.sleep(POLL_S)
                    continue
                for job in jobs or []:
                    self.ledger.delivered(job)
                for job in jobs or []:
                    await self.settle_job(client, job)
        finally:
            await client.close()

    async def settle_job(self, client: SeppClient, job: Job) -> None:
        ledger = self.ledger
        job_id = job.ctx.id
        ledger.ack_sent.add(job_id)
        try:
            if self.work_rng.random() < DEAD_LETTER_SHARE:
                await client.nack(job.ctx, RetryDirective.DEAD_LETTER, reason="failover")
                ledger.dead.add(job_id)
                self.report.dead_acked += 1
            else:
                await client.ack(job.ctx)
                ledger.ack_answered(job_id)
        except (JobNotFoundError, AttemptMismatchError):
            pass  # a retried ack answering not_found after a first one that was done
        except SeppError as exc:
            if _in_doubt(exc):
                self.report.in_doubt += 1

    async def probe(self, started: float) -> float:
        """Seconds from `started` to the first acknowledged enqueue."""
        deadline = started + RECOVERY_DEADLINE_S
        client: SeppClient | None = None
        try:
            while True:
                if wall() > deadline:
                    raise HarnessError(f"no acknowledged enqueue within {RECOVERY_DEADLINE_S} s")
                try:
                    if client is None:
                        client = await self.client(PROBE_RPC_S, PROBE_CONNECT_S)
                    key = self.key("probe-")
                    ack = await client.enqueue(
                        EnqueueRequest(queue=QUEUE, job_type="t", idempotency_key=key)
                    )
                except SeppError:
                    await asyncio.sleep(POLL_S)
                    continue
                done = wall() - started
                self.ledger.enqueue_acked(key, ack.job_id)
                return done
        finally:
            if client is not None:
                await client.close()

    # -- the faults --------------------------------------------------------------------

    async def fault(self, kind: str) -> float:
        cluster = self.cluster
        assert cluster is not None and self.proxy_thread is not None
        leader = await self.settle()
        stream_leader = await asyncio.to_thread(cluster.stream_leader, STREAM)
        assert stream_leader is not None
        if self.options.verbose:
            self.say(f"  {kind}: sepp leader {leader}, stream leader {stream_leader}")
        run = asyncio.to_thread
        if kind == "corrupt_block":
            target = next(s.name for s in cluster.servers if s.name != stream_leader)
            await run(cluster.stop_server, target)
            damaged = corrupt_block_file(cluster.server(target).config_path, self.rng)
            if damaged is None:
                raise HarnessError(f"no block file of stream {STREAM} in {target}'s store")
            self.corrupted = True
            self.say(f"  corrupted {damaged} of stopped {target}")
            started = wall()
            await run(cluster.restart, target)
            return await self.probe(started)
        started = wall()
        if kind == "kill_leader":
            cluster.sepp_signal(leader, signal.SIGKILL)
        elif kind == "pause_leader":
            cluster.sepp_pause(leader)
        elif kind == "term_leader":
            cluster.sepp_signal(leader, signal.SIGTERM)
        elif kind == "kill_stream_leader":
            cluster.signal(stream_leader, signal.SIGKILL)
        elif kind == "pause_stream_leader":
            cluster.pause(stream_leader)
        elif kind == "kill_both":
            cluster.sepp_signal(leader, signal.SIGKILL)
            cluster.signal(stream_leader, signal.SIGKILL)
        elif kind == "isolate_leader":
            self.proxy_thread.cut([p for (s, _), p in self.proxies.items() if s == leader])
        else:
            raise HarnessError(f"unknown fault {kind}")
        try:
            return await self.probe(started)
        finally:
            await self.restore(kind, leader, stream_leader)

    async def restore(self, kind: str, leader: str, stream_leader: str) -> None:
        cluster = self.cluster
        assert cluster is not None and self.proxy_thread is not None
        run = asyncio.to_thread
        if kind in ("kill_leader", "kill_both", "term_leader"):
            await run(local_cluster._wait_gone, cluster.sepp(leader), 30.0)
            if kind == "term_leader":
                code = local_cluster.exit_codes.get(cluster.sepp(leader).pid)
                if code != 0:
                    self.ledger.violation(f"SIGTERM of {leader}: exit code {code}, not 0")
        if kind in ("kill_stream_leader", "kill_both"):
            await run(local_cluster._wait_gone, cluster.server(stream_leader), 30.0)
            await run(cluster.restart, stream_leader)
        if kind == "pause_stream_leader":
            cluster.resume(stream_leader)
        if kind == "pause_leader":
            cluster.sepp_resume(leader)
        if kind == "isolate_leader":
            self.proxy_thread.heal([p for (s, _), p in self.proxies.items() if s == leader])
        if kind in ("kill_leader", "kill_both", "term_leader"):
            await run(cluster.sepp_restart, leader)

    # -- the end ---------------------------------------------------------------------

    async def converge(self) -> None:
        """All nodes at the same (log_seq, state_hash); a node that stopped is a
        violation unless a block file was corrupted (then it is noted)."""
        cluster = self.cluster
        assert cluster is not None
        deadline = wall() + CONVERGE_DEADLINE_S
        while True:
            views = {}
            for node in cluster.sepp_nodes:
                if not node.alive():
                    continue
                info = await self.node_info(node.address)
                if info is not None:
                    views[node.name] = (info.log_seq, info.state_hash)
            stopped = [n.name for n in cluster.sepp_nodes if not n.alive()]
            pairs = set(views.values())
            if len(views) + len(stopped) == len(cluster.sepp_nodes) and len(pairs) == 1:
                log_seq, digest = next(iter(pairs))
                if log_seq is not None and digest is not None:
                    self.report.final_log_seq, self.report.final_state_hash = log_seq, digest
                    break
            if wall() > deadline:
                self.ledger.violation(f"the nodes did not converge: {views}")
                return
            await asyncio.sleep(POLL_S * 4)
        for name in stopped:
            text = f"sepp node {name} stopped (log: {cluster.sepp(name).log_path})"
            if self.corrupted:
                self.report.notes.append(text + " after a corrupted block file")
            else:
                self.ledger.violation(text)

    async def check_jobs(self) -> None:
        ledger = self.ledger
        client = await self.client()
        try:
            for key, job_id in ledger.enqueued.items():
                info = await client.get_job(job_id)
                if job_id in ledger.acked:
                    if info is not None:
                        ledger.violation(f"acked job {job_id} ({key}) is back: {info.state}")
                    continue
                if info is None:
                    if job_id not in ledger.ack_sent:
                        ledger.violation(f"acknowledged enqueue {key} ({job_id}) is lost")
                    continue
                if job_id in ledger.dead and info.state != "dead_letter":
                    ledger.violation(f"dead-lettered job {job_id} is {info.state}")
        finally:
            await client.close()

    async def run(self) -> FailoverReport:
        self.say(
            f"seed {self.seed}: {self.options.faults} faults of {','.join(self.options.kinds)}"
        )
        failed = True
        try:
            cluster = await asyncio.to_thread(self.setup)
            self.say(f"cluster up: {cluster.addresses()}")
            await self.settle()
            tasks = [asyncio.create_task(self.producer(i)) for i in range(self.options.producers)]
            tasks += [asyncio.create_task(self.worker(i)) for i in range(self.options.workers)]
            try:
                plan = self.options.plan
                count = len(plan) if plan is not None else self.options.faults
                for index in range(count):
                    await asyncio.sleep(self.rng.uniform(*self.options.between_s))
                    kind = plan[index] if plan is not None else self.rng.choice(self.options.kinds)
                    try:
                        seconds = await self.fault(kind)
                    except HarnessError as exc:
                        self.report.liveness.append(f"fault {index + 1} ({kind}): {exc}")
                        await self.settle()
                        continue
                    self.report.faults.append((kind, seconds))
                    self.say(
                        f"fault {index + 1}: {kind}: first acknowledged enqueue {seconds:.2f} s"
                    )
                    for task in tasks:
                        if task.done():
                            task.result()  # a crashed workload task ends the run
            finally:
                self.stopping = True
                results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            await self.settle()
            await self.converge()
            await self.check_jobs()
            failed = bool(self.report.violations or self.report.liveness)
        finally:
            await asyncio.to_thread(self.teardown, failed)
        return self.report


class HarnessError(RuntimeError):
    """The harness could not go on (the cluster did not recover in time)."""


def corrupt_block_file(config_path: str, rng: random.Random) -> str | None:
    """Write garbage over the middle of one block file of the log stream in the
    (stopped) server's store; the file's path, or None if it has none."""
    store = Path(config_path).parent / "jetstream"
    blocks = sorted(store.glob(f"**/streams/{STREAM}/msgs/*.blk"))
    if not blocks:
        return None
    block = rng.choice(blocks)
    size = block.stat().st_size
    if size < 64:
        return None
    with open(block, "r+b") as fh:
        fh.seek(rng.randrange(size // 4, size // 2))
        fh.write(rng.randbytes(32))
        fh.flush()
        os.fsync(fh.fileno())
    return str(block)


def run_failover(options: FailoverOptions) -> FailoverReport:
    return asyncio.run(FailoverHarness(options).run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.failover", description=__doc__)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated, of {','.join(KINDS)}"
    )
    parser.add_argument("--dir", help="the cluster's directory (default a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the directory")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}")
    report = run_failover(
        FailoverOptions(
            faults=args.faults,
            seed=args.seed,
            kinds=kinds,
            directory=args.dir,
            keep=args.keep,
            verbose=args.verbose,
        )
    )
    print(report.summary(), flush=True)
    return 1 if report.violations or report.liveness else 0


if __name__ == "__main__":
    raise SystemExit(main())
