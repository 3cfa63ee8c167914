"""The README's "Using it from Python" example, run as written against a real
server: it processes its job, and Ctrl-C (SIGINT) or SIGTERM stops it gracefully,
with exit code 0 and no traceback (issue 12, section 5)."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent.parent


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it from Python") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python example under 'Using it from Python'"
    return match.group(1)


def read_line_containing(proc: subprocess.Popen[bytes], needle: str, timeout: float) -> str:
    """Read the child's stdout until a line contains `needle` (or fail at the deadline)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0 and proc.poll() is None, f"no {needle!r} in {buffer!r}"
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            buffer += chunk
            *complete, _partial = buffer.decode(errors="replace").split("\n")
            for line in complete:
                if needle in line:
                    return line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_readme_example_processes_its_job_and_stops_on_a_signal(
    server_factory: Callable[..., Any], tmp_path: Path, signum: int
) -> None:
    server = server_factory()
    code = readme_example().replace('"127.0.0.1:7463"', repr(server.address))
    assert repr(server.address) in code
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.Popen(
        [sys.executable, "-u", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        assert "attempt 1" in read_line_containing(proc, "processing", timeout=30)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr and b"KeyboardInterrupt" not in stderr
