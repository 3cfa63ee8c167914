"""TLS: the client verifies the server against a private CA (`tls_ca_cert`)
or an `ssl.SSLContext`, and refuses a server it cannot verify."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest

from sepp.client import ConnectError, SeppClient
from tests.client.fakeserver import FakeServer
from tests.support import self_signed_certificate

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert, key)."""
    where = tmp_path_factory.mktemp("tls")
    return self_signed_certificate(where / "cert.pem", where / "key.pem")


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_tls_with_a_private_ca(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    async with FakeServer(ssl=server_context(cert, key), api_key="k") as fake:
        client = await SeppClient.connect(fake.address, api_key="k", tls_ca_cert=cert.read_bytes())
        assert (await client.health()).serving
        await client.close()
        context = ssl.create_default_context(cafile=str(cert))
        client = await SeppClient.connect(fake.address, api_key="k", tls=context)
        assert (await client.health()).serving
        await client.close()


async def test_tls_refuses_an_unverifiable_server(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    async with FakeServer(ssl=server_context(cert, key)) as fake:
        with pytest.raises(ConnectError):
            await SeppClient.connect(fake.address, tls=True)  # system roots: not trusted


async def test_tls_against_the_real_server(server_factory, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server = server_factory(
        env={"SEPP_SERVER__TLS_CERT_PATH": str(cert), "SEPP_SERVER__TLS_KEY_PATH": str(key)}
    )
    client = await SeppClient.connect(f"https://{server.address}", tls_ca_cert=cert.read_bytes())
    assert (await client.get_server_info()).version
    await client.close()
    assert server.stop() == 0
