"""The optional compiled build of this repository: which modules it compiles, which
build a process is running, and the guards that keep a stale build from running.

Owns: `COMPILED_MODULES` (the replay and request hot paths: the modules
`python -m tools.compile` compiles with mypyc into extension modules next to their
sources; a wheel built by `python -m build` carries them compiled, see
build_backend/sepp_build.py), `PURE_ENV`, `WHEEL_BUILD_FILE`, `guard(package)`,
`build_name()` and `build_env(build)`.

Promises: a compiled module is only ever loaded when it was built from the source
beside it. `guard(package)` — called by `log_format/__init__.py` and
`sepp/__init__.py` before they import anything else — raises `StaleBuildError` when
an extension module is older than its `.py` (the source changed after the build:
the extension would run old code; not in an installed wheel, whose extension modules
were built with its sources), and with `SEPP_PURE=1` in the environment it
makes the package's compiled modules load from their `.py` sources instead, so the
same checkout can run both builds (the benchmarks compare them that way).

Why here: log_format is the lowest layer (it imports nothing from `sepp`), so both
packages can use one implementation. It names `sepp` modules only as strings.

Must not import: anything but the standard library.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType, TracebackType

# Replay, verify and snapshot loading, and the server's request path (framing,
# decoding, parsing, decide, the record envelope). Compiled code converts a value
# read through a declared type (a bool read as an int becomes the int; a string
# read as an int raises TypeError), so a compiled module checks what callers pass
# through untyped views (decide's `fields: tuple[object, ...] = command`), and
# tests/core/test_field_types.py holds both builds to the same answers. Not
# compiled: modules whose classes subclass built-in exceptions or other classes
# (the commands and events, the storage engine, the server's asyncio protocol).
COMPILED_MODULES: tuple[str, ...] = (
    "log_format._bytes",
    "log_format.crc",
    "log_format.catalogue",
    "log_format.fastpath",
    "sepp.core.state",
    "sepp.core.apply",
    "sepp.core.snapshot",
    "sepp.core.invariants",
    "sepp.storage.replay",
    "sepp.core.decide",
    "sepp.protocol.messages",
    "sepp.protocol.framing",
    "sepp.server.wire",
    "sepp.server.ids",
    "log_format.envelope",
)
# The support library mypyc builds for the group (importable as a package module,
# so it is found wherever the package is).
SHARED_LIBRARY = "sepp._native__mypyc"
GROUP_NAME = "sepp._native"

PURE_ENV = "SEPP_PURE"

# A wheel (build_backend/sepp_build.py) carries this file in log_format, naming its
# build ("compiled" or "pure"). Its extension modules were built with the sources
# beside them, and an installer writes files in any order with fresh modification
# times, so the guard does not compare them there.
WHEEL_BUILD_FILE = "_wheel_build.txt"


class StaleBuildError(ImportError):
    """An extension module is older than its source."""


def _pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def extension_paths(source: str) -> list[str]:
    """The extension modules built for the module whose source is `source`."""
    stem = source[: -len(".py")]
    return [
        stem + suffix
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if os.path.exists(stem + suffix)
    ]


def stale_extensions(source: str) -> list[str]:
    """The extension modules built for `source` that are older than it."""
    return [
        path
        for path in extension_paths(source)
        if os.path.getmtime(path) < os.path.getmtime(source)
    ]


def _sources(package: str, package_dir: str) -> dict[str, str]:
    prefix = package + "."
    return {
        name: os.path.join(package_dir, *name[len(prefix) :].split(".")) + ".py"
        for name in COMPILED_MODULES
        if name.startswith(prefix)
    }


class _SourceFirst:
    """A meta-path finder that loads the named modules from their `.py` files."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _report_stale_builds_in_one_line(package: str) -> None:
    """Make an uncaught `StaleBuildError` end the program with one line on stderr
    (exit code 1) instead of a traceback. The guard runs while `sepp` or
    `log_format` is imported, before any command's own error handling exists,
    so every command (even ``sepp --help``) would otherwise die with a
    traceback; other exceptions go to the previous hook unchanged."""
    previous = sys.excepthook
    if getattr(previous, "stale_build_hook", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(value, StaleBuildError):
            previous(kind, value, tb)
            return
        prog = os.path.basename(sys.argv[0]) if sys.argv else ""
        if prog in ("", "-c", "-m") or prog.endswith(".py"):
            prog = package
        sys.stderr.write(f"{prog}: {value}\n")

    hook.stale_build_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def guard(package: str, package_dir: str) -> None:
    """Refuse a stale build of `package`'s compiled modules; honour SEPP_PURE."""
    sources = _sources(package, package_dir)
    if _pure_requested():
        sys.meta_path.insert(0, _SourceFirst(sources))
        return
    if installed_wheel_build(os.path.dirname(package_dir)) is not None:
        return
    for name, source in sources.items():
        stale = stale_extensions(source)
        if stale:
            _report_stale_builds_in_one_line(package)
            raise StaleBuildError(
                f"{stale[0]} is older than {source}: the compiled build would run "
                "old code. Rebuild it (python -m tools.compile), remove it "
                f"(python -m tools.compile --clean) or set {PURE_ENV}=1 to run "
                f"the sources ({name})"
            )


def installed_wheel_build(root: str) -> str | None:
    """The build named by the wheel installed at `root` (the directory holding
    `log_format`), or None where no wheel was installed (a checkout)."""
    try:
        with open(os.path.join(root, "log_format", WHEEL_BUILD_FILE), encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def loaded_build() -> dict[str, str]:
    """For each compiled-build module: "compiled", "pure", or "not loaded"."""
    result = {}
    for name in COMPILED_MODULES:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None) or ""
        if module is None:
            result[name] = "not loaded"
        elif file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            result[name] = "compiled"
        else:
            result[name] = "pure"
    return result


def running_build() -> str:
    """How this process loaded the compiled-build modules it imported so far:
    "compiled", "pure" or "mixed" (none imported yet: `build_name()`)."""
    kinds = set(loaded_build().values()) - {"not loaded"}
    if not kinds:
        return build_name()
    return kinds.pop() if len(kinds) == 1 else "mixed"


BUILDS = ("pure", "compiled")


def build_env(build: str) -> dict[str, str]:
    """The environment a child process needs to run `build` ("pure" or "compiled")
    of this checkout, whatever this process runs."""
    if build not in BUILDS:
        raise ValueError(f"unknown build {build!r} (expected one of {', '.join(BUILDS)})")
    return {PURE_ENV: "1" if build == "pure" else ""}


def _checkout_sources() -> list[str]:
    """The source file of every compiled-build module in this checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources: dict[str, str] = {}
    for package in dict.fromkeys(name.partition(".")[0] for name in COMPILED_MODULES):
        sources.update(_sources(package, os.path.join(root, package)))
    return [sources[name] for name in COMPILED_MODULES]


def stale_sources() -> list[str]:
    """The sources whose extension module is older than they are (a process
    without SEPP_PURE would refuse to start: StaleBuildError)."""
    return [source for source in _checkout_sources() if stale_extensions(source)]


def build_name(ignore_env: bool = False) -> str:
    """The build this process runs: "compiled", "pure" or "partial (k/n
    compiled)" (for logs and benchmark headers). With `ignore_env`, the build a
    process started without SEPP_PURE would run: what the checkout holds."""
    if _pure_requested() and not ignore_env:
        return "pure"
    count = sum(1 for source in _checkout_sources() if extension_paths(source))
    if count == 0:
        return "pure"
    if count == len(COMPILED_MODULES):
        return "compiled"
    return f"partial ({count}/{len(COMPILED_MODULES)} compiled)"


# log_format's own modules: guarded as soon as the package starts importing (its
# __init__ imports this module first).
guard("log_format", os.path.dirname(os.path.abspath(__file__)))
