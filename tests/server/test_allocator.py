"""[server] allocator (issue 13): with "system", `sepp serve` runs on the C library's
malloc, so memory freed after a burst goes back to the operating system; it
re-executes itself once with PYTHONMALLOC=malloc (same process id). The default
("python", pymalloc) and a PYTHONMALLOC the user set leave the interpreter as it
started."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sepp.server.allocator import allocator_in_use, reexec_command


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode().partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def test_allocator_system_runs_on_malloc_under_the_pid_the_server_was_started_with(
    server_factory, monkeypatch
):
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    server = server_factory(env={"SEPP_SERVER__ALLOCATOR": "system"})
    # The process the test started (its pid) is the one serving, on malloc.
    assert environ_of(server.proc.pid).get("PYTHONMALLOC") == "malloc"
    assert "memory allocator: system malloc" in server.log()
    assert server.stop() == 0


def test_a_pythonmalloc_the_user_set_is_kept(server_factory, monkeypatch):
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc")
    server = server_factory(env={"SEPP_SERVER__ALLOCATOR": "system"})
    assert environ_of(server.proc.pid).get("PYTHONMALLOC") == "pymalloc"
    assert "memory allocator: pymalloc" in server.log()
    assert server.stop() == 0


def test_the_default_allocator_is_pymalloc(server_factory, monkeypatch):
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    server = server_factory()
    assert "PYTHONMALLOC" not in environ_of(server.proc.pid)
    assert "memory allocator: pymalloc" in server.log()
    assert server.stop() == 0


@pytest.mark.parametrize(
    ("allocator", "environ", "reexec"),
    [
        ("system", {}, True),
        ("system", {"PYTHONMALLOC": "malloc"}, False),  # already re-executed
        ("system", {"PYTHONMALLOC": "pymalloc"}, False),  # the user's choice
        ("python", {}, False),
    ],
)
def test_when_the_server_re_executes_itself(
    allocator: str, environ: dict[str, str], reexec: bool
) -> None:
    command = reexec_command(allocator, environ)
    if reexec:
        assert command == [sys.executable, *sys.orig_argv[1:]]
    else:
        assert command is None


@pytest.mark.parametrize(
    ("value", "shown"),
    [("", "pymalloc"), ("malloc", "system malloc"), ("malloc_debug", "system malloc")],
)
def test_the_allocator_named_in_the_startup_log(value: str, shown: str) -> None:
    environ = {"PYTHONMALLOC": value} if value else {}
    assert allocator_in_use(environ) == shown
