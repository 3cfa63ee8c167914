"""Cluster mode against a single node, in the same run (issue 19 targets).

    python -m benchmarks.bench_cluster [--rounds 3] [--jobs 20000] [--pin]
        [--appends-in-flight N [N ...]]   # e.g. 1 4: two clusters, rounds interleaved
        [--clients]                       # also as users run it: SeppClient and Worker
        [--bound K [K ...]] [--bound-colocated]  # the least a leader does (bound_leader.py)

Starts a local three-server JetStream cluster (tools/cluster.py: R3, file
storage, `sync_interval: always`) and three `sepp serve --cluster` nodes on it
(admin listener on 127.0.0.1:0 for /metrics, follower snapshots off); then, in
each round, a fresh single-node `sepp serve` (`sync_data`, the default durable
setting; `bench_e2e.one_run`) and the cluster's leader, one after the other, are
driven by the lean load generator (`loadgen.py`) at the 50/50 load: 50 producer
connections enqueue `--jobs` 256-byte jobs one per request, then 50 worker
connections reserve + ack them (benchmark-method.md; no latency phase). Each
cluster round uses its own queue. Prints every round, then the medians: enqueue
and drain jobs/s of each, the cluster/single ratios (target >= 60 %), and the
follower lag (target p99 <= 50 ms), the CPU of each of the cluster's
processes (nats 1-3, leader, followers, probe; share of one core), and the
leader's appends: how many, and how long each took from its request to
JetStream's acknowledgement (its `sepp_cluster_append_duration_seconds`).

Follower lag, as the two followers measure it: their
`sepp_cluster_replication_lag_seconds` histograms (/metrics, read before and
after each round, both followers added up): per log message, from JetStream
storing it (the stream leader's clock, before it acknowledges the leader's
append) to the follower having applied it (same machine, one clock). Shown: the
share of messages applied within 50 ms (the target, exactly: p99 <= 50 ms means
at least 99 %), and p50 / p99 interpolated inside the histogram's buckets (as
Prometheus' histogram_quantile does; the buckets around 50 ms are 25-50 and
50-100 ms, so these two are estimates).

`--probe-lag` adds the lag probe (below), for exact per-message figures at the
price of a fourth follower process on the two cores (it slows the cluster, and
so lowers the ratio, by about its own CPU: 13-18 % of a core measured).

The probe: a fourth follower process tails the stream with
the followers' own apply path -- `JetStreamLog.read_from` + `LogApplier.apply`,
as `ClusterNode._tail` does -- and also subscribes to `_INBOX.>`, where NATS
delivers it a copy of every reply, JetStream's publish acknowledgements to the
leader included (`{"stream": "sepp", "seq": N}`). Lag = the probe's clock when
it had applied message N minus its clock when N's acknowledgement went by
("leader's append acknowledged -> follower applied", one clock, no skew; negative
when the follower applied first). Also shown: applied minus the batch's decided
time (`time_ms`, the leader's wall clock for its newest record, same machine),
which adds the batch's wait for its group commit and its append. Only batches
applied inside a round's load window count. Both
probe figures carry the probe's own delays: an acknowledgement is stamped when the
probe's loop gets to it, so a backlogged probe understates ack -> applied;
decided -> applied is an upper bound.

`--clients` measures what users run as well: in each round, after the load
generator, `bench_client`'s `producer` (one `SeppClient`, 50 concurrent single-job
`enqueue` calls, coalesced by the client) and `worker` (one `Worker`, no-op
handler, `max_in_flight=50`) phases, one client process, against a fresh single
node (`sync_data`) and then against the cluster -- given all three nodes'
addresses, followers first, so the client finds the leader as a user's would
(`SeppClient.connect("h1:p,h2:p,h3:p")`). Printed last: medians of jobs/s and the
client process's CPU per job, single node and cluster, and cluster/single.

With several `--appends-in-flight` values, one cluster (JetStream servers, nodes and
any probe) runs per value, all started first; each round runs the single node, then each
cluster in turn (the others idle meanwhile).

`--bound K [K ...]` adds, per value and round, the bound leader
(`benchmarks/bound_leader.py`): a process on the first cluster's JetStream
servers that appends each request's frame, as it came, to a stream of its own
(fenced, whatever is buffered as one message, K appends in flight) and answers
once the append is acknowledged, with no state machine and nothing tailing the
stream. It is what a leader whose own work cost nothing would reach on this
machine at this load: the real leader's rate cannot exceed it. The sepp nodes
sit idle meanwhile. `--bound-colocated` adds each K again with the bound leader
connected to the server that leads its stream (a real leader connects to one of
the three at random).

Pinning: off by default for both (the cluster's seven processes cannot share one
core fairly with each other); `--pin` pins the single node and the cluster's
processes to the server core and the load generator to the driver core, as bench_e2e
does (`common.bench_cores`). The
cluster stays up (idle) while the single node runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack

from benchmarks import bench_client
from benchmarks.bench_e2e import loadgen, one_run
from benchmarks.common import (
    ServeProcess,
    bench_cores,
    fsync_rate,
    machine_line,
    median,
    print_table,
    server_core,
    taskset,
    terminate,
)
from sepp.protocol.framing import LENGTH_PREFIX
from tools import cluster as local_cluster

ROOT = Path(__file__).resolve().parent.parent
NODES = ("b1", "b2", "b3")
# How long the nodes get to elect a leader after start.
LEADER_DEADLINE_S = 60.0
# The followers' histogram read after each round (sepp/admin/metrics.py).
LAG_METRIC = "sepp_cluster_replication_lag_seconds_bucket"
# The leader's, read likewise: how long its appends took.
APPEND_METRIC = "sepp_cluster_append_duration_seconds_bucket"
# The target: a follower's lag p99 at most this many seconds.
LAG_TARGET_S = 0.05
# `--clients`: bench_client's phases run against the single node and the cluster.
CLIENT_PHASES = ("producer", "worker")


def _hello(port: int) -> dict[str, Any]:
    """The hello answer of the node on `port` (raw wire protocol)."""
    frame = msgpack.packb([1, "hello", {"protocol": 1, "client": "bench-cluster"}])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(LENGTH_PREFIX.pack(len(frame)) + frame)
        data = b""
        while len(data) < LENGTH_PREFIX.size or len(data) < LENGTH_PREFIX.size + int(
            LENGTH_PREFIX.unpack_from(data)[0]
        ):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the node closed the connection")
            data += chunk
    _, status, body = msgpack.unpackb(data[LENGTH_PREFIX.size :])
    if status != "ok":
        raise RuntimeError(f"hello refused: {body}")
    return dict(body)


def _cpu_each(pids: list[int]) -> list[float]:
    """CPU seconds (user + system) of each process so far (0 once it is gone)."""
    seconds = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            seconds.append(0.0)
            continue
        seconds.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return seconds


class Cluster:
    """Three JetStream servers, three sepp nodes and the lag probe."""

    def __init__(
        self,
        pin: bool,
        appends_in_flight: int | None = None,
        append_latency: bool = False,
        probe: bool = False,
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="sepp-bench-cluster-")
        self.core = server_core() if pin else None
        self.js = local_cluster.start_cluster(self.dir)
        self.nodes: list[ServeProcess] = []
        self.probe: subprocess.Popen[bytes] | None = None
        self.probe_out = os.path.join(self.dir, "lag.txt")
        try:
            if self.core is not None:
                for server in self.js.servers:
                    # -a: every thread; the Go runtime has started several by now,
                    # and -p alone moves only the main one.
                    subprocess.run(["taskset", "-apc", self.core, str(server.pid)], check=True,
                                   capture_output=True)  # fmt: skip
            env = dict(os.environ)
            env.update(
                SEPP_CLUSTER__MONITOR_URLS=",".join(self.js.monitor_urls()),
                SEPP_CLUSTER__SNAPSHOT_EVERY_MESSAGES="0",
                SEPP_LOGGING__LEVEL="warning",
            )
            if appends_in_flight is not None:
                env["SEPP_CLUSTER__APPENDS_IN_FLIGHT"] = str(appends_in_flight)
            urls = ",".join(self.js.urls())
            for name in NODES:
                node_dir = tempfile.mkdtemp(prefix=f"sepp-bench-{name}-", dir=self.dir)
                args = ["--cluster", urls, "--node-id", name, "--admin-listen", "127.0.0.1:0"]
                self.nodes.append(ServeProcess(node_dir, "sync_data", env, core=self.core,
                                               args=args, wait_for_admin=True))  # fmt: skip
            self.leader = self._wait_leader()
            if not probe:
                return
            self.probe = subprocess.Popen(
                [*taskset(self.core), sys.executable, "-m", "benchmarks.bench_cluster",
                 "--probe", urls, "--probe-out", self.probe_out,
                 *(["--append-latency"] if append_latency else [])],
                cwd=ROOT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise

    def _wait_leader(self) -> ServeProcess:
        deadline = time.monotonic() + LEADER_DEADLINE_S
        while time.monotonic() < deadline:
            for node in self.nodes:
                try:
                    cluster = _hello(node.port).get("cluster") or {}
                except (OSError, RuntimeError):
                    continue
                if cluster.get("role") == "leader":
                    return node
            time.sleep(0.1)
        raise RuntimeError(f"no sepp node led within {LEADER_DEADLINE_S} s")

    def client_addr(self) -> str:
        """Every node's address, as a user gives them to `SeppClient.connect`: the
        followers first, so the client finds the leader through a redirect."""
        followers = [n for n in self.nodes if n is not self.leader]
        return ",".join(f"127.0.0.1:{n.port}" for n in [*followers, self.leader])

    def roles(self) -> list[tuple[str, int]]:
        """(role, pid) of every process of the cluster, the probe included."""
        roles = [(f"nats {i + 1}", s.pid) for i, s in enumerate(self.js.servers)]
        followers = [n for n in self.nodes if n is not self.leader]
        roles.append(("leader", self.leader.proc.pid))
        roles += [(f"follower {i + 1}", n.proc.pid) for i, n in enumerate(followers)]
        if self.probe is not None:
            roles.append(("probe", self.probe.pid))
        return roles

    def follower_lag_buckets(self) -> dict[float, float]:
        """Both followers' replication-lag histograms added up: upper bound (s,
        inf last) -> messages applied within it so far (cumulative)."""
        return _buckets([n for n in self.nodes if n is not self.leader], LAG_METRIC)

    def leader_append_buckets(self) -> dict[float, float]:
        """The leader's append-duration histogram (request -> JetStream's ack)."""
        return _buckets([self.leader], APPEND_METRIC)

    def lags_between(self, start_ms: float, end_ms: float) -> dict[str, list[float]]:
        """The probe's samples of batches applied in [start_ms, end_ms]."""
        lags: dict[str, list[float]] = {"ack": [], "decided": [], "append": []}
        if self.probe is None:
            return lags
        with open(self.probe_out) as f:
            for line in f:
                kind, _, rest = line.partition(" ")
                parts = rest.split()
                if kind in lags and len(parts) == 2 and start_ms <= float(parts[0]) <= end_ms:
                    lags[kind].append(float(parts[1]))
        return lags

    def stop(self) -> None:
        if self.probe is not None:
            terminate(self.probe)
        for node in reversed(self.nodes):
            node.stop()
        local_cluster.stop_cluster(self.js)
        shutil.rmtree(self.dir, ignore_errors=True)


class BoundLeader:
    """`benchmarks/bound_leader.py` on a cluster's JetStream servers, a stream of
    its own (`--bound`): the rate a leader whose own work cost nothing could reach."""

    def __init__(self, cluster: Cluster, in_flight: int, colocate: bool) -> None:
        self.in_flight = in_flight
        self.label = _bound_label(in_flight, colocate)
        self.proc = subprocess.Popen(
            [*taskset(cluster.core), sys.executable, "-m", "benchmarks.bound_leader",
             "--nats", ",".join(cluster.js.urls()),
             "--monitor", ",".join(cluster.js.monitor_urls()),
             "--stream", f"bound{in_flight}{'c' if colocate else ''}",
             "--appends-in-flight", str(in_flight), *(["--colocate"] if colocate else [])],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"bound leader did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])

    def run(self, connections: int, jobs: int, pin: bool, queue: str) -> dict[str, Any]:
        return loadgen(
            self.port, pin, connections=connections, jobs=jobs,
            phases=["enqueue", "drain"], queue=queue, server_pid=self.proc.pid,
        )  # fmt: skip

    def stop(self) -> None:
        terminate(self.proc)


def _buckets(nodes: list[ServeProcess], metric: str) -> dict[float, float]:
    """The histogram `metric` (its `_bucket` series) of these nodes' /metrics,
    added up: upper bound (s, inf last) -> observations within it (cumulative)."""
    buckets: dict[float, float] = {}
    for node in nodes:
        with urllib.request.urlopen(f"{node.admin}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for line in text.splitlines():
            if line.startswith(metric + "{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def _bucket_quantile(buckets: dict[float, float], fraction: float) -> float:
    """A quantile (ms) of a cumulative histogram, interpolated linearly inside
    its bucket (Prometheus' histogram_quantile); nan when it is empty, the
    highest finite bound when the quantile falls in the +Inf bucket."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank = fraction * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower * 1000
            inside = count - below
            share = (rank - below) / inside if inside else 1.0
            return (lower + (bound - lower) * share) * 1000
        lower, below = bound, count
    return lower * 1000


def _within(buckets: dict[float, float], bound: float) -> float:
    """The share of a cumulative histogram's observations at most `bound` (a
    bucket bound); nan when it is empty."""
    total = buckets.get(float("inf"), 0.0)
    return buckets[bound] / total if total else float("nan")


def _added(results: list[dict[str, Any]], key: str) -> dict[float, float]:
    """The histograms `key` of several rounds, added up bucket by bucket."""
    total: dict[float, float] = {}
    for r in results:
        for bound, count in r[key].items():
            total[bound] = total.get(bound, 0.0) + count
    return total


def _bucket_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def cluster_round(
    cluster: Cluster, connections: int, jobs: int, pin: bool, queue: str
) -> dict[str, Any]:
    roles = cluster.roles()
    buckets0 = cluster.follower_lag_buckets()
    appends0 = cluster.leader_append_buckets()
    each0, wall0 = _cpu_each([pid for _, pid in roles]), time.time()
    result = loadgen(
        cluster.leader.port,
        pin,
        connections=connections,
        jobs=jobs,
        phases=["enqueue", "drain"],
        queue=queue,
        server_pid=cluster.leader.proc.pid,
    )
    each1, wall1 = _cpu_each([pid for _, pid in roles]), time.time()
    result["role_cpu"] = [
        (role, (b - a) / (wall1 - wall0)) for (role, _), a, b in zip(roles, each0, each1)
    ]
    # The cluster's own processes (3 nats + 3 sepp), the probe left out.
    result["cluster_cpu"] = sum(share for role, share in result["role_cpu"] if role != "probe")
    # The followers' lag: what they applied during the round and the moment after.
    result["follower_lag"] = _bucket_delta(cluster.follower_lag_buckets(), buckets0)
    result["leader_appends"] = _bucket_delta(cluster.leader_append_buckets(), appends0)
    # Give the probe a moment to apply the last batches of the window.
    deadline = time.monotonic() + 5
    lags = cluster.lags_between(wall0 * 1000, wall1 * 1000)
    while cluster.probe is not None and not lags["ack"] and time.monotonic() < deadline:
        time.sleep(0.2)
        lags = cluster.lags_between(wall0 * 1000, wall1 * 1000)
    result["lags"] = lags["ack"]
    result["decided_lags"] = lags["decided"]
    result["appends"] = lags["append"]
    return result


async def _probe(urls: str, out: str, append_latency: bool) -> None:
    """The lag probe: a follower's apply path on the stream. Lines `ack WALL LAG`
    (LAG: ms from the leader's append acknowledgement, as seen on `_INBOX.>`, to
    this follower having applied that message; negative if applied first) and
    `decided WALL LAG` (ms from the batch's decided time), WALL the apply time;
    with `append_latency`, `append WALL MS`: from the leader's publish going by
    (a plain subscription to the log's subject) to its acknowledgement."""
    from sepp.cluster import jetstream
    from sepp.cluster.logengine import LogApplier, new_cluster_engine
    from sepp.server.config import load_config

    nc = await jetstream.connect(urls)
    log = jetstream.JetStreamLog(nc, jetstream.ClusterNames().stream)
    applier = LogApplier(new_cluster_engine(load_config(None).core_config()))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    f = open(out, "w", buffering=1)  # noqa: SIM115 (closed below)
    acked: dict[int, float] = {}  # log seq -> when its acknowledgement went by
    applied: dict[int, float] = {}  # log seq -> applied before its ack was seen

    async def on_reply(msg: Any) -> None:
        # The leader's publish acknowledgements: {"stream": "sepp", "seq": N}.
        now_ms = time.time_ns() / 1e6
        if not msg.data.startswith(b'{"stream"'):
            return
        try:
            answer = json.loads(msg.data)
        except ValueError:
            return
        if answer.get("stream") != log.stream or "error" in answer or "seq" not in answer:
            return
        seq = int(answer["seq"])
        sent = published.pop(msg.subject, None)
        if sent is not None:
            f.write(f"append {now_ms:.1f} {now_ms - sent:.2f}\n")
        at = applied.pop(seq, None)
        if at is None:
            acked[seq] = now_ms
        else:
            f.write(f"ack {at:.1f} {at - now_ms:.2f}\n")

    published: dict[str, float] = {}  # reply subject -> when the publish went by

    async def on_publish(msg: Any) -> None:
        if msg.reply:
            published[msg.reply] = time.time_ns() / 1e6

    await nc.subscribe("_INBOX.>", cb=on_reply)
    if append_latency:
        await nc.subscribe(log.subject, cb=on_publish)

    async def tail() -> None:
        async for entry in log.read_from(1):
            applier.apply(entry)
            now_ms = time.time_ns() / 1e6
            f.write(f"decided {now_ms:.1f} {now_ms - applier.tip.time_ms:.1f}\n")
            at = acked.pop(entry.seq, None)
            if at is None:
                applied[entry.seq] = now_ms
            else:
                f.write(f"ack {now_ms:.1f} {now_ms - at:.2f}\n")

    task = asyncio.ensure_future(tail())
    waiter = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    waiter.cancel()
    f.close()
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument(
        "--pin", action="store_true", help="cluster + server on one core, load on the other"
    )
    parser.add_argument(
        "--appends-in-flight",
        type=int,
        nargs="+",
        help="the nodes' [cluster] appends_in_flight (default 4); several values: one "
        "cluster each, measured side by side, rounds interleaved",
    )
    parser.add_argument(
        "--clients",
        action="store_true",
        help="also run, each round, bench_client's producer (one SeppClient, 50 concurrent "
        "enqueue calls) and worker (one Worker, no-op, max_in_flight 50) phases against the "
        "single node and the cluster (all three addresses given)",
    )
    parser.add_argument(
        "--bound",
        type=int,
        nargs="+",
        metavar="K",
        help="also drive, each round, the bound leader (benchmarks/bound_leader.py: no state "
        "machine, each request's frame appended as it came, K appends in flight) on the "
        "first cluster's JetStream servers: the most any leader could do there",
    )
    parser.add_argument(
        "--bound-colocated",
        action="store_true",
        help="with --bound: also each K with the bound leader connected to the server that "
        "leads its stream (bound_leader.py --colocate)",
    )
    parser.add_argument("--probe", metavar="URLS", help=argparse.SUPPRESS)
    parser.add_argument("--probe-out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--probe-lag",
        action="store_true",
        help="also run the lag probe (a fourth follower process: exact per-message lag, "
        "at the cost of its CPU on the cluster's cores)",
    )
    parser.add_argument(
        "--append-latency",
        action="store_true",
        help="also time each leader append (publish seen -> ack seen) in the probe (implies "
        "--probe-lag); it then receives every batch twice",
    )
    args = parser.parse_args()
    if args.probe:
        asyncio.run(_probe(args.probe, args.probe_out, args.append_latency))
        return

    print(machine_line())
    probe = fsync_rate()
    print(
        f"disk: 4 KiB append + fdatasync median {probe['median_us']:.0f} us, "
        f"{probe['syncs_per_s']:,.0f} syncs/s"
    )
    if args.pin:
        server, driver = bench_cores()
        print(f"pinning: server/cluster core {server}, load generator core {driver}")
    else:
        print("pinning: none")
    variants: list[int | None] = list(args.appends_in_flight or [None])
    clusters: dict[int | None, Cluster] = {}
    rows = []
    single: list[dict[str, Any]] = []
    clustered: dict[int | None, list[dict[str, Any]]] = {v: [] for v in variants}
    single_clients: list[dict[str, Any]] = []
    cluster_clients: dict[int | None, list[dict[str, Any]]] = {v: [] for v in variants}
    bounds: list[BoundLeader] = []
    bounded: dict[str, list[dict[str, Any]]] = {}
    try:
        for variant in variants:
            clusters[variant] = cluster = Cluster(
                args.pin, variant, args.append_latency, args.probe_lag or args.append_latency
            )
            print(
                f"cluster {_label(variant)}: leader port {cluster.leader.port}, "
                f"nats {','.join(cluster.js.urls())}"
            )
        for k in args.bound or []:
            for colocate in [False, True] if args.bound_colocated else [False]:
                bounds.append(BoundLeader(clusters[variants[0]], k, colocate))
                bounded[bounds[-1].label] = []
        for n in range(args.rounds):
            runs: list[tuple[str, dict[str, Any]]] = []
            s = one_run("sync_data", args.connections, args.jobs, args.pin, latency=False)
            single.append(s)
            runs.append(("single", s))
            for variant in variants:
                c = cluster_round(
                    clusters[variant], args.connections, args.jobs, args.pin, f"bench{n}"
                )
                clustered[variant].append(c)
                runs.append((f"cluster {_label(variant)}", c))
            for bound in bounds:
                b = bound.run(args.connections, args.jobs, args.pin, f"bench{n}")
                bounded[bound.label].append(b)
                runs.append((bound.label, b))
            for label, r in runs:
                lags, decided = r.get("lags"), r.get("decided_lags")
                own = r.get("follower_lag")
                rows.append((
                    n + 1, label, r["enqueue"]["jobs_per_s"], r["drain"]["jobs_per_s"],
                    f"{_within(own, LAG_TARGET_S):.2%}" if own else "",
                    _bucket_quantile(own, 0.5) if own else "",
                    _bucket_quantile(own, 0.99) if own else "",
                    int(own[float("inf")]) if own else "",
                    _percentile(lags, 0.5) if lags else "", _percentile(lags, 0.99) if lags else "",
                    _percentile(decided, 0.99) if decided else "",
                ))  # fmt: skip
                print("  ", rows[-1], flush=True)
            if args.clients:
                run_clients(n, clusters, args, single_clients, cluster_clients)
    finally:
        for bound in bounds:
            bound.stop()
        for cluster in clusters.values():
            cluster.stop()
    print()
    print_table(
        [
            "round",
            "run",
            "enqueue jobs/s",
            "drain jobs/s",
            "followers' lag <= 50 ms",
            "~p50 ms",
            "~p99 ms",
            "messages applied",
            "probe lag p50 ms",
            "probe lag p99 ms",
            "probe decided->applied p99 ms",
        ],
        rows,
    )

    def med(results: list[dict[str, Any]], phase: str) -> float:
        return median([r[phase]["jobs_per_s"] for r in results])

    summary = []
    for variant in variants:
        results = clustered[variant]
        added = _added(results, "follower_lag")
        for phase in ("enqueue", "drain"):
            summary.append((
                f"{phase}, {_label(variant)}", med(single, phase), med(results, phase),
                f"{med(results, phase) / med(single, phase):.0%}",
                f"{_within(added, LAG_TARGET_S):.2%}",
                _bucket_quantile(added, 0.5), _bucket_quantile(added, 0.99),
            ))  # fmt: skip
    for label, results in bounded.items():
        for phase in ("enqueue", "drain"):
            summary.append((
                f"{phase}, {label}", med(single, phase), med(results, phase),
                f"{med(results, phase) / med(single, phase):.0%}", "", "", "",
            ))  # fmt: skip
    print()
    print_table(
        [
            "medians",
            "single jobs/s",
            "cluster jobs/s",
            "cluster/single (target >= 60%)",
            "followers' lag <= 50 ms (target >= 99%)",
            "~p50 ms",
            "~p99 ms (target <= 50)",
        ],
        summary,
    )
    probe_figures = (
        ("lags", "probe", "ack -> applied"),
        ("appends", "leader's appends", "publish -> ack"),
    )
    for key, who, span in probe_figures:
        for variant in variants:
            values = [v for r in clustered[variant] for v in r[key]]
            if values:
                print(
                    f"{who}, {_label(variant)} (probe): {span} p50 {_percentile(values, 0.5):.2f} "
                    f"ms, p99 {_percentile(values, 0.99):.2f} ms over {len(values)} messages"
                )
    print(
        "(followers' lag = JetStream stored a message -> a follower applied it, both "
        "followers, all rounds, from their histograms (~: interpolated in a bucket); "
        "CPU, share of one core over each run: single server "
        + " / ".join(f"{r['enqueue']['server_cpu']:.0%}" for r in single)
        + "; "
        + "; ".join(
            f"cluster {_label(v)} (3 nats + 3 sepp) "
            + " / ".join(f"{r['cluster_cpu']:.0%}" for r in clustered[v])
            for v in variants
        )
        + "; load generator in the cluster rounds (enqueue) "
        + " / ".join(f"{r['enqueue']['client_cpu']:.0%}" for v in variants for r in clustered[v])
        + ")"
    )
    for variant in variants:
        shares: dict[str, list[float]] = {}
        for r in clustered[variant]:
            for role, share in r["role_cpu"]:
                shares.setdefault(role, []).append(share)
        print(
            f"CPU by process, {_label(variant)}, median of rounds (share of one core): "
            + ", ".join(f"{role} {median(v):.0%}" for role, v in shares.items())
        )
        appends = _added(clustered[variant], "leader_appends")
        jobs = sum(r["enqueue"]["jobs"] for r in clustered[variant])
        print(
            f"leader's appends, {_label(variant)}, all rounds (its /metrics): "
            f"{appends.get(float('inf'), 0):,.0f} for {jobs:,} jobs enqueued and drained, "
            f"request -> acknowledgement ~p50 {_bucket_quantile(appends, 0.5):.1f} ms, "
            f"~p99 {_bucket_quantile(appends, 0.99):.1f} ms"
        )
    for label, results in bounded.items():
        print(
            f"{label}, its CPU, median of rounds (share of one core): enqueue "
            f"{median([r['enqueue']['server_cpu'] for r in results]):.0%}, drain "
            f"{median([r['drain']['server_cpu'] for r in results]):.0%}"
        )
    if args.clients:
        print()
        print_table(CLIENT_HEADERS, client_rows(single_clients, cluster_clients))
        print(
            "(clients: one client process using only the public API, as bench_client: "
            "producer = one SeppClient, 50 concurrent enqueue calls; worker = one Worker, "
            "no-op handler, max_in_flight 50; the cluster's client is given all three "
            "addresses, followers first)"
        )


def run_clients(
    n: int,
    clusters: dict[int | None, Cluster],
    args: argparse.Namespace,
    single: list[dict[str, Any]],
    clustered: dict[int | None, list[dict[str, Any]]],
) -> None:
    """One round of `--clients`: bench_client's phases against a fresh single node
    (`sync_data`, as the loadgen rounds), then against each cluster."""
    phases = list(CLIENT_PHASES)
    s = bench_client.run_once("sync_data", phases, args.jobs, pin=args.pin)
    single.append(s)
    parts = [f"single {_client_brief(s)}"]
    for variant, cluster in clusters.items():
        leader = cluster.leader.proc.pid
        c = bench_client.run_child(cluster.client_addr(), leader, phases, args.jobs, pin=args.pin)
        clustered[variant].append(c)
        parts.append(f"cluster {_label(variant)} {_client_brief(c)}")
    print(f"   clients, round {n + 1}: " + "; ".join(parts), flush=True)


def _client_brief(result: dict[str, Any]) -> str:
    return ", ".join(
        f"{p} {result[p]['jobs_per_s']:,.0f}/s {result[p]['client_us_per_job']:.0f} µs"
        for p in CLIENT_PHASES
        if p in result
    )


def client_rows(
    single: list[dict[str, Any]], clustered: dict[int | None, list[dict[str, Any]]]
) -> list[tuple[object, ...]]:
    """The `--clients` table: per phase and cluster, medians over rounds of jobs/s
    and client CPU µs per job, single node and cluster, and cluster/single."""
    rows: list[tuple[object, ...]] = []
    for variant, results in clustered.items():
        for phase in CLIENT_PHASES:
            one = bench_client.summarize(phase, single)
            many = bench_client.summarize(phase, results)
            if not one or not many:
                continue
            rows.append((
                f"{phase}, {_label(variant)}", one["jobs_per_s"], f"{one['client_us_per_job']:.1f}",
                many["jobs_per_s"], f"{many['client_us_per_job']:.1f}",
                f"{many['jobs_per_s'] / one['jobs_per_s']:.0%}",
            ))  # fmt: skip
    return rows


CLIENT_HEADERS = [
    "clients (medians)",
    "single jobs/s",
    "single client µs/job",
    "cluster jobs/s",
    "cluster client µs/job",
    "cluster/single",
]


def _label(appends_in_flight: int | None) -> str:
    return f"{appends_in_flight or 'default 4'} in flight"


def _bound_label(appends_in_flight: int, colocate: bool) -> str:
    where = ", on the stream leader's server" if colocate else ""
    return f"bound leader, {appends_in_flight} in flight{where}"


if __name__ == "__main__":
    main()
