"""Every field of every command, set to a value of every kind: `decide` answers with a
decision or a typed refusal — never an exception — and a value of a type the field
does not declare is always refused.

The server's edge only builds well-typed commands, but `decide` is also the library's
core, and CI runs this file on the compiled build too (`python -m tools.compile`),
where a field read through its declared type would be converted (a bool read as an
int becomes the int) or raise TypeError. So this is what keeps both builds answering
the same: exhaustive rather than sampled, one case per (command, field, value).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest

from sepp.core import (
    RETRY_DEAD_LETTER,
    RETRY_DEFAULT,
    RETRY_DELAY,
    Ack,
    Command,
    CoreConfig,
    DeadLetterJobs,
    Decision,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Nack,
    NewJob,
    Release,
    RequeueDeadLetters,
    Reserve,
)
from sepp.core.results import Accepted, AtomicRejected, CommandError, EnqueueResult, Rejection

from .helpers import NOW, Harness, make_job

# One value of each kind a caller could pass by mistake.
VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2**64,
    1.5,
    math.nan,
    "",
    "q",
    "x" * 300,
    b"",
    b"x",
    [],
    ["q"],
    (),
    ("q",),
    {},
    {"k": 1},
    object(),
]
VALUE_IDS = [f"{i}-{type(v).__name__}" for i, v in enumerate(VALUES)]


def _int(v: Any) -> bool:
    return type(v) is int


def _str(v: Any) -> bool:
    return type(v) is str


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _str_tuple(v: Any) -> bool:
    return type(v) is tuple and all(type(x) is str for x in v)


def _primitive_map(v: Any) -> bool:
    return type(v) is dict and all(
        type(k) is str and type(x) in (str, int, float, bool) for k, x in v.items()
    )


def _retry(v: Any) -> bool:
    return v in (RETRY_DEFAULT, RETRY_DELAY, RETRY_DEAD_LETTER) and type(v) is str


# (field, the values of its declared type) per command. A value outside it must be
# refused; a value inside it may be refused for its content (0 attempts, "" names).
NEW_JOB_FIELDS: dict[str, Callable[[Any], bool]] = {
    "job_id": _str,
    "queue": _str,
    "job_type": _str,
    "payload_data": _opt(lambda v: type(v) is bytes),
    "payload_encoding": _opt(_str),
    "idempotency_key": _opt(_str),
    "priority": _opt(_int),
    "max_attempts": _opt(_int),
    "scheduled_at": _opt(_int),
    "traceparent": _opt(_str),
    "tracestate": _opt(_str),
    "custom": _opt(_primitive_map),
    "invalid": lambda v: v is None,  # any other value marks the job malformed
}

COMMAND_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "enqueue": {"jobs": lambda v: False, "atomic": lambda v: type(v) is bool},
    "reserve": {
        "queues": _str_tuple,
        "lease_ms": _int,
        "max_jobs": _int,
        "worker_id": _opt(_str),
        "max_bytes": _opt(_int),
    },
    "ack": {"job_id": _str, "attempt": _int, "worker_id": _opt(_str)},
    "nack": {
        "job_id": _str,
        "attempt": _int,
        "retry": _retry,
        "reason": _opt(_str),
        "worker_id": _opt(_str),
    },
    # delay_ms is only read with retry="delay"; the test of that pairing is below.
    "extend": {"job_id": _str, "attempt": _int, "lease_ms": _int, "worker_id": _opt(_str)},
    "release": {"job_id": _str, "attempt": _int, "worker_id": _opt(_str)},
    "drain": {"queue": _opt(_str), "max_records": _int, "max_bytes": _opt(_int)},
    "dead_letter": {"job_ids": lambda v: type(v) is tuple, "reason": _opt(_str)},
    "requeue": {"job_ids": lambda v: type(v) is tuple},
}


class World:
    """A state with one in-flight job (attempt 1), one Ready job and one dead letter."""

    def __init__(self) -> None:
        self.h = Harness(CoreConfig(dead_letter_retention_ms=86_400_000))
        ids = self.h.enqueue(make_job(), make_job(), make_job(), now=NOW)
        self.dead_id = self.h.reserve_one("q", now=NOW).job_id
        self.flying_id = self.h.reserve_one("q", now=NOW).job_id
        [self.ready_id] = set(ids) - {self.dead_id, self.flying_id}
        self.h.nack(self.dead_id, 1, now=NOW, retry=RETRY_DEAD_LETTER)

    def valid(self, name: str) -> Command:
        if name == "enqueue":
            return Enqueue(jobs=(make_job(),))
        if name == "reserve":
            return Reserve(queues=("q",), lease_ms=1_000)
        if name == "ack":
            return Ack(job_id=self.flying_id, attempt=1)
        if name == "nack":
            return Nack(job_id=self.flying_id, attempt=1)
        if name == "extend":
            return Extend(job_id=self.flying_id, attempt=1, lease_ms=1_000)
        if name == "release":
            return Release(job_id=self.flying_id, attempt=1)
        if name == "drain":
            return DrainDeadLetters(max_records=1)
        if name == "dead_letter":
            return DeadLetterJobs(job_ids=(self.ready_id,))
        assert name == "requeue"
        return RequeueDeadLetters(job_ids=(self.dead_id,))


def _with(command: Command, field: str, value: Any) -> Command:
    """`command` with one field replaced (neither kind of command checks types when
    built)."""
    if isinstance(command, tuple):
        return command._replace(**{field: value})  # type: ignore[return-value]
    return dataclasses.replace(command, **{field: value})


def _refused(result: Decision | CommandError) -> bool:
    """A refusal of the whole command, or of every job of an enqueue."""
    if isinstance(result, CommandError):
        return True
    reply = result.reply
    if isinstance(reply, AtomicRejected):
        return True
    if isinstance(reply, EnqueueResult):
        return all(isinstance(r, Rejection) for r in reply.results)
    return False


def _run(world: World, command: Command) -> Decision | CommandError:
    result = world.h.run(command, NOW + 1)  # checks purity and the invariants too
    assert isinstance(result, Decision | CommandError), result
    return result


@pytest.mark.parametrize("name", list(COMMAND_FIELDS))
def test_the_valid_command_is_accepted(name: str) -> None:
    # The baseline every case below changes one field of.
    world = World()
    result = _run(world, world.valid(name))
    assert not _refused(result), (name, result)


@pytest.mark.parametrize(
    ("name", "field"), [(n, f) for n, fields in COMMAND_FIELDS.items() for f in fields]
)
def test_a_command_field_of_any_type_is_answered_and_a_wrong_type_refused(
    name: str, field: str
) -> None:
    declared = COMMAND_FIELDS[name][field]
    for value in VALUES:
        world = World()
        result = _run(world, _with(world.valid(name), field, value))
        if not declared(value):
            assert _refused(result), (name, field, value, result)


@pytest.mark.parametrize("field", list(NEW_JOB_FIELDS))
@pytest.mark.parametrize("atomic", [False, True])
def test_a_job_field_of_any_type_is_answered_and_a_wrong_type_refused(
    field: str, atomic: bool
) -> None:
    declared = NEW_JOB_FIELDS[field]
    for value in VALUES:
        world = World()
        job = make_job()._replace(**{field: value})
        result = _run(world, Enqueue(jobs=(job,), atomic=atomic))
        if not declared(value):
            assert _refused(result), (field, value, result)
        elif isinstance(result, Decision) and isinstance(result.reply, EnqueueResult):
            [entry] = result.reply.results
            assert isinstance(entry, Accepted | Rejection), entry


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
def test_an_enqueue_of_things_that_are_not_jobs_is_refused(value: Any) -> None:
    world = World()
    for jobs in (value, (value,), (make_job(), value), [make_job()]):
        if type(jobs) is tuple and all(type(j) is NewJob for j in jobs):
            continue
        result = _run(world, Enqueue(jobs=jobs))
        assert isinstance(result, CommandError), (jobs, result)


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
def test_a_delay_nack_with_any_delay_is_answered_and_a_wrong_type_refused(value: Any) -> None:
    world = World()
    result = _run(world, Nack(job_id=world.flying_id, attempt=1, retry=RETRY_DELAY, delay_ms=value))
    if type(value) is not int:
        assert isinstance(result, CommandError), (value, result)
    else:
        assert isinstance(result, Decision) == (value >= 0), (value, result)


@pytest.mark.parametrize("value", VALUES, ids=VALUE_IDS)
def test_operator_ids_of_any_type_are_answered(value: Any) -> None:
    for command in (DeadLetterJobs(job_ids=(value,)), RequeueDeadLetters(job_ids=(value,))):
        world = World()
        result = _run(world, command)
        assert isinstance(result, Decision), (command, result)
        assert result.events == ()  # no such job, whatever the value
