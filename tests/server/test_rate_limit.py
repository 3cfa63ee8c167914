"""Per-queue rate limits on a real server (issue 17 item 3): a runtime override
limits the queue's deliveries per window; a long-poll reserve at the limit is
parked (not refused) and served by the server itself once the window frees --
no client action (no ack, no enqueue) wakes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sepp.core.config import ConfigError
from sepp.server.config import example_config, load_config
from tests.server.conftest import LEASE_MS, connect, job, reserved_at
from tests.server.test_long_poll import jobs_of, park

PER_MS = 300


async def test_a_long_poll_parked_at_the_rate_limit_is_served_when_the_window_frees(
    sepp_server, queue_names
):
    worker = await connect(sepp_server.address)
    other = await connect(sepp_server.address)
    q = next(queue_names)
    overrides = {"rate_limit_jobs": 2, "rate_limit_per_ms": PER_MS}
    await worker.ok("put_queue", {"queue": q, "overrides": overrides})
    await other.enqueue_ids(*(job(q) for _ in range(4)))
    first = await worker.reserve([q], max_jobs=4, lease_ms=LEASE_MS)
    assert len(first) == 2  # fewer jobs, never an error
    assert await worker.reserve([q], max_jobs=4) == []
    # Parked: nothing else happens on the server from here on.
    waiting = await park(other, [q], wait_ms=30_000)
    (served,) = await jobs_of(other, waiting)
    # Delivered once the window of the first two deliveries had passed.
    assert reserved_at(served, LEASE_MS) >= reserved_at(first[0], LEASE_MS) + PER_MS
    info = await worker.ok("queue_info", {"queue": q})
    assert info["queue"]["settings"]["rate_limit_jobs"] == 2
    assert info["queue"]["settings"]["rate_limit_per_ms"] == PER_MS


async def test_put_queue_refuses_a_rate_limit_without_its_window(sepp_server, queue_names):
    admin = await connect(sepp_server.address)
    q = next(queue_names)
    response = await admin.call("put_queue", {"queue": q, "overrides": {"rate_limit_jobs": 2}})
    assert response.status == "invalid_argument", response
    assert "rate_limit" in response.body["message"]


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "sepp.toml"
    path.write_text(text)
    return load_config(str(path), env={})


def test_rate_limit_tables_in_limits_and_queues_set_the_policy(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "[limits]\nrate_limit = { jobs = 100, per_ms = 1000 }\n"
        '[[queues]]\nname = "mail"\nrate_limit = { jobs = 5, per_ms = 60000 }\n'
        '[[queues]]\nname = "other"\n',
    ).core_config()
    assert (config.defaults.rate_limit_jobs, config.defaults.rate_limit_per_ms) == (100, 1000)
    mail = config.queues["mail"]
    assert (mail.rate_limit_jobs, mail.rate_limit_per_ms) == (5, 60_000)
    other = config.queues["other"]
    assert (other.rate_limit_jobs, other.rate_limit_per_ms) == (100, 1000)


def test_no_rate_limit_is_the_default(tmp_path: Path) -> None:
    policy = load(tmp_path, "").core_config().defaults
    assert (policy.rate_limit_jobs, policy.rate_limit_per_ms) == (None, None)
    assert "# rate_limit = { jobs = 100, per_ms = 1000 }" in example_config()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[limits]\nrate_limit = 5\n", "limits.rate_limit"),
        ("[limits]\nrate_limit = { jobs = 5 }\n", "limits.rate_limit.per_ms"),
        ("[limits]\nrate_limit = { per_ms = 5 }\n", "limits.rate_limit.jobs"),
        ("[limits]\nrate_limit = { jobs = 0, per_ms = 5 }\n", "limits.rate_limit.jobs"),
        ("[limits]\nrate_limit = { jobs = 1, per_ms = 0 }\n", "limits.rate_limit.per_ms"),
        ('[limits]\nrate_limit = { jobs = "1", per_ms = 5 }\n', "limits.rate_limit.jobs"),
        ("[limits]\nrate_limit = { jobs = 1, per_ms = 5, burst = 2 }\n", "limits.rate_limit.burst"),
        (
            '[[queues]]\nname = "q"\nrate_limit = { jobs = 1000000, per_ms = 5 }\n',
            "queues.q.rate_limit.jobs",
        ),
        (
            '[[queues]]\nname = "q"\nrate_limit = { jobs = 1, per_ms = 86400001 }\n',
            "queues.q.rate_limit.per_ms",
        ),
    ],
)
def test_a_bad_rate_limit_is_refused_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert caught.value.key == key
