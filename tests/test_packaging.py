"""The distribution: what `pip install sepp` puts into site-packages.

The repository keeps its operator tools in `tools/` (run from the root as
`python -m tools.X`), but an installed distribution must not claim a generic
top-level name like `tools` (it would collide with any other project's). So the
folder installs as `sepp_tools` (pyproject's package-dir), `sepp-log` points
there, and the modules inside import each other relatively, which works under
both names. The `dev` extra declares setuptools, which tools/compile.py needs.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from log_format._compiled import WHEEL_BUILD_FILE

REPO = Path(__file__).resolve().parent.parent
INSTALLED_TOOLS = "sepp_tools"


def pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def tools_modules() -> list[Path]:
    return sorted((REPO / "tools").glob("*.py"))


def test_the_distribution_installs_tools_as_sepp_tools_never_as_tools() -> None:
    config = pyproject()
    setuptools = config["tool"]["setuptools"]
    packages = setuptools["packages"]
    assert not [p for p in packages if p == "tools" or p.startswith("tools.")], packages
    assert INSTALLED_TOOLS in packages
    assert setuptools["package-dir"] == {INSTALLED_TOOLS: "tools"}
    assert config["project"]["scripts"]["sepp-log"] == f"{INSTALLED_TOOLS}.sepp_log:main"


def test_every_package_folder_is_declared() -> None:
    """The packages are listed, not found: a new subpackage must be added."""
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in ("sepp", "log_format")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert (REPO / "tools" / "__init__.py").is_file()
    assert set(pyproject()["tool"]["setuptools"]["packages"]) == found | {INSTALLED_TOOLS}


def test_modules_in_tools_import_each_other_relatively() -> None:
    absolute = []
    for path in tools_modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            absolute += [
                f"{path.name}:{node.lineno} imports {name}"
                for name in names
                if name == "tools" or name.startswith("tools.")
            ]
    assert not absolute, "use `from .x import ...` inside tools/:\n" + "\n".join(absolute)


def test_every_tools_module_imports_under_its_installed_name(tmp_path: Path) -> None:
    """Under the name a wheel installs it as, in a directory where `tools` is not
    importable, every module imports and none reaches for `tools`."""
    (tmp_path / INSTALLED_TOOLS).symlink_to(REPO / "tools", target_is_directory=True)
    modules = [f"{INSTALLED_TOOLS}.{p.stem}" for p in tools_modules() if p.stem != "__init__"]
    code = (
        "import importlib, sys\n"
        f"sys.path[:0] = [{str(tmp_path)!r}, {str(REPO)!r}]\n"
        # The project's own packages come from the repository; `tools` must not.
        "sys.modules['tools'] = None\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


def test_the_dev_extra_declares_setuptools_for_the_compiled_build() -> None:
    dev = pyproject()["project"]["optional-dependencies"]["dev"]
    assert any(req.replace(" ", "").startswith("setuptools>=") for req in dev), dev
    assert "from setuptools import setup" in (REPO / "tools" / "compile.py").read_text()


def test_the_built_wheel_holds_sepp_log_format_and_sepp_tools_only(tmp_path: Path) -> None:
    """A real wheel, built offline from a copy of the sources (nothing is
    written into the repository)."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for folder in ("sepp", "log_format", "tools"):
        shutil.copytree(REPO / folder, source / folder, ignore=ignore)
    shutil.copytree(REPO / "build_backend", source / "build_backend", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "setup.py", "MANIFEST.in"):
        shutil.copy(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    offline = ["--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, "-q", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        # A pure wheel: compiling takes half a minute (.ci/run builds the compiled
        # one and smoke-tests it; tests/test_release_build.py checks its setup).
        env={**os.environ, "SEPP_PURE": "1"},
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("sepp-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert archive.read(f"log_format/{WHEEL_BUILD_FILE}") == b"pure\n"
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"sepp", "log_format", INSTALLED_TOOLS}, tops
    assert f"{INSTALLED_TOOLS}/sepp_log.py" in names
    assert f"sepp-log = {INSTALLED_TOOLS}.sepp_log:main" in scripts
