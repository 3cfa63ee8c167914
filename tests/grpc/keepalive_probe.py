"""The keepalive probe, run as a child process by tests/grpc/conftest.py while the
rest of the suite runs (it only idles, so it costs the run no wall time):

    python -m tests.grpc.keepalive_probe --idle 170 --out RESULT.json   (cwd: a temp dir)

A server with the gRPC front (in this process, on the fake file system) and one
channel with the official client's options (keepalive every 30 s, also idle):
one call, then IDLE_S seconds without a call -- only the client's pings -- then
one more call. Writes {"changes": [channel states seen while idle], "final":
"ok" | the final call's error}. test_keepalive.py checks it.

`--default-policy` runs the server with the gRPC core's default ping policy (the
front's keepalive options removed): the negative control, by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import grpc
import grpc.aio

from sepp.grpc import front
from sepp.grpc.v1 import queue_pb2 as pb
from tests.inprocess import in_process, in_process_config

# The official client's channel options (sepp-py 0.1.0, client.py _CHANNEL_OPTIONS).
OFFICIAL_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


async def probe(idle_s: float) -> dict[str, Any]:
    config = in_process_config(grpc__listen_addr="127.0.0.1:0")
    async with in_process(config) as server:
        assert server.grpc_address is not None
        host, port = server.grpc_address
        async with grpc.aio.insecure_channel(
            f"{host}:{port}", options=OFFICIAL_CHANNEL_OPTIONS
        ) as channel:
            info = channel.unary_unary(
                f"/{front.SERVICE_NAME}/GetServerInfo",
                request_serializer=pb.GetServerInfoRequest.SerializeToString,
                response_deserializer=pb.GetServerInfoResponse.FromString,
            )
            await info(pb.GetServerInfoRequest(), timeout=30)
            start = time.monotonic()
            changes: list[list[Any]] = []

            async def watch() -> None:
                state = channel.get_state()
                while True:
                    await channel.wait_for_state_change(state)
                    state = channel.get_state()
                    changes.append([round(time.monotonic() - start, 1), state.name])

            watcher = asyncio.ensure_future(watch())
            try:
                # Idling is what is probed: no call for idle_s, only the pings.
                await asyncio.sleep(idle_s)
            finally:
                watcher.cancel()
            try:
                await info(pb.GetServerInfoRequest(), timeout=30)
                final = "ok"
            except grpc.aio.AioRpcError as exc:
                final = f"{exc.code().name}: {exc.details()}"
    return {"idle_s": idle_s, "changes": changes, "final": final}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle", type=float, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--default-policy", action="store_true")
    args = parser.parse_args()
    if args.default_policy:
        options = front.server_options
        front.server_options = lambda receive_bytes_max: [  # type: ignore[assignment]
            o for o in options(receive_bytes_max) if "ping" not in o[0] and "keepalive" not in o[0]
        ]
    result = asyncio.run(probe(args.idle))
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
