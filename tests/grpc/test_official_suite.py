"""The official Python client's own integration suite, unchanged, against a real
`sepp serve --grpc-listen 127.0.0.1:0`: sepp-py 0.1.0's tests/integration (19
tests), run twice in a row against one server (the second run meets the first
run's leftovers, as the suite allows: "the tests then share that server and its
state"), in the client's own virtual environment (it imports as `sepp` too).
"""

from __future__ import annotations

import os
import re
import subprocess

from tests.grpc.conftest import OfficialClient, read_grpc_line

OFFICIAL_TESTS = 19
RUN_TIMEOUT_S = 300


def run_official_suite(client: OfficialClient, address: str) -> tuple[str, str]:
    """(the summary line, the whole output) of one run."""
    env = dict(os.environ)
    env["SEPP_TEST_ADDR"] = address
    for name in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV"):
        env.pop(name, None)
    proc = subprocess.run(
        [str(client.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration"],
        cwd=client.sdist,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return proc.stdout.strip().splitlines()[-1], output


def test_the_official_clients_integration_suite_passes_twice_against_one_server(
    official_client: OfficialClient, server_factory
):
    server = server_factory(args=["--grpc-listen", "127.0.0.1:0"])
    address = read_grpc_line(server)
    for run in (1, 2):
        summary, output = run_official_suite(official_client, address)
        print(f"official suite run {run}: {summary}")
        assert re.search(rf"\b{OFFICIAL_TESTS} passed\b", summary), output
        assert not re.search(r"\b(failed|skipped|error|errors)\b", summary), output
    assert server.stop() == 0, server.log()
