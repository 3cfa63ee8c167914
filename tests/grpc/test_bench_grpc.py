"""benchmarks/bench_grpc.py runs end to end (200 jobs, one run): its phases, its
table and its verdict line (the figures themselves are the benchmark's business,
never a test's)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.grpc.conftest import OfficialClient


def test_bench_grpc_prints_its_table_and_verdict(official_client: OfficialClient):
    venv = official_client.python.parent.parent
    proc = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.bench_grpc", "--jobs", "200", "--runs", "1",
            "--no-pin", "--official-venv", str(venv),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("phase "))
    assert "server µs/request" in header
    for phase in ("official", "native_raw", "native"):
        assert any(line.split()[:1] == [phase] for line in lines), proc.stdout
    assert any(line.startswith("official client, 50 concurrent") for line in lines)
