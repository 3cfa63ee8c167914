"""Build, remove or show the optional compiled build (mypyc) in this checkout.

    python -m tools.compile            # compile COMPILED_MODULES in place
    python -m tools.compile --clean    # remove the extension modules: pure Python again
    python -m tools.compile --status   # which build runs, module by module

The modules of `log_format._compiled.COMPILED_MODULES` (the replay and verify hot
path, and the server's request path) are compiled by mypyc, from the same typed sources, into extension modules
next to those sources; Python then loads them instead of the `.py` files. Needs the
dev extra (mypy, which brings mypyc) and a C compiler with the Python headers.
Nothing else changes: the pure-Python sources stay the reference, `SEPP_PURE=1`
runs them even when a build exists, and an extension older than its source refuses
to load (rebuild after editing one of these modules).

Exit codes: 0 done; 1 the build failed (the compiler's output is shown).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import textwrap

# This tool must run on a stale build (to replace it), and never loads a compiled
# module itself: import log_format with the sources first.
os.environ["SEPP_PURE"] = "1"

from log_format._compiled import (
    COMPILED_MODULES,
    GROUP_NAME,
    SHARED_LIBRARY,
    extension_paths,
    stale_extensions,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_DIR = os.path.join(REPO, "build", "mypyc")

# Run by a child interpreter in the repository root: setuptools' build_ext
# --inplace over the extensions mypyc generates (what the `mypyc` command does,
# with the group name set so the shared support library lives inside `sepp`).
_SETUP = textwrap.dedent(
    """
    import sys
    from setuptools import setup
    from mypyc.build import mypycify

    files, group, build_dir = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    sys.argv[1:] = ["build_ext", "--inplace", "--build-temp", build_dir + "/temp"]
    setup(
        name="sepp-compiled",
        py_modules=[],
        packages=[],
        ext_modules=mypycify(files, opt_level="3", group_name=group, target_dir=build_dir),
    )
    """
)


def source_path(module: str) -> str:
    return os.path.join(REPO, *module.split(".")) + ".py"


def built_files() -> list[str]:
    files = [path for module in COMPILED_MODULES for path in extension_paths(source_path(module))]
    shared = os.path.join(REPO, *SHARED_LIBRARY.split("."))
    files += sorted(glob.glob(shared + ".*"))
    return files


def clean() -> list[str]:
    removed = built_files()
    for path in removed:
        os.remove(path)
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    return removed


def build() -> int:
    clean()
    files = [os.path.relpath(source_path(m), REPO) for m in COMPILED_MODULES]
    os.makedirs(BUILD_DIR, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", _SETUP, ",".join(files), GROUP_NAME, BUILD_DIR],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-20_000:] + out.stderr[-20_000:])
        print(f"ERROR the compiled build failed (exit {out.returncode})", file=sys.stderr)
        clean()  # never leave half a build behind
        return 1
    return 0


def status() -> str:
    """Which build a process started now would run (without SEPP_PURE)."""
    rows = []
    for module in COMPILED_MODULES:
        source = source_path(module)
        built = extension_paths(source)
        if not built:
            rows.append((module, "pure"))
        elif stale_extensions(source):
            rows.append((module, "STALE (older than its source: refuses to load)"))
        else:
            rows.append((module, "compiled"))
    kinds = {kind for _, kind in rows}
    overall = kinds.pop() if len(kinds) == 1 else "mixed"
    return "\n".join([f"build: {overall}"] + [f"  {m:<28} {kind}" for m, kind in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.compile",
        description="Build, remove or show the optional compiled build (mypyc).",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--clean", action="store_true", help="remove the compiled modules")
    action.add_argument("--status", action="store_true", help="show which build runs")
    args = parser.parse_args(argv)
    if args.status:
        print(status())
        return 0
    if args.clean:
        removed = clean()
        print(f"removed {len(removed)} compiled files")
        return 0
    code = build()
    if code == 0:
        print(status())
    return code


if __name__ == "__main__":
    raise SystemExit(main())
