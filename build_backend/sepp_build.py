"""How a release of sepp is built: the PEP 517 backend (setuptools' own, which
adds mypy to the requirements of a wheel build only) and what setup.py hands to
setuptools.

    python -m build                      # sdist + a compiled wheel built from it
    SEPP_PURE=1 python -m build          # sdist + a pure wheel (py3-none-any)
    SEPP_REQUIRE_COMPILED=1 python -m build   # a release: no silent pure fallback

A wheel build compiles the modules of `COMPILED_MODULES` (log_format/_compiled.py,
the one list, read here with `ast` because the build environment has none of
sepp's dependencies) with mypyc — the same call as `python -m tools.compile` —
and the wheel carries their extension modules and every `.py` source beside
them (SEPP_PURE=1 runs the sources of an installed compiled wheel). It also
carries `log_format/<WHEEL_BUILD_FILE>`, naming its build: in an installed wheel
the extension modules and sources were built together, and an installer writes
them in any order, so the stale-build guard (which compares modification times
in a checkout) does not apply there.

When a build compiles (`build_kind`; one test per row in tests/test_release_build.py):

| setup.py command                             | environment                     | result                               |
|----------------------------------------------|---------------------------------|--------------------------------------|
| sdist, egg_info, dist_info (metadata)        | any                             | sources only, nothing compiled       |
| editable_wheel (`pip install -e .`)          | any                             | pure: no compile step, no mypy       |
| bdist_wheel, build, build_ext, install       | SEPP_PURE=1                     | pure wheel (py3-none-any)            |
| bdist_wheel, build, build_ext, install       | no mypyc, or no working C compiler with the Python headers | pure wheel and a warning; with SEPP_REQUIRE_COMPILED=1 the build fails |
| bdist_wheel, build, build_ext, install       | otherwise                       | compiled wheel (cp3XX-<platform>)    |

A compiler or mypyc error once both are found is a bug in the sources, not a
missing tool: the build fails (no half-compiled wheel).

Must not import: sepp, log_format or tools (their dependencies are not installed
in an isolated build environment); setuptools only inside functions that need it.
"""

from __future__ import annotations

import ast
import os
import tempfile
import warnings
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the rest of the backend, unchanged)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILED_LIST_FILE = os.path.join("log_format", "_compiled.py")
# mypyc comes with mypy; the same requirement as the dev extra's.
MYPYC_REQUIREMENT = "mypy>=1.10"
PURE_ENV = "SEPP_PURE"
REQUIRE_COMPILED_ENV = "SEPP_REQUIRE_COMPILED"
# Where mypyc writes its C sources for a wheel (tools.compile uses build/mypyc).
C_SOURCES_DIR = os.path.join("build", "mypyc-wheel")

WHEEL_COMMANDS = frozenset({"bdist_wheel", "build", "build_ext", "install"})


def _flag(name: str, environ: dict[str, str] | os._Environ[str]) -> bool:
    return environ.get(name, "") not in ("", "0")


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    """setuptools' requirements, and mypy (mypyc) unless the wheel is to be pure."""
    requires = list(_setuptools.get_requires_for_build_wheel(config_settings))
    if not _flag(PURE_ENV, os.environ):
        requires.append(MYPYC_REQUIREMENT)
    return requires


def compiled_list(root: str = REPO) -> dict[str, Any]:
    """The module-level constants of log_format/_compiled.py that name the build:
    COMPILED_MODULES, GROUP_NAME, WHEEL_BUILD_FILE (read, not imported)."""
    path = os.path.join(root, COMPILED_LIST_FILE)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    wanted = {"COMPILED_MODULES", "GROUP_NAME", "WHEEL_BUILD_FILE"}
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            for target in targets:
                if isinstance(target, ast.Name) and target.id in wanted and node.value:
                    found[target.id] = ast.literal_eval(node.value)
    missing = wanted - found.keys()
    if missing:
        raise RuntimeError(f"{path} defines no {', '.join(sorted(missing))}")
    return found


def module_source(module: str) -> str:
    """The source file of `module`, relative to the project root."""
    return os.path.join(*module.split(".")) + ".py"


def build_kind(commands: list[str], environ: dict[str, str] | os._Environ[str]) -> str:
    """What this setup.py run builds: "none" (sources or metadata only),
    "editable" (the sources, in place: nothing compiled, no build file), "pure",
    or "compile" (try to; `compile_problem` may still make it pure)."""
    if "editable_wheel" in commands:
        return "editable"
    if not WHEEL_COMMANDS.intersection(commands):
        return "none"
    if _flag(PURE_ENV, environ):
        return "pure"
    return "compile"


def compile_problem() -> str | None:
    """Why this machine cannot compile: no mypyc, or no C compiler that builds
    against the Python headers (a one-line C file tried). None when it can."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError as error:
        return f"mypyc is not importable ({error}; it comes with {MYPYC_REQUIREMENT})"
    import sysconfig

    # `distutils` here is setuptools' own copy (setuptools is imported above).
    from distutils.ccompiler import new_compiler  # type: ignore[import-not-found,unused-ignore]
    from distutils.sysconfig import customize_compiler  # type: ignore[import-not-found,unused-ignore]

    from setuptools.errors import CompileError, ExecError, PlatformError

    with tempfile.TemporaryDirectory(prefix="sepp-cc-") as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w", encoding="utf-8") as f:
            f.write("#include <Python.h>\nint sepp_probe(void) { return 0; }\n")
        compiler = new_compiler()
        customize_compiler(compiler)
        try:
            compiler.compile(
                [source], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]]
            )
        except (CompileError, ExecError, PlatformError, OSError) as error:
            return f"no working C compiler with the Python headers ({error})"
    return None


def setup_arguments(commands: list[str]) -> dict[str, Any]:
    """The keyword arguments setup.py passes to `setuptools.setup` for `commands`
    (its command line): the extension modules when it compiles, and a build_py
    that writes the wheel's build file."""
    from setuptools.command.build_py import build_py

    constants = compiled_list()
    kind = build_kind(commands, os.environ)
    ext_modules: list[Any] = []
    if kind == "compile":
        problem = compile_problem()
        if problem is not None:
            if _flag(REQUIRE_COMPILED_ENV, os.environ):
                raise SystemExit(f"error: {REQUIRE_COMPILED_ENV}=1 but {problem}")
            warnings.warn(
                f"sepp: building a PURE-PYTHON wheel: {problem}. It works, with the "
                "server and replay slower than the compiled build.",
                stacklevel=1,
            )
            kind = "pure"
        else:
            from mypyc.build import mypycify

            ext_modules = mypycify(
                [module_source(m) for m in constants["COMPILED_MODULES"]],
                opt_level="3",
                group_name=constants["GROUP_NAME"],
                target_dir=C_SOURCES_DIR,
            )
            kind = "compiled"
    build_file = os.path.join("log_format", constants["WHEEL_BUILD_FILE"])

    class BuildPyNamingTheBuild(build_py):
        """build_py, plus log_format/<WHEEL_BUILD_FILE> in a (non-editable) build."""

        def run(self) -> None:
            super().run()
            if kind in ("none", "editable") or getattr(self, "editable_mode", False):
                return
            target = os.path.join(self.build_lib, build_file)
            with open(target, "w", encoding="utf-8") as f:
                f.write(f"{kind}\n")

        def get_outputs(self, include_bytecode: bool = True) -> list[str]:
            outputs = list(super().get_outputs(include_bytecode))
            if kind not in ("none", "editable") and not getattr(self, "editable_mode", False):
                outputs.append(os.path.join(self.build_lib, build_file))
            return outputs

    return {"ext_modules": ext_modules, "cmdclass": {"build_py": BuildPyNamingTheBuild}}
