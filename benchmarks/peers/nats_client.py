"""User-level client benchmark of NATS JetStream (compare.py's "clients" section):
nats-py as its users write it, from ONE process and ONE connection.

producer: N concurrent tasks each awaiting ``js.publish(subject, payload)`` (the
publish ack comes after the fsync with ``sync_interval: always``); worker: a pull
consumer looping ``fetch(batch=N)`` and handling the batch concurrently: a no-op
handler, then ``await msg.ack()`` per message. ``ack()`` does not wait for the
server, so the clock stops when the stream (work-queue retention: an ack removes
the message) is empty after the last ack. The stream, file storage, and its durable
consumer are the ones of nats_driver.py. The worker works what the producer phase
left (topped up, not timed, when fewer are stored). Prints one JSON line in
bench_client's format.

    python -m benchmarks.peers.nats_client --port 4222 --jobs 50000 --concurrency 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
from importlib.metadata import version
from typing import Any

import nats

from benchmarks.bench_client import Mark, result
from benchmarks.peers.driverlib import PAYLOAD
from benchmarks.peers.nats_driver import CONSUMER, STREAM, SUBJECT, connect, setup


async def produce(js: Any, jobs: int, concurrency: int) -> None:
    remaining = [jobs]

    async def caller() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await js.publish(SUBJECT, PAYLOAD, stream=STREAM)

    await asyncio.gather(*(caller() for _ in range(concurrency)))


async def stored(js: Any) -> int:
    info = await js.stream_info(STREAM)
    return int(info.state.messages)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    nc = await connect(args.host, args.port)
    await setup(nc, STREAM, SUBJECT)
    js = nc.jetstream()
    out: dict[str, Any] = {}
    if "producer" in args.phases:
        start = Mark(args.server_pid)
        await produce(js, args.jobs, args.concurrency)
        out["producer"] = result(args.jobs, start, Mark(args.server_pid))
    if "worker" in args.phases:
        missing = args.jobs - await stored(js)
        if missing > 0:
            await produce(js, missing, args.concurrency)
        sub = await js.pull_subscribe_bind(CONSUMER, stream=STREAM)
        acked = 0

        async def handle(msg: Any) -> None:
            await msg.ack()

        start = Mark(args.server_pid)
        while acked < args.jobs:
            try:
                msgs = await sub.fetch(batch=args.concurrency, timeout=5.0)
            except nats.errors.TimeoutError:
                raise RuntimeError(f"fetch timed out after {acked} of {args.jobs} acks") from None
            await asyncio.gather(*(handle(m) for m in msgs))
            acked += len(msgs)
        await nc.flush()
        while await stored(js) > 0:
            await asyncio.sleep(0.001)
        out["worker"] = result(args.jobs, start, Mark(args.server_pid))
    await nc.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--server-pid", type=int, default=0)
    p.add_argument("--phases", nargs="+", default=["producer", "worker"])
    args = p.parse_args()
    out = asyncio.run(run(args))
    out["client"] = f"nats-py {version('nats-py')} (asyncio)"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
