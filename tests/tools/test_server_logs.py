"""`sepp-log` on the data directory of a real `sepp serve` process: read-only
while it runs (the growing log is not an error), again after it stopped (its
shutdown snapshot matches the log), and point-in-time recovery: a directory cut by
`replay --into` is one the server starts from, with the jobs it held at that point.

The test speaks the wire protocol (sepp/protocol, PROTOCOL.md) over a blocking
socket: a minimal client, so that nothing but the server is under test.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sepp.protocol import FrameReader, decode_response, encode_frame, encode_request
from tests.conftest import ServerProcess
from tests.tools.helpers import tree
from tools.datadir import ERROR, open_data_dir
from tools.dump import DumpFilter, EventLine, dump
from tools.replay import queue_summaries, replay_to, write_into
from tools.verify import verify

CONFIG_TOML = """
[storage]
persist_mode = "buffer"
segment_bytes_max = 4096
snapshot_every_bytes = 0
dead_letter_retention_ms = 600000
log_retention_ms = 86400000
"""


class RawClient:
    """Requests one at a time over a blocking socket."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=30)
        self.frames = FrameReader()
        self.next_id = 1
        self.call("hello", {"protocol": 1, "client": "tests/tools"})

    def call(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        request_id = self.next_id
        self.next_id += 1
        self.sock.sendall(encode_frame(encode_request(request_id, op, body)))
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            for frame in self.frames.feed(data):
                response = decode_response(frame)
                if response.id == request_id:
                    if response.status != "ok":
                        raise AssertionError(f"{op} failed: {response}")
                    body_out: dict[str, Any] = response.body
                    return body_out

    def close(self) -> None:
        self.sock.close()


def _enqueue(client: RawClient, queue: str, count: int) -> list[str]:
    jobs = [
        {"queue": queue, "job_type": "send", "payload": {"data": bytes(300), "encoding": "raw"}}
        for _ in range(count)
    ]
    results = client.call("enqueue", {"jobs": jobs})["results"]
    return [r["job_id"] for r in results]


def test_tools_read_a_running_servers_directory_and_its_cut_restarts(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    config = tmp_path / "sepp.toml"
    config.write_text(CONFIG_TOML)
    data = tmp_path / "data"
    server = server_factory(args=["--config", str(config)], data_dir=data)
    client = RawClient(server)
    try:
        emails = [job for _ in range(6) for job in _enqueue(client, "emails", 3)]
        reserved = client.call(
            "reserve", {"queues": ["emails"], "lease_ms": 60_000, "max_jobs": 4, "worker_id": "w1"}
        )["jobs"]
        for job in reserved[:2]:
            client.call("ack", {"job_id": job["id"], "attempt": job["attempt"]})
        client.call(
            "nack",
            {"job_id": reserved[2]["id"], "attempt": 1, "retry": "dead_letter", "reason": "bad"},
        )
        reports = _enqueue(client, "reports", 2)

        # While it runs: read-only, and every record is there.
        before = tree(data)
        live = verify(open_data_dir(str(data)))
        assert [p for p in live.problems if p.severity == ERROR] == []
        assert live.segments > 1
        state = replay_to(open_data_dir(str(data))).state
        assert state is not None
        by_queue = {s.queue: s for s in queue_summaries(state)}
        assert (by_queue["emails"].ready, by_queue["emails"].in_flight) == (14, 1)
        assert by_queue["emails"].dead == 1
        assert by_queue["reports"].ready == 2
        lines: list[EventLine] = []
        dump(
            open_data_dir(str(data)),
            DumpFilter(job=reserved[2]["id"]),
            on_event=lines.append,
            on_problem=lambda p: None,
        )
        assert [line.event[0] for line in lines] == [1, 2, 8]  # enqueued, reserved, dead
        assert tree(data) == before, "a tool changed a running server's directory"
        cut_seq = live.last_seq
        assert cut_seq is not None
    finally:
        client.close()
    assert server.stop() == 0

    # Stopped: the shutdown snapshot agrees with the log.
    stopped = verify(open_data_dir(str(data)))
    assert stopped.problems == []
    assert [s.verdict for s in stopped.snapshots] == ["match"]

    # Point-in-time: the log cut before the two "reports" jobs were enqueued.
    result = replay_to(open_data_dir(str(data)), until_seq=cut_seq - 1)
    restored = tmp_path / "restored"
    write_into(result, str(restored))
    again = server_factory(args=["--config", str(config)], data_dir=restored)
    client = RawClient(again)
    try:
        stats = client.call("queue_stats", {})["queues"]
        counts = {q["name"]: (q["ready"], q["in_flight"], q["dead_lettered"]) for q in stats}
        assert counts.get("emails") == (14, 1, 1)
        assert counts.get("reports", (0, 0, 0)) == (0, 0, 0)
        ready = client.call("reserve", {"queues": ["emails"], "lease_ms": 1000, "max_jobs": 20})
        assert {job["id"] for job in ready["jobs"]} <= set(emails)
        assert not set(reports) & {job["id"] for job in ready["jobs"]}
    finally:
        client.close()
    assert again.stop() == 0
