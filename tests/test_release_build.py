"""How a release is built (build_backend/sepp_build.py, setup.py): one list of
compiled modules, the decision table of what a build compiles (one test per row),
and an sdist that carries every source. The compiled wheel itself takes half a
minute to build, so `.ci/run` builds it once (`python -m build`) and smoke-tests it
in a throwaway environment (.ci/wheel_smoke.py); tests/test_packaging.py builds a
pure wheel.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from log_format._compiled import COMPILED_MODULES, GROUP_NAME, WHEEL_BUILD_FILE

REPO = Path(__file__).resolve().parent.parent
WHEEL_COMMANDS = ("bdist_wheel", "build", "build_ext", "install")


def load_backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sepp_build_under_test", REPO / "build_backend" / "sepp_build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def backend() -> ModuleType:
    return load_backend()


def test_the_wheel_compiles_exactly_the_modules_of_compiled_modules(backend: ModuleType) -> None:
    constants = backend.compiled_list()
    assert constants == {
        "COMPILED_MODULES": COMPILED_MODULES,
        "GROUP_NAME": GROUP_NAME,
        "WHEEL_BUILD_FILE": WHEEL_BUILD_FILE,
    }
    for module in COMPILED_MODULES:
        assert (REPO / backend.module_source(module)).is_file(), module


# -- the decision table of build_kind, one test per row -----------------------------


@pytest.mark.parametrize("command", ["sdist", "egg_info", "dist_info"])
def test_an_sdist_or_metadata_build_compiles_nothing(backend: ModuleType, command: str) -> None:
    assert backend.build_kind([command, "--any-option"], {}) == "none"


def test_an_editable_install_compiles_nothing(backend: ModuleType) -> None:
    # build_meta.build_editable runs `editable_wheel`, which runs build_ext too.
    assert backend.build_kind(["editable_wheel", "--dist-info-dir", "x"], {}) == "editable"
    args = backend.setup_arguments(["editable_wheel", "--dist-info-dir", "x"])
    assert args["ext_modules"] == []


@pytest.mark.parametrize("command", WHEEL_COMMANDS)
def test_a_wheel_build_with_sepp_pure_is_pure(backend: ModuleType, command: str) -> None:
    assert backend.build_kind([command], {"SEPP_PURE": "1"}) == "pure"


@pytest.mark.parametrize("command", WHEEL_COMMANDS)
def test_a_wheel_build_compiles_by_default(backend: ModuleType, command: str) -> None:
    assert backend.build_kind([command, "--dist-dir", "x"], {}) == "compile"
    assert backend.build_kind([command], {"SEPP_PURE": "0"}) == "compile"


def test_a_wheel_build_without_a_compiler_is_pure_with_a_warning(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEPP_PURE", raising=False)
    monkeypatch.delenv("SEPP_REQUIRE_COMPILED", raising=False)
    monkeypatch.setattr(backend, "compile_problem", lambda: "no working C compiler (cc: not found)")
    with pytest.warns(UserWarning, match=r"PURE-PYTHON wheel: no working C compiler"):
        args = backend.setup_arguments(["bdist_wheel"])
    assert args["ext_modules"] == []


def test_a_build_that_requires_the_compiled_build_fails_without_a_compiler(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SEPP_PURE", raising=False)
    monkeypatch.setenv("SEPP_REQUIRE_COMPILED", "1")
    monkeypatch.setattr(backend, "compile_problem", lambda: "mypyc is not importable")
    with pytest.raises(SystemExit, match=r"SEPP_REQUIRE_COMPILED=1 but mypyc is not importable"):
        backend.setup_arguments(["bdist_wheel"])


# -- build requirements --------------------------------------------------------------


def _requires(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch, hook: str, pure: bool
) -> list[str]:
    # setuptools' own answer runs setup.py egg_info; only ours is under test.
    monkeypatch.setattr(backend._setuptools, "get_requires_for_build_wheel", lambda _=None: [])
    if pure:
        monkeypatch.setenv("SEPP_PURE", "1")
    else:
        monkeypatch.delenv("SEPP_PURE", raising=False)
    result: list[str] = getattr(backend, hook)(None)
    return result


def test_a_wheel_build_requires_mypy_unless_it_is_pure(
    backend: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    requirement = backend.MYPYC_REQUIREMENT
    assert _requires(backend, monkeypatch, "get_requires_for_build_wheel", False) == [requirement]
    assert _requires(backend, monkeypatch, "get_requires_for_build_wheel", True) == []


def test_the_mypy_of_a_wheel_build_is_the_dev_extras() -> None:
    import tomllib

    with open(REPO / "pyproject.toml", "rb") as f:
        config: dict[str, Any] = tomllib.load(f)
    assert load_backend().MYPYC_REQUIREMENT in config["project"]["optional-dependencies"]["dev"]
    assert config["build-system"]["build-backend"] == "sepp_build"
    assert config["build-system"]["backend-path"] == ["build_backend"]


# -- the sdist -----------------------------------------------------------------------


def test_the_sdist_carries_every_source_and_what_builds_the_wheel(tmp_path: Path) -> None:
    """A real sdist (`python -m build --sdist`, no isolation: offline), built
    into a temporary directory."""
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    (sdist,) = tmp_path.glob("sepp-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    expected = {"setup.py", "pyproject.toml", "README.md", "build_backend/sepp_build.py"}
    for folder in ("sepp", "log_format", "tools"):
        for path in (REPO / folder).rglob("*"):
            source = path.suffix in (".py", ".md") or path.name == "py.typed"
            if source and "__pycache__" not in path.parts:
                expected.add(str(path.relative_to(REPO)))
    assert expected - names == set()
    assert not [n for n in names if n.endswith(".so") or n.startswith("tests/")]
