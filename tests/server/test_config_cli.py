"""`sepp config example`, configuration loading and precedence, and the exit codes
of `sepp serve` for configuration and start-up errors."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sepp._version import __version__
from sepp.core.config import ConfigError
from sepp.server.config import SCHEMA, load_config
from tests.server.conftest import connect

CLI = [sys.executable, "-m", "sepp.server.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any sepp setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    # No admin listener (its default port 9465 is one per machine) unless asked for.
    env["SEPP_ADMIN__LISTEN_ADDR"] = "off"
    env.update(extra)
    return env


def sepp(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        env=clean_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=60,
    )


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    """`sepp serve` expected to fail at start-up (so it never blocks)."""
    return sepp(
        "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"), *args,
        cwd=tmp_path, env=env,
    )  # fmt: skip


DEFAULTS = {section: {name: key.default for name, key in keys.items()} for section, keys in SCHEMA.items()}  # fmt: skip


def test_config_example_parses_as_toml_and_loads_to_exactly_the_defaults(tmp_path):
    result = sepp("config", "example", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    parsed = tomllib.loads(result.stdout)
    assert set(parsed) == set(SCHEMA)
    path = tmp_path / "example.toml"
    path.write_text(result.stdout)
    config = load_config(str(path), env={})
    assert config.values == DEFAULTS
    assert config.queues == []
    # Every setting is shown, the unset ones as comments.
    for section, keys in SCHEMA.items():
        for name in keys:
            assert f"{name} = " in result.stdout, f"{section}.{name} missing from the example"


def test_no_config_at_all_gives_the_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(None, env={})
    assert config.values == DEFAULTS
    assert config.source is None


async def test_a_server_runs_on_the_example_config(server_factory, tmp_path):
    example = tmp_path / "sepp.toml"
    example.write_text(sepp("config", "example", cwd=tmp_path).stdout)
    server = server_factory(args=["--config", str(example)])
    client = await connect(server.address)
    info = await client.ok("server_info")
    assert info["persist_mode"] == "sync_all"
    assert info["max_wait_timeout_ms"] == 300_000
    await client.close()
    assert server.stop() == 0


def test_version_flag_prints_the_version(tmp_path):
    result = sepp("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == f"sepp {__version__}"


FILE_CASES = [
    ('[limits]\nmax_wait_timeout_ms = "soon"\n', "limits.max_wait_timeout_ms"),
    ("[limits]\nmax_enqueue_batch = 0\n", "limits.max_enqueue_batch"),
    ('[storage]\npersist_mode = "yolo"\n', "storage.persist_mode"),
    ("[server]\nlisten_port = 7000\n", "server.listen_port"),
    ("[server]\nmax_connections = true\n", "server.max_connections"),
    ("[nope]\nx = 1\n", "nope"),
    ('[auth]\napi_keys = [{name = "a"}]\n', "auth.api_keys[0]"),
    ('[[queues]]\nname = "q"\nretry_dely_ms = 5\n', "queues.q.retry_dely_ms"),
    ("[limits]\nmax_message_bytes = 2048\n", "limits.max_payload_bytes"),
    ("this is = not toml [", "not valid TOML"),
]
ENV_CASES = [
    ("SEPP_LIMITS__MAX_WAIT_TIMEOUT_MS", "abc", "limits.max_wait_timeout_ms"),
    ("SEPP_LIMITS__MAX_WAIT_TIMEOUT_MS", "-5", "limits.max_wait_timeout_ms"),
    ("SEPP_STORAGE__PERSIST_MODE", "fast", "storage.persist_mode"),
    ("SEPP_STORAGE__NOPE", "1", "storage.nope"),
    ("SEPP_BOGUS__X", "1", "bogus.x"),
    ("SEPP_AUTH__API_KEYS", "[{name='a', key=''}]", "auth.api_keys[0]"),
    ("SEPP_SERVER__STRICT_QUEUES", "maybe", "server.strict_queues"),
    ("SEPP_SERVER__EVENT_LOOP", "tokio", "server.event_loop"),
    ("SEPP_STORAGE__SYNC_METHOD", "io_uring", "storage.sync_method"),
]


@pytest.mark.parametrize(("text", "named"), FILE_CASES)
def test_an_invalid_config_file_is_refused_naming_the_key(tmp_path, text, named):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(str(path), env={})
    assert named in str(refused.value)


@pytest.mark.parametrize(("name", "value", "named"), ENV_CASES)
def test_an_invalid_environment_value_is_refused_naming_the_key(name, value, named):
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={name: value})
    assert named in str(refused.value)
    assert name in str(refused.value) or "must" in str(refused.value)


@pytest.mark.parametrize(
    ("text", "named"),
    [FILE_CASES[0], FILE_CASES[3]],
    ids=["bad-value", "unknown-key"],
)
def test_serve_with_an_invalid_config_file_exits_1_naming_the_key(tmp_path, text, named):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = serve(tmp_path, "--config", str(path))
    assert result.returncode == 1, result
    assert named in result.stderr
    assert "sepp listening" not in result.stdout


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [ENV_CASES[0], ENV_CASES[3]],
    ids=["bad-value", "unknown-key"],
)
def test_serve_with_an_invalid_environment_value_exits_1_naming_the_key(
    tmp_path, name, value, named
):
    result = serve(tmp_path, env={name: value})
    assert result.returncode == 1, result
    assert named in result.stderr


def test_serve_refuses_aio_syncs_in_buffer_mode_before_recovery(tmp_path):
    result = serve(tmp_path, "--persist-mode", "buffer", env={"SEPP_STORAGE__SYNC_METHOD": "aio"})
    assert result.returncode == 1, result
    assert "storage.sync_method" in result.stderr and "buffer" in result.stderr
    assert "sepp listening" not in result.stdout
    assert not (tmp_path / "data").exists()  # refused before recovery touched anything


def test_a_missing_config_path_exits_1(tmp_path):
    missing = tmp_path / "nowhere" / "sepp.toml"
    result = serve(tmp_path, "--config", str(missing))
    assert result.returncode == 1
    assert str(missing) in result.stderr


def test_a_missing_sepp_config_path_exits_1(tmp_path):
    missing = tmp_path / "absent.toml"
    result = serve(tmp_path, env={"SEPP_CONFIG": str(missing)})
    assert result.returncode == 1
    assert str(missing) in result.stderr


def test_an_address_in_use_exits_1(sepp_server, tmp_path):
    result = sepp(
        "serve", "--listen", sepp_server.address, "--data-dir", str(tmp_path / "other"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot start" in result.stderr


@pytest.mark.parametrize("listen", ["no-port", "127.0.0.1:http", "127.0.0.1:70000", ":80"])
def test_a_bad_listen_flag_exits_1_naming_the_key(tmp_path, listen):
    result = sepp(
        "serve", "--listen", listen, "--data-dir", str(tmp_path / "data"), cwd=tmp_path
    )  # fmt: skip
    assert result.returncode == 1, result
    assert "server.listen_addr" in result.stderr


def test_an_unknown_persist_mode_flag_is_a_usage_error(tmp_path):
    result = serve(tmp_path, "--persist-mode", "yolo")
    assert result.returncode == 2


async def test_flags_override_the_environment_which_overrides_the_file(server_factory, tmp_path):
    path = tmp_path / "sepp.toml"
    path.write_text(
        '[storage]\npersist_mode = "buffer"\n[limits]\nmax_wait_timeout_ms = 1111\n'
        "max_enqueue_batch = 7\n"
    )
    env = {"SEPP_STORAGE__PERSIST_MODE": "sync_data", "SEPP_LIMITS__MAX_WAIT_TIMEOUT_MS": "2222"}
    cases = [
        ([], {}, ("buffer", 1111)),
        ([], env, ("sync_data", 2222)),
        (["--persist-mode", "sync_all"], env, ("sync_all", 2222)),
    ]
    for flags, environment, (mode, wait) in cases:
        server = server_factory(args=["--config", str(path), *flags], env=environment)
        client = await connect(server.address)
        info = await client.ok("server_info")
        assert (info["persist_mode"], info["max_wait_timeout_ms"]) == (mode, wait), flags
        # Settings only the file gives keep their file value.
        assert info["max_enqueue_batch"] == 7
        await client.close()
        assert server.stop() == 0


async def test_a_sepp_toml_in_the_working_directory_is_read(server_factory, tmp_path):
    # The fixture runs the server in the data directory's parent: tmp_path.
    (tmp_path / "sepp.toml").write_text("[limits]\nmax_reserve_queues = 5\n")
    server = server_factory()
    client = await connect(server.address)
    assert (await client.ok("server_info"))["max_reserve_queues"] == 5


async def test_the_data_dir_flag_beats_the_file(server_factory, tmp_path):
    path = tmp_path / "sepp.toml"
    path.write_text(f'[server]\ndata_dir = "{tmp_path / "from-file"}"\n')
    server = server_factory(args=["--config", str(path)])
    assert server.stop() == 0
    assert server.data_dir.is_dir()
    assert not (tmp_path / "from-file").exists()


def test_a_second_server_on_the_same_data_directory_exits_1(server_factory, tmp_path):
    first = server_factory()
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "sepp.server.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(first.data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert "locked" in second.stderr


# ---------------------------------------------------------------- API keys from a file


def test_api_keys_can_come_from_a_file_instead_of_the_config_or_environment(tmp_path):
    # Keys in the config file or in SEPP_AUTH__API_KEYS end up in files others may
    # read and in the environment of every child (issue 13 §6): a keys file holds
    # them alone.
    keys = tmp_path / "keys"
    keys.write_text("# ops team\nops s3cret\n\n  plain-key  \n")
    config = tmp_path / "sepp.toml"
    config.write_text(f'[auth]\napi_keys_file = "{keys}"\n')
    expected = [("ops", "s3cret"), ("key2", "plain-key")]
    from_file = load_config(str(config), env={})
    assert [(k.name, k.key) for k in from_file.api_keys or []] == expected
    from_env = load_config(None, env={"SEPP_AUTH__API_KEYS_FILE": str(keys)})
    assert [(k.name, k.key) for k in from_env.api_keys or []] == expected


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (None, {}, "does not exist"),
        ("\n# nothing\n", {}, "holds no key"),
        ("a b c\n", {}, "line 1: expected KEY or NAME KEY"),
        ("a k1\na k2\n", {}, "key names must be unique"),
        ("k\n", {"SEPP_AUTH__API_KEYS": '["other"]'}, "not both"),
    ],
    ids=["missing", "empty", "three words", "duplicate names", "both settings"],
)
def test_an_api_keys_file_that_cannot_be_used_is_refused_naming_the_key(
    tmp_path, text, env, message
):
    keys = tmp_path / "keys"
    if text is not None:
        keys.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={"SEPP_AUTH__API_KEYS_FILE": str(keys), **env})
    assert "auth.api_keys_file" in str(refused.value)
    assert message in str(refused.value)


def test_serve_takes_its_keys_from_api_keys_file_and_clients_from_api_key_file(
    server_factory, tmp_path
):
    keys = tmp_path / "keys"
    keys.write_text("ops s3cret\n")
    client_key = tmp_path / "client-key"
    client_key.write_text("s3cret\n")
    server = server_factory(args=["--api-keys-file", str(keys)])
    command = [sys.executable, "-m", "sepp.server.cli", "info", "--addr", server.address]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    allowed = subprocess.run(
        [*command, "--api-key-file", str(client_key)], capture_output=True, text=True, timeout=60
    )
    assert allowed.returncode == 0, allowed.stderr
