"""Command-line mistakes end with one line naming the problem and exit code 1 or 2,
never a Python traceback (issue 12, section 5): a missing payload file, an empty
queue name, a malformed address, missing or mismatched TLS files, and any `sepp`
command (even `--help`) after a compiled module went stale."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from log_format._compiled import PURE_ENV
from tests.server.test_config_cli import clean_env, sepp, serve
from tests.support import self_signed_certificate

REPO = Path(__file__).resolve().parent.parent.parent


def assert_one_line(result: subprocess.CompletedProcess, code: int, *named: str) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in named:
        assert name in lines[0], (name, lines[0])


def test_a_missing_payload_file_is_one_line_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    result = sepp("enqueue", "q", "t", "--payload-file", str(missing), cwd=tmp_path)
    assert_one_line(result, 1, "--payload-file", str(missing), "No such file")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["enqueue", "", "t"], "queue must not be empty"),
        (["enqueue", "q", ""], "job_type must not be empty"),
        (["enqueue", "q", "t", "--delay", "1e20"], "--delay"),
        (["stats", "--addr", "localhost:http"], "--addr"),
        (["info", "--addr", ""], "--addr"),
    ],
    ids=["empty-queue", "empty-job-type", "huge-delay", "bad-port", "empty-addr"],
)
def test_an_unusable_argument_is_a_usage_error_in_one_line(
    tmp_path: Path, args: list[str], named: str
) -> None:
    assert_one_line(sepp(*args, cwd=tmp_path), 2, named)


# -- TLS files -----------------------------------------------------------------------------------


def _self_signed(where: Path, name: str) -> tuple[Path, Path]:
    return self_signed_certificate(where / f"{name}.crt", where / f"{name}.key")


@pytest.fixture(scope="module")
def two_certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    where = tmp_path_factory.mktemp("tls")
    cert_a, key_a = _self_signed(where, "a")
    _cert_b, key_b = _self_signed(where, "b")
    return {"cert": cert_a, "key": key_a, "other_key": key_b}


def tls_env(cert: Path, key: Path) -> dict[str, str]:
    return {"SEPP_SERVER__TLS_CERT_PATH": str(cert), "SEPP_SERVER__TLS_KEY_PATH": str(key)}


def test_a_missing_certificate_file_names_the_setting_and_the_file(
    tmp_path: Path, two_certificates: dict[str, Path]
) -> None:
    missing = tmp_path / "absent.crt"
    result = serve(tmp_path, env=tls_env(missing, two_certificates["key"]))
    assert_one_line(result, 1, "server.tls_cert_path", str(missing))
    assert not (tmp_path / "data").exists()  # refused before recovery


def test_a_missing_key_file_names_the_setting_and_the_file(
    tmp_path: Path, two_certificates: dict[str, Path]
) -> None:
    missing = tmp_path / "absent.key"
    result = serve(tmp_path, env=tls_env(two_certificates["cert"], missing))
    assert_one_line(result, 1, "server.tls_key_path", str(missing))


def test_a_key_of_another_certificate_names_both_files(
    tmp_path: Path, two_certificates: dict[str, Path]
) -> None:
    key = two_certificates["other_key"]
    result = serve(tmp_path, env=tls_env(two_certificates["cert"], key))
    assert_one_line(result, 1, "server.tls_key_path", str(key), str(two_certificates["cert"]))
    assert "does not match" in result.stderr


def test_a_certificate_file_without_a_certificate_names_the_setting(
    tmp_path: Path, two_certificates: dict[str, Path]
) -> None:
    not_a_cert = tmp_path / "junk.crt"
    not_a_cert.write_text("not a certificate\n")
    result = serve(tmp_path, env=tls_env(not_a_cert, two_certificates["key"]))
    assert_one_line(result, 1, "server.tls_cert_path", str(not_a_cert))


# -- a stale compiled build -----------------------------------------------------------------------


def _checkout_with_a_stale_extension(tmp_path: Path, module: str) -> Path:
    """A copy of the sepp and log_format packages in which `module` has an
    extension module older than its source (the build went stale)."""
    root = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", *(f"*{s}" for s in EXTENSION_SUFFIXES))
    for package in ("sepp", "log_format", "tools"):
        shutil.copytree(REPO / package, root / package, ignore=skip)
    source = root / Path(*module.split("."))
    source = source.with_suffix(".py")
    extension = source.with_name(source.stem + EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"not really an extension")
    os.utime(extension, (1_000_000, 1_000_000))
    os.utime(source, (2_000_000, 2_000_000))
    return root


@pytest.mark.parametrize("module", ["sepp.core.apply", "log_format.crc"])
@pytest.mark.parametrize("args", [["--help"], ["config", "example"]], ids=["help", "config"])
def test_any_sepp_command_after_the_build_went_stale_is_one_line(
    tmp_path: Path, module: str, args: list[str]
) -> None:
    root = _checkout_with_a_stale_extension(tmp_path, module)
    # What the `sepp` console script runs, under that name.
    script = root / "bin" / "sepp"
    script.parent.mkdir()
    script.write_text("import sys\nfrom sepp.server.cli import main\nsys.exit(main())\n")
    env = clean_env(PYTHONPATH=str(root))
    env.pop(PURE_ENV, None)
    result = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert_one_line(result, 1, "older than", "tools.compile", PURE_ENV)
    assert result.stderr.startswith("sepp: ")
    stem = module.rpartition(".")[2]
    assert stem in result.stderr


def test_sepp_log_after_the_build_went_stale_is_one_line(tmp_path: Path) -> None:
    root = _checkout_with_a_stale_extension(tmp_path, "log_format.crc")
    # What the `sepp-log` console script runs (tools/ is installed as sepp_tools;
    # its modules import each other relatively, so the folder name works too).
    script = root / "bin" / "sepp-log"
    script.parent.mkdir()
    script.write_text("import sys\nfrom tools.sepp_log import main\nsys.exit(main())\n")
    env = clean_env(PYTHONPATH=str(root))
    env.pop(PURE_ENV, None)
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert_one_line(result, 1, "older than", "crc", PURE_ENV)
    assert result.stderr.startswith("sepp-log: ")
