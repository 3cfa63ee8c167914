"""The server's request path in process: CPU time per request, without sockets.

A real `SeppServer` (recovered from an empty data directory, persist mode
`buffer` so no disk wait is mixed in) with N client connections whose transports
are stand-ins: each cycle feeds every connection enqueue frames, then reserve
frames, then ack frames for the jobs it got, exactly as the wire carries them
(`ClientConnection.data_received`: framing, decode, parse, decide, apply, record
encoding, the durable hand-off, the reply). Reported per operation: CPU time of the
event-loop thread per request (`time.thread_time`) and of the whole process (the
flushing thread included), best of --cycles. What it leaves out is what the
kernel and the event loop add per request (recv, send, epoll): `bench_e2e`
measures those with the rest.

    python -m benchmarks.bench_requests                  # 30,000 requests per op, 3 cycles
    python -m benchmarks.bench_requests --requests 50000 --cycles 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import tempfile
import time
from typing import Any

import msgpack

from benchmarks.common import machine_line, print_table
from sepp.protocol.framing import FrameReader, encode_frame
from sepp.server.config import load_config
from sepp.server.server import ClientConnection, SeppServer

PAYLOAD = b"x" * 256
_pack = msgpack.Packer(use_bin_type=True).pack


class StandInTransport:
    """Collects what the server writes; never pushes back."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.out.append(b"".join(parts))

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 0) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request(request_id: int, op: str, body: dict[str, Any]) -> bytes:
    return encode_frame(_pack([request_id, op, body]))


def replies(transport: StandInTransport) -> list[tuple[int, str, Any]]:
    reader = FrameReader(1 << 26)
    out = []
    for data in transport.out:
        for frame in reader.feed(data):
            out.append(tuple(msgpack.unpackb(frame, raw=False)))
    transport.out.clear()
    return out


async def measure(requests: int, cycles: int, connections: int) -> dict[str, tuple[float, float]]:
    data_dir = tempfile.mkdtemp(prefix="sepp-bench-requests-")
    config = load_config(
        None,
        overrides={
            ("server", "data_dir"): data_dir,
            ("server", "listen_addr"): "127.0.0.1:0",
            ("admin", "listen_addr"): "off",
            ("storage", "persist_mode"): "buffer",
            # CPU per request is measured, not back-pressure: a slow periodic sync
            # (the flushing thread holds the log while it runs) must not make the
            # phase's backlog refuse requests as overloaded.
            ("storage", "command_queue_capacity"): 1_000_000,
        },
        env={"SEPP_STORAGE__SNAPSHOT_EVERY_BYTES": "0"},
    )
    server = SeppServer(config)
    await server.start()
    try:
        conns: list[tuple[ClientConnection, StandInTransport]] = []
        for _ in range(connections):
            conn, transport = ClientConnection(server), StandInTransport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            conn.data_received(request(1, "hello", {"protocol": 1, "client": "bench"}))
            conns.append((conn, transport))
        await asyncio.sleep(0.01)
        for _, transport in conns:
            assert [status for _, status, _ in replies(transport)] == ["ok"]
        job = {
            "queue": "bench",
            "job_type": "bench",
            "payload": {"data": PAYLOAD, "encoding": "application/octet-stream"},
        }
        reserve = {"queues": ["bench"], "lease_ms": 60_000, "wait_ms": 0}
        best: dict[str, tuple[float, float]] = {}
        request_id = 2

        async def phase(name: str, frames: list[bytes]) -> None:
            # One frame per connection per loop turn, as 50 clients with one
            # request in flight each would arrive; replies are released between.
            gc.collect()
            thread0, process0 = time.thread_time(), time.process_time()
            for start in range(0, len(frames), connections):
                for (conn, _), frame in zip(conns, frames[start : start + connections]):
                    conn.data_received(frame)
                await asyncio.sleep(0)
            while server.pipeline is not None and server.pipeline.backlog:
                await asyncio.sleep(0.001)
            spent = (
                (time.thread_time() - thread0) / len(frames) * 1e6,
                (time.process_time() - process0) / len(frames) * 1e6,
            )
            best[name] = min(best.get(name, spent), spent)

        for _ in range(cycles):
            enqueues = [
                request(request_id + i, "enqueue", {"jobs": [job]}) for i in range(requests)
            ]
            request_id += requests
            await phase("enqueue", enqueues)
            for _, transport in conns:
                assert all(status == "ok" for _, status, _ in replies(transport))
            reserves = [request(request_id + i, "reserve", reserve) for i in range(requests)]
            request_id += requests
            await phase("reserve", reserves)
            acks = []
            for _, transport in conns:
                for _, status, body in replies(transport):
                    assert status == "ok", body
                    for delivered in body["jobs"]:
                        ack = {"job_id": delivered["id"], "attempt": delivered["attempt"]}
                        acks.append(request(request_id, "ack", ack))
                        request_id += 1
            assert len(acks) == requests, f"reserved {len(acks)} of {requests}"
            await phase("ack", acks)
            for _, transport in conns:
                assert all(status == "ok" for _, status, _ in replies(transport))
        return best
    finally:
        server.request_shutdown()
        await server.wait_stopped()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=30_000, help="per operation and cycle")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--connections", type=int, default=50)
    args = parser.parse_args()
    print(machine_line())
    best = asyncio.run(measure(args.requests, args.cycles, args.connections))
    print()
    print_table(
        ["operation", "loop thread µs/request", "process µs/request"],
        [(name, loop, process) for name, (loop, process) in best.items()],
    )
    print(
        f"(best of {args.cycles} cycles of {args.requests:,} requests per operation over "
        f"{args.connections} connections; persist mode buffer; no sockets)"
    )


if __name__ == "__main__":
    main()
