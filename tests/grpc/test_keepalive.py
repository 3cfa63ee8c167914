"""The official clients ping every 30 s, also while idle (keepalive_time_ms 30000,
permit_without_calls). The gRPC core's server defaults count such pings as abuse
(pings without calls refused while idle, 2 strikes) and drop the connection with
GOAWAY "too_many_pings": after ~150 s idle here (grpcio 1.85; the negative control
is `python -m tests.grpc.keepalive_probe --idle 170 --out r.json
--default-policy`, which records the channel going IDLE at ~150 s). The front's
settings accept the pings: a channel with the official client's options idles for
KEEPALIVE_IDLE_S (170 s) and its connection never leaves READY.

The idling happens in a child process started at collection (conftest.py,
keepalive_probe.py), so it overlaps the rest of the suite. Marked `grpc_long`:
SEPP_GRPC_LONG_TESTS=0 deselects it (.ci/run's second pass): it runs once per CI
run.
"""

from __future__ import annotations

import pytest

from tests.grpc.conftest import KEEPALIVE_IDLE_S, keepalive_probe_result

pytestmark = [pytest.mark.grpc_long, pytest.mark.keepalive_probe]

# How long past the probe's idle time its answer may take (start-up, the last call).
PROBE_ANSWER_S = 90.0


def test_an_idle_channel_with_the_official_clients_keepalive_stays_connected():
    result = keepalive_probe_result(PROBE_ANSWER_S)
    assert result["idle_s"] >= KEEPALIVE_IDLE_S
    assert result["changes"] == [], (
        f"the connection left READY while idle: {result['changes']}\n{result['log']}"
    )
    assert result["final"] == "ok", result["log"]
