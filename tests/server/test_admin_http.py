"""The admin HTTP listener (issue 15, items 5 and 6 and the listener of item 2):
/livez, /readyz and /metrics on a real server, the counters equal to what was
done, the `[admin] listen_addr` setting and its refusal of a non-loopback address
without admin keys."""

from __future__ import annotations

import errno
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sepp.core.config import ConfigError
from sepp.server.config import load_config
from sepp.server.metrics import OTHER_QUEUE, ServerMetrics
from sepp.server.server import SeppServer
from sepp.storage.faultfs import FaultyFileSystem
from tests.inprocess import address_of, in_process, in_process_config
from tests.server.conftest import connect, job

pytestmark = pytest.mark.usefixtures("in_process_env")

ADMIN_ON = {"admin__listen_addr": "127.0.0.1:0"}


def admin_url(server: SeppServer, path: str) -> str:
    assert server.admin_address is not None
    host, port = server.admin_address
    return f"http://{host}:{port}{path}"


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def scrape(server: SeppServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by (name, sorted labels)."""
    status, text = await get(admin_url(server, "/metrics"))
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


# -- health ---------------------------------------------------------------------------------


async def test_livez_and_readyz_answer_200_while_the_server_serves():
    async with in_process(in_process_config(**ADMIN_ON)) as server:
        assert await get(admin_url(server, "/livez")) == (200, "ok\n")
        assert await get(admin_url(server, "/readyz")) == (200, "ready\n")


async def test_readyz_is_503_once_shutdown_began_and_livez_still_200():
    async with in_process(in_process_config(**ADMIN_ON)) as server:
        server.stopping = True  # the state shutdown sets first
        try:
            assert await get(admin_url(server, "/readyz")) == (503, "shutting_down\n")
            assert (await get(admin_url(server, "/livez")))[0] == 200
        finally:
            server.stopping = False  # let the fixture run the real shutdown


async def test_readyz_is_503_after_storage_failed():
    async with in_process(in_process_config(**ADMIN_ON)) as server:
        server.storage_failure = OSError(errno.EIO, "injected")
        assert await get(admin_url(server, "/readyz")) == (503, "storage_failed\n")


async def test_the_admin_listener_closes_when_the_server_stops():
    async with in_process(in_process_config(**ADMIN_ON)) as server:
        url = admin_url(server, "/livez")
        await server.shutdown()
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(url)


async def test_no_admin_listener_when_listen_addr_is_off():
    async with in_process(in_process_config(admin__listen_addr="off")) as server:
        assert server.admin is None and server.admin_address is None


# -- metrics --------------------------------------------------------------------------------


async def test_metrics_counters_equal_what_was_done():
    async with in_process(in_process_config(**ADMIN_ON)) as server:
        client = await connect(address_of(server))
        await client.enqueue_ids(*(job("emails") for _ in range(5)))
        await client.enqueue_ids(job("reports"), job("reports", idempotency_key="k"))
        # The same key again: deduplicated, not stored.
        await client.enqueue_ids(job("reports", idempotency_key="k"))
        # Refused by the core: a payload over max_payload_bytes.
        limit = server.core_config.defaults.max_payload_bytes
        big = {"data": b"x" * (limit + 1), "encoding": "application/octet-stream"}
        answer = await client.enqueue(job("emails", payload=big))
        assert answer["results"][0]["rejection"]["reason"] == "payload_too_large"
        leased = await client.reserve(["emails"], max_jobs=3)
        assert len(leased) == 3
        assert (await client.ack(leased[0])).status == "ok"
        assert (await client.nack(leased[1])).status == "ok"
        nacked = await client.nack(leased[2], retry="dead_letter", reason="bad")
        assert nacked.status == "ok"
        assert await client.reserve(["empty"]) == []
        await client.close()

        samples = await scrape(server)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("sepp_jobs_enqueued_total", queue="emails") == 5
    assert value("sepp_jobs_enqueued_total", queue="reports") == 2
    assert value("sepp_jobs_deduplicated_total") == 1
    assert value("sepp_jobs_rejected_total", queue="emails", reason="payload_too_large") == 1
    assert value("sepp_jobs_reserved_total") == 3
    assert value("sepp_jobs_acked_total") == 1
    # A nack that ended the job counts as dead-lettered (cause rejected), not nacked.
    assert value("sepp_jobs_nacked_total") == 1
    assert value("sepp_jobs_dead_lettered_total", queue="emails", cause="rejected") == 1
    assert value("sepp_reserve_empty_total") == 1
    assert value("sepp_log_events_total", type="JobAcked") == 1
    # Gauges read from the state at scrape time.
    assert value("sepp_queue_jobs", queue="emails", state="ready") == 3  # 2 left + 1 nacked
    assert value("sepp_queue_jobs", queue="emails", state="inflight") == 0
    assert value("sepp_queue_jobs", queue="reports", state="ready") == 2
    assert value("sepp_queue_oldest_ready_age_seconds", queue="emails") >= 0
    assert value("sepp_command_queue_depth") >= 0
    assert value("sepp_wal_segments") >= 1
    assert value("sepp_wal_bytes") > 0
    assert value("sepp_log_records_total") >= 1
    # Every record logged since start was made durable by some group commit.
    records = value("sepp_log_records_total")
    assert value("sepp_group_commit_records_sum") == records
    assert value("sepp_group_commit_records_bucket", le="+Inf") >= 1
    assert value("sepp_group_commit_records_count") == value(
        "sepp_group_commit_records_bucket", le="+Inf"
    )
    # Every request above waited for a commit, so some commits were timed.
    assert (
        1 <= value("sepp_commit_duration_seconds_count") <= value("sepp_group_commit_records_count")
    )
    assert value("sepp_commit_duration_seconds_sum") > 0
    assert value("sepp_ready") == 1
    # The process metrics come along.
    assert value("process_resident_memory_bytes") > 0


async def test_counters_count_since_start_not_what_recovery_replays():
    fs = FaultyFileSystem()
    async with in_process(in_process_config(**ADMIN_ON), fs) as server:
        client = await connect(address_of(server))
        await client.enqueue_ids(*(job("q") for _ in range(3)))
        await client.close()
        assert (await scrape(server))[("sepp_jobs_enqueued_total", (("queue", "q"),))] == 3
    async with in_process(in_process_config(**ADMIN_ON), fs) as server:
        samples = await scrape(server)
    assert ("sepp_jobs_enqueued_total", (("queue", "q"),)) not in samples
    assert samples[("sepp_queue_jobs", (("queue", "q"), ("state", "ready")))] == 3


def test_queue_labels_stop_at_the_cap_and_the_rest_count_as_other():
    metrics = ServerMetrics(queue_labels_max=2)
    assert [metrics.queue_label(q) for q in ("a", "b", "c", "a")] == ["a", "b", OTHER_QUEUE, "a"]


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:9465", ("127.0.0.1", 9465)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:1", ("localhost", 1)),
        ("off", None),
        ("OFF", None),
    ],
)
def test_admin_listen_addr_loopback_or_off_is_accepted(value, expected):
    config = load_config(None, env={"SEPP_ADMIN__LISTEN_ADDR": value})
    assert config.admin_listen == expected


def test_admin_listen_addr_defaults_to_loopback_9465():
    assert load_config(None, env={}).admin_listen == ("127.0.0.1", 9465)


@pytest.mark.parametrize("value", ["0.0.0.0:9465", "10.1.2.3:80", "[::]:0", "admin.example:1"])
def test_a_non_loopback_admin_listener_without_admin_keys_is_refused(value):
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={"SEPP_ADMIN__LISTEN_ADDR": value})
    assert refused.value.key == "admin.listen_addr"
    assert "needs admin keys" in str(refused.value)


def test_sepp_serve_refuses_a_non_loopback_admin_listener(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    proc = subprocess.run(
        [sys.executable, "-m", "sepp.server.cli", "serve", "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "data"), "--admin-listen", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "admin.listen_addr" in proc.stderr and "needs admin keys" in proc.stderr
    assert not (tmp_path / "data").exists()  # refused before storage was opened


def _read_line(server, timeout: float = 30.0) -> str:
    """The next line the `sepp serve` child prints."""
    stdout = server.proc.stdout
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no line from the server; log:\n{server.log()}"
        ready, _, _ = select.select([stdout], [], [], remaining)
        if ready:
            chunk = os.read(stdout.fileno(), 1)
            assert chunk, f"the server closed its output; log:\n{server.log()}"
            line += chunk
    return line.decode().strip()


async def test_sepp_serve_prints_the_admin_url_after_the_listening_line(server_factory):
    server = server_factory(args=["--admin-listen", "127.0.0.1:0"])
    line = _read_line(server)
    assert line.startswith("sepp admin on http://127.0.0.1:"), line
    url = line.removeprefix("sepp admin on ")
    assert int(url.rpartition(":")[2]) > 0
    assert await get(url + "/readyz") == (200, "ready\n")
    status, text = await get(url + "/metrics")
    assert status == 200 and "sepp_jobs_enqueued_total" in text
    assert server.stop() == 0


def test_sepp_serve_refuses_to_start_when_the_admin_port_is_taken(tmp_path: Path, server_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
        proc = subprocess.run(
            [sys.executable, "-m", "sepp.server.cli", "serve", "--listen", "127.0.0.1:0",
             "--data-dir", str(tmp_path / "data"), "--admin-listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )  # fmt: skip
    assert proc.returncode == 1
    assert f"admin listener on 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "sepp listening on" not in proc.stdout
    # It let go of the data directory (its lock): the next start recovers it.
    assert server_factory(data_dir=tmp_path / "data").stop() == 0


async def test_a_metrics_listener_of_its_own_serves_metrics_without_the_admin_listener():
    config = in_process_config(admin__listen_addr="off", metrics__listen_addr="127.0.0.1:0")
    async with in_process(config) as server:
        assert server.admin_address is None and server.metrics_address is not None
        host, port = server.metrics_address
        status, text = await get(f"http://{host}:{port}/metrics")
        assert status == 200 and "sepp_queue_jobs" in text
        assert await get(f"http://{host}:{port}/readyz") == (200, "ready\n")


def test_the_metrics_listener_is_off_by_default_and_may_listen_on_any_address():
    assert load_config(None, env={}).metrics_listen is None
    config = load_config(None, env={"SEPP_METRICS__LISTEN_ADDR": "0.0.0.0:9466"})
    assert config.metrics_listen == ("0.0.0.0", 9466)
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={"SEPP_METRICS__LISTEN_ADDR": "nowhere"})
    assert refused.value.key == "metrics.listen_addr"
