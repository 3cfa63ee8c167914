"""The server's counters: exact, counted where events are applied, read at scrape time.

Owns: `ServerMetrics`, plain integers and dicts the live path bumps (no metrics
library on the hot path), `queue_label`, which keeps the `queue` label bounded,
and `RequestMetrics`, the native front's requests by method and outcome with
their durations (kept only while a listener serves /metrics). The admin front (sepp/admin/metrics.py) renders them, with the gauges it reads
from the state, when /metrics is scraped.

Promises:
- Event counters are counted by `observe`, which the engine calls with each
  decided command's events just before it applies them (`Engine.observer`): on
  the live path only, never while recovery replays the log. So a counter equals
  the events of its kind logged since this process started.
- Queue names are user-chosen: the first QUEUE_LABELS_MAX distinct queues seen
  get a label of their own for the life of the process, every later one counts
  under OTHER_QUEUE ("_other"). A name that is not a queue of the state (a refused
  enqueue to an unknown or too long name) is never given a label of its own.
- A request counter equals the requests the native front handled since start
  (every frame that names an op, refused ones included, by their answer's code).

Must not import: a front end, aiohttp, prometheus_client (the service imports it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from sepp.core.commands import Command, Enqueue, Reserve
from sepp.core.decide import Decision
from sepp.core.events import (
    CAUSE_NAMES,
    DeadLetterDrained,
    DeadLetterExpired,
    DedupExpired,
    JobAcked,
    JobDeadLettered,
    JobEnqueued,
    JobLeaseExpired,
    JobNacked,
    JobPromoted,
    JobReserved,
)
from sepp.core.results import Accepted, AtomicRejected, CommandError, EnqueueResult
from sepp.core.state import State
from sepp.storage.histogram import Histogram

# sepp_request_duration_seconds' bucket bounds (s): a request's handling on the
# loop takes microseconds; the slow end catches a loop stalled by something else.
REQUEST_DURATION_BOUNDS = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)

# The outcome of a request answered with status ok (PROTOCOL.md section 4).
OUTCOME_OK = "ok"

# Distinct queues that get a `queue` label of their own; the rest are OTHER_QUEUE.
QUEUE_LABELS_MAX = 100
OTHER_QUEUE = "_other"


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class ServerMetrics:
    """Counters of the live path since start. Loop thread only."""

    def __init__(self, queue_labels_max: int = QUEUE_LABELS_MAX) -> None:
        self.queue_labels_max = queue_labels_max
        self._labels: set[str] = set()
        self.enqueued: dict[str, int] = {}
        self.reserved = 0
        self.acked = 0
        # queue label -> acks (the web console's per-queue ack rate, via /events)
        self.acked_by_queue: dict[str, int] = {}
        self.nacked = 0
        # (queue label, cause name) -> count
        self.dead_lettered: dict[tuple[str, str], int] = {}
        self.deduplicated = 0
        # (queue label, reason) -> count
        self.rejected: dict[tuple[str, str], int] = {}
        self.reserve_empty = 0
        self.promoted = 0
        self.lease_expired = 0
        self.dedup_expired = 0
        self.dead_letters_expired = 0
        self.dead_letters_drained = 0
        # event class name -> count, every event type (bounded by the catalogue)
        self.events: dict[str, int] = {}

        # The native front's request counters (`RequestMetrics`); None when no
        # listener serves /metrics ([admin] and [metrics] listen_addr "off"): then
        # nobody can read them, and the hot path skips them.
        self.requests: RequestMetrics | None = None

    def queue_label(self, queue: str, state: State | None = None) -> str:
        """The bounded label of `queue` (`state`: only a queue it holds gets one)."""
        labels = self._labels
        if queue in labels:
            return queue
        if state is not None and queue not in state.queues:
            return OTHER_QUEUE
        if len(labels) < self.queue_labels_max:
            labels.add(queue)
            return queue
        return OTHER_QUEUE

    # -- the live path ------------------------------------------------------------------

    def observe(self, state: State, events: Sequence[Any]) -> None:
        """One decided command's events, before they are applied (Engine.observer)."""
        counts = self.events
        for event in events:
            kind = type(event)
            name = kind.__name__
            counts[name] = counts.get(name, 0) + 1
            if kind is JobReserved:
                self.reserved += 1
            elif kind is JobAcked:
                self.acked += 1
                acked = state.jobs.get(event.job_id)
                label = OTHER_QUEUE if acked is None else self.queue_label(acked.queue)
                self.acked_by_queue[label] = self.acked_by_queue.get(label, 0) + 1
            elif kind is JobEnqueued:
                label = self.queue_label(event.queue)
                self.enqueued[label] = self.enqueued.get(label, 0) + 1
            elif kind is JobNacked:
                self.nacked += 1
            elif kind is JobDeadLettered:
                job = state.jobs.get(event.job_id)
                label = OTHER_QUEUE if job is None else self.queue_label(job.queue)
                key = (label, CAUSE_NAMES.get(event.cause, "unknown"))
                self.dead_lettered[key] = self.dead_lettered.get(key, 0) + 1
            elif kind is JobPromoted:
                self.promoted += 1
            elif kind is JobLeaseExpired:
                self.lease_expired += 1
            elif kind is DedupExpired:
                self.dedup_expired += 1
            elif kind is DeadLetterExpired:
                self.dead_letters_expired += 1
            elif kind is DeadLetterDrained:
                self.dead_letters_drained += 1

    def count_decision(
        self, state: State, command: Command, decision: Decision | CommandError
    ) -> None:
        """What a command's reply says beyond its events: deduplicated and refused
        enqueues, reserves that found nothing."""
        kind = type(command)
        if kind is Reserve:
            if type(decision) is Decision and not decision.events:
                self.reserve_empty += 1
            return
        if kind is not Enqueue:
            return
        assert isinstance(command, Enqueue)
        if type(decision) is not Decision:
            assert isinstance(decision, CommandError)
            queue = command.jobs[0].queue if command.jobs else ""
            self._rejected(state, queue, decision)
            return
        reply = decision.reply
        if type(reply) is EnqueueResult:
            for job, result in zip(command.jobs, reply.results):
                if type(result) is Accepted:
                    if result.deduplicated:
                        self.deduplicated += 1
                else:
                    self._rejected(state, job.queue, result)
        elif type(reply) is AtomicRejected:
            for index, rejection in reply.failures:
                self._rejected(state, command.jobs[index].queue, rejection)

    def _rejected(self, state: State, queue: str, why: object) -> None:
        # A rejection's protocol reason (payload_too_large...), else the error's
        # class in snake case: bounded by the code either way.
        reason = getattr(type(why), "reason", None)
        if not isinstance(reason, str):
            reason = _snake(type(why).__name__)
        key = (self.queue_label(queue, state), reason)
        self.rejected[key] = self.rejected.get(key, 0) + 1


# sepp_request_duration_seconds times one request in REQUEST_TIMED_EVERY (a power of
# two; every request is counted): timing each one cost ~3 % of the server's CPU
# per drained job (two requests a job) in benchmarks/bench_metrics_overhead.py.
REQUEST_TIMED_EVERY = 8
REQUEST_TIMED_MASK = REQUEST_TIMED_EVERY - 1


class RequestMetrics:
    """sepp_requests_total{method,outcome} and sepp_request_duration_seconds{method}
    of the native front (loop thread only). Every request is counted (`counts`,
    exact); one in REQUEST_TIMED_EVERY of them, in arrival order across the
    process, is also timed (`observe`): the histogram is a sample, so its count is
    the timed requests, not all of them, and its sum over its count the mean
    handling time. `count` / `observe` are on the hot path: dict updates and, for
    a timed request, a bucket (bisect); nothing allocated but the float given.

    `method` is the protocol op (or "unknown": a frame that names no op), bounded
    by the protocol; `outcome` is "ok" or the error code of the answer (PROTOCOL.md
    section 4), bounded by the codes. The duration is the request's handling on
    the loop: from the frame read to its answer decided and handed on -- written,
    queued behind its group commit (that wait is sepp_commit_duration_seconds), or
    a reserve parked (its long poll is not counted)."""

    __slots__ = ("counts", "durations", "refused", "tick")

    def __init__(self) -> None:
        # method -> requests since start (all of them)
        self.counts: dict[str, int] = {}
        # method -> durations (s) of its timed requests (`Histogram.commits`: how many)
        self.durations: dict[str, Histogram] = {}
        # method -> error code -> requests answered with it
        self.refused: dict[str, dict[str, int]] = {}
        # requests seen: the timed ones are those where tick & REQUEST_TIMED_MASK == 0
        self.tick = 0

    def count(self, method: str, outcome: str) -> None:
        """One request of `method` answered with `outcome` (not timed). The
        native front inlines this (ClientConnection._handle_frame)."""
        counts = self.counts
        counts[method] = counts.get(method, 0) + 1
        if outcome != OUTCOME_OK:
            self.refuse(method, outcome)

    def refuse(self, method: str, outcome: str) -> None:
        """A counted request of `method` was answered with the error `outcome`."""
        by_code = self.refused.get(method)
        if by_code is None:
            by_code = self.refused[method] = {}
        by_code[outcome] = by_code.get(outcome, 0) + 1

    def observe(self, method: str, outcome: str, seconds: float) -> None:
        """One timed request: counted, and its duration observed."""
        self.count(method, outcome)
        histogram = self.durations.get(method)
        if histogram is None:
            histogram = self.durations[method] = Histogram(REQUEST_DURATION_BOUNDS)
        histogram.counts[bisect_left(REQUEST_DURATION_BOUNDS, seconds)] += 1
        histogram.commits += 1
        histogram.total += seconds

    def requests(self, method: str) -> int:
        """Requests of `method` since start."""
        return self.counts.get(method, 0)

    def outcomes(self) -> dict[str, dict[str, int]]:
        """method -> outcome -> requests, "ok" included (scrape time)."""
        out: dict[str, dict[str, int]] = {}
        for method, total in self.counts.items():
            refused = self.refused.get(method, {})
            by_outcome = dict(refused)
            ok = total - sum(refused.values())
            if ok:
                by_outcome[OUTCOME_OK] = ok
            out[method] = by_outcome
        return out
