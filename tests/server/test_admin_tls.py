"""The admin listener over TLS (`[admin] tls_cert_path` / `tls_key_path`): https
for the admin API, health and metrics, `sepp serve` printing an https URL, and
`sepp backup --tls-ca` verifying it (issue 15 item 3: every CLI command that talks
to a server takes TLS options). The settings are checked like the native
listener's: both or neither, and a file that cannot be used is named."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sepp.core.config import ConfigError
from sepp.server.config import load_config, load_tls_context
from tests.inprocess import in_process, in_process_config
from tests.server.test_backup import admin_url_of, sepp_async, verify
from tests.support import self_signed_certificate

pytestmark = pytest.mark.usefixtures("in_process_env")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path / "cert.pem", tmp_path / "key.pem")


def tls_env(cert: Path, key: Path) -> dict[str, str]:
    return {
        "admin__listen_addr": "127.0.0.1:0",
        "admin__tls_cert_path": str(cert),
        "admin__tls_key_path": str(key),
    }


async def test_the_admin_listener_answers_over_https_verified_by_its_certificate(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    async with in_process(in_process_config(**tls_env(cert, key))) as server:
        assert server.admin_address is not None
        host, port = server.admin_address
        trust = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            for path in ("/livez", "/readyz", "/admin/api/v1/queues"):
                async with session.get(f"https://{host}:{port}{path}", ssl=trust) as response:
                    assert response.status == 200, path
            # Plain http to a TLS listener gets no answer.
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://{host}:{port}/livez") as response:
                    await response.read()
            # An unknown certificate is refused by a verifying client.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with session.get(f"https://{host}:{port}/livez") as response:
                    await response.read()


@pytest.mark.parametrize(
    ("set_", "named"),
    [
        ({"SEPP_ADMIN__TLS_CERT_PATH": "CERT"}, "admin.tls_key_path"),
        ({"SEPP_ADMIN__TLS_KEY_PATH": "KEY"}, "admin.tls_key_path"),
    ],
)
def test_admin_tls_needs_both_files(
    set_: dict[str, str], named: str, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    env = {k: v.replace("CERT", str(cert)).replace("KEY", str(key)) for k, v in set_.items()}
    with pytest.raises(ConfigError) as caught:
        load_config(None, env=env)
    assert named in str(caught.value)


def test_an_unreadable_admin_certificate_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    env = {"SEPP_ADMIN__TLS_CERT_PATH": str(missing), "SEPP_ADMIN__TLS_KEY_PATH": str(missing)}
    config = load_config(None, env=env)
    with pytest.raises(ConfigError) as caught:
        load_tls_context(config, "admin")
    assert "admin.tls_cert_path" in str(caught.value) and str(missing) in str(caught.value)


async def test_sepp_backup_verifies_an_https_admin_listener_with_tls_ca(
    server_factory: Any, tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    server = server_factory(
        args=["--admin-listen", "127.0.0.1:0"],
        env={"SEPP_ADMIN__TLS_CERT_PATH": str(cert), "SEPP_ADMIN__TLS_KEY_PATH": str(key)},
    )
    url = admin_url_of(server)
    assert url.startswith("https://127.0.0.1:"), url
    unverified = tmp_path / "unverified"
    code, _out, err = await sepp_async("backup", str(unverified), "--admin-addr", url)
    assert code == 1 and "certificate" in err.lower(), err
    assert not unverified.exists()
    copy = tmp_path / "copy"
    code, _out, err = await sepp_async(
        "backup", str(copy), "--admin-addr", url, "--tls-ca", str(cert)
    )
    assert code == 0, err
    assert verify(copy).returncode == 0
