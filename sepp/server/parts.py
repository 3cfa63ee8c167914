"""Large best-effort enqueues, stored in parts (issue 13).

Why: the log is one sequence, written and synced one group commit at a time. A
batch of eight 1 MiB jobs is one 8 MiB record: its write and sync took 15-25 ms
here, and every other client's command that arrived meanwhile waited for it, then
for its own commit (a worker's reserve and ack each waited behind the next such
batch: p99 54 ms with `tools.attack --full --only snapshot-large`). Sent one job
per request the same load gave 26-27 ms.

So a best-effort batch whose jobs carry more than `ENQUEUE_PART_BYTES` is stored
as consecutive parts of at most that many bytes (a job larger than that is a part
of its own): one Enqueue command per part, each run once the part before it is
durable, so every group commit carries at most one part of it and what other
clients sent meanwhile. Best effort already means each job is stored or rejected
on its own; the answer is the same list of results, in request order, sent once
the last part is durable. What a client can tell: other clients' commands may be
applied between two parts of its batch (a worker may reserve its first jobs before
the last ones are stored), and a crash between parts keeps the parts before it (as
two requests would; its answer was never sent). An atomic enqueue, a single job,
a batch over `max_enqueue_batch` (refused whole by the core), and any batch in
cluster mode (records capped at one log message; `SeppService.enqueue_parts`) are
never split.

Owns: `ENQUEUE_PART_BYTES`, `job_bytes`, `split_enqueue` (the parts, or None), and
`EnqueueInParts` (runs them; the service starts one, each front waits for its
`done` callback: the native front holds the connection's later requests until
then, since commands are applied in the order a connection sends them).

Promises: parts run in order, each only after the one before is durable; the
first part is admitted like any command (it may raise Overloaded, ShuttingDown,
StorageFailed) and the rest are not refused for a full backlog (the request was
admitted); `done(error, outcome)` is called exactly once, on the loop thread,
after the last part (or the part that failed) is durable. A part refused as a
whole, a storage failure or a stop between parts ends it: the outcome (a
CommandError) or the error says how many of the batch's jobs were stored.

Must not import: any front end, the wire translation, a transport library.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from sepp.core.commands import Enqueue, NewJob
from sepp.core.decide import NOTHING_WOKEN, Decision
from sepp.core.results import CommandError, EnqueueResult

# A best-effort batch whose jobs carry more bytes than this is stored in parts of
# at most this many bytes each (a larger job is a part of its own).
ENQUEUE_PART_BYTES = 1 << 20
# What a job costs in its record besides the payload and the strings counted.
JOB_RECORD_OVERHEAD = 96


def job_bytes(job: NewJob) -> int:
    """About what `job` adds to an enqueue record: its payload, trace context and
    idempotency key, and a fixed overhead (its custom map is bounded by
    max_custom_bytes and not counted)."""
    return batch_bytes((job,))


def batch_bytes(jobs: tuple[NewJob, ...]) -> int:
    """The sum of `job_bytes` over `jobs`, in one loop (every batch enqueue pays it,
    so no call per job)."""
    total = JOB_RECORD_OVERHEAD * len(jobs)
    for job in jobs:
        total += (
            len(job.payload_data or b"")
            + len(job.traceparent or "")
            + len(job.tracestate or "")
            + len(job.idempotency_key or "")
        )
    return total


def split_enqueue(
    jobs: tuple[NewJob, ...], max_batch: int, part_bytes: int = ENQUEUE_PART_BYTES
) -> list[tuple[NewJob, ...]] | None:
    """The parts a best-effort enqueue of `jobs` is stored in, in order, or None when
    it is stored whole: one job, more than `max_batch` (the core refuses the
    request whole), or every job within `part_bytes` together."""
    if len(jobs) < 2 or len(jobs) > max_batch or part_bytes <= 0:
        return None
    if batch_bytes(jobs) <= part_bytes:
        return None  # every enqueue but the large ones
    sizes = [job_bytes(job) for job in jobs]
    parts: list[tuple[NewJob, ...]] = []
    start = total = 0
    for index, size in enumerate(sizes):
        if index > start and total + size > part_bytes:
            parts.append(jobs[start:index])
            start, total = index, 0
        total += size
    parts.append(jobs[start:])
    return parts if len(parts) > 1 else None


class PartRunner(Protocol):
    """What `EnqueueInParts` needs of the service."""

    def run(self, command: Any, admitted: bool = False) -> tuple[Decision | CommandError, int]: ...

    def after_durable(self, barrier: int, callback: Callable[..., None], *args: Any) -> None: ...

    def parts_may_continue(self) -> BaseException | None: ...

    def parts_ended(self, parted: EnqueueInParts) -> None: ...


def _noted(error: BaseException, note: str) -> BaseException:
    """A copy of `error` whose message ends with `note`. A copy: the pipeline fails
    every waiter with one exception object, whose message the others keep."""
    try:
        noted = copy.copy(error)
    except Exception:  # an exception type that cannot be rebuilt from its args
        return error
    noted.args = (f"{error} ({note})",)
    return noted


# done(error, outcome): error None and outcome the combined Decision (or a
# CommandError), or error the exception that ended it.
PartsDone = Callable[[BaseException | None, Decision | CommandError | None], None]


class EnqueueInParts:
    """One best-effort enqueue, run part by part (see the module docstring)."""

    __slots__ = ("_service", "_parts", "_done", "_index", "_results", "_stored", "_time_ms")

    def __init__(
        self, service: PartRunner, parts: list[tuple[NewJob, ...]], done: PartsDone
    ) -> None:
        self._service = service
        self._parts = parts
        self._done = done
        self._index = 0
        self._results: list[Any] = []
        self._stored: list[str] = []  # ids of the jobs of parts already run
        self._time_ms = 0

    @property
    def total(self) -> int:
        return sum(len(part) for part in self._parts)

    def start(self) -> None:
        """Run the first part (raises what the service's `run` raises: nothing has
        been done then)."""
        self._run(admitted=False)

    def _run(self, admitted: bool) -> None:
        part = self._parts[self._index]
        decision, barrier = self._service.run(Enqueue(jobs=part, atomic=False), admitted)
        if type(decision) is not Decision:
            self._service.after_durable(barrier, self._refused, decision)
            return
        reply = decision.reply
        assert isinstance(reply, EnqueueResult)
        self._results.extend(reply.results)
        self._time_ms = decision.time_ms
        self._service.after_durable(barrier, self._durable, part)

    def _durable(self, error: BaseException | None, part: tuple[NewJob, ...]) -> None:
        if error is not None:
            # This part's record may or may not be on disk.
            self._finish(_noted(error, self._stored_note(unknown=len(part))), None)
            return
        self._stored.extend(job.job_id for job in part)
        self._index += 1
        if self._index == len(self._parts):
            combined = EnqueueResult(tuple(self._results))
            self._finish(None, Decision((), self._time_ms, combined, NOTHING_WOKEN))
            return
        stop = self._service.parts_may_continue()
        if stop is not None:
            self._finish(_noted(stop, self._stored_note()), None)
            return
        try:
            self._run(admitted=True)
        except Exception as exc:  # StorageFailed: the front maps it
            self._finish(_noted(exc, self._stored_note()), None)

    def _refused(self, error: BaseException | None, decision: CommandError) -> None:
        if error is None and self._stored:
            message = f"{decision.message} ({self._stored_note()})"
            decision = dataclasses.replace(decision, message=message)
        self._finish(error, decision)

    def _stored_note(self, unknown: int = 0) -> str:
        """What became of the batch's jobs: the first ones stored (by id), then
        `unknown` whose outcome is unknown, the rest not stored."""
        stored, total = self._stored, self.total
        said = (
            f"the batch's first {len(stored)} of {total} jobs were stored ({', '.join(stored)})"
            if stored
            else f"none of the batch's {total} jobs is known to be stored"
        )
        if unknown:
            said += f"; the outcome of the next {unknown} is unknown"
        if len(stored) + unknown < total:
            said += "; the rest were not stored"
        return said

    def _finish(self, error: BaseException | None, outcome: Decision | CommandError | None) -> None:
        self._service.parts_ended(self)
        self._done(error, outcome)
