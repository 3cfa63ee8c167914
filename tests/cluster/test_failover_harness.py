"""The failover harness's fast subset (issue 19 item 7): a local cluster of three
JetStream servers and three `sepp serve --cluster` processes under a few planned
faults, with the client-side ledger's checks (tools/failover.py). The long
seeded runs are `python -m tools.failover --faults N`."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from tests.cluster.conftest import _nats_server_or_skip
from tools.failover import LEADER_KINDS, FailoverOptions, ProxyThread, run_failover

PLAN = ("kill_leader", "pause_leader", "kill_leader", "kill_stream_leader", "kill_leader")


def test_three_leader_kills_a_pause_and_a_stream_leader_kill_lose_nothing(
    tmp_path: Path,
) -> None:
    _nats_server_or_skip()
    seed = random.SystemRandom().randrange(2**32)
    print(f"failover seed {seed}")
    report = run_failover(
        FailoverOptions(
            seed=seed, plan=PLAN, directory=str(tmp_path / "cluster"), settle_deadline_s=20.0
        )
    )
    print(report.summary())

    assert report.violations == []
    assert report.liveness == []
    assert [kind for kind, _ in report.faults] == list(PLAN)
    assert sum(kind in LEADER_KINDS for kind, _ in report.faults) == 4
    assert report.enqueues_acked > 0
    assert report.acks_acked > 0
    assert report.final_state_hash != ""


def test_closing_the_proxy_thread_closes_its_loop_and_ends_its_connections() -> None:
    # A proxy to a port nothing listens on, and one connection through it: its
    # handler is running when the proxies are closed.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    thread = ProxyThread()
    proxy = thread.proxy(dead_port)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as conn:
        conn.settimeout(5)
        assert conn.recv(1) == b""  # upstream refused: the proxy closed it
    thread.close([proxy])
    assert thread.loop.is_closed()
    assert not thread._thread.is_alive()
