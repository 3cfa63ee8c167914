"""Load driver for NATS JetStream with its native Python client, nats-py (asyncio).

One stream with file storage and work-queue retention and one durable pull
consumer with explicit acks. Every producer and worker has its own connection with
one request in flight. Enqueue = `js.publish` awaiting the publish ack; drain =
`fetch(1)` + `ack_sync` per job, the clock stopping at the last ack; latency =
publish -> fetch(1) -> ack_sync on one connection.

    python -m benchmarks.peers.nats_driver --port 4222 --connections 50 --jobs 200000
"""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import version
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from benchmarks.peers.driverlib import PAYLOAD, PhaseClock, emit, parser, percentiles, rate

STREAM = "BENCH"
SUBJECT = "bench.jobs"
CONSUMER = "workers"
# The latency phase has its own stream and consumer (as sepp's loadgen uses its own
# queue): a pull request of a drain worker that gave up on an empty stream can stay
# pending at the server for a moment after the client's timeout, and would take the
# first latency message.
LAT_STREAM = "BENCH_LATENCY"
LAT_SUBJECT = "bench.latency"


async def connect(host: str, port: int) -> Any:
    return await nats.connect(
        f"nats://{host}:{port}",
        allow_reconnect=False,
        max_reconnect_attempts=0,
        pending_size=64 * 1024 * 1024,
    )


async def setup(nc: Any, stream: str, subject: str) -> None:
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[subject],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )
    )
    await js.add_consumer(
        stream,
        ConsumerConfig(
            durable_name=CONSUMER,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=300.0,
            max_ack_pending=100_000,
            max_waiting=10_000,
        ),
    )


async def enqueue_phase(ncs: list[Any], jobs: int) -> dict[str, float]:
    remaining = [jobs]

    async def producer(nc: Any) -> None:
        js = nc.jetstream()
        while remaining[0] > 0:
            remaining[0] -= 1
            await js.publish(SUBJECT, PAYLOAD, stream=STREAM)

    started = time.perf_counter()
    await asyncio.gather(*(producer(nc) for nc in ncs))
    return rate(jobs, time.perf_counter() - started)


async def drain_phase(subs: list[Any], jobs: int) -> dict[str, float]:
    done = [0]
    last_ack = [0.0]

    async def worker(sub: Any) -> None:
        while done[0] < jobs:
            try:
                msgs = await sub.fetch(1, timeout=2.0)
            except nats.errors.TimeoutError:
                return
            for msg in msgs:
                await msg.ack_sync()
                done[0] += 1
                last_ack[0] = time.perf_counter()

    started = time.perf_counter()
    await asyncio.gather(*(worker(s) for s in subs))
    return rate(done[0], last_ack[0] - started)


async def latency_phase(nc: Any, sub: Any, rounds: int) -> dict[str, float]:
    js = nc.jetstream()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await js.publish(LAT_SUBJECT, PAYLOAD, stream=LAT_STREAM)
        msgs = await sub.fetch(1, timeout=5.0)
        await msgs[0].ack_sync()
        samples.append(time.perf_counter() - t0)
    return percentiles(samples, rounds)


async def run(args: Any) -> dict[str, Any]:
    ncs = [await connect(args.host, args.port) for _ in range(args.connections)]
    await setup(ncs[0], STREAM, SUBJECT)
    await setup(ncs[0], LAT_STREAM, LAT_SUBJECT)
    clock = PhaseClock(args.server_pid)
    if "enqueue" in args.phases:
        mark = clock.start()
        clock.stop("enqueue", mark, await enqueue_phase(ncs, args.jobs))
    subs = []
    for nc in ncs:
        subs.append(await nc.jetstream().pull_subscribe_bind(CONSUMER, stream=STREAM))
    if "drain" in args.phases:
        mark = clock.start()
        clock.stop("drain", mark, await drain_phase(subs, args.jobs))
    if "latency" in args.phases:
        lat_sub = await ncs[0].jetstream().pull_subscribe_bind(CONSUMER, stream=LAT_STREAM)
        mark = clock.start()
        clock.stop("latency", mark, await latency_phase(ncs[0], lat_sub, args.rounds))
    for nc in ncs:
        await nc.close()
    return clock.result


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    args = p.parse_args()
    loop = args.loop
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            loop = "asyncio"
    if loop == "uvloop":
        result = uvloop.run(run(args))
    else:
        result = asyncio.run(run(args))
    emit(result, client=f"nats-py {version('nats-py')}", driver=f"asyncio ({loop})")


if __name__ == "__main__":
    main()
