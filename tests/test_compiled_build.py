"""The optional compiled build (log_format/_compiled.py, tools/compile.py): a stale
extension never loads, SEPP_PURE=1 runs the sources, and a run can say which build
it is. The guard tests use a fake package in a temporary directory, so they need no
C compiler; CI also runs the core, format, storage and tools suites on a real
compiled build (`.ci/run`), where the last test here checks that it really was one.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from log_format._compiled import (
    COMPILED_MODULES,
    PURE_ENV,
    WHEEL_BUILD_FILE,
    StaleBuildError,
    guard,
    installed_wheel_build,
    loaded_build,
    running_build,
)

REPO = Path(__file__).resolve().parent.parent


def _fake_package(tmp_path: Path, source_mtime: float, extension_mtime: float) -> Path:
    """`sepp/core/apply.py` and an extension module for it, with these mtimes."""
    package = tmp_path / "sepp"
    (package / "core").mkdir(parents=True)
    source = package / "core" / "apply.py"
    source.write_text("VALUE = 'source'\n")
    extension = package / "core" / f"apply{EXTENSION_SUFFIXES[0]}"
    extension.write_bytes(b"not really an extension")
    os.utime(source, (source_mtime, source_mtime))
    os.utime(extension, (extension_mtime, extension_mtime))
    return package


def test_an_extension_older_than_its_source_refuses_to_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PURE_ENV, raising=False)
    package = _fake_package(tmp_path, source_mtime=2_000_000, extension_mtime=1_000_000)
    with pytest.raises(StaleBuildError, match=r"apply.*older than.*apply\.py.*tools\.compile"):
        guard("sepp", str(package))


def test_an_extension_built_after_its_source_passes_the_guard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PURE_ENV, raising=False)
    package = _fake_package(tmp_path, source_mtime=1_000_000, extension_mtime=2_000_000)
    guard("sepp", str(package))  # no exception: a fresh build may load


def test_an_installed_wheel_loads_its_extensions_whatever_their_modification_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installer writes a wheel's files in archive order with fresh times: an
    # extension module lands before its `.py` (apply.cpython-*.so sorts before
    # apply.py). The wheel's build file says they were built together.
    monkeypatch.delenv(PURE_ENV, raising=False)
    package = _fake_package(tmp_path, source_mtime=2_000_000, extension_mtime=1_000_000)
    (tmp_path / "log_format").mkdir()
    (tmp_path / "log_format" / WHEEL_BUILD_FILE).write_text("compiled\n")
    guard("sepp", str(package))  # no exception
    assert installed_wheel_build(str(tmp_path)) == "compiled"
    assert installed_wheel_build(str(REPO)) is None  # a checkout


def test_pure_mode_loads_the_source_even_when_an_extension_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stale (and not even loadable) extension: SEPP_PURE=1 neither refuses it
    # nor loads it; the module comes from the .py beside it.
    monkeypatch.setenv(PURE_ENV, "1")
    package = _fake_package(tmp_path, source_mtime=2_000_000, extension_mtime=1_000_000)
    before = list(sys.meta_path)
    guard("sepp", str(package))
    finder = next(f for f in sys.meta_path if f not in before)
    try:
        spec = finder.find_spec("sepp.core.apply", None)
        assert spec is not None and spec.origin == str(package / "core" / "apply.py")
        assert finder.find_spec("sepp.server.server", None) is None  # not a compiled module
    finally:
        sys.meta_path.remove(finder)


def test_a_child_with_sepp_pure_runs_every_module_from_source() -> None:
    code = (
        f"import {', '.join(COMPILED_MODULES)}; "
        "from log_format._compiled import loaded_build, running_build; "
        "print(sorted(set(loaded_build().values())), running_build())"
    )
    env = {**os.environ, PURE_ENV: "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["['pure']", "pure"]


def test_every_compiled_module_names_a_source_file() -> None:
    for name in COMPILED_MODULES:
        assert (REPO / Path(*name.split("."))).with_suffix(".py").is_file(), name


def test_the_build_under_test_is_the_one_ci_asked_for() -> None:
    """`.ci/run` sets SEPP_EXPECT_BUILD for both passes: `pure` for the first
    (no stale extension module may sneak in), `compiled` for the second, after
    `python -m tools.compile` (that pass must really run the extension modules).
    Only a run that expects nothing (a developer's `pytest`) skips; in CI that
    skip is a failure (tests/ci_skips.py)."""
    expected = os.environ.get("SEPP_EXPECT_BUILD")
    if expected is None:
        pytest.skip("SEPP_EXPECT_BUILD not set (.ci/run sets it for both of its passes)")
    assert expected in ("pure", "compiled"), f"SEPP_EXPECT_BUILD={expected!r}"
    for name in COMPILED_MODULES:
        importlib.import_module(name)
    assert running_build() == expected, loaded_build()
    assert set(loaded_build().values()) == {expected}, loaded_build()
