"""Fair reserve (issue 17 item 4): a reserve naming several queues with
order = "fair" is a weighted round robin over the named queues that can deliver
(ready jobs, not paused, room under max_in_flight and the rate limit); weights
are the queue setting `weight` (1..1000, default 1). The default order "strict"
tries the queues in the order given.

Each queue's place comes from the state: apply numbers every delivery
(State.delivery_seq) and keeps, per queue, the number of its newest delivery
and its current turn (granted at which number, how many deliveries so far).
The queue with the smallest key is served next (ties: the order given); a turn
lasts `weight` deliveries. Deterministic, rebuilt by replay and snapshots.

Rows, one test each:
  order omitted / "strict": the order given (a busy first queue starves the rest)
  "fair", equal weights: round robin over the queues with ready jobs
  "fair", weights 3 and 1: a a a b a a a b ...
  a queue with nothing to deliver (empty, paused, at a limit) is skipped
  a batch reserve picks what one-job reserves in a row would
  one queue named: the same as strict
  a queue that appears (first job, or back after being forgotten) queues up
    behind the waiting ones, it is not owed a past
  an unknown order -> invalid_argument
  weight below 1 or above 1000 -> ConfigError naming it; PutQueue sets it
  replay and a snapshot rebuild the bookkeeping: the next pick is the same

Plus the starvation bound as a property (a queue that can deliver is served
within the sum of the other named queues' weights fair deliveries, whatever
strict reserves take meanwhile), and the core-against-model machine with fair
reserves (tools/refmodel.py). Hypothesis is seeded from SEPP_SEED.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from sepp.core import CoreConfig, Decision, Limits, QueuePolicy, Reserve, State, apply_record
from sepp.core.commands import PauseQueue, PutQueue
from sepp.core.config import ConfigError, validate_config
from sepp.core.decide import decide
from sepp.core.results import InvalidArgument, ReserveResult
from sepp.core.snapshot import StateBuilder, export_dead, export_dedup, export_jobs, export_meta
from tests.core.helpers import Harness, make_job
from tests.core.test_stateful import JOB_FIELDS, RESERVE_QUEUES, SKEW, CoreAgainstModel, often
from tools.refmodel import Model

NOW = 1_000_000
BATCH = Limits(max_enqueue_batch=64, max_reserve_batch=64)


def harness(config: CoreConfig | None = None, **jobs: int) -> Harness:
    h = Harness(config or CoreConfig(limits=BATCH))
    for queue, count in jobs.items():
        if count:
            h.enqueue(*(make_job(queue) for _ in range(count)), now=NOW)
    return h


def fair(h: Harness, *queues: str, max_jobs: int = 1, order: str = "fair") -> list[str]:
    reply = h.accept(Reserve(queues=queues, lease_ms=60_000, max_jobs=max_jobs, order=order), NOW)
    assert isinstance(reply, ReserveResult)
    return [job.queue for job in reply.jobs]


def one_by_one(h: Harness, *queues: str, n: int, order: str = "fair") -> list[str]:
    return [q for _ in range(n) for q in fair(h, *queues, order=order)]


def test_the_default_order_is_strict_and_a_busy_first_queue_starves_the_rest():
    h = harness(a=5, b=5)
    reply = h.accept(Reserve(queues=("a", "b"), lease_ms=60_000), NOW)
    assert isinstance(reply, ReserveResult) and reply.jobs[0].queue == "a"
    assert one_by_one(h, "a", "b", n=4, order="strict") == ["a"] * 4


def test_fair_with_equal_weights_is_a_round_robin_over_the_queues_with_ready_jobs():
    h = harness(a=5, b=5, c=1)
    assert one_by_one(h, "a", "b", "c", n=7) == ["a", "b", "c", "a", "b", "a", "b"]


def test_fair_with_weights_3_and_1_serves_three_of_a_then_one_of_b():
    config = CoreConfig(limits=BATCH).with_queue("a", weight=3)
    h = harness(config, a=20, b=20)
    assert one_by_one(h, "b", "a", n=8) == ["b", "a", "a", "a", "b", "a", "a", "a"]


@pytest.mark.parametrize("why", ["empty", "paused", "max_in_flight", "rate_limit"])
def test_a_queue_that_cannot_deliver_is_skipped(why: str):
    config = CoreConfig(limits=BATCH)
    if why == "max_in_flight":
        config = config.with_queue("a", max_in_flight=1)
    if why == "rate_limit":
        config = config.with_queue("a", rate_limit_jobs=1, rate_limit_per_ms=60_000)
    h = harness(config, a=0 if why == "empty" else 5, b=5)
    if why == "paused":
        h.accept(PauseQueue(actor="t", role="operator", queue="a"), NOW)
    expected = ["b"] * 4 if why in ("empty", "paused") else ["a", "b", "b", "b"]
    assert one_by_one(h, "a", "b", n=4) == expected


def test_a_batch_reserve_picks_what_one_job_reserves_in_a_row_would():
    config = CoreConfig(limits=BATCH).with_queue("a", weight=2).with_queue("c", weight=3)
    one, batch = harness(config, a=9, b=9, c=9), harness(config, a=9, b=9, c=9)
    assert fair(batch, "c", "b", "a", max_jobs=14) == one_by_one(one, "c", "b", "a", n=14)
    assert batch.state.canonical()["fair"] == one.state.canonical()["fair"]


def test_fair_over_one_queue_is_the_strict_order():
    h = harness(a=3)
    h.enqueue(make_job("a", priority=5), now=NOW)
    strict_order = h.ready_order("a")
    reply = h.accept(Reserve(queues=("a", "a"), lease_ms=1_000, max_jobs=4, order="fair"), NOW)
    assert isinstance(reply, ReserveResult)
    assert [job.job_id for job in reply.jobs] == strict_order


def test_a_queue_that_appears_queues_up_behind_the_waiting_ones():
    h = harness(a=5, b=5)
    assert one_by_one(h, "a", "b", "c", n=3) == ["a", "b", "a"]
    h.enqueue(make_job("c"), now=NOW)  # a newcomer is not owed the deliveries it missed
    assert one_by_one(h, "a", "b", "c", n=3) == ["b", "a", "c"]


def test_an_unknown_order_is_invalid_argument():
    h = harness(a=1)
    error = h.refuse(Reserve(queues=("a", "b"), lease_ms=1_000, order="random"), NOW)
    assert isinstance(error, InvalidArgument) and "order" in error.message


@pytest.mark.parametrize("weight", [0, 1001])
@pytest.mark.parametrize("where", ["defaults", "queue"])
def test_a_weight_out_of_range_is_a_config_error_naming_it(where: str, weight: int):
    if where == "defaults":
        config = CoreConfig(defaults=QueuePolicy(weight=weight))
    else:
        config = CoreConfig().with_queue("q", weight=weight)
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    assert caught.value.key.endswith("weight")


def test_put_queue_sets_the_weight_at_runtime_and_refuses_it_out_of_range():
    h = harness(a=9, b=9)
    put = PutQueue(actor="t", role="admin", queue="b", overrides={"weight": 2})
    h.accept(put, NOW)
    assert one_by_one(h, "a", "b", n=6) == ["a", "b", "b", "a", "b", "b"]
    bad = PutQueue(actor="t", role="admin", queue="b", overrides={"weight": 0})
    error = h.refuse(bad, NOW)
    assert isinstance(error, InvalidArgument) and "weight" in error.message


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


def test_replay_and_a_snapshot_rebuild_the_bookkeeping_so_the_next_pick_is_the_same():
    config = CoreConfig(limits=BATCH).with_queue("a", weight=3)
    h = harness(config, a=9, b=9, c=9)
    one_by_one(h, "a", "b", "c", n=5)
    replayed = State(config)
    for time_ms, events in h.records:
        apply_record(replayed, time_ms, events)
    command = Reserve(queues=("c", "b", "a"), lease_ms=1_000, max_jobs=6, order="fair")
    live = decide(h.state, command, NOW)
    for restarted in (replayed, _snapshot(h.state, config)):
        assert restarted.canonical() == h.state.canonical()
        again = decide(restarted, command, NOW)
        assert isinstance(again, Decision) and isinstance(live, Decision)
        assert again.reply == live.reply


# -- the starvation bound ------------------------------------------------------------------

QUEUE_NAMES = ("a", "b", "c")


@settings(max_examples=100, deadline=None)
@given(
    weights=st.tuples(*(st.integers(1, 4) for _ in QUEUE_NAMES)),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("enqueue"), st.sampled_from(QUEUE_NAMES), st.integers(1, 6)),
            st.tuples(st.just("fair"), st.permutations(QUEUE_NAMES), st.integers(1, 8)),
            st.tuples(st.just("strict"), st.sampled_from(QUEUE_NAMES), st.integers(1, 3)),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_a_queue_that_can_deliver_is_served_within_the_other_queues_weights(
    weights: tuple[int, ...], steps: list[tuple[str, Any, int]]
):
    """A busy queue cannot starve another: while x has ready jobs, fair reserves
    naming it deliver at most sum(weights of the others) jobs of other queues
    before one of x's, however strict reserves (other workers) drain queues."""
    config = CoreConfig(limits=BATCH)
    for name, weight in zip(QUEUE_NAMES, weights, strict=True):
        config = config.with_queue(name, weight=weight)
    h = Harness(config)
    total = sum(weights)
    waited = dict.fromkeys(QUEUE_NAMES, 0)  # fair deliveries to others while x was ready
    for kind, arg, n in steps:
        if kind == "enqueue":
            h.enqueue(*(make_job(arg) for _ in range(n)), now=NOW)
            continue
        queues = tuple(arg) if kind == "fair" else (arg,)
        for _ in range(n):
            ready = {q for q in QUEUE_NAMES if (s := h.state.queues.get(q)) and s.ready_count}
            got = fair(h, *queues, order=kind)
            for x in QUEUE_NAMES:
                if x not in ready or got == [x]:
                    waited[x] = 0
                elif kind == "fair" and got:
                    waited[x] += 1
                    bound = total - weights[QUEUE_NAMES.index(x)]
                    assert waited[x] <= bound, (x, waited, weights)


# -- the core against the model, with fair reserves ------------------------------------------

MODEL_CONFIG = (
    CoreConfig(
        limits=Limits(max_enqueue_batch=8, max_reserve_queues=3), dead_letter_retention_ms=3_000
    )
    .with_queue("a", weight=3)
    .with_queue("b", weight=2, rate_limit_jobs=2, rate_limit_per_ms=500)
)


class FairCoreAgainstModel(CoreAgainstModel):
    """The stateful core-against-model test with weights a = 3, b = 2 (b also rate
    limited) and fair reserves besides the strict ones: every answer, and the fair
    bookkeeping after every step, agree with the reference model."""

    @initialize(prefill=st.lists(st.fixed_dictionaries(JOB_FIELDS), min_size=4, max_size=16))
    def choose_config(self, prefill: list[dict[str, Any]]) -> None:  # type: ignore[override]
        self.h = Harness(MODEL_CONFIG)
        self.model = Model(MODEL_CONFIG)
        for start in range(0, len(prefill), 8):
            self._enqueue(prefill[start : start + 8], atomic=False, skew=0)

    @rule(
        queues=RESERVE_QUEUES,
        max_jobs=often([1, 1, 2, 3, 5, 300], [0], one_in=15),
        order=often(["fair"], ["random", ""], one_in=15),
        skew=SKEW,
    )
    def fair_reserve(self, queues: list[str], max_jobs: int, order: str, skew: int) -> None:
        now = self.now - skew
        answer = self.model.reserve(tuple(queues), 1_000, max_jobs, None, now, order)
        command = Reserve(queues=tuple(queues), lease_ms=1_000, max_jobs=max_jobs, order=order)
        self.run(command, answer, now)

    @rule(
        queues=st.permutations(["a", "b", "c"]),
        max_jobs=st.sampled_from([1, 2, 4]),
    )
    def fair_reserve_of_all(self, queues: list[str], max_jobs: int) -> None:
        answer = self.model.reserve(tuple(queues), 1_000, max_jobs, None, self.now, "fair")
        command = Reserve(queues=tuple(queues), lease_ms=1_000, max_jobs=max_jobs, order="fair")
        self.run(command, answer, self.now)


FairCoreAgainstModel.TestCase.settings = settings(max_examples=40, stateful_step_count=50)
TestFairCoreAgainstModel = FairCoreAgainstModel.TestCase
