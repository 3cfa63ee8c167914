"""The admin API's audit trail and event stream, and the native front's request
metrics (issue 15 items 2 and 5): `GET /admin/api/v1/audit` pages the admin
records of the log newest first with its `next_before` cursor and filters;
`GET /admin/api/v1/events` streams per-queue depths and rates once a second, one
computation shared by every stream; `sepp_requests_total` /
`sepp_request_duration_seconds` count every native request exactly.

The servers run in-process on the real file system (the audit trail reads the
segment files with aiofiles), on 127.0.0.1:0."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from log_format import decode_envelope, encode_envelope
from sepp.admin.events import EVENTS_KEY, EventsRoute
from sepp.server.audit_trail import AUDIT_SCAN_ENTRIES_MAX
from sepp.server.config import ServerConfig, load_config
from sepp.server.metrics import REQUEST_TIMED_EVERY
from sepp.server.server import SeppServer
from sepp.server.service import Principal
from sepp.storage.audit import command_kind_of
from sepp.storage.fs import RealFileSystem
from tests.inprocess import address_of, in_process
from tests.server.conftest import connect, job

pytestmark = pytest.mark.usefixtures("in_process_env")

API = "/admin/api/v1"
ANN = Principal("ann", "operator")
BOB = Principal("bob", "admin")
KEYS = [
    {"name": "eve", "key": "viewer-secret-0123456789", "role": "viewer"},
    {"name": "root", "key": "admin-secret-0123456789", "role": "admin"},
]
# How long a test waits for something that should come within about a second.
DEADLINE_S = 15.0


def real_config(tmp_path: Path, *, admin: str = "127.0.0.1:0", **overrides: Any) -> ServerConfig:
    """Defaults on 127.0.0.1:0, the data directory under tmp_path (real files)."""
    extra = {("storage", name): value for name, value in overrides.items() if name != "keys"}
    if "keys" in overrides:
        extra[("admin", "keys")] = overrides["keys"]
    return load_config(
        None,
        env={"SEPP_ADMIN__LISTEN_ADDR": admin},
        overrides={
            ("server", "data_dir"): str(tmp_path / "data"),
            ("server", "listen_addr"): "127.0.0.1:0",
            **extra,
        },
    )


def real_server(config: ServerConfig) -> Any:
    return in_process(config, fs=RealFileSystem())


def url(server: SeppServer, path: str) -> str:
    assert server.admin_address is not None
    host, port = server.admin_address
    return f"http://{host}:{port}{path}"


async def get_json(
    server: SeppServer, path: str, key: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url(server, path), headers=headers) as response,
    ):
        return response.status, await response.json()


async def act(server: SeppServer, principal: Principal, action: str, queue: str) -> None:
    """One admin action through the service, waited until durable."""
    service = server.service
    call = service.pause_queue if action == "pause" else service.resume_queue
    _, barrier = call(principal, queue, reason=f"{action} {queue}")
    await service.durable(barrier)


async def six_actions(server: SeppServer) -> None:
    for queue in ("a", "b", "c"):
        await act(server, ANN, "pause", queue)
        await act(server, BOB, "resume", queue)


async def all_pages(server: SeppServer, query: str, limit: int) -> list[list[dict[str, Any]]]:
    pages = []
    before = ""
    for _ in range(100):
        status, page = await get_json(server, f"{API}/audit?limit={limit}{query}{before}")
        assert status == 200, page
        pages.append(page["entries"])
        if page["next_before"] is None:
            return pages
        before = f"&before={page['next_before']}"
    raise AssertionError("the cursor never reached the oldest entry")


# -- /audit -----------------------------------------------------------------------------------


async def test_audit_pages_the_admin_actions_newest_first_with_the_next_before_cursor(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        await six_actions(server)
        pages = await all_pages(server, "", limit=4)
        assert [len(p) for p in pages] == [4, 2]
        entries = [e for p in pages for e in p]
        seqs = [e["seq"] for e in entries]
        assert seqs == sorted(seqs, reverse=True)
        assert [(e["action"], e["actor"], e["role"], e["queue"]) for e in entries] == [
            ("queue.resume", "bob", "admin", "c"),
            ("queue.pause", "ann", "operator", "c"),
            ("queue.resume", "bob", "admin", "b"),
            ("queue.pause", "ann", "operator", "b"),
            ("queue.resume", "bob", "admin", "a"),
            ("queue.pause", "ann", "operator", "a"),
        ]
        assert entries[0]["reason"] == "resume c"
        assert entries[0]["job_ids"] == [] and entries[0]["changes"] == {"QueueResumed": 1}
        assert entries[0]["time"].endswith("Z")
        _, page = await get_json(server, f"{API}/audit")
        assert page["truncated_before_seq"] is None


async def test_audit_shows_actions_logged_after_the_first_call(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        await act(server, ANN, "pause", "q")
        _, first = await get_json(server, f"{API}/audit")
        await act(server, BOB, "resume", "q")
        _, second = await get_json(server, f"{API}/audit")
        assert [e["action"] for e in first["entries"]] == ["queue.pause"]
        assert [e["action"] for e in second["entries"]] == ["queue.resume", "queue.pause"]


async def test_audit_filters_by_actor_and_by_action_prefix(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        await six_actions(server)
        by_ann = [e for p in await all_pages(server, "&actor=ann", limit=2) for e in p]
        assert [(e["actor"], e["queue"]) for e in by_ann] == [
            ("ann", "c"),
            ("ann", "b"),
            ("ann", "a"),
        ]
        resumes = [
            e for p in await all_pages(server, "&action_prefix=queue.res", limit=10) for e in p
        ]
        assert [e["action"] for e in resumes] == ["queue.resume"] * 3
        _, nobody = await get_json(server, f"{API}/audit?actor=mallory")
        assert nobody == {"entries": [], "next_before": None, "truncated_before_seq": None}


async def test_a_filter_that_matches_little_gives_a_short_page_with_a_cursor_when_the_scan_is_capped(
    tmp_path,
):
    async with real_server(real_config(tmp_path)) as server:
        await act(server, ANN, "pause", "q")
        # More of bob's actions than one call examines.
        service = server.service
        barrier = 0
        for n in range(AUDIT_SCAN_ENTRIES_MAX + 5):
            _, barrier = (service.pause_queue if n % 2 == 0 else service.resume_queue)(
                BOB, "q", reason=None
            )
        await service.durable(barrier)
        status, page = await get_json(server, f"{API}/audit?actor=ann")
        assert status == 200
        assert page["entries"] == [] and page["next_before"] is not None
        _, rest = await get_json(server, f"{API}/audit?actor=ann&before={page['next_before']}")
        assert [e["actor"] for e in rest["entries"]] == ["ann"]
        assert rest["next_before"] is None


async def test_audit_says_when_retention_deleted_the_oldest_segments(tmp_path):
    config = real_config(tmp_path, segment_bytes_max=4096, snapshots_kept=1)
    async with real_server(config) as server:
        service = server.service
        for n in range(60):  # about 18 KB of admin records, one commit each: 4+ segments
            call = service.pause_queue if n % 2 == 0 else service.resume_queue
            _, barrier = call(ANN, "q", reason="x" * 200)
            await service.durable(barrier)
            if n in (10, 45):  # the index follows the log across segments
                _, page = await get_json(server, f"{API}/audit?limit=1000")
                assert [e["seq"] for e in page["entries"]] == list(range(n + 1, 0, -1))
        engine = server.engine
        assert engine is not None
        await asyncio.to_thread(engine.snapshot_now)
        await asyncio.to_thread(engine.apply_retention)
        first_seq = engine.segments[0].first_seq
        assert first_seq > 1
        pages = await all_pages(server, "", limit=1000)
        entries = [e for p in pages for e in p]
        _, page = await get_json(server, f"{API}/audit")
        assert page["truncated_before_seq"] == first_seq
        # Every admin record still in the log, none of those retention deleted.
        assert [e["seq"] for e in entries] == list(range(60, first_seq - 1, -1))


async def test_audit_refuses_a_bad_limit_with_400(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        for query in ("limit=0", "limit=1001", "limit=x", "before=-1"):
            status, body = await get_json(server, f"{API}/audit?{query}")
            assert status == 400 and body["error"]["code"] == "invalid_argument", query


async def test_a_viewer_gets_403_on_audit_and_an_admin_key_200(tmp_path):
    async with real_server(real_config(tmp_path, keys=KEYS)) as server:
        status, body = await get_json(server, f"{API}/audit", KEYS[0]["key"])
        assert status == 403 and body["error"]["code"] == "permission_denied"
        status, body = await get_json(server, f"{API}/audit", KEYS[1]["key"])
        assert status == 200 and body["entries"] == []
        assert (await get_json(server, f"{API}/audit"))[0] == 401


# -- /events ------------------------------------------------------------------------------------


class EventStream:
    """A client of /events: `next()` is the next event as (name, data)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> tuple[str, dict[str, Any]]:
        while True:
            block = await asyncio.wait_for(self.response.content.readuntil(b"\n\n"), DEADLINE_S)
            if not block:
                raise EOFError("the stream ended")
            name, data = "", None
            for line in block.decode().splitlines():
                if line.startswith("event: "):
                    name = line[len("event: ") :]
                elif line.startswith("data: "):
                    data = json.loads(line[len("data: ") :])
            if name and data is not None:
                return name, data

    async def next_stats(self) -> dict[str, Any]:
        while True:
            name, data = await self.next()
            if name == "stats":
                return data


async def open_stream(
    session: aiohttp.ClientSession, server: SeppServer, key: str | None = None
) -> EventStream:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = await session.get(url(server, f"{API}/events"), headers=headers)
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return EventStream(response)


def route_of(server: SeppServer) -> EventsRoute:
    runner = server.admin._runner
    return runner.app[EVENTS_KEY]


async def wait_for(predicate: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_an_event_stream_sends_the_queue_depths_once_a_second(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        client = await connect(address_of(server))
        await client.enqueue(job("q"), job("q"), job("q"))
        await client.enqueue(job("later", scheduled_at_ms=(await client.server_time()) + 3_600_000))
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, server)
            name, heartbeat = await stream.next()
            assert name == "heartbeat" and heartbeat["serving"] is True
            first = await stream.next_stats()
            second = await stream.next_stats()
            for stats in (first, second):
                assert stats["queues"]["q"] == {
                    "ready": 3,
                    "scheduled": 0,
                    "inflight": 0,
                    "dead_letter": 0,
                    "paused": False,
                    "enqueued_per_s": stats["queues"]["q"]["enqueued_per_s"],
                    "acked_per_s": 0.0,
                    "dead_lettered_per_s": 0.0,
                }
                assert stats["queues"]["later"]["scheduled"] == 1
                assert set(stats["rates"]) >= {"enqueued", "reserved", "acked", "nacked"}
            assert second["time_ms"] >= first["time_ms"] and second["interval_s"] > 0
        await client.close()


async def test_rates_are_the_counters_difference_over_the_interval(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        client = await connect(address_of(server))
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, server)
            await stream.next_stats()  # the baseline
            await client.enqueue(*(job("q") for _ in range(5)))
            stats = await stream.next_stats()
            # Exact: 5 jobs over the interval the event reports.
            assert stats["rates"]["enqueued"] == pytest.approx(5 / stats["interval_s"], rel=1e-2)
            assert stats["queues"]["q"]["enqueued_per_s"] == stats["rates"]["enqueued"]
        await client.close()


async def test_a_queues_ack_rate_is_its_acks_over_the_interval(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        client = await connect(address_of(server))
        # One job left in each (a queue without jobs leaves the snapshot).
        await client.enqueue(*(job("q") for _ in range(5)))
        await client.enqueue(job("other"), job("other"))
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, server)
            await stream.next_stats()  # the baseline
            for queue, count in (("q", 4), ("other", 1)):
                for delivered in await client.reserve([queue], max_jobs=count):
                    await client.ack(delivered)
            stats = await stream.next_stats()
            per_s = stats["interval_s"]
            assert stats["queues"]["q"]["acked_per_s"] == pytest.approx(4 / per_s, rel=1e-2)
            assert stats["queues"]["other"]["acked_per_s"] == pytest.approx(1 / per_s, rel=1e-2)
            assert stats["rates"]["acked"] == pytest.approx(5 / per_s, rel=1e-2)
        await client.close()


async def test_many_streams_share_one_computation_per_interval(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        hub = route_of(server).hub
        async with aiohttp.ClientSession() as session:
            streams = [await open_stream(session, server) for _ in range(4)]
            before = hub.computations
            for stream in streams:
                await stream.next_stats()
            seen = [await stream.next_stats() for stream in streams]
            # Every stream got the same snapshot of one tick, computed once.
            assert len({json.dumps(s, sort_keys=True) for s in seen}) == 1
            assert hub.computations - before <= 2
            for stream in streams:
                stream.response.close()


async def test_a_client_that_goes_away_is_dropped_and_leaves_no_task_behind(tmp_path, caplog):
    async with real_server(real_config(tmp_path)) as server:
        hub = route_of(server).hub
        tasks_before = len(asyncio.all_tasks())
        async with aiohttp.ClientSession() as session:
            stream = await open_stream(session, server)
            await stream.next_stats()
            assert hub.streams == 1
            stream.response.close()  # the client goes away
        await wait_for(lambda: hub.streams == 0, "the stream to be dropped")
        assert hub._task is None  # no ticker without streams
        await wait_for(lambda: len(asyncio.all_tasks()) <= tasks_before, "the handler to end")
        assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_shutdown_ends_the_open_streams(tmp_path):
    async with real_server(real_config(tmp_path)) as server, aiohttp.ClientSession() as session:
        stream = await open_stream(session, server)
        await stream.next_stats()
        shutdown = asyncio.ensure_future(server.shutdown())
        with pytest.raises((EOFError, aiohttp.ClientPayloadError, asyncio.IncompleteReadError)):
            while True:
                await stream.next()
        await asyncio.wait_for(shutdown, DEADLINE_S)


async def test_a_viewer_key_may_open_the_event_stream(tmp_path):
    async with (
        real_server(real_config(tmp_path, keys=KEYS)) as server,
        aiohttp.ClientSession() as session,
    ):
        stream = await open_stream(session, server, KEYS[0]["key"])
        assert (await stream.next())[0] == "heartbeat"
        stream.response.close()


# -- request metrics --------------------------------------------------------------------------


async def scrape(server: SeppServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(url(server, "/metrics")) as r:
        text = await r.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def test_request_metrics_count_every_native_request_by_method_and_outcome(tmp_path):
    async with real_server(real_config(tmp_path)) as server:
        client = await connect(address_of(server))
        for _ in range(7):
            await client.enqueue(job("q"))
        # Two refusals: the first is the ninth request (timed), the second is not.
        for _ in range(2):
            refused = await client.call(
                "ack", {"job_id": "no-such-job", "attempt": 1, "worker_id": "w"}
            )
            assert refused.status != "ok"
        samples = await scrape(server)
        total = "sepp_requests_total"
        assert samples[(total, (("method", "hello"), ("outcome", "ok")))] == 1
        assert samples[(total, (("method", "enqueue"), ("outcome", "ok")))] == 7
        assert samples[(total, (("method", "ack"), ("outcome", refused.status)))] == 2
        # The durations are a sample: one request in REQUEST_TIMED_EVERY, in arrival
        # order across the process (the first one included).
        requests = sum(v for (name, _), v in samples.items() if name == total)
        count = "sepp_request_duration_seconds_count"
        timed = {
            dict(labels)["method"]: v for (name, labels), v in samples.items() if name == count
        }
        assert sum(timed.values()) == -(-requests // REQUEST_TIMED_EVERY)
        assert timed["hello"] == 1  # the process's first request is timed
        for method, n in timed.items():
            inf = ("sepp_request_duration_seconds_bucket", (("le", "+Inf"), ("method", method)))
            assert samples[inf] == n
            of_method = [
                v for (name, labels), v in samples.items()
                if name == total and dict(labels)["method"] == method
            ]  # fmt: skip
            assert n <= sum(of_method)
        await client.close()


async def test_request_metrics_are_not_counted_when_no_listener_serves_metrics(tmp_path):
    async with real_server(real_config(tmp_path, admin="off")) as server:
        client = await connect(address_of(server))
        await client.enqueue(job("q"))
        assert server.service.metrics.requests is None
        await client.close()


# -- the shared decoding ----------------------------------------------------------------------


@pytest.mark.parametrize("time_ms", [0, 127, 128, 65_536, 2**31, 1_764_000_000_000])
@pytest.mark.parametrize("kind", [1, 3, 9, 12])
def test_command_kind_of_reads_the_kind_from_the_first_bytes_of_any_envelope(time_ms, kind):
    body = encode_envelope(time_ms, kind, [], 0)
    assert command_kind_of(body) == kind == decode_envelope(body).command_kind


def test_command_kind_of_is_none_for_bytes_not_laid_out_as_an_envelope():
    for body in (b"", b"\x95", b"\x93\x02\x01\x01", b"\x95\x02\xd3" + bytes(8) + b"\x01"):
        assert command_kind_of(body) is None
