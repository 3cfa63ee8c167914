"""The benchmark scripts' own arithmetic and the in-process request benchmark: the
numbers the closing notes quote come from these, so they are checked like code
(the benchmarks themselves never run with the tests)."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_client, bench_cluster, bench_e2e, bench_large, bench_requests, common
from benchmarks.common import check_builds, server_loop, server_sync
from benchmarks.compare import (
    ClientRow,
    Row,
    clients_table,
    clients_verdicts,
    headline_table,
    make_rows,
    verdicts,
)
from log_format._compiled import build_env
from sepp.server import loops
from sepp.storage.aio import aio_unavailable
from tests.conftest import ServerProcess

REPO = Path(__file__).resolve().parent.parent


def _run(enqueue: float, drain: float, cpu: float) -> dict:
    return {
        "enqueue": {"jobs_per_s": enqueue, "server_cpu": cpu, "client_cpu": 0.5},
        "drain": {"jobs_per_s": drain, "server_cpu": cpu, "client_cpu": 0.5},
    }


def _row(
    key: str, setting: str, runs: list[dict], per_op_fsync: bool = False, build: str = ""
) -> Row:
    return Row("durable", key, key, "durable", setting, 50, 1000, per_op_fsync, runs, build=build)


def test_cpu_per_job_is_the_median_over_runs_of_share_over_rate() -> None:
    row = _row(
        "sepp",
        "sync_data",
        [_run(20_000, 10_000, 0.9), _run(30_000, 10_000, 0.9), _run(10_000, 10_000, 0.5)],
    )
    # 0.9/20k = 45 us, 0.9/30k = 30 us, 0.5/10k = 50 us: the median is 45.
    assert row.cpu_us("enqueue") == 45.0
    assert row.cpu_us("drain") == 90.0
    assert _row("x", "y", []).cpu_us("enqueue") is None


def test_verdicts_compare_sepp_with_the_best_and_the_per_operation_fsync_peers() -> None:
    rows = [
        _row("sepp", "sync_data", [_run(28_000, 14_000, 0.9)], build="compiled"),
        _row("sepp", "sync_data", [_run(27_000, 12_000, 0.9)], build="pure"),
        _row("bullmq", "always", [_run(20_000, 7_000, 0.7)]),
        _row("beanstalkd", "-f 0", [_run(7_000, 5_000, 0.4)], per_op_fsync=True),
    ]
    lines = verdicts(rows, "compiled")
    assert "sepp compiled 28,000/s" in lines[0], lines[0]
    assert lines[0].endswith("= 1.40x -> MET"), lines[0]  # 28k / 20k enqueue
    assert lines[1].endswith("-> MET"), lines[1]  # 4.0x beanstalkd
    assert lines[2].endswith("= 2.00x -> MET"), lines[2]  # drain vs BullMQ
    assert "2.80x" in lines[3] and lines[3].endswith("-> MET"), lines[3]
    lines = verdicts(rows, "pure")  # each build is judged on its own row
    assert lines[0].endswith("NOT MET") and lines[3].endswith("NOT MET"), lines
    assert verdicts(rows[2:], "pure") == [
        "verdict: needs sepp pure sync_data and at least one durable peer"
    ]


def test_a_compiled_build_that_is_not_there_cannot_be_benchmarked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(common, "build_name", lambda ignore_env=False: "pure")
    assert check_builds(["pure"]) is None
    problem = check_builds(["pure", "compiled"])
    assert problem is not None and "python -m tools.compile" in problem
    monkeypatch.setattr(common, "build_name", lambda ignore_env=False: "compiled")
    monkeypatch.setattr(common, "stale_sources", lambda: [])
    assert check_builds(["compiled"]) is None
    monkeypatch.setattr(common, "stale_sources", lambda: ["/repo/sepp/core/decide.py"])
    problem = check_builds(["compiled"])
    assert problem is not None and "older than /repo/sepp/core/decide.py" in problem


def test_the_load_generator_runs_the_pure_build_whatever_the_server_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"loop": "asyncio"}\n', stderr="")

    monkeypatch.delenv("SEPP_PURE", raising=False)
    monkeypatch.setattr(bench_e2e.subprocess, "run", fake_run)
    assert bench_e2e.loadgen(1, False, jobs=10) == {"loop": "asyncio"}
    assert seen["env"]["SEPP_PURE"] == "1"


def test_a_build_is_run_through_the_environment() -> None:
    assert build_env("pure") == {"SEPP_PURE": "1"}
    assert build_env("compiled") == {"SEPP_PURE": ""}
    with pytest.raises(ValueError, match="unknown build"):
        build_env("fast")


def test_the_headline_table_shows_cpu_per_job_and_ratios() -> None:
    sepp = _row("sepp", "sync_data", [_run(20_000, 10_000, 0.9)])
    peer = _row("beanstalkd", "-f 0", [_run(5_000, 4_000, 0.4)])
    table = headline_table([sepp, peer], sepp, "sepp sync_data")
    assert "broker µs/job enq/drain" in table.splitlines()[0]
    peer_line = next(line for line in table.splitlines() if line.startswith("| beanstalkd"))
    assert "80 / 100" in peer_line  # 0.4/5k and 0.4/4k
    assert "4.00x" in peer_line and "2.50x" in peer_line


def test_server_loop_names_what_the_setting_resolves_to() -> None:
    assert server_loop("asyncio") == "asyncio"
    expected = "uvloop" if loops.uvloop_installed() else "asyncio"
    assert server_loop("auto").split()[0] == expected


def test_server_sync_names_what_the_sync_method_resolves_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert server_sync("sync_data", "thread") == "thread"
    assert server_sync("buffer", "auto") == "thread"  # buffer mode syncs on a timer
    expected = "aio" if aio_unavailable() is None else "thread"
    assert server_sync("sync_all", "auto") == expected
    monkeypatch.setenv("SEPP_STORAGE__SYNC_METHOD", "thread")
    assert server_sync("sync_data") == "thread"  # None: what the environment says


def test_bench_requests_measures_every_operation_through_a_real_server() -> None:
    best = asyncio.run(bench_requests.measure(requests=200, cycles=1, connections=5))
    assert set(best) == {"enqueue", "reserve", "ack"}
    for loop_us, process_us in best.values():
        assert 0 < loop_us <= process_us


@pytest.mark.parametrize(
    "loop",
    [
        "asyncio",
        pytest.param(
            "uvloop",
            marks=pytest.mark.skipif(not loops.uvloop_installed(), reason="no uvloop"),
        ),
    ],
)
def test_the_load_generator_runs_its_phases_on_the_loop_asked_for(
    server_factory: Callable[..., ServerProcess], loop: str
) -> None:
    server = server_factory()
    port = server.address.rpartition(":")[2]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.loadgen", "--port", port, "--jobs", "300",
         "--connections", "4", "--phases", "enqueue", "drain", "--loop", loop],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loop"] == loop
    for phase in ("enqueue", "drain"):
        assert result[phase]["jobs"] == 300 and result[phase]["jobs_per_s"] > 0


def test_sepp_gets_a_row_per_build_and_persist_mode() -> None:
    rows = make_rows("durable", "durable", ["sepp"], ["sync_data", "sync_all"], 50, 1000, ["compiled", "pure"])  # fmt: skip
    assert [(r.broker, r.setting, r.build) for r in rows] == [
        ("sepp compiled", "sync_data", "compiled"),
        ("sepp compiled", "sync_all", "compiled"),
        ("sepp pure", "sync_data", "pure"),
        ("sepp pure", "sync_all", "pure"),
    ]


# --- the user-level client benchmark (bench_client) and compare's clients section ------


def test_bench_client_quick_runs_short_and_slow_settings_run_fewer_jobs() -> None:
    args = bench_client.parse_args(["--quick"])
    assert (args.jobs, args.runs, args.rounds, args.mode) == (10_000, 1, 300, "sync_all")
    assert args.phases == list(bench_client.PHASES) and args.pin
    args = bench_client.parse_args(["--jobs", "4000", "--phases", "producer", "--no-pin"])
    assert (args.jobs, args.runs, args.rounds, args.phases, args.pin) == (
        4000, 3, 2000, ["producer"], False,
    )  # fmt: skip
    assert bench_client.phase_jobs("worker", 4000) == 4000
    assert bench_client.phase_jobs("worker_mj1", 4000) == 1000
    assert bench_client.phase_jobs("worker_mif1", 1000) == bench_client.MIN_JOBS


def _client_phase(rate: float, client_us: float, **extra: float | None) -> dict[str, float | None]:
    return {
        "jobs": 1000, "seconds": 1000 / rate, "jobs_per_s": rate, "client_cpu_s": 0.0,
        "server_cpu_s": 0.0, "client_us_per_job": client_us, "server_us_per_job": 30.0,
        "client_cpu": 0.5, **extra,
    }  # fmt: skip


def test_bench_client_summarizes_medians_and_judges_its_own_targets() -> None:
    runs = [
        {"producer": _client_phase(20_000, 14.0), "roundtrip": _client_phase(500, 400, p99_ms=2.5, p50_ms=1, p999_ms=4)},
        {"producer": _client_phase(30_000, 16.0), "roundtrip": _client_phase(500, 400, p99_ms=3.5, p50_ms=1, p999_ms=4)},
        {"producer": _client_phase(10_000, 15.0), "roundtrip": _client_phase(500, 400, p99_ms=2.9, p50_ms=1, p999_ms=4)},
    ]  # fmt: skip
    summary = {p: bench_client.summarize(p, runs) for p in ("producer", "worker", "roundtrip")}
    assert summary["producer"]["jobs_per_s"] == 20_000
    assert (summary["producer"]["min"], summary["producer"]["max"]) == (10_000, 30_000)
    assert summary["worker"] == {}
    lines = bench_client.verdicts(summary)
    assert lines[0] == "client CPU per enqueue <= 15 µs: 15.00 µs -> MET", lines
    assert lines[1].endswith("not measured (phase worker not run)"), lines
    assert lines[2] == "round trip p99 <= 3 ms: 2.90 ms -> MET", lines
    rows = bench_client.table_rows(summary)
    assert [r[0] for r in rows] == ["producer", "roundtrip"]
    assert rows[1][-1] == "1.00 / 2.90 / 4.00"


def test_the_round_trip_verdict_says_how_far_apart_the_slow_ones_came() -> None:
    runs = [
        {"roundtrip": _client_phase(500, 400, p99_ms=6.0, p50_ms=1, p999_ms=9, slow=30, slow_gap_ms=101.0)},
        {"roundtrip": _client_phase(500, 400, p99_ms=7.0, p50_ms=1, p999_ms=9, slow=40, slow_gap_ms=99.0)},
        {"roundtrip": _client_phase(500, 400, p99_ms=5.0, p50_ms=1, p999_ms=9, slow=1, slow_gap_ms=None)},
    ]  # fmt: skip
    summary = {"roundtrip": bench_client.summarize("roundtrip", runs)}
    line = bench_client.verdicts(summary)[2]
    assert line == (
        "round trip p99 <= 3 ms: 6.00 ms -> NOT MET (30 round trips took >= 3 ms, median 100 ms apart)"
    ), line


def test_slow_spacing_counts_the_slow_operations_and_the_gaps_between_them() -> None:
    starts = [0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.31]
    durations = [0.010, 0.001, 0.012, 0.001, 0.011, 0.009, 0.001]
    assert common.slow_spacing(starts, durations, 0.005) == {"slow": 4, "gap_ms": 100.0}
    assert common.slow_spacing(starts, durations, 0.0115) == {"slow": 1, "gap_ms": None}
    assert common.slow_spacing([], [], 0.005) == {"slow": 0, "gap_ms": None}


def test_the_sync_stall_probe_counts_what_it_ran(tmp_path: Path) -> None:
    probe = common.sync_stalls(str(tmp_path), seconds=0.05)
    assert probe["syncs"] > 0 and 0 <= probe["slow"] <= probe["syncs"], probe
    assert probe["max_ms"] > 0
    assert list(tmp_path.iterdir()) == []  # its file is removed


@pytest.mark.parametrize(
    ("stalls", "cores"),
    [({0: 12, 1: 0}, ("1", "0")), ({0: 0, 1: 3}, ("0", "1")), ({0: 2, 1: 2}, ("0", "1"))],
)
def test_bench_cores_puts_servers_on_the_core_whose_syncs_stalled_less(
    monkeypatch: pytest.MonkeyPatch, stalls: dict[int, int], cores: tuple[str, str]
) -> None:
    monkeypatch.setenv(common.CORES_ENV, "")  # unset, and restored after the test
    monkeypatch.setattr(common.os, "cpu_count", lambda: 2)
    probed: list[int] = []
    monkeypatch.setattr(common, "_pinned_stalls", lambda core: probed.append(core) or stalls[core])
    assert common.bench_cores() == cores
    assert probed == [0, 1]
    assert common.os.environ[common.CORES_ENV] == ",".join(cores)
    assert (common.server_core(), common.driver_core()) == cores  # reused, not probed again
    assert probed == [0, 1]


def test_bench_cores_takes_the_cores_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(common.CORES_ENV, "1, 0")
    monkeypatch.setattr(common, "_pinned_stalls", lambda core: pytest.fail("probed"))
    assert common.bench_cores() == ("1", "0")


def test_the_clients_verdicts_set_sepp_against_bullmqs_own_api() -> None:
    sepp = ClientRow("sepp", "sepp pure", "sync_all", 1000)
    sepp.runs.append(
        {
            "producer": _client_phase(40_000, 14.0),
            "worker": _client_phase(20_000, 30.0),
            "worker_mj1": _client_phase(9_000, 60.0),
        }
    )
    bull = ClientRow("bullmq", "BullMQ/Redis", "appendfsync always", 1000)
    bull.runs.append(
        {"producer": _client_phase(20_000, 35.0), "worker": _client_phase(10_000, 50.0)}
    )
    lines = clients_verdicts([sepp, bull])
    assert lines[0].endswith("= 2.00x -> MET"), lines[0]
    assert lines[1].endswith("= 2.00x -> MET"), lines[1]
    assert lines[2].endswith("= 0.90x -> NOT MET"), lines[2]
    assert lines[3].endswith("14.00 µs -> MET") and lines[4].endswith("30.00 µs -> NOT MET"), lines
    table = clients_table([sepp, bull])
    assert "0.90x" in table and "2.00x" in table  # max_jobs=1 and the worker against BullMQ
    assert clients_verdicts([bull]) == ["clients verdict: needs sepp's client run"]


def test_bench_client_runs_every_phase_through_the_public_client(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory()
    port = server.address.rpartition(":")[2]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_client", "--child", "--no-pin", "--port", port,
         "--jobs", "200", "--concurrency", "8", "--rounds", "20", "--phases", *bench_client.PHASES],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for phase in bench_client.PHASES:
        want = 20 if phase == "roundtrip" else bench_client.phase_jobs(phase, 200)
        assert result[phase]["jobs"] == want, (phase, result[phase])
        assert result[phase]["jobs_per_s"] > 0 and result[phase]["client_us_per_job"] > 0
    assert result["roundtrip"]["p50_ms"] <= result["roundtrip"]["p99_ms"]
    assert 0 <= result["roundtrip"]["slow"] <= 20


def test_bench_client_child_takes_the_addresses_a_user_gives(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """bench_cluster --clients hands the child a cluster's address list: the
    client tries each in turn (here a closed port first, then the server)."""
    server = server_factory()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    addr = f"127.0.0.1:{closed},{server.address}"
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_client", "--child", "--no-pin", "--addr", addr,
         "--jobs", "200", "--concurrency", "8", "--phases", "producer", "worker"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["producer"]["jobs"] == 200 and result["worker"]["jobs"] == 200


def test_the_cluster_clients_table_sets_each_cluster_against_the_single_node() -> None:
    def run(producer: float, worker: float, us: float) -> dict[str, Any]:
        phase = {"jobs": 100, "client_us_per_job": us, "server_us_per_job": 1.0, "client_cpu": 0.5}
        return {
            "producer": {**phase, "jobs_per_s": producer},
            "worker": {**phase, "jobs_per_s": worker},
        }

    single = [run(20_000, 10_000, 20), run(30_000, 14_000, 30), run(25_000, 12_000, 22)]
    clustered: dict[int | None, list[dict[str, Any]]] = {
        None: [run(5_000, 6_000, 40), run(7_500, 3_000, 50), run(6_000, 4_000, 45)]
    }
    rows = bench_cluster.client_rows(single, clustered)
    assert rows == [
        ("producer, default 4 in flight", 25_000, "22.0", 6_000, "45.0", "24%"),
        ("worker, default 4 in flight", 12_000, "22.0", 4_000, "45.0", "33%"),
    ]
    # A cluster with no client rounds (or a phase not run) adds no row.
    assert bench_cluster.client_rows(single, {2: []}) == []


def test_the_instruction_fit_recovers_fixed_per_job_and_per_second_costs() -> None:
    from benchmarks.bench_metrics_instructions import fit

    def total(jobs: int, seconds: float) -> dict[str, float]:
        return {"jobs": jobs, "seconds": seconds, "ir": 2e9 + 500_000 * jobs + 7e6 * seconds}

    fixed, per_job, per_second = fit(
        [total(0, 5.2), total(0, 25.1), total(4000, 11.0), total(12000, 33.4)]
    )
    assert fixed == pytest.approx(2e9)
    assert per_job == pytest.approx(500_000)
    assert per_second == pytest.approx(7e6)


def test_the_followers_lag_is_read_from_cumulative_buckets_as_prometheus_does() -> None:
    inf = float("inf")
    before = {0.01: 5.0, 0.05: 5.0, 0.1: 5.0, inf: 5.0}
    after = {0.01: 55.0, 0.05: 103.0, 0.1: 104.0, inf: 105.0}
    delta = bench_cluster._bucket_delta(after, before)
    assert delta == {0.01: 50.0, 0.05: 98.0, 0.1: 99.0, inf: 100.0}
    # 98 of 100 within 50 ms: the target (>= 99 %) missed, said exactly.
    assert bench_cluster._within(delta, 0.05) == 0.98
    # The median is the 50th observation: the top of the first bucket (10 ms).
    assert bench_cluster._bucket_quantile(delta, 0.5) == pytest.approx(10.0)
    # The 99th: the one observation in the 50-100 ms bucket, its top.
    assert bench_cluster._bucket_quantile(delta, 0.99) == pytest.approx(100.0)
    # Halfway into the 10-50 ms bucket's 48 observations: 30 ms.
    assert bench_cluster._bucket_quantile(delta, 0.74) == pytest.approx(30.0)
    # In the +Inf bucket: the highest finite bound, never infinity.
    assert bench_cluster._bucket_quantile(delta, 1.0) == pytest.approx(100.0)
    empty = {0.05: 0.0, inf: 0.0}
    assert math.isnan(bench_cluster._bucket_quantile(empty, 0.99))
    assert math.isnan(bench_cluster._within(empty, 0.05))


def test_the_large_job_benchmark_enqueues_what_it_reports(
    server_factory: Callable[..., ServerProcess],
) -> None:
    from sepp.client import SeppClient

    server = server_factory()
    assert server.proc is not None
    out = asyncio.run(bench_large._shape(server.address, server.proc.pid, 2, 3, seed=5))
    assert out["p50_ms"] <= out["p90_ms"]
    assert out["mib_per_s"] > 0 and out["server_cpu_ms"] >= 0 and out["faults"] >= 0

    async def ready() -> int:
        async with await SeppClient.connect(server.address) as client:
            (queue,) = await client.queue_stats([bench_large.QUEUE])
            return queue.ready

    # The warm-up requests and the timed ones, two 1 MiB jobs each, all still live.
    assert asyncio.run(ready()) == 2 * (bench_large.WARMUP_REQUESTS + 3)
    # The reserve shape takes (and acks) as many, two per reserve.
    out = asyncio.run(
        bench_large._shape(server.address, server.proc.pid, 2, 3, seed=5, op="reserve")
    )
    assert out["p50_ms"] <= out["p90_ms"] and out["mib_per_s"] > 0
    assert asyncio.run(ready()) == 0
