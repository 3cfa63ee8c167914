"""Model-based stateful test: hypothesis drives the real core (decide + apply) and
the reference model in `model.py` with the same random commands, and compares
after every step:

- every reply: accepted ids and dedup flags, rejection reasons and fields, whole
  command errors, delivered jobs in order with attempt and lease deadline, fencing
  errors, dead_lettered flags, drained records, sweep counts, operator results;
- the decision time and the queues woken;
- the observable state: each job's queue, status, attempt, priority, times and
  deadline; per-queue counts; dead letters in order; dedup records; the next
  deadline; the oldest ready enqueue time;
- `check_invariants` (the harness runs it after every command) and, at the end,
  that replaying the recorded log into a fresh State rebuilds the same state.

Hypothesis is seeded from SEPP_SEED by tests/conftest.py.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sepp.core import (
    Ack,
    Command,
    CoreConfig,
    DeadLetterJobs,
    Decision,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Limits,
    Nack,
    NewJob,
    QueuePolicy,
    Release,
    RequeueDeadLetters,
    Reserve,
    State,
    Sweep,
    apply_record,
)
from sepp.core.commands import DeleteSchedule, PauseSchedule, PutSchedule, ResumeSchedule
from sepp.core.results import (
    Accepted,
    CommandError,
    EnqueueResult,
)
from tests.core.helpers import Harness
from tools.refmodel import (
    IN_FLIGHT,
    MJob,
    Model,
    assert_same_answer,
    normalise,
    observe_core,
)

# ---------------------------------------------------------------------------
# Configurations: each run draws one.

CONFIGS = {
    # Defaults: retention 0 (dead letters dropped), no retry delay, auto-created queues.
    "defaults": CoreConfig(limits=Limits(max_enqueue_batch=4, max_reserve_queues=3)),
    # Retention > 0; a declared queue "a" with many overrides (exponential retry,
    # small depth, short leases, job-type allow-list, short horizon); small limits.
    "retained": CoreConfig(
        dead_letter_retention_ms=3_000,
        limits=Limits(
            max_reserve_batch=3,
            max_reserve_queues=2,
            max_queue_name_bytes=8,
            max_job_type_bytes=8,
            max_idempotency_key_bytes=4,
        ),
        defaults=QueuePolicy(
            max_payload_bytes=6,
            allowed_encodings=("json", "text"),
            max_custom_entries=2,
            max_custom_total_bytes=20,
            max_custom_key_bytes=3,
            dedup_window_ms=2_000,
        ),
    ).with_queue(
        "a",
        max_lease_duration_ms=700,
        default_priority=4,
        default_max_attempts=2,
        max_attempts_ceiling=4,
        max_queue_depth=4,
        retry_delay_ms=100,
        retry_backoff="exponential",
        retry_delay_max_ms=1_000,
        max_payload_bytes=12,
        allowed_encodings=None,
        allowed_job_types=("t",),
        max_schedule_horizon_ms=5_000,
        dedup_window_ms=800,
    ),
    # Strict mode with two declared queues, a sweep budget of 2 entries per phase,
    # a global retry delay and depth, and short retention.
    "strict": CoreConfig(
        strict_queues=True,
        dead_letter_retention_ms=500,
        sweep_limit=2,
        defaults=QueuePolicy(
            retry_delay_ms=50,
            max_queue_depth=3,
            max_lease_duration_ms=2_000,
            default_max_attempts=2,
            dedup_window_ms=1_500,
        ),
    )
    .with_queue("a")
    .with_queue("b", max_queue_depth=None, retry_delay_ms=0, default_max_attempts=3),
}

QUEUES = ["a", "a", "a", "b", "b", "c"]

# ---------------------------------------------------------------------------
# Strategies. Valid values come first (hypothesis shrinks towards them); invalid
# ones are rare, so that most runs build up state worth checking. "Valid" here
# means structurally valid: many of them still break a limit of some config.


def mostly(
    valid: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], one_in: int = 10
) -> st.SearchStrategy[Any]:
    """`valid`, except about one draw in `one_in` comes from `rare`."""
    return st.integers(0, one_in - 1).flatmap(lambda i: rare if i == one_in - 1 else valid)


def often(valid: list[Any], rare: list[Any], one_in: int = 10) -> st.SearchStrategy[Any]:
    return mostly(st.sampled_from(valid), st.sampled_from(rare), one_in)


JOB_FIELDS = {
    "queue": st.sampled_from(QUEUES),
    "job_type": st.sampled_from(["t", "t", "u"]),
    "payload": st.sampled_from(
        [
            (None, None),
            (None, None),
            (b"x", "json"),
            (b"hello", "text"),
            (b"1234567", "json"),
            (b"x" * 13, "json"),
            (b"x", "xml"),
        ]
    ),
    "idempotency_key": st.sampled_from([None, None, None, "k1", "k2", "k3"]),
    "priority": st.sampled_from([None, None, 0, 1, 5, 9]),
    "max_attempts": st.sampled_from([None, None, 1, 2, 3, 150]),
    "schedule": st.sampled_from([None, None, None, -100, 0, 1, 50, 300, 1_000, 4_000, 6_000]),
    "custom": st.sampled_from(
        [
            None,
            None,
            {},
            {"n": 1},
            {"s": "hello"},
            {"f": 1.5, "b": True},
            {"abcd": 1},
            {"s": "x" * 30},
        ]
    ),
    "trace": st.sampled_from(
        [(None, None), (None, None), ("00-abc-def-01", None), ("00-abc-def-01", "k=v")]
    ),
}
# One structural fault per faulty job: (field, value).
JOB_FAULTS = [
    ("queue", ""), ("queue", "a/b"), ("queue", ".."), ("queue", "queue-name-too-long"),
    ("job_type", ""), ("job_type", "t" * 300), ("job_type", "typename9"),
    ("payload", (b"", "json")), ("payload", (b"x", "")), ("payload", (b"x", None)), ("payload", (None, "json")),
    ("idempotency_key", ""), ("idempotency_key", "k" * 300), ("idempotency_key", "key5x"),
    ("priority", 10), ("priority", -1), ("max_attempts", 0), ("schedule", 10**10),
    ("custom", {"a": 1, "b": 2, "c": 3}), ("custom", {"": 1}), ("custom", {"k": None}), ("custom", {"k": 2**64}),
    ("trace", ("", None)), ("trace", (None, "k=v")),
]  # fmt: skip


def _with_fault(spec: dict[str, Any], fault: tuple[str, Any] | None) -> dict[str, Any]:
    if fault is not None:
        spec = {**spec, fault[0]: fault[1]}
    return spec


JOB_SPECS = st.builds(
    _with_fault,
    st.fixed_dictionaries(JOB_FIELDS),
    mostly(st.none(), st.sampled_from(JOB_FAULTS), one_in=8),
)
BATCHES = mostly(
    st.lists(JOB_SPECS, min_size=1, max_size=4),
    st.sampled_from([0, 5]).flatmap(lambda n: st.lists(JOB_SPECS, min_size=n, max_size=n)),
    one_in=25,
)
RESERVE_QUEUES = mostly(
    st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2),
    st.sampled_from(
        [
            (),
            ("a", ""),
            ("a/b",),
            ("queue-name-too-long",),
            ("b", "a", "c"),
            ("a", "b", "c", "a", "b"),
        ]
    ),
    one_in=15,
)
SKEW = st.sampled_from([0, 0, 0, 0, 0, 0, 250])  # a command stamped before the clock
PAIRS = st.tuples(
    st.integers(0, 63),
    often(["current"], ["stale", "newer", "one"], one_in=5),
    often(["plain"], ["upper", "bogus", "malformed", "zero"], one_in=6),
)
DIRECTIVES = often(
    [("default", None), ("default", None), ("delay", 0), ("delay", 100), ("delay", 2_000), ("dead_letter", None)],
    [("delay", 10**10), ("delay", None), ("delay", -5), ("later", None)],
)  # fmt: skip


def job_id_for(n: int) -> str:
    """Deterministic, unordered ids: the n-th job of a run."""
    return str(uuid.UUID(bytes=hashlib.sha256(str(n).encode()).digest()[:16]))


# ---------------------------------------------------------------------------


class CoreAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h: Harness
        self.model: Model
        self.now = 1_000_000
        self.ids: list[str] = []
        self.serial = 0

    @initialize(
        name=st.sampled_from(sorted(CONFIGS)),
        prefill=st.lists(st.fixed_dictionaries(JOB_FIELDS), min_size=0, max_size=8),
    )
    def choose_config(self, name: str, prefill: list[dict[str, Any]]) -> None:
        """Pick a config and start with a few (mostly valid) jobs, so that runs in
        which hypothesis disables the enqueue rules still have work to reserve."""
        self.h = Harness(CONFIGS[name])
        self.model = Model(CONFIGS[name])
        if prefill:
            self._enqueue(prefill, atomic=False, skew=0)

    # -- running one command against both -----------------------------------

    def run(
        self, command: Command, model_answer: tuple[Any, ...], now: int
    ) -> Decision | CommandError:
        result = self.h.run(command, now)
        assert_same_answer(normalise(result), model_answer)
        if isinstance(result, Decision):
            assert result.time_ms == self.model.time
            assert set(result.woken) == self.model.woken, (result.woken, self.model.woken)
        return result

    def new_job(self, spec: dict[str, Any]) -> NewJob:
        self.serial += 1
        data, encoding = spec["payload"]
        traceparent, tracestate = spec["trace"]
        schedule = spec["schedule"]
        return NewJob(
            job_id=job_id_for(self.serial),
            queue=spec["queue"],
            job_type=spec["job_type"],
            payload_data=data,
            payload_encoding=encoding,
            idempotency_key=spec["idempotency_key"],
            priority=spec["priority"],
            max_attempts=spec["max_attempts"],
            scheduled_at=None if schedule is None else self.now + schedule,
            traceparent=traceparent,
            tracestate=tracestate,
            custom=spec["custom"],
        )

    def pick(self, pair: tuple[int, str, str]) -> tuple[str, int]:
        """A (job_id, attempt) pair: mostly right, sometimes stale or bogus."""
        index, attempt_mode, id_mode = pair
        in_flight = [j for j in self.model.jobs.values() if j.status == IN_FLIGHT]
        if in_flight and index % 8 != 0:
            job_id = in_flight[index % len(in_flight)].job_id
        elif self.ids:
            job_id = self.ids[index % len(self.ids)]
        else:
            job_id = str(uuid.UUID(int=index))
        job: MJob | None = self.model.jobs.get(job_id)
        current = job.attempt if job is not None else 1
        attempt = {"current": current, "stale": current - 1, "newer": current + 1, "one": 1}[
            attempt_mode
        ]
        if id_mode == "upper":
            job_id = job_id.upper()
        elif id_mode == "bogus":
            job_id = str(uuid.UUID(int=index + 1))
        elif id_mode == "malformed":
            job_id = "job-" + job_id[:8]
        elif id_mode == "zero":
            attempt = 0
        return job_id, attempt

    # -- rules --------------------------------------------------------------

    ENQUEUE_ARGS = {"specs": BATCHES, "atomic": often([False], [True], one_in=4), "skew": SKEW}
    RESERVE_ARGS = {
        "queues": RESERVE_QUEUES,
        "lease_ms": often([100, 1_000, 500, 1, 5_000, 10**7], [0, -1], one_in=15),
        "max_jobs": often([1, 1, 2, 3, 5, 300], [0, -2], one_in=15),
        "worker_id": often([None, "w"], [""], one_in=15),
        "skew": SKEW,
    }

    def _enqueue(self, specs: list[dict[str, Any]], atomic: bool, skew: int) -> None:
        jobs = tuple(self.new_job(spec) for spec in specs)
        now = self.now - skew
        answer = self.model.enqueue(jobs, atomic, now)
        result = self.run(Enqueue(jobs=jobs, atomic=atomic), answer, now)
        if isinstance(result, Decision) and isinstance(result.reply, EnqueueResult):
            for r in result.reply.results:
                if isinstance(r, Accepted) and r.job_id not in self.ids:
                    self.ids.append(r.job_id)

    def _reserve(
        self,
        queues: list[str] | tuple[str, ...],
        lease_ms: int,
        max_jobs: int,
        worker_id: str | None,
        skew: int,
    ) -> None:
        now = self.now - skew
        answer = self.model.reserve(tuple(queues), lease_ms, max_jobs, worker_id, now)
        command = Reserve(
            queues=tuple(queues), lease_ms=lease_ms, max_jobs=max_jobs, worker_id=worker_id
        )
        self.run(command, answer, now)

    # Enqueue and reserve are registered twice: hypothesis picks rules uniformly,
    # and a run needs more jobs flowing than operator actions.
    enqueue = rule(**ENQUEUE_ARGS)(_enqueue)
    enqueue_again = rule(**ENQUEUE_ARGS)(_enqueue)
    reserve = rule(**RESERVE_ARGS)(_reserve)
    reserve_again = rule(**RESERVE_ARGS)(_reserve)

    @rule(pair=PAIRS, skew=SKEW)
    def ack(self, pair: tuple[int, str, str], skew: int) -> None:
        job_id, attempt = self.pick(pair)
        now = self.now - skew
        self.run(Ack(job_id=job_id, attempt=attempt), self.model.ack(job_id, attempt, now), now)

    @rule(pair=PAIRS, directive=DIRECTIVES, reason=st.sampled_from([None, "boom"]), skew=SKEW)
    def nack(
        self,
        pair: tuple[int, str, str],
        directive: tuple[str, int | None],
        reason: str | None,
        skew: int,
    ) -> None:
        job_id, attempt = self.pick(pair)
        retry, delay_ms = directive
        now = self.now - skew
        answer = self.model.nack(job_id, attempt, retry, delay_ms, reason, now)
        command = Nack(
            job_id=job_id, attempt=attempt, retry=retry, delay_ms=delay_ms, reason=reason
        )
        self.run(command, answer, now)

    @rule(pair=PAIRS, lease_ms=often([1, 100, 1_000, 10**6], [0]), skew=SKEW)
    def extend(self, pair: tuple[int, str, str], lease_ms: int, skew: int) -> None:
        job_id, attempt = self.pick(pair)
        now = self.now - skew
        answer = self.model.extend(job_id, attempt, lease_ms, now)
        self.run(Extend(job_id=job_id, attempt=attempt, lease_ms=lease_ms), answer, now)

    @rule(pair=PAIRS, skew=SKEW)
    def release(self, pair: tuple[int, str, str], skew: int) -> None:
        job_id, attempt = self.pick(pair)
        now = self.now - skew
        answer = self.model.release(job_id, attempt, now)
        self.run(Release(job_id=job_id, attempt=attempt), answer, now)

    @rule(dt=st.sampled_from([0, 1, 10, 100, 400, 1_000, 3_000]))
    def time_passes(self, dt: int) -> None:
        self.now += dt

    @rule(dt=st.sampled_from([0, 0, 1, 50, 100, 500, 1_000, 2_500, 10_000]))
    def time_passes_then_sweep(self, dt: int) -> None:
        self.now += dt
        self.run(Sweep(), self.model.sweep(self.now), self.now)

    @rule(
        queue=often([None, "a", "b", "c"], [""]),
        max_records=often([1, 2, 5, 300], [0]),
    )
    def drain(self, queue: str | None, max_records: int) -> None:
        answer = self.model.drain(queue, max_records, self.now)
        self.run(DrainDeadLetters(queue=queue, max_records=max_records), answer, self.now)

    @rule(
        picks=st.lists(st.integers(0, 63), min_size=1, max_size=3),
        bogus=st.booleans(),
        reason=st.sampled_from([None, "operator"]),
    )
    def operator_dead_letters(self, picks: list[int], bogus: bool, reason: str | None) -> None:
        ids = [self.ids[i % len(self.ids)] for i in picks] if self.ids else []
        if bogus or not ids:
            ids.append(str(uuid.UUID(int=len(picks))))
        answer = self.model.dead_letter_jobs(tuple(ids), reason, self.now)
        self.run(DeadLetterJobs(job_ids=tuple(ids), reason=reason), answer, self.now)

    @rule(picks=st.lists(st.integers(0, 63), min_size=1, max_size=3), live=st.booleans())
    def operator_requeues(self, picks: list[int], live: bool) -> None:
        dead = [d.job.job_id for d in self.model.dead]
        pool = dead if dead and not live else self.ids
        ids = [pool[i % len(pool)] for i in picks] if pool else [str(uuid.UUID(int=7))]
        answer = self.model.requeue(tuple(ids), self.now)
        self.run(RequeueDeadLetters(job_ids=tuple(ids)), answer, self.now)

    # -- schedules (issue 17; fixed intervals: cron has its own tests) -------

    @rule(
        name=st.sampled_from(["s1", "s2"]),
        queue=st.sampled_from(["a", "b"]),
        every_ms=often([1_000, 2_500], [999]),
        catch_up=st.sampled_from(["none", "one", "all"]),
    )
    def put_schedule(self, name: str, queue: str, every_ms: int, catch_up: str) -> None:
        answer = self.model.put_schedule(name, queue, "tick", every_ms, catch_up, self.now)
        command = PutSchedule(
            actor="ann", role="admin", name=name, queue=queue, job_type="tick",
            every_ms=every_ms, catch_up=catch_up,
        )  # fmt: skip
        self.run(command, answer, self.now)

    @rule(name=st.sampled_from(["s1", "s2"]), paused=st.booleans())
    def pause_or_resume_schedule(self, name: str, paused: bool) -> None:
        answer = self.model.pause_schedule(name, paused, self.now)
        cls = PauseSchedule if paused else ResumeSchedule
        self.run(cls(actor="ann", role="admin", name=name), answer, self.now)

    @rule(name=st.sampled_from(["s1", "s2"]))
    def delete_schedule(self, name: str) -> None:
        answer = self.model.delete_schedule(name, self.now)
        self.run(DeleteSchedule(actor="ann", role="admin", name=name), answer, self.now)

    # -- checks ---------------------------------------------------------------

    @invariant()
    def same_observable_state(self) -> None:
        if not hasattr(self, "h"):
            return
        core, model = observe_core(self.h.state), self.model.observe()
        for key in model:
            assert core[key] == model[key], (key, core[key], model[key])

    def teardown(self) -> None:
        if not hasattr(self, "h"):
            return
        replayed = State(self.h.config)
        for time_ms, events in self.h.records:
            apply_record(replayed, time_ms, events)
        assert replayed.canonical() == self.h.state.canonical()


CoreAgainstModel.TestCase.settings = settings(max_examples=200, stateful_step_count=60)
TestCoreAgainstModel = CoreAgainstModel.TestCase
