"""sepp's pure state machine: `decide(state, command, now_ms)` and `apply`.

No I/O, no clock, no randomness, no asyncio: time and ids come in as arguments,
and every decision is written into events so that replaying the log rebuilds the
state exactly. See ARCHITECTURE.md ("Time, ids and randomness are inputs").
"""

from sepp.core.apply import ApplyError, apply, apply_record
from sepp.core.commands import (
    RETRY_DEAD_LETTER,
    RETRY_DEFAULT,
    RETRY_DELAY,
    Ack,
    Command,
    DeadLetterJobs,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Nack,
    NewJob,
    Release,
    RequeueDeadLetters,
    Reserve,
    Sweep,
)
from sepp.core.config import ConfigError, CoreConfig, Limits, QueuePolicy, validate_config
from sepp.core.decide import Decision, canonical_job_id, decide, retry_delay_ms
from sepp.core.events import EVENT_CLASSES, Event, EventDecodeError, from_fields, to_fields
from sepp.core.invariants import InvariantViolation, check_invariants
from sepp.core.state import State

__all__ = [
    "EVENT_CLASSES",
    "RETRY_DEAD_LETTER",
    "RETRY_DEFAULT",
    "RETRY_DELAY",
    "Ack",
    "ApplyError",
    "Command",
    "ConfigError",
    "CoreConfig",
    "DeadLetterJobs",
    "Decision",
    "DrainDeadLetters",
    "Enqueue",
    "Event",
    "EventDecodeError",
    "Extend",
    "InvariantViolation",
    "Limits",
    "Nack",
    "NewJob",
    "QueuePolicy",
    "Release",
    "RequeueDeadLetters",
    "Reserve",
    "State",
    "Sweep",
    "apply",
    "apply_record",
    "canonical_job_id",
    "check_invariants",
    "decide",
    "from_fields",
    "retry_delay_ms",
    "to_fields",
    "validate_config",
]
