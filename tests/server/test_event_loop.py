"""`server.event_loop`: the server runs the same on the standard loop and on uvloop,
`auto` picks uvloop only when it is installed, and asking for a missing uvloop is a
configuration error, not a silent fallback."""

from __future__ import annotations

import pytest

from sepp.core.errors import ConfigError
from sepp.server import loops
from tests.server.conftest import connect, job
from tests.server.test_long_poll import jobs_of, park

LOOPS = [
    "asyncio",
    pytest.param(
        "uvloop",
        marks=pytest.mark.skipif(not loops.uvloop_installed(), reason="uvloop is not installed"),
    ),
]


@pytest.mark.parametrize("loop_name", LOOPS)
async def test_the_server_serves_and_recovers_on_each_loop(server_factory, tmp_path, loop_name):
    env = {"SEPP_SERVER__EVENT_LOOP": loop_name, "SEPP_LOGGING__LEVEL": "info"}
    data = tmp_path / "data"
    server = server_factory(env=env, data_dir=data)
    assert f"loop={loop_name}" in server.log()
    worker = await connect(server.address)
    producer = await connect(server.address)
    # A long poll woken from another connection (a cross-connection wake-up).
    waiting = await park(worker, ["q"])
    (first,) = await producer.enqueue_ids(job("q"))
    (delivered,) = await jobs_of(worker, waiting)
    assert delivered["id"] == first
    assert (await worker.ack(delivered)).status == "ok"
    # A pipelined burst on one connection: every request answered, by id.
    request_ids = [producer.send("enqueue", {"jobs": [job("q")]}) for _ in range(200)]
    for request_id in request_ids:
        assert (await producer.response(request_id)).status == "ok"
    producer.assert_clean()
    worker.assert_clean()
    await worker.close()
    await producer.close()
    assert server.stop() == 0
    # What was acknowledged survived the stop: 200 ready, the acked job gone.
    again = server_factory(env=env, data_dir=data)
    client = await connect(again.address)
    assert (await client.stats("q"))["ready"] == 200
    assert (await client.ack(delivered)).status == "not_found"
    await client.close()
    assert again.stop() == 0


def test_auto_means_uvloop_exactly_when_it_is_installed(monkeypatch):
    monkeypatch.setattr(loops, "uvloop_installed", lambda: True)
    assert loops.resolve_event_loop("auto") == "uvloop"
    monkeypatch.setattr(loops, "uvloop_installed", lambda: False)
    assert loops.resolve_event_loop("auto") == "asyncio"
    assert loops.resolve_event_loop("asyncio") == "asyncio"


def test_asking_for_a_missing_uvloop_is_a_configuration_error(monkeypatch):
    monkeypatch.setattr(loops, "uvloop_installed", lambda: False)
    with pytest.raises(ConfigError) as refused:
        loops.resolve_event_loop("uvloop")
    assert refused.value.key == "server.event_loop"
    assert "pip install 'sepp[uvloop]'" in str(refused.value)
