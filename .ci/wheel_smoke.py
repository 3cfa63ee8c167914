"""The smoke test of a built wheel (run by .ci/run in a throwaway virtual
environment where only the wheel and its dependencies are installed; the working
directory must not be the checkout, so nothing is imported from it).

    <venv>/bin/python wheel_smoke.py compiled|pure

Checks that sepp imports from the environment's site-packages and runs the
expected build in this process (the client side, every COMPILED_MODULES module
loaded), starts the installed `sepp serve` on 127.0.0.1:0 with a temporary data
directory, reads the build its startup line names, enqueues, reserves and acks one
job through the client, and stops the server by its PID (SIGTERM: exit code 0).
Exit code 0: all checks passed; 1: a check failed (the reason on stderr).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from datetime import timedelta

STARTUP_S_MAX = 60.0
LISTENING = re.compile(r"listening on ([0-9.]+):(\d+) \(.*build=([a-z]+)")


def fail(reason: str) -> None:
    print(f"wheel smoke: FAIL: {reason}", file=sys.stderr)
    raise SystemExit(1)


def check_imports(expected: str) -> None:
    import sepp
    from log_format._compiled import COMPILED_MODULES, loaded_build, running_build

    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    if not os.path.realpath(sepp.__file__).startswith(site + os.sep):
        fail(f"sepp imported from {sepp.__file__}, not from {site}")
    for name in COMPILED_MODULES:
        importlib.import_module(name)
    if running_build() != expected:
        fail(f"this process runs the {running_build()} build, not {expected}: {loaded_build()}")


def start_server(data_dir: str, log_path: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """The installed `sepp serve`, its address and the build its startup line names."""
    sepp_command = os.path.join(os.path.dirname(sys.executable), "sepp")
    log = open(log_path, "wb")  # noqa: SIM115 (the server writes to it until stopped)
    server = subprocess.Popen(
        [sepp_command, "serve", "--data-dir", data_dir, "--listen", "127.0.0.1:0"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + STARTUP_S_MAX
    while time.monotonic() < deadline:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            found = LISTENING.search(f.read())
        if found:
            return server, f"{found[1]}:{found[2]}", found[3]
        if server.poll() is not None:
            break
        time.sleep(0.05)  # polling a log file for a line, with a deadline
    server.kill()
    with open(log_path, encoding="utf-8", errors="replace") as f:
        fail(f"no 'listening on' line within {STARTUP_S_MAX} s:\n{f.read()}")
    raise AssertionError("unreachable")


async def round_trip(address: str) -> None:
    from sepp import EnqueueRequest, Payload, SeppClient
    from sepp.client.types import ReserveOptions

    client = await SeppClient.connect(address)
    try:
        await client.enqueue(EnqueueRequest("smoke", "ping", payload=Payload(b"1", "text/plain")))
        jobs = await client.reserve(
            ReserveOptions(
                ["smoke"], timedelta(seconds=30), wait_timeout=timedelta(seconds=5), max_jobs=1
            )
        )
        if not jobs or len(jobs) != 1:
            fail(f"reserve returned {jobs!r}, expected the one enqueued job")
        await client.ack(jobs[0].ctx)
    finally:
        await client.close()


def main() -> int:
    expected = sys.argv[1] if len(sys.argv) > 1 else "compiled"
    check_imports(expected)
    with tempfile.TemporaryDirectory(prefix="sepp-wheel-smoke-") as tmp:
        log_path = os.path.join(tmp, "server.log")
        server, address, server_build = start_server(os.path.join(tmp, "data"), log_path)
        try:
            if server_build != expected:
                fail(f"the server names build={server_build}, expected {expected}")
            asyncio.run(round_trip(address))
        finally:
            if server.poll() is None:
                os.kill(server.pid, signal.SIGTERM)
            code = server.wait(timeout=60)
        if code != 0:
            with open(log_path, encoding="utf-8", errors="replace") as f:
                fail(f"the server exited with {code} after SIGTERM:\n{f.read()}")
    print(f"wheel smoke: ok ({expected} build; server on {address}; enqueue, reserve, ack)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
