"""The simulation (`tools/sim.py`) issues every admin mutation of issue 15, and its
reference model (`tools/refmodel.py`) answers each like the core: a purge in
delivery order, a requeue or delete by filter with what remains, a runtime queue
whose overrides change later commands, and a deleted runtime queue's jobs."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from typing import Any

from sepp.core import CoreConfig, NewJob, decide
from sepp.core.commands import (
    AdminDeadLetterJobs,
    AdminRequeueDeadLetters,
    CancelJobs,
    DeleteDeadLetters,
    DeleteQueue,
    DeleteSchedule,
    Enqueue,
    PauseQueue,
    PauseSchedule,
    PurgeQueue,
    PutQueue,
    PutSchedule,
    ResumeQueue,
    ResumeSchedule,
)
from sepp.core.events import CAUSE_ADMIN
from tests.core.helpers import NOW, Harness
from tools import sim
from tools.refmodel import Model, assert_same_answer, normalise, observe_core

EVERY_ADMIN_MUTATION = {
    AdminDeadLetterJobs,
    CancelJobs,
    AdminRequeueDeadLetters,
    DeleteDeadLetters,
    PauseQueue,
    ResumeQueue,
    PurgeQueue,
    PutQueue,
    DeleteQueue,
    # Schedules (issue 17) go the same way.
    PutSchedule,
    PauseSchedule,
    ResumeSchedule,
    DeleteSchedule,
}


def test_the_simulated_operator_issues_every_admin_mutation(seed: int) -> None:
    workload = sim.Workload(random.Random(seed))
    model = Model(sim.CORE_CONFIGS["retained"])
    kinds: Counter[type] = Counter()
    filters = 0
    for _ in range(2_000):
        command, run = workload.admin(model, NOW)
        kinds[type(command)] += 1
        filters += getattr(command, "cause", None) is not None
        run(model)
    assert set(kinds) == EVERY_ADMIN_MUTATION, kinds
    assert filters, "no requeue or delete by cause"


def _same(h: Harness, model: Model, command: object, run: object, now: int) -> tuple[Any, ...]:
    result = decide(h.state, command, now)  # type: ignore[arg-type]
    answer = run(model)  # type: ignore[operator]
    assert_same_answer(normalise(result), answer)
    h.run(command, now)  # type: ignore[arg-type]
    core, mine = observe_core(h.state), model.observe()
    for key in mine:
        assert core[key] == mine[key], key
    return answer  # type: ignore[no-any-return]


def test_the_model_answers_runtime_queues_purges_and_filters_like_the_core() -> None:
    config = CoreConfig(dead_letter_retention_ms=60_000).with_queue(
        "a", max_attempts_ceiling=2, default_max_attempts=2
    )
    h, model = Harness(config), Model(config)
    who: dict[str, Any] = {"actor": "ann", "role": "admin"}
    t = NOW

    def enqueue(queue: str, n: int, priority: int | None = None) -> list[str]:
        nonlocal t
        t += 1
        jobs = tuple(
            NewJob(job_id=str(uuid.UUID(int=t * 100 + i, version=4)), queue=queue, job_type="w")
            if priority is None
            else NewJob(
                job_id=str(uuid.UUID(int=t * 100 + i, version=4)),
                queue=queue,
                job_type="w",
                priority=priority,
            )
            for i in range(n)
        )
        _same(h, model, Enqueue(jobs=jobs), lambda m: m.enqueue(jobs, False, t), t)
        return [j.job_id for j in jobs]

    put = PutQueue(queue="r", overrides={"default_priority": 7}, **who)
    _same(h, model, put, lambda m: m.put_queue("r", {"default_priority": 7}, t), t)
    again = lambda m: m.put_queue("r", {"default_priority": 7}, t)  # noqa: E731
    _same(h, model, put, again, t)  # changed=False
    too_many = PutQueue(queue="a", overrides={"default_max_attempts": 3}, **who)
    _same(h, model, too_many, lambda m: m.put_queue("a", {"default_max_attempts": 3}, t), t)
    enqueue("r", 3)  # default priority 7 from the runtime queue
    low = enqueue("r", 2, priority=1)
    dead = enqueue("a", 4)
    kill = AdminDeadLetterJobs(job_ids=(*dead, *low[:1]), reason="x", **who)
    _same(h, model, kill, lambda m: m.live_jobs_admin(kill.job_ids, True, "x", t), t)

    purge = PurgeQueue(queue="r", max_jobs=2, **who)
    assert _same(h, model, purge, lambda m: m.purge("r", 2, t), t) == ("purge", "r", 2, 2)
    # Delivery order: two of the priority-7 jobs (the runtime default) went first.
    left = sorted(j.priority for j in h.state.jobs.values() if j.queue == "r")
    assert left == [1, 7]
    requeue = AdminRequeueDeadLetters(queue="a", max_jobs=3, **who)
    answer = _same(h, model, requeue, lambda m: m.dead_letters_admin((), "a", None, 3, True, t), t)
    assert answer == ("outcomes", tuple((j, "done") for j in dead[:3]), 1)
    delete = DeleteDeadLetters(cause=CAUSE_ADMIN, max_jobs=1, **who)
    _same(h, model, delete, lambda m: m.dead_letters_admin((), None, CAUSE_ADMIN, 1, False, t), t)
    gone = DeleteQueue(queue="r", **who)
    assert _same(h, model, gone, lambda m: m.delete_queue("r", t), t) == (
        "delete_queue",
        "r",
        2,
        False,
    )
    assert _same(h, model, gone, lambda m: m.delete_queue("r", t), t)[0] == "error"
