"""The least a clustered leader can do, for `bench_cluster --bound` (issue 19).

    python -m benchmarks.bound_leader --nats URLS --monitor URLS --stream NAME
        [--appends-in-flight K] [--colocate]

A process that answers the load generator (`loadgen.py`) as a sepp leader would,
but without a state machine, a job, a lease or a reply body worth the name:
each request's frame, as it came, is buffered; whatever is buffered is appended
as one message to its own JetStream stream (R3, file storage, `sync_interval:
always`, set up by `ensure_cluster_resources` as a sepp cluster's), fenced on
the previous sequence, up to K appends outstanding; a request is answered once
the append holding it is acknowledged, in log order. `enqueue` is answered with
job ids, `reserve` hands out those ids one at a time, everything else gets an
empty `ok`. Nothing tails the stream (a sepp cluster's two followers do).
`--colocate` connects it to the server that leads the stream, as a leader that
sought it out would be (no route hop for its appends and their answers).

What it measures: the rate a leader could reach at that load if its own work
cost nothing. A real leader does everything this does (read, buffer, append,
answer) and more (decide, encode records, chain hashes, feed two followers), so
its rate cannot exceed this one on the same machine at the same time: if this
is under a target, the target is out of reach there, whatever the leader's code.

Prints `bound leader listening on 127.0.0.1:PORT` once it serves (after one
empty message appended: the stream takes appends). Any append
that fails ends the process (exit status 2): the load generator then sees its
connections lost and the benchmark fails instead of waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
import urllib.request
from typing import Any

import msgpack

from sepp.cluster import jetstream
from sepp.protocol.framing import LENGTH_PREFIX, FrameReader
from sepp.server.loops import resolve_event_loop, run_on

_pack = msgpack.Packer(use_bin_type=True).pack


class BoundLeader:
    """Group commit to the stream: buffered frames go out as one fenced append
    whenever fewer than `in_flight` appends are outstanding."""

    def __init__(self, log: jetstream.JetStreamLog, in_flight: int, last_seq: int) -> None:
        self.log = log
        self.in_flight = in_flight
        self.expected = last_seq
        # (transport, answer, frame) of the requests not yet appended.
        self.buffered: list[tuple[asyncio.Transport, bytes, bytes]] = []
        self.window: collections.deque[tuple[asyncio.Future[int], list[Any]]] = collections.deque()
        self.ready: collections.deque[int] = collections.deque()
        self.next_id = 1
        self.fill_scheduled = False

    def submit(self, transport: asyncio.Transport, answer: bytes, frame: bytes) -> None:
        self.buffered.append((transport, answer, frame))
        # Once per loop turn, after every request that arrived with it: the same
        # batching as CommitPipeline's wake of its committer.
        if not self.fill_scheduled:
            self.fill_scheduled = True
            asyncio.get_running_loop().call_soon(self.fill)

    def fill(self) -> None:
        self.fill_scheduled = False
        while self.buffered and len(self.window) < self.in_flight:
            batch, self.buffered = self.buffered, []
            data = b"".join(frame for _, _, frame in batch)
            append = asyncio.ensure_future(self.log.append_if(self.expected, data))
            self.expected += 1
            self.window.append((append, batch))
            append.add_done_callback(self.answered)

    def answered(self, _: asyncio.Future[int]) -> None:
        while self.window and self.window[0][0].done():
            append, batch = self.window.popleft()
            if append.cancelled() or append.exception() is not None:
                error = "cancelled" if append.cancelled() else repr(append.exception())
                print(f"bound leader: append failed: {error}", file=sys.stderr, flush=True)
                os._exit(2)
            for transport, answer, _frame in batch:
                transport.write(answer)
        self.fill()


class Connection(asyncio.Protocol):
    def __init__(self, leader: BoundLeader) -> None:
        self.leader = leader
        self.reader = FrameReader(64 * 1024 * 1024)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        leader = self.leader
        transport = self.transport
        assert transport is not None
        for frame in self.reader.feed(data):
            rid, op, body = msgpack.unpackb(frame)
            result: dict[str, Any] = {}
            if op == "enqueue":
                ids = list(range(leader.next_id, leader.next_id + len(body["jobs"])))
                leader.next_id += len(ids)
                leader.ready.extend(ids)
                result = {"job_ids": ids}
            elif op == "reserve":
                ready = leader.ready
                result = {"jobs": [{"id": ready.popleft(), "attempt": 1}] if ready else []}
            packed = _pack([rid, "ok", result])
            answer = LENGTH_PREFIX.pack(len(packed)) + packed
            if op == "hello":
                transport.write(answer)
            else:
                leader.submit(transport, answer, frame)


async def _first_append(log: jetstream.JetStreamLog) -> int:
    """Append an empty message once the new stream takes appends (its leader may
    still be settling: no responders); returns its sequence."""
    deadline = time.monotonic() + jetstream.SETUP_DEADLINE_S
    while True:
        try:
            return await log.append_if(await log.last(), b"")
        except (jetstream.AppendOutcomeUnknown, jetstream.BackendUnavailable):
            # Landed or not, the next try fences on the tail as it then is.
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _stream_leader_url(monitor_urls: list[str], leader: str) -> str:
    """The client URL of the server named `leader`, from the servers' /varz."""
    for url in monitor_urls:
        with urllib.request.urlopen(f"{url}/varz", timeout=10) as answer:
            varz = json.load(answer)
        if varz.get("server_name") == leader:
            return f"nats://127.0.0.1:{varz['port']}"
    raise RuntimeError(f"no server named {leader!r} among {monitor_urls}")


async def serve(args: argparse.Namespace) -> None:
    names = jetstream.ClusterNames(stream=args.stream)
    monitor_urls = args.monitor.split(",")
    nc = await jetstream.connect(args.nats.split(","))
    resources = await jetstream.ensure_cluster_resources(nc, names, monitor_urls=monitor_urls)
    if args.colocate:
        # Publish where the stream's leader is: no route hop each way per append.
        info = await nc.jetstream().stream_info(names.stream)
        assert info.cluster is not None and info.cluster.leader is not None
        url = await asyncio.to_thread(_stream_leader_url, monitor_urls, info.cluster.leader)
        nc = await jetstream.connect([url])
        resources = await jetstream.ensure_cluster_resources(nc, names, monitor_urls=monitor_urls)
    leader = BoundLeader(resources.log, args.appends_in_flight, await _first_append(resources.log))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(leader), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"bound leader listening on 127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--nats", required=True, help="the JetStream servers' URLs, comma-separated"
    )
    parser.add_argument("--monitor", required=True, help="their monitoring URLs, comma-separated")
    parser.add_argument("--stream", required=True, help="a stream of its own")
    parser.add_argument("--appends-in-flight", type=int, default=1)
    parser.add_argument(
        "--colocate",
        action="store_true",
        help="connect to the server that leads the stream (found once, at the start)",
    )
    args = parser.parse_args()
    run_on(resolve_event_loop("auto"), lambda: serve(args))


if __name__ == "__main__":
    main()
