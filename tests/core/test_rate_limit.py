"""Per-queue rate limits (issue 17 item 3, second part): at most rate_limit_jobs
deliveries of a queue's jobs in any window of rate_limit_per_ms milliseconds,
decided in the core's reserve from the queue's rate window -- the times of its
recent deliveries, built by apply from each JobReserved and its record's time, so
replay (and a snapshot) rebuilds it and the limit holds exactly across restarts.
A delivery is a lease grant: a redelivery counts, a released one still counted.

Rows of the rule, one test each:
  deliveries in (now - per_ms, now] < jobs: a reserve gets at most the difference
  = jobs: the queue is passed over (other named queues still serve), never an error
  the oldest counted delivery leaves the window at its time + per_ms: room again
  a redelivery (after a nack, a release, a lease expiry) is a delivery: it counts
  max_in_flight and rate_limit together: the smaller room wins
  a queue forgotten (emptied) keeps its window: it still counts
  PutQueue sets / changes it at runtime (wakes the queue); jobs or per_ms below
    1, or one without the other, is refused (invalid_argument naming rate_limit)
  [limits] / [[queues]] rate_limit out of range -> ConfigError naming it
  rate_limited_until: when the window next has room (the server's wake timer)

Plus the model-based property test: a queue limited to 3 deliveries per 1000 ms
never has a fourth in any window, and the core agrees with the reference model
step by step (tools/refmodel.py). Hypothesis is seeded from SEPP_SEED by
tests/conftest.py.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

from sepp.core import (
    CoreConfig,
    Decision,
    Limits,
    QueuePolicy,
    Reserve,
    State,
    apply_record,
)
from sepp.core.commands import PutQueue, Release
from sepp.core.config import ConfigError, validate_config
from sepp.core.decide import decide
from sepp.core.results import InvalidArgument, ReserveResult
from sepp.core.snapshot import StateBuilder, export_dead, export_dedup, export_jobs, export_meta
from sepp.core.state import rate_limited_until
from tests.core.helpers import Harness, make_job
from tests.core.test_stateful import JOB_FIELDS, CoreAgainstModel
from tools.refmodel import Model

JOBS = 3
PER_MS = 1_000
NOW = 1_000_000
LIMITED = CoreConfig(limits=Limits(max_enqueue_batch=16)).with_queue(
    "q", rate_limit_jobs=JOBS, rate_limit_per_ms=PER_MS
)


def filled(n: int, config: CoreConfig = LIMITED) -> Harness:
    h = Harness(config)
    h.enqueue(*(make_job("q") for _ in range(n)), now=NOW)
    return h


def put_queue(**overrides: Any) -> PutQueue:
    return PutQueue(actor="t", role="admin", queue="q", overrides=overrides)


def test_a_reserve_below_the_limit_gets_at_most_the_deliveries_left_in_the_window():
    h = filled(10)
    assert len(h.reserve("q", now=NOW, max_jobs=2)) == 2
    assert len(h.reserve("q", now=NOW + 10, max_jobs=10)) == JOBS - 2


def test_a_reserve_at_the_limit_gets_no_job_and_no_error_while_other_queues_still_serve():
    h = filled(10)
    h.enqueue(make_job("other"), now=NOW)
    assert len(h.reserve("q", now=NOW, max_jobs=JOBS)) == JOBS
    assert h.reserve("q", now=NOW + 1, max_jobs=1) == ()
    assert h.reserve("q", now=NOW + PER_MS - 1, max_jobs=5) == ()
    (job,) = h.reserve("q", "other", now=NOW + 2, max_jobs=5)
    assert job.queue == "other"


def test_room_comes_back_when_the_oldest_delivery_leaves_the_window():
    h = filled(10)
    h.reserve("q", now=NOW, max_jobs=1)
    h.reserve("q", now=NOW + 100, max_jobs=2)
    assert h.reserve("q", now=NOW + PER_MS - 1) == ()
    # The window is (now - per_ms, now]: the delivery at NOW leaves it at NOW + per_ms.
    assert len(h.reserve("q", now=NOW + PER_MS, max_jobs=5)) == 1
    assert h.reserve("q", now=NOW + PER_MS + 99) == ()
    assert len(h.reserve("q", now=NOW + PER_MS + 100, max_jobs=5)) == 2


@pytest.mark.parametrize("how", ["nack", "release", "lease expiry"])
def test_a_redelivery_counts_as_a_delivery(how: str):
    h = Harness(LIMITED)
    h.enqueue(make_job("q", max_attempts=10), now=NOW)
    for step in range(JOBS):
        now = NOW + 10 * step
        (job,) = h.reserve("q", now=now, lease_ms=10)
        if how == "nack":
            h.nack(job.job_id, job.attempt, now=now)
        elif how == "release":
            h.accept(Release(job_id=job.job_id, attempt=job.attempt), now)
        else:
            h.sweep(now + 10)
    # The same job, delivered three times within the window: the limit is reached.
    assert h.status(job.job_id) == "ready"
    assert h.reserve("q", now=NOW + 30) == ()
    assert len(h.reserve("q", now=NOW + PER_MS)) == 1


def test_max_in_flight_and_rate_limit_both_apply_and_the_smaller_room_wins():
    config = LIMITED.with_queue(
        "q", rate_limit_jobs=JOBS, rate_limit_per_ms=PER_MS, max_in_flight=2
    )
    h = filled(10, config)
    first = h.reserve("q", now=NOW, max_jobs=10)
    assert len(first) == 2  # max_in_flight
    h.ack(first[0].job_id, first[0].attempt, now=NOW)
    assert len(h.reserve("q", now=NOW, max_jobs=10)) == 1  # rate limit: 3 in the window
    h.ack(first[1].job_id, first[1].attempt, now=NOW)
    assert h.reserve("q", now=NOW, max_jobs=10) == ()


def test_a_forgotten_queue_keeps_its_window():
    config = CoreConfig(defaults=QueuePolicy(rate_limit_jobs=1, rate_limit_per_ms=PER_MS))
    h = Harness(config)
    h.enqueue(make_job("q"), now=NOW)
    (job,) = h.reserve("q", now=NOW)
    h.ack(job.job_id, job.attempt, now=NOW)
    assert "q" not in h.state.queues  # undeclared and empty: forgotten
    h.enqueue(make_job("q"), now=NOW + 1)
    assert h.reserve("q", now=NOW + 1) == ()
    assert len(h.reserve("q", now=NOW + PER_MS)) == 1


def test_put_queue_sets_a_rate_limit_at_runtime_and_wakes_the_queue():
    h = filled(10, CoreConfig())
    h.accept(put_queue(rate_limit_jobs=2, rate_limit_per_ms=PER_MS), NOW)
    assert h.decisions[-1].woken == frozenset({"q"})
    assert len(h.reserve("q", now=NOW, max_jobs=10)) == 2
    h.accept(put_queue(rate_limit_jobs=3, rate_limit_per_ms=PER_MS), NOW)
    assert h.decisions[-1].woken == frozenset({"q"})
    assert len(h.reserve("q", now=NOW, max_jobs=10)) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        {"rate_limit_jobs": 0, "rate_limit_per_ms": PER_MS},
        {"rate_limit_jobs": 2, "rate_limit_per_ms": 0},
        {"rate_limit_jobs": 2},
        {"rate_limit_per_ms": PER_MS},
    ],
)
def test_put_queue_refuses_a_rate_limit_out_of_range_or_half_given(overrides: dict[str, int]):
    h = filled(1, CoreConfig())
    error = h.refuse(put_queue(**overrides), NOW)
    assert isinstance(error, InvalidArgument) and "rate_limit" in error.message


@pytest.mark.parametrize(
    ("jobs", "per_ms", "key"),
    [(0, 1, "rate_limit.jobs"), (1, 0, "rate_limit.per_ms"), (1, None, "rate_limit")],
)
@pytest.mark.parametrize("where", ["defaults", "queue"])
def test_a_configured_rate_limit_out_of_range_is_a_config_error_naming_it(
    where: str, jobs: int, per_ms: int | None, key: str
):
    if where == "defaults":
        config = CoreConfig(defaults=QueuePolicy(rate_limit_jobs=jobs, rate_limit_per_ms=per_ms))
    else:
        config = CoreConfig().with_queue("q", rate_limit_jobs=jobs, rate_limit_per_ms=per_ms)
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    assert caught.value.key.endswith(key)


def test_rate_limited_until_is_when_the_window_next_has_room():
    h = filled(10)
    h.reserve("q", now=NOW, max_jobs=2)
    assert rate_limited_until(h.state, "q", NOW) is None  # room for one more
    h.reserve("q", now=NOW + 200)
    assert rate_limited_until(h.state, "q", NOW + 200) == NOW + PER_MS
    assert rate_limited_until(h.state, "q", NOW + PER_MS) is None
    assert rate_limited_until(h.state, "other", NOW) is None


def _snapshot(state: State, config: CoreConfig) -> State:
    body = [
        export_meta(state),
        list(export_jobs(state)),
        list(export_dedup(state)),
        list(export_dead(state)),
    ]
    meta, jobs, dedup, dead = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False)
    builder = StateBuilder(config, meta)
    builder.add_jobs(jobs)
    builder.add_dedup(dedup)
    builder.add_dead(dead)
    return builder.finish()


def test_the_limit_holds_after_a_restart_because_replay_and_snapshots_rebuild_the_window():
    h = filled(10)
    h.reserve("q", now=NOW, max_jobs=1)
    h.reserve("q", now=NOW + 500, max_jobs=2)
    replayed = State(LIMITED)
    for time_ms, events in h.records:
        apply_record(replayed, time_ms, events)
    for restarted in (replayed, _snapshot(h.state, LIMITED)):
        assert restarted.canonical() == h.state.canonical()
        for now, expected in ((NOW + 999, 0), (NOW + 1_000, 1), (NOW + 1_500, 3)):
            again = decide(restarted, Reserve(queues=("q",), lease_ms=1_000, max_jobs=5), now)
            assert isinstance(again, Decision) and isinstance(again.reply, ReserveResult)
            assert len(again.reply.jobs) == expected, now


# -- the property: never a fourth delivery in a window ------------------------------------

MODEL_CONFIG = CoreConfig(
    limits=Limits(max_enqueue_batch=8, max_reserve_queues=3), dead_letter_retention_ms=3_000
).with_queue("a", rate_limit_jobs=JOBS, rate_limit_per_ms=PER_MS)


class RateLimitedCoreAgainstModel(CoreAgainstModel):
    """The stateful core-against-model test with queue "a" limited to 3 deliveries
    per 1000 ms (enqueues, reserves of up to 300 jobs over 1-2 queues, acks, nacks,
    releases, lease expiries, time passing, operator actions, as in
    test_stateful)."""

    @initialize(prefill=st.lists(st.fixed_dictionaries(JOB_FIELDS), min_size=6, max_size=16))
    def choose_config(self, prefill: list[dict[str, Any]]) -> None:  # type: ignore[override]
        self.h = Harness(MODEL_CONFIG)
        self.model = Model(MODEL_CONFIG)
        for start in range(0, len(prefill), 8):
            self._enqueue(
                [dict(spec, queue="a") for spec in prefill[start : start + 8]],
                atomic=False,
                skew=0,
            )

    @invariant()
    def never_more_than_the_limit_delivered_in_a_window(self) -> None:
        if not hasattr(self, "h"):
            return
        times = [
            decision.time_ms
            for decision in self.h.decisions
            if isinstance(decision.reply, ReserveResult)
            for job in decision.reply.jobs
            if job.queue == "a"
        ]
        for i, start in enumerate(times):
            in_window = sum(1 for t in times[i:] if t < start + PER_MS)
            assert in_window <= JOBS, (start, times)


RateLimitedCoreAgainstModel.TestCase.settings = settings(max_examples=25, stateful_step_count=50)
TestRateLimitedCoreAgainstModel = RateLimitedCoreAgainstModel.TestCase
