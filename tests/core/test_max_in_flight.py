"""Per-queue max_in_flight (issue 17 item 3, first part): jobs of a queue leased at
once across all workers, decided in the core's reserve from the state (the
queue's in-flight count), so it holds exactly across restarts (replay rebuilds
the count). A reserve at the cap gets fewer jobs, or none: never an error.

Rows of the rule, one test each:
  in flight < cap: a reserve gets at most cap - in flight of the queue's jobs
  in flight = cap: the queue is passed over (other named queues still serve)
  a job leaves In-flight (ack, nack, lease expiry) -> the capped queue is woken
  PutQueue may set / raise it at runtime (wakes the queue); below 1 is refused
  [limits] / [[queues]] max_in_flight below 1 -> ConfigError naming it

Plus the model-based property test: a queue with max_in_flight = 5 never has a
sixth job leased, and the core agrees with the reference model step by step.
Hypothesis is seeded from SEPP_SEED by tests/conftest.py.
"""

from __future__ import annotations

from typing import Any

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
    Sweep,
    apply_record,
)
from sepp.core.commands import PutQueue
from sepp.core.config import ConfigError, validate_config
from sepp.core.decide import decide
from sepp.core.results import InvalidArgument
from tests.core.helpers import Harness, make_job
from tests.core.test_stateful import JOB_FIELDS, CoreAgainstModel
from tools.refmodel import IN_FLIGHT, Model

CAP = 5
NOW = 1_000_000
CAPPED = CoreConfig(limits=Limits(max_enqueue_batch=16)).with_queue("q", max_in_flight=CAP)


def filled(n: int, config: CoreConfig = CAPPED) -> Harness:
    h = Harness(config)
    h.enqueue(*(make_job("q") for _ in range(n)), now=NOW)
    return h


def test_a_reserve_below_the_cap_gets_at_most_the_room_left():
    h = filled(10)
    assert len(h.reserve("q", now=NOW, max_jobs=3)) == 3
    assert len(h.reserve("q", now=NOW, max_jobs=10)) == CAP - 3
    assert h.state.queues["q"].in_flight_count == CAP


def test_a_reserve_at_the_cap_gets_no_job_and_no_error_while_other_queues_still_serve():
    h = filled(10)
    h.enqueue(make_job("other"), now=NOW)
    assert len(h.reserve("q", now=NOW, max_jobs=CAP)) == CAP
    assert h.reserve("q", now=NOW, max_jobs=1) == ()
    assert h.reserve("q", now=NOW, max_jobs=4) == ()
    (job,) = h.reserve("q", "other", now=NOW, max_jobs=4)
    assert job.queue == "other"


def test_an_ack_of_a_capped_queue_wakes_it_and_frees_one_place():
    h = filled(10)
    first, *_ = h.reserve("q", now=NOW, max_jobs=CAP)
    h.ack(first.job_id, first.attempt, now=NOW)
    assert h.decisions[-1].woken == frozenset({"q"})
    assert len(h.reserve("q", now=NOW, max_jobs=CAP)) == 1


def test_an_ack_of_an_uncapped_queue_wakes_nothing():
    h = filled(2, CoreConfig())
    (job,) = h.reserve("q", now=NOW)
    h.ack(job.job_id, job.attempt, now=NOW)
    assert h.decisions[-1].woken == frozenset()


def test_a_dead_lettering_nack_and_a_final_lease_expiry_wake_the_capped_queue():
    h = Harness(CAPPED)
    h.enqueue(*(make_job("q", max_attempts=1) for _ in range(3)), now=NOW)
    a, _ = h.reserve("q", now=NOW, max_jobs=2, lease_ms=100)
    h.nack(a.job_id, a.attempt, now=NOW, retry="dead_letter")
    assert h.decisions[-1].woken == frozenset({"q"})
    swept = h.sweep(NOW + 1_000)  # the other lease expired on its last attempt: dead
    assert swept.dead_lettered == 1
    assert h.decisions[-1].woken == frozenset({"q"})


def test_put_queue_sets_max_in_flight_at_runtime_and_wakes_the_queue():
    h = filled(4, CoreConfig())
    h.accept(PutQueue(actor="t", role="admin", queue="q", overrides={"max_in_flight": 1}), NOW)
    assert h.decisions[-1].woken == frozenset({"q"})
    assert len(h.reserve("q", now=NOW, max_jobs=4)) == 1
    h.accept(PutQueue(actor="t", role="admin", queue="q", overrides={"max_in_flight": 3}), NOW)
    assert len(h.reserve("q", now=NOW, max_jobs=4)) == 2


def test_put_queue_refuses_a_max_in_flight_below_1():
    h = filled(1, CoreConfig())
    error = h.refuse(
        PutQueue(actor="t", role="admin", queue="q", overrides={"max_in_flight": 0}), NOW
    )
    assert isinstance(error, InvalidArgument) and "max_in_flight" in error.message


@pytest.mark.parametrize("where", ["defaults", "queue"])
def test_a_configured_max_in_flight_below_1_is_a_config_error_naming_it(where: str):
    if where == "defaults":
        config = CoreConfig(defaults=QueuePolicy(max_in_flight=0))
    else:
        config = CoreConfig().with_queue("q", max_in_flight=0)
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    assert "max_in_flight" in caught.value.key


def test_the_cap_holds_after_a_restart_because_replay_rebuilds_the_in_flight_count():
    h = filled(10)
    h.reserve("q", now=NOW, max_jobs=CAP)
    replayed = State(CAPPED)
    for time_ms, events in h.records:
        apply_record(replayed, time_ms, events)
    assert replayed.queues["q"].in_flight_count == CAP
    again = decide(replayed, Reserve(queues=("q",), lease_ms=1_000, max_jobs=3), NOW)
    assert isinstance(again, Decision) and again.reply.jobs == ()  # type: ignore[union-attr]
    assert isinstance(decide(replayed, Sweep(), NOW), Decision)


# -- the property: never a sixth job leased ---------------------------------------------

MODEL_CONFIG = CoreConfig(
    limits=Limits(max_enqueue_batch=8, max_reserve_queues=3), dead_letter_retention_ms=3_000
).with_queue("a", max_in_flight=CAP)


class CappedCoreAgainstModel(CoreAgainstModel):
    """The stateful core-against-model test with queue "a" capped at 5 in flight
    (enqueues, reserves of up to 300 jobs over 1-2 queues, acks, nacks, releases,
    extends, lease expiries, operator actions, as in test_stateful)."""

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
    def never_more_than_max_in_flight_leased(self) -> None:
        if not hasattr(self, "h"):
            return
        q = self.h.state.queues.get("a")
        leased = 0 if q is None else q.in_flight_count
        assert leased <= CAP, leased
        in_model = sum(
            1 for j in self.model.jobs.values() if j.queue == "a" and j.status == IN_FLIGHT
        )
        assert in_model == leased


CappedCoreAgainstModel.TestCase.settings = settings(max_examples=25, stateful_step_count=50)
TestCappedCoreAgainstModel = CappedCoreAgainstModel.TestCase
