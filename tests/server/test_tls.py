"""TLS on the job listener: configured with a certificate and key, the server
speaks the same protocol inside TLS and nothing outside it."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest

from tests.server.conftest import RawClient, job
from tests.support import self_signed_certificate

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert, key)."""
    where = tmp_path_factory.mktemp("tls")
    return self_signed_certificate(where / "cert.pem", where / "key.pem")


@pytest.fixture
def tls_server(server_factory, certificate):
    cert, key = certificate
    return server_factory(
        env={
            "SEPP_SERVER__TLS_CERT_PATH": str(cert),
            "SEPP_SERVER__TLS_KEY_PATH": str(key),
            "SEPP_AUTH__API_KEYS": '[{name="a", key="s3cret"}]',
        }
    )


async def test_the_protocol_runs_inside_tls(tls_server, certificate, queue_names):
    context = ssl.create_default_context(cafile=str(certificate[0]))
    client = await RawClient.connect(tls_server.address, tls=context)
    assert (await client.hello(api_key="s3cret"))["auth_required"] is True
    q = next(queue_names)
    (job_id,) = await client.enqueue_ids(job(q))
    (delivered,) = await client.reserve([q])
    assert delivered["id"] == job_id
    assert "TLS" in tls_server.log()


async def test_a_plain_tcp_client_gets_nothing_and_the_server_keeps_serving(
    tls_server, certificate
):
    plain = await RawClient.connect(tls_server.address)
    plain.send("hello", {"protocol": 1, "api_key": "s3cret"})
    await plain.wait_closed()
    assert plain.arrivals == []
    context = ssl.create_default_context(cafile=str(certificate[0]))
    client = await RawClient.connect(tls_server.address, tls=context)
    assert await client.ok("health") == {"status": "serving"}


def test_a_certificate_without_its_key_is_a_configuration_error(server_factory, certificate):
    with pytest.raises(RuntimeError, match="tls_cert_path and tls_key_path"):
        server_factory(env={"SEPP_SERVER__TLS_CERT_PATH": str(certificate[0])})


def tls_env(certificate, **extra: str) -> dict[str, str]:
    cert, key = certificate
    return {
        "SEPP_SERVER__TLS_CERT_PATH": str(cert),
        "SEPP_SERVER__TLS_KEY_PATH": str(key),
        **extra,
    }


async def test_a_tls_handshake_that_never_finishes_is_closed_after_its_timeout(
    server_factory, certificate
):
    server = server_factory(
        env=tls_env(
            certificate,
            SEPP_SERVER__TLS_HANDSHAKE_TIMEOUT_MS="200",
            SEPP_SERVER__HANDSHAKE_TIMEOUT_MS="60000",
        )
    )
    stalled = await RawClient.connect(server.address)  # TCP only: no ClientHello
    await stalled.wait_closed()
    assert stalled.arrivals == []
    context = ssl.create_default_context(cafile=str(certificate[0]))
    client = await RawClient.connect(server.address, tls=context)
    assert await client.ok("health") == {"status": "serving"}


async def test_half_finished_tls_handshakes_count_as_connections_without_hello(
    server_factory, certificate
):
    server = server_factory(
        env=tls_env(
            certificate,
            SEPP_SERVER__MAX_UNAUTHENTICATED_CONNECTIONS="1",
            SEPP_SERVER__TLS_HANDSHAKE_TIMEOUT_MS="60000",
            SEPP_SERVER__HANDSHAKE_TIMEOUT_MS="60000",
        )
    )
    first = await RawClient.connect(server.address)  # a handshake that never starts
    second = await RawClient.connect(server.address)
    # The cap of one: the older handshake made room (closed, nothing in clear).
    await first.wait_closed()
    assert first.arrivals == []
    assert not second.closed
    context = ssl.create_default_context(cafile=str(certificate[0]))
    client = await RawClient.connect(server.address, tls=context)
    await second.wait_closed()
    assert await client.ok("health") == {"status": "serving"}
