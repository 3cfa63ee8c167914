"""[server] allocator (issue 13). The default, "auto", runs `sepp serve` on jemalloc
when the system has it, so memory freed after a burst goes back to the operating
system; "system" does the same on the C library's malloc. Either way the server
re-executes itself once (PYTHONMALLOC=malloc, jemalloc preloaded) under the same
process id. "python" (pymalloc), "auto" without jemalloc, and a PYTHONMALLOC the user
set leave the interpreter as it started; "jemalloc" without it refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sepp.server.allocator import (
    JEMALLOC_CONF,
    AllocatorUnavailable,
    allocator_in_use,
    find_jemalloc,
    reexec_environment,
)

JEMALLOC = find_jemalloc()
needs_jemalloc = pytest.mark.skipif(
    JEMALLOC is None, reason="libjemalloc is not installed (apt install libjemalloc2)"
)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode().partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PYTHONMALLOC", "LD_PRELOAD", "MALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)


@needs_jemalloc
def test_the_default_runs_on_jemalloc_under_the_pid_the_server_was_started_with(
    server_factory, clean_environ
):
    server = server_factory()
    # The process the test started (its pid) is the one serving, on jemalloc.
    environ = environ_of(server.proc.pid)
    assert environ.get("PYTHONMALLOC") == "malloc"
    assert environ.get("MALLOC_CONF") == JEMALLOC_CONF
    assert "libjemalloc" in mapped_libraries(server.proc.pid)
    assert "memory allocator: jemalloc 5." in server.log()
    assert server.stop() == 0


@needs_jemalloc
def test_a_malloc_conf_the_user_set_is_kept(server_factory, clean_environ, monkeypatch):
    monkeypatch.setenv("MALLOC_CONF", "narenas:1")
    server = server_factory(env={"SEPP_SERVER__ALLOCATOR": "jemalloc"})
    assert environ_of(server.proc.pid).get("MALLOC_CONF") == "narenas:1"
    assert "memory allocator: jemalloc" in server.log()
    assert server.stop() == 0


def test_allocator_system_runs_on_malloc_under_the_pid_the_server_was_started_with(
    server_factory, clean_environ
):
    server = server_factory(env={"SEPP_SERVER__ALLOCATOR": "system"})
    environ = environ_of(server.proc.pid)
    assert environ.get("PYTHONMALLOC") == "malloc"
    assert "LD_PRELOAD" not in environ
    assert "libjemalloc" not in mapped_libraries(server.proc.pid)
    assert "memory allocator: system malloc" in server.log()
    assert server.stop() == 0


def test_a_pythonmalloc_the_user_set_is_kept(server_factory, clean_environ, monkeypatch):
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc")
    server = server_factory(env={"SEPP_SERVER__ALLOCATOR": "system"})
    assert environ_of(server.proc.pid).get("PYTHONMALLOC") == "pymalloc"
    assert "memory allocator: pymalloc" in server.log()
    assert server.stop() == 0


def test_allocator_python_is_pymalloc(server_factory, clean_environ):
    server = server_factory(env={"SEPP_SERVER__ALLOCATOR": "python"})
    environ = environ_of(server.proc.pid)
    assert "PYTHONMALLOC" not in environ and "LD_PRELOAD" not in environ
    assert "memory allocator: pymalloc" in server.log()
    assert server.stop() == 0


def test_allocator_jemalloc_without_the_library_refuses_to_start(tmp_path, clean_environ):
    # find_library reads the system's ldconfig cache, which a test cannot change:
    # the CLI runs with the lookup answering "not installed".
    code = (
        "import sys, sepp.server.allocator as a;"
        "a.find_jemalloc = lambda: None;"
        "from sepp.server.cli import main;"
        "sys.argv = ['sepp', 'serve', '--listen', '127.0.0.1:0', '--data-dir', sys.argv[1]];"
        "sys.exit(main())"
    )
    env = {**os.environ, "SEPP_SERVER__ALLOCATOR": "jemalloc", "SEPP_ADMIN__LISTEN_ADDR": "off"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "libjemalloc is not installed" in done.stderr
    assert "apt install libjemalloc2" in done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("allocator", "environ", "found", "expected"),
    [
        ("auto", {}, "libjemalloc.so.2", "jemalloc"),
        ("auto", {}, None, None),  # no jemalloc: pymalloc, as started
        ("jemalloc", {}, "libjemalloc.so.2", "jemalloc"),
        ("system", {}, "libjemalloc.so.2", "system"),
        ("python", {}, "libjemalloc.so.2", None),
        ("auto", {"PYTHONMALLOC": "malloc"}, "libjemalloc.so.2", None),  # re-executed
        ("system", {"PYTHONMALLOC": "malloc"}, None, None),  # already re-executed
        ("jemalloc", {"PYTHONMALLOC": "pymalloc"}, "libjemalloc.so.2", None),  # the user's
    ],
)
def test_when_the_server_re_executes_itself(
    allocator: str, environ: dict[str, str], found: str | None, expected: str | None
) -> None:
    changes = reexec_environment(allocator, environ, find=lambda: found)
    if expected is None:
        assert changes is None
    elif expected == "system":
        assert changes == {"PYTHONMALLOC": "malloc"}
    else:
        assert changes == {
            "PYTHONMALLOC": "malloc",
            "LD_PRELOAD": "libjemalloc.so.2",
            "MALLOC_CONF": JEMALLOC_CONF,
        }


def test_jemalloc_goes_first_in_a_preload_list_and_a_user_conf_stays() -> None:
    environ = {"LD_PRELOAD": "libfoo.so", "MALLOC_CONF": "narenas:1"}
    changes = reexec_environment("auto", environ, find=lambda: "libjemalloc.so.2")
    assert changes is not None
    assert changes["LD_PRELOAD"] == "libjemalloc.so.2 libfoo.so"
    assert changes["MALLOC_CONF"] == "narenas:1"


def test_allocator_jemalloc_missing_is_a_typed_error() -> None:
    with pytest.raises(AllocatorUnavailable, match="apt install libjemalloc2"):
        reexec_environment("jemalloc", {}, find=lambda: None)


@pytest.mark.parametrize(
    ("value", "jemalloc", "shown"),
    [
        ("", None, "pymalloc"),
        ("malloc", None, "system malloc"),
        ("malloc_debug", None, "system malloc"),
        ("malloc", "5.3.0", "jemalloc 5.3.0"),
    ],
)
def test_the_allocator_named_in_the_startup_log(
    value: str, jemalloc: str | None, shown: str
) -> None:
    environ = {"PYTHONMALLOC": value} if value else {}
    assert allocator_in_use(environ, jemalloc=lambda: jemalloc) == shown


def test_jemalloc_is_looked_for_only_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    # LD_PRELOAD is the Linux loader's; elsewhere "auto" stays on pymalloc.
    monkeypatch.setattr(sys, "platform", "darwin")
    assert find_jemalloc() is None
    assert reexec_environment("auto", {}) is None
