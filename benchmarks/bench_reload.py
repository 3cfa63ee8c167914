"""How soon a hot-reloaded API key or limit takes effect (issue 15 target: <= 1 s
after SIGHUP).

    python -m benchmarks.bench_reload              # 20 reloads of each kind
    python -m benchmarks.bench_reload --reloads 50

Starts a real `sepp serve` (127.0.0.1:0, a config file in a temporary directory,
admin listener off) and, for each kind, `--reloads` times: writes the config file
with a change, sends SIGHUP and polls (no pause between tries) until the change
is seen, and records the milliseconds from the SIGHUP to the first request that
saw it:

- key: a new API key each time; a try is a fresh connection whose hello carries
  the new key, accepted once the reload switched the keys;
- limit: `limits.max_payload_bytes` goes up each time; a try is an enqueue, on a
  connection opened before the reload, of a payload one byte over the old limit,
  accepted once the new limit is live.

The file watcher would reload the same change 500 ms later (its debounce): the
SIGHUP comes first, and the watcher's reload of an unchanged file changes nothing.
Prints the machine line and a table of median, p90 and max.
"""

from __future__ import annotations

import argparse
import itertools
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine_line, median, print_table
from sepp.protocol import messages as pm
from sepp.protocol.framing import FRAME_BYTES_CEILING, FrameReader, encode_frame

GIVE_UP_S = 30.0


class Connection:
    """One blocking protocol connection (no client library: no retries, no pools,
    nothing between the request and the wire)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.frames = FrameReader(FRAME_BYTES_CEILING)
        self.ids = itertools.count(1)
        self.pending: list[bytes] = []

    def call(self, op: str, body: dict[str, Any]) -> pm.Response:
        request_id = next(self.ids)
        self.sock.sendall(encode_frame(pm.encode_request(request_id, op, body)))
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server")
            self.pending.extend(self.frames.feed(data))
        return pm.decode_response(self.pending.pop(0))

    def hello(self, key: str | None) -> str:
        body: dict[str, Any] = {"protocol": pm.PROTOCOL_VERSION}
        if key is not None:
            body["api_key"] = key
        return self.call("hello", body).status

    def close(self) -> None:
        self.sock.close()


def config_text(keys: list[str], max_payload_bytes: int) -> str:
    entries = ", ".join(f'{{name = "k{i}", key = "{key}"}}' for i, key in enumerate(keys))
    return f"[auth]\napi_keys = [{entries}]\n[limits]\nmax_payload_bytes = {max_payload_bytes}\n"


def start_server(workdir: Path, config: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    env["SEPP_ADMIN__LISTEN_ADDR"] = "off"
    log = open(workdir / "server.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "sepp.server.cli", "serve", "--listen", "127.0.0.1:0",
         "--data-dir", str(workdir / "data"), "--config", str(config)],
        stdout=subprocess.PIPE, stderr=log, env=env, cwd=workdir,
    )  # fmt: skip
    log.close()
    assert proc.stdout is not None
    line = b""
    deadline = time.monotonic() + GIVE_UP_S
    while not line.endswith(b"\n"):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError((workdir / "server.log").read_text())
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line += os.read(proc.stdout.fileno(), 1)
    return proc, int(line.decode().strip().rpartition(":")[2])


def until(check: Any) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the reload never took effect")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reloads", type=int, default=20)
    args = parser.parse_args(argv)
    print(machine_line())
    print(f"command: python -m benchmarks.bench_reload --reloads {args.reloads}")
    with tempfile.TemporaryDirectory(prefix="bench-reload-") as tmp:
        workdir = Path(tmp)
        config = workdir / "sepp.toml"
        keys = ["key-0"]
        limit = 1024
        config.write_text(config_text(keys, limit))
        proc, port = start_server(workdir, config)
        try:
            key_ms: list[float] = []
            for i in range(1, args.reloads + 1):
                keys = [keys[-1], f"key-{i}"]
                config.write_text(config_text(keys, limit))

                def accepted(key: str = keys[-1]) -> bool:
                    conn = Connection(port)
                    try:
                        return conn.hello(key) == "ok"
                    except ConnectionError:
                        return False
                    finally:
                        conn.close()

                t0 = time.perf_counter()
                os.kill(proc.pid, signal.SIGHUP)
                until(accepted)
                key_ms.append((time.perf_counter() - t0) * 1000)

            limit_ms: list[float] = []
            worker = Connection(port)
            assert worker.hello(keys[-1]) == "ok"
            for _ in range(args.reloads):
                job = {"queue": "bench", "job_type": "work",
                       "payload": {"data": b"x" * (limit + 1), "encoding": "application/octet-stream"}}  # fmt: skip
                limit += 1024
                config.write_text(config_text(keys, limit))

                def enqueued(job: dict[str, Any] = job) -> bool:
                    result = worker.call("enqueue", {"jobs": [job]}).body["results"][0]
                    return "job_id" in result

                t0 = time.perf_counter()
                os.kill(proc.pid, signal.SIGHUP)
                until(enqueued)
                limit_ms.append((time.perf_counter() - t0) * 1000)
            worker.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            if proc.stdout is not None:
                proc.stdout.close()

    def p90(values: list[float]) -> float:
        return sorted(values)[max(0, int(len(values) * 0.9) - 1)]

    print_table(
        ["change", "reloads", "median ms", "p90 ms", "max ms", "target"],
        [
            ["new API key", len(key_ms), median(key_ms), p90(key_ms), max(key_ms), "<= 1000"],
            ["limit (max_payload_bytes)", len(limit_ms), median(limit_ms), p90(limit_ms),
             max(limit_ms), "<= 1000"],
        ],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
