"""Hot reload (issue 15 item 7, sepp/server/reload.py) and /readyz during recovery
(item 6): the live / restart-only table (one test per row), the reload plan, the
reload in a running server (in process, and SIGHUP and file changes to a real
`sepp serve`), and the admin listener answering while recovery is held."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from pathlib import Path

import aiohttp
import pytest

from sepp.core.config import ConfigError
from sepp.core.invariants import check_invariants
from sepp.core.results import CommandError
from sepp.server.config import SCHEMA, ServerConfig, load_config
from sepp.server.reload import LIVE, RESTART_ONLY, ConfigReloader, plan_reload, reload_kind
from sepp.server.service import LOCAL_ADMIN
from tests.conftest import ServerProcess
from tests.inprocess import address_of, in_process
from tests.server.conftest import RawClient, connect, job, payload, wait_until
from tests.server.test_long_poll import jobs_of, park

pytestmark = pytest.mark.usefixtures("in_process_env")

OFF = {"SEPP_ADMIN__LISTEN_ADDR": "off"}


def write_config(path: Path, text: str) -> None:
    """Replace the file's contents in one write (an editor's save)."""
    path.write_text(text)


def keys_toml(*keys: str) -> str:
    entries = ", ".join(f'{{name = "k{i}", key = "{key}"}}' for i, key in enumerate(keys))
    return f"[auth]\napi_keys = [{entries}]\n"


def load(path: Path, **env: str) -> ServerConfig:
    return load_config(str(path), env={**OFF, **env})


# -- the decision table: one test per row ---------------------------------------------------


LIMITS_LIVE = [key for key in SCHEMA["limits"] if key != "max_message_bytes"]


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("auth", "api_keys"),
        ("auth", "api_keys_file"),
        ("admin", "keys"),
        ("server", "strict_queues"),
    ],
)
def test_api_keys_admin_keys_and_strict_queues_are_live(section, key):
    assert reload_kind(section, key) == LIVE


@pytest.mark.parametrize("key", LIMITS_LIVE)
def test_every_limit_but_max_message_bytes_is_live(key):
    assert reload_kind("limits", key) == LIVE


def test_max_message_bytes_is_restart_only():
    assert reload_kind("limits", "max_message_bytes") == RESTART_ONLY


@pytest.mark.parametrize("key", ["", "default_priority", "max_queue_depth", "allowed_job_types"])
def test_adding_removing_and_retuning_a_queue_is_live(key):
    assert reload_kind("queues", key) == LIVE


def test_a_queues_dedup_window_is_restart_only():
    assert reload_kind("queues", "dedup_window_ms") == RESTART_ONLY


@pytest.mark.parametrize(
    "key", ["listen_addr", "data_dir", "tls_cert_path", "tls_key_path", "max_connections"]
)
def test_the_listener_data_dir_tls_and_connection_settings_are_restart_only(key):
    assert reload_kind("server", key) == RESTART_ONLY


@pytest.mark.parametrize("key", list(SCHEMA["storage"]))
def test_every_storage_setting_is_restart_only(key):
    assert reload_kind("storage", key) == RESTART_ONLY


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("logging", "level"),
        ("logging", "format"),
        ("admin", "listen_addr"),
        ("metrics", "listen_addr"),
    ],
)
def test_logging_and_the_admin_and_metrics_listeners_are_restart_only(section, key):
    assert reload_kind(section, key) == RESTART_ONLY


def test_every_setting_of_the_schema_has_a_row():
    kinds = {reload_kind(section, key) for section, keys in SCHEMA.items() for key in keys}
    assert kinds == {LIVE, RESTART_ONLY}


# -- the plan --------------------------------------------------------------------------------


def test_a_plan_switches_live_settings_and_names_them_never_the_secret(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    write_config(path, keys_toml("old-secret") + "[limits]\nmax_payload_bytes = 100\n")
    running = load(path)
    write_config(path, keys_toml("new-secret") + "[limits]\nmax_payload_bytes = 200\n")
    plan = plan_reload(running, load(path))
    assert plan.changed == ("auth.api_keys", "limits.max_payload_bytes")
    assert plan.restart_only == ()
    assert [k.key for k in plan.config.api_keys or []] == ["new-secret"]
    assert plan.config.core_config().defaults.max_payload_bytes == 200
    assert "secret" not in " ".join(plan.changed)


def test_a_plan_keeps_the_running_value_of_a_restart_only_setting_and_names_it(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    write_config(path, '[storage]\npersist_mode = "sync_all"\n')
    running = load(path)
    write_config(
        path, '[storage]\npersist_mode = "buffer"\n[limits]\nmax_message_bytes = 2097152\n'
    )
    plan = plan_reload(running, load(path))
    assert plan.restart_only == ("limits.max_message_bytes", "storage.persist_mode")
    assert plan.changed == ()
    assert plan.config.get("storage", "persist_mode") == "sync_all"
    assert plan.config.get("limits", "max_message_bytes") == running.get(
        "limits", "max_message_bytes"
    )


def test_a_live_value_that_contradicts_a_kept_restart_only_one_is_refused_naming_it(
    tmp_path: Path,
):
    path = tmp_path / "sepp.toml"
    write_config(path, "[limits]\nmax_message_bytes = 1048576\nmax_payload_bytes = 1000\n")
    running = load(path)
    # Valid as a file (a restart would take both), not with the running max_message_bytes.
    write_config(path, "[limits]\nmax_message_bytes = 4194304\nmax_payload_bytes = 2000000\n")
    with pytest.raises(ConfigError) as refused:
        plan_reload(running, load(path))
    assert refused.value.key == "limits.max_payload_bytes"


def test_queues_are_added_removed_and_retuned_but_keep_their_dedup_window(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    write_config(
        path,
        '[[queues]]\nname = "a"\ndedup_window_ms = 1000\n'
        '[[queues]]\nname = "b"\n'
        '[[queues]]\nname = "c"\ndefault_priority = 1\n',
    )
    running = load(path)
    write_config(
        path,
        '[[queues]]\nname = "a"\ndedup_window_ms = 5000\n'
        '[[queues]]\nname = "c"\ndefault_priority = 2\n'
        '[[queues]]\nname = "d"\n',
    )
    plan = plan_reload(running, load(path))
    assert plan.changed == ("queues.c", "queues.d (added)", "queues.b (removed)")
    assert plan.restart_only == ("queues.a.dedup_window_ms",)
    core = plan.config.core_config()
    assert sorted(core.queues) == ["a", "c", "d"]
    assert core.queues["a"].dedup_window_ms == 1000
    assert core.queues["c"].default_priority == 2


def test_an_unchanged_file_plans_no_change(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    write_config(path, keys_toml("k") + '[[queues]]\nname = "a"\n')
    plan = plan_reload(load(path), load(path))
    assert (plan.changed, plan.restart_only) == ((), ())


# -- in a running server (in process) --------------------------------------------------------


def in_process_reloader(server, path: Path, env: dict[str, str] = OFF) -> ConfigReloader:
    """Hot reload of `server` from `path` as `sepp serve --config path` runs it (no
    timers: the test calls reload)."""
    overrides = {("server", "data_dir"): "/sepp-data", ("server", "listen_addr"): "127.0.0.1:0"}
    reloader = ConfigReloader(
        server.service.config,
        lambda: load_config(str(path), env=env, overrides=overrides),
        server.reconfigure,
    )
    server.reloader = reloader
    return reloader


def in_process_config_from(path: Path, env: dict[str, str] = OFF) -> ServerConfig:
    overrides = {("server", "data_dir"): "/sepp-data", ("server", "listen_addr"): "127.0.0.1:0"}
    return load_config(str(path), env=env, overrides=overrides)


async def test_a_reload_switches_keys_and_closes_only_connections_of_a_removed_key(
    tmp_path: Path,
):
    path = tmp_path / "sepp.toml"
    write_config(path, keys_toml("kept", "removed"))
    async with in_process(in_process_config_from(path)) as server:
        address = address_of(server)
        kept = await connect(address, "kept")
        revoked = await connect(address, "removed")
        write_config(path, keys_toml("kept", "added"))
        assert in_process_reloader(server, path).reload()
        await revoked.wait_closed()
        await kept.enqueue_ids(job("q"))
        await connect(address, "added")
        client = await RawClient.connect(address)
        response = await client.call("hello", {"protocol": 1, "api_key": "removed"})
        assert response.status == "unauthenticated"


class Lines(logging.Handler):
    """The messages logged to sepp.reload while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))

    def __enter__(self) -> Lines:
        logging.getLogger("sepp.reload").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("sepp.reload").removeHandler(self)


async def test_a_reload_that_would_break_a_runtime_queue_definition_changes_nothing(
    tmp_path: Path,
):
    path = tmp_path / "sepp.toml"
    write_config(path, "[limits]\nmax_attempts_ceiling = 100\n")
    async with in_process(in_process_config_from(path)) as server:
        decision, _barrier = server.service.put_queue(
            LOCAL_ADMIN, "q", {"default_max_attempts": 50}, "test"
        )
        assert not isinstance(decision, CommandError), decision
        write_config(path, "[limits]\nmax_attempts_ceiling = 10\nmax_payload_bytes = 5\n")
        with Lines() as logged:
            assert not in_process_reloader(server, path).reload()
        assert [level for level, _ in logged.lines] == ["ERROR"], logged.lines
        assert "queues.q.default_max_attempts" in logged.lines[0][1]
        assert server.core_config.defaults.max_payload_bytes == 1_048_576  # unchanged
        assert server.core_config.limits == server.engine.state.base_config.limits


async def test_a_reload_declares_new_queues_and_forgets_removed_empty_ones(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    write_config(path, '[server]\nstrict_queues = true\n[[queues]]\nname = "old"\n')
    async with in_process(in_process_config_from(path)) as server:
        client = await connect(address_of(server))
        refused = (await client.enqueue(job("new")))["results"][0]
        assert "rejection" in refused, refused
        write_config(path, '[server]\nstrict_queues = true\n[[queues]]\nname = "new"\n')
        assert in_process_reloader(server, path).reload()
        await client.enqueue_ids(job("new"))
        state = server.engine.state
        assert "old" not in state.queues and "new" in state.queues
        check_invariants(state)


def admin_keys_toml(**roles: str) -> str:
    entries = ", ".join(
        f'{{name = "{name}", key = "{name}-secret", role = "{role}"}}'
        for name, role in roles.items()
    )
    return f'[admin]\nlisten_addr = "127.0.0.1:0"\nkeys = [{entries}]\n'


async def test_a_reload_switches_admin_keys_and_their_roles(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    write_config(path, admin_keys_toml(alice="admin", bob="viewer"))
    async with in_process(in_process_config_from(path, {})) as server:
        assert server.admin_address is not None
        host, port = server.admin_address
        url = f"http://{host}:{port}/admin/api/v1/queues/q:pause"

        async def pause_as(name: str) -> int:
            headers = {"Authorization": f"Bearer {name}-secret"}
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, json={"reason": "test"}, headers=headers) as response,
            ):
                return response.status

        assert (await pause_as("alice"), await pause_as("bob")) == (200, 403)
        write_config(path, admin_keys_toml(bob="operator", carol="admin"))
        assert in_process_reloader(server, path, {}).reload()
        assert [await pause_as(name) for name in ("alice", "bob", "carol")] == [401, 200, 200]


# -- SIGHUP and file changes to a real `sepp serve` -------------------------------------------


def reload_lines(server: ServerProcess, level: str = "INFO") -> list[str]:
    return [
        line
        for line in server.log().splitlines()
        if f" {level} " in line and "sepp.reload:" in line
    ]


async def wait_reloads(server: ServerProcess, count: int, level: str = "INFO") -> list[str]:
    await wait_until(
        lambda: len(reload_lines(server, level)) >= count,
        what=f"{count} {level} reload line(s); log:\n{server.log()}",
    )
    return reload_lines(server, level)


def hup(server: ServerProcess) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGHUP)


async def hello_status(address: str, key: str) -> str:
    client = await RawClient.connect(address)
    response = await client.call("hello", {"protocol": 1, "api_key": key})
    await client.close()
    return response.status


async def test_sighup_switches_api_keys_and_a_limit_keeping_open_connections(
    tmp_path: Path, server_factory
):
    path = tmp_path / "sepp.toml"
    write_config(path, keys_toml("first") + "[limits]\nmax_payload_bytes = 16\n")
    server = server_factory(args=["--config", str(path)])
    before = await connect(server.address, "first")
    big = job("q", payload=payload(b"x" * 32))
    assert (await before.enqueue(big))["results"][0]["rejection"]["reason"] == "payload_too_large"

    write_config(path, keys_toml("first", "second") + "[limits]\nmax_payload_bytes = 64\n")
    hup(server)
    lines = await wait_reloads(server, 1)
    assert "config reloaded (SIGHUP): changed auth.api_keys, limits.max_payload_bytes" in lines[0]
    assert "first" not in lines[0] and "second" not in lines[0]
    # The connection opened before the reload works on, under the new limit.
    await before.enqueue_ids(big)
    await connect(server.address, "second")

    write_config(path, keys_toml("second") + "[limits]\nmax_payload_bytes = 64\n")
    hup(server)
    await wait_reloads(server, 2)
    assert await hello_status(server.address, "first") == "unauthenticated"
    await before.wait_closed()  # let in with the removed key: closed
    assert server.stop() == 0


async def test_an_invalid_file_keeps_the_running_config_and_logs_one_error_naming_the_key(
    tmp_path: Path, server_factory
):
    path = tmp_path / "sepp.toml"
    write_config(path, keys_toml("first"))
    server = server_factory(args=["--config", str(path)])
    write_config(path, keys_toml("second") + "[limits]\ndefault_priority = 12\n")
    hup(server)
    errors = await wait_reloads(server, 1, "ERROR")
    assert "limits.default_priority" in errors[0] and "the running configuration stays" in errors[0]
    # Still the old keys; and the next reload (a valid file) is the next line.
    assert await hello_status(server.address, "first") == "ok"
    assert await hello_status(server.address, "second") == "unauthenticated"
    write_config(path, keys_toml("second"))
    hup(server)
    await wait_reloads(server, 1)
    assert len(reload_lines(server, "ERROR")) == 1
    assert await hello_status(server.address, "second") == "ok"
    assert server.stop() == 0


async def test_a_restart_only_change_logs_a_warning_naming_it_and_keeps_the_value(
    tmp_path: Path, server_factory
):
    path = tmp_path / "sepp.toml"
    write_config(path, "[limits]\nmax_message_bytes = 1048576\n")
    server = server_factory(args=["--config", str(path)])
    write_config(path, "[limits]\nmax_message_bytes = 2097152\n[storage]\nsweep_limit = 5\n")
    hup(server)
    warnings = await wait_reloads(server, 1, "WARNING")
    assert len(warnings) == 1
    assert "limits.max_message_bytes, storage.sweep_limit" in warnings[0]
    assert "no live setting changed" in reload_lines(server)[0]
    client = await connect(server.address)
    info = await client.ok("server_info")
    assert info["max_message_bytes"] == 1048576
    assert server.stop() == 0


async def test_a_file_change_reloads_once_for_two_quick_writes(tmp_path: Path, server_factory):
    path = tmp_path / "sepp.toml"
    write_config(path, keys_toml("first"))
    server = server_factory(args=["--config", str(path)])
    write_config(path, keys_toml("first", "half-written"))
    write_config(path, keys_toml("first", "second"))
    lines = await wait_reloads(server, 1)
    assert "config reloaded (file change): changed auth.api_keys" in lines[0]
    assert await hello_status(server.address, "second") == "ok"
    # A SIGHUP's reload is the next line: the two writes made one reload.
    hup(server)
    lines = await wait_reloads(server, 2)
    assert [("file change" in line, "SIGHUP" in line) for line in lines] == [
        (True, False),
        (False, True),
    ]
    assert server.stop() == 0


async def test_readyz_is_503_recovering_while_recovery_runs_then_200_and_a_sighup_waits(
    tmp_path: Path,
):
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    server = ServerProcess(
        tmp_path / "data",
        ["--admin-listen", "127.0.0.1:0"],
        {"SEPP_FAULT_HOLD_RECOVERY": str(fifo)},
    )
    started = threading.Thread(target=server.start)
    started.start()
    try:
        match = await wait_until(
            lambda: re.search(r"admin listening on 127\.0\.0\.1:(\d+)", server.log()),
            what="the admin listener's log line",
        )
        url = f"http://127.0.0.1:{match.group(1)}"
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/livez") as response:
                assert response.status == 200
            async with session.get(url + "/readyz") as response:
                assert (response.status, await response.text()) == (503, "recovering\n")
            async with session.get(url + "/admin/api/v1/queues") as response:
                assert response.status == 503
                assert (await response.json())["error"]["code"] == "unavailable"
            # A SIGHUP now does not end the process: it reloads once serving.
            hup(server)
            with open(fifo, "wb"):
                pass  # lets recovery go on
            started.join(60)
            assert server.port > 0, server.log()
            async with session.get(url + "/readyz") as response:
                assert (response.status, await response.text()) == (200, "ready\n")
            lines = await wait_reloads(server, 1)
            assert "config reloaded (SIGHUP): no live setting changed" in lines[0]
    finally:
        started.join(60)
        server.kill()


async def test_a_reload_that_raises_a_queues_limits_serves_its_parked_long_poll(tmp_path: Path):
    path = tmp_path / "sepp.toml"
    limited = '[[queues]]\nname = "q"\nrate_limit = { jobs = 1, per_ms = 86400000 }\n'
    write_config(path, limited)
    async with in_process(in_process_config_from(path)) as server:
        address = address_of(server)
        worker = await connect(address)
        await worker.enqueue_ids(job("q"), job("q"))
        assert len(await worker.reserve(["q"], max_jobs=2)) == 1  # the day's one delivery
        other = await connect(address)
        waiting = await park(other, ["q"], wait_ms=60_000)
        # Nothing but the reload happens: the window would free only in a day.
        write_config(path, '[[queues]]\nname = "q"\nrate_limit = { jobs = 5, per_ms = 86400000 }\n')
        assert in_process_reloader(server, path).reload()
        (served,) = await jobs_of(other, waiting)
        assert served["queue"] == "q"
