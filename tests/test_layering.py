"""The import table of ARCHITECTURE.md, enforced.

Reads every module's import statements (statically, with `ast`) and fails on an
arrow the table forbids: log_format imports nothing from sepp; the core imports no
I/O, clock, randomness, logging or asyncio; storage has no asyncio or sockets; the
protocol has no sockets or asyncio; the client never reaches into the server side;
the server's service layer imports no front end and no wire.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# folder -> (allowed first-party prefixes, forbidden module prefixes)
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "log_format": (
        ("log_format",),
        ("sepp", "tools", "asyncio", "socket"),
    ),
    "sepp/core": (
        ("sepp.core",),
        (
            "log_format",
            "tools",
            "os",
            "io",
            "time",
            "datetime",
            "random",
            "secrets",
            "uuid",
            "asyncio",
            "logging",
            "socket",
            "threading",
            "subprocess",
            "pathlib",
            "shutil",
            "tempfile",
            "sys",
            "msgpack",
            "crc32c",
            "sepp.storage",
            "sepp.protocol",
            "sepp.server",
            "sepp.client",
        ),
    ),
    "sepp/storage": (
        ("log_format", "sepp.core", "sepp.storage"),
        ("asyncio", "socket", "ssl", "tools", "sepp.protocol", "sepp.server", "sepp.client"),
    ),
    "sepp/protocol": (
        ("sepp.protocol",),
        (
            "asyncio",
            "socket",
            "ssl",
            "selectors",
            "tools",
            "log_format",
            "sepp.core",
            "sepp.storage",
            "sepp.server",
            "sepp.client",
        ),
    ),
    "sepp/client": (
        ("sepp.protocol", "sepp.client", "sepp._version"),
        ("sepp.core", "sepp.storage", "sepp.server", "log_format", "tools"),
    ),
    "tools": (
        ("log_format", "sepp.core", "sepp.storage", "sepp.cluster", "tools"),
        ("sepp.server", "sepp.client"),
    ),
    # Cluster mode (issue 19): the replicated log, its backends (nats) and the
    # node over the core and storage; never the server, the wire or the client.
    "sepp/cluster": (
        ("log_format", "sepp.core", "sepp.storage", "sepp.cluster"),
        ("tools", "sepp.server", "sepp.client", "sepp.protocol"),
    ),
    # The process and its front ends (operator.py, the CLI, is a client of a server).
    "sepp/server": (
        ("log_format", "sepp"),
        ("tools",),
    ),
    # The admin HTTP front: a thin adapter over the service layer (and the counters
    # it keeps), like every front; never storage, the native wire or the client.
    "sepp/admin": (
        (
            "sepp.admin",
            "sepp.server.service",
            "sepp.server.admin_shapes",
            "sepp.server.metrics",
            "sepp.server.pipeline",
            # The audit trail's log reader (GET /audit is its front).
            "sepp.server.audit_trail",
            "sepp.server.job_timeline",
            "sepp.core",
            "sepp._version",
        ),
        (
            "tools",
            "log_format",
            "sepp.storage",
            "sepp.protocol",
            "sepp.client",
            "sepp.server.server",
            "sepp.server.wire",
        ),
    ),
    # The gRPC sepp.v1 front (issue 18): a thin adapter over the service layer, like
    # the admin front; never storage, the native protocol or wire, another front,
    # or the client.
    "sepp/grpc": (
        ("sepp.grpc", "sepp.server.service", "sepp.core"),
        (
            "tools",
            "log_format",
            "sepp.storage",
            "sepp.protocol",
            "sepp.client",
            "sepp.admin",
            "sepp.server.server",
            "sepp.server.wire",
            "sepp.server.native_admin",
            "aiohttp",
            "msgpack",
        ),
    ),
}

# Narrow exceptions by file (fnmatch on the path from the repo root), replacing the
# folder's rule. The crash harness is a client of a real `sepp serve` process: it
# may use the client library and the protocol, never the server itself (see the
# docstring of tools/crash.py).
FILE_RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tools/crash*.py": (
        ("log_format", "sepp.core", "sepp.storage", "tools", "sepp.client", "sepp.protocol"),
        ("sepp.server",),
    ),
    # The failover harness (issue 19) is a client of real `sepp serve --cluster`
    # processes, like the crash harness: the client library, never the server.
    "tools/failover.py": (
        ("sepp.client", "tools"),
        ("sepp.server", "sepp.core", "sepp.storage", "sepp.cluster"),
    ),
    # The service layer (ARCHITECTURE.md, "Front ends and the service layer"): every
    # front end may import it; it imports no front end, no wire translation, no
    # protocol and no wire or transport library.
    "sepp/server/service.py": (
        ("log_format", "sepp.core", "sepp.storage", "sepp.server", "sepp._version"),
        (
            "tools",
            "sepp.client",
            "sepp.protocol",
            "sepp.server.server",
            "sepp.server.native",
            "sepp.server.wire",
            "sepp.server.operator",
            "sepp.server.cli",
            "sepp.admin",
            "sepp.grpc",
            "socket",
            "ssl",
            "selectors",
            "msgpack",
            "aiohttp",
            "grpc",
        ),
    ),
    # The admin API's enqueue takes the native protocol's job map (the payload in
    # base64) and checks it with the native front's own parser and translation
    # (protocol.messages.parse_job, server.wire.new_job / enqueue_body), so both
    # fronts validate and answer a job alike; otherwise the admin folder's rule.
    "sepp/admin/api.py": (
        (
            "sepp.admin",
            "sepp.server.service",
            "sepp.server.admin_shapes",
            "sepp.core",
            "sepp.protocol.messages",
            "sepp.protocol.errors",
            "sepp.server.wire",
        ),
        (
            "tools",
            "log_format",
            "sepp.storage",
            "sepp.client",
            "sepp.server.server",
            "sepp.server.native_admin",
            "sepp.protocol.framing",
        ),
    ),
    # The attacks (issue 13) speak raw frames to a real `sepp serve` process.
    "tools/attack.py": (
        ("tools", "sepp.protocol"),
        ("sepp.server", "sepp.core", "sepp.storage", "sepp.client"),
    ),
}

FIRST_PARTY = ("sepp", "log_format", "tools")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _cases() -> list[tuple[str, Path]]:
    cases = []
    for folder in RULES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            cases.append((folder, path))
    return cases


@pytest.mark.parametrize(
    ("folder", "path"),
    _cases(),
    ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else v,
)
def test_module_imports_only_what_its_layer_may(folder: str, path: Path) -> None:
    allowed, forbidden = RULES[folder]
    relative = path.relative_to(ROOT).as_posix()
    for pattern, rule in FILE_RULES.items():
        if fnmatch.fnmatch(relative, pattern):
            allowed, forbidden = rule
    problems = []
    for lineno, module in _imports(path):
        if _matches(module, forbidden):
            problems.append(
                f"{path.relative_to(ROOT)}:{lineno} imports {module} (forbidden in {folder})"
            )
        elif _matches(module, FIRST_PARTY) and not _matches(module, allowed) and module != "sepp":
            problems.append(
                f"{path.relative_to(ROOT)}:{lineno} imports {module} (not allowed in {folder})"
            )
    assert not problems, "\n".join(problems)


def test_every_layer_has_modules() -> None:
    # A rule over an empty folder would pass vacuously.
    for folder in ("log_format", "sepp/core", "sepp/storage"):
        assert list((ROOT / folder).rglob("*.py")), folder


def test_the_service_layer_may_not_import_a_front_end_or_a_wire() -> None:
    allowed, forbidden = FILE_RULES["sepp/server/service.py"]
    for module in ("sepp.server.server", "sepp.server.wire", "sepp.protocol.messages", "msgpack"):
        assert _matches(module, forbidden), module
    assert _matches("sepp.server.pipeline", allowed)
    assert not _matches("sepp.server.pipeline", forbidden)


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom sepp.storage import Engine\n")
    modules = [m for _, m in _imports_at(bad)]
    assert _matches(modules[0], RULES["sepp/core"][1])
    assert _matches(modules[1], RULES["sepp/core"][1])


def _imports_at(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or ""))
    return out
