"""The crash harness: kills a real `sepp serve` process with SIGKILL over and over
and checks, after every restart, that it kept its promises.

    python -m tools.crash --crashes N [--seed S] [--fast] [--no-points]
                          [--no-fuzz] [--no-disk-faults] [--workdir DIR] [--verbose]

Prints crashes survived, operations checked, violations and the seed; exits 1 on
any violation (data and server log kept for the post-mortem).

Owns: the harness (`run_harness`, `HarnessOptions`, `Report`), its client-side
ledger (`Ledger`) and its checks. What it does, per cycle:

1. start `python -m sepp.server.cli serve --listen 127.0.0.1:0 --data-dir DIR`
   with seeded storage settings (persist mode, tiny segments, frequent snapshots,
   one or two snapshots kept, a short retry delay, dead letters kept a day);
2. after a restart, probe it: per-queue totals (`queue_stats`) and every
   idempotency key known to be durable (re-enqueued: must deduplicate to the same
   job id);
3. drive a seeded mixed workload from several client connections (`SeppClient`):
   single, batch and atomic enqueues, with and without idempotency keys and
   schedules; reserves; acks; nacks of every kind; extends; releases; leases left to
   expire; stale acks (fencing); (unless `--no-admin`) an operator calling the
   native admin methods (issue 15) one at a time, each with a reason: cancel and
   dead-letter jobs by id, requeue and delete dead letters by id, pause and resume
   the workers' queues, fill and purge a queue of its own (PURGE_QUEUE); and
   (unless `--no-fuzz`) a hostile connection sending junk frames, huge lengths,
   wrong types and half-closes alongside;
4. end the cycle with SIGKILL at a random moment, once the cycle's workload has
   had at least `CYCLE_OPERATIONS_MIN` operations checked — or (unless `--no-points`) let
   the server kill itself at a storage hook point (`SEPP_FAULT_CRASH_AT`, see
   `sepp/server/faults.py`): between write and sync, mid-rotation, mid-snapshot
   publication, mid-retention — or, now and then, with a graceful SIGTERM;
5. sometimes damage the stopped directory the way a crash can: a torn last write
   (a partial record or zeros appended to the last segment: recovery must cut it),
   or a flipped bit in a sealed segment (the server must refuse to start, naming
   the file and offset `sepp-log verify` names; repaired, it must start -- unless
   verify calls it damaged history, wholly below the snapshot recovery starts
   from: then the server must start and log it);
6. check the stopped directory offline: `tools.verify.verify` must find no error
   (so every snapshot, an image of the live state, equals the replay of the log
   at its seq), and `tools.replay.replay_to` gives S, the state recovery will
   rebuild. The ledger is checked against S (below) and then re-based on it.

The ledger records every request and its outcome: *acknowledged* (an answer
came), *refused* (an error answer: rejections never touch state) or *in doubt*
(no answer: the process died, or `internal`). In-doubt operations may or may not
have happened; S decides, and the ledger adopts what S says. Checks, each exact
unless said otherwise (`S` = the recovered state, `t` = the server's decision time
of a delivery, read exactly from its lease: lease_expires_at - lease_ms):

1. no acknowledged job is lost: every acknowledged enqueue is in S (ready,
   scheduled, in flight or dead-lettered) unless the ledger shows it acked (an
   in-doubt ack allows either); per-queue totals after the restart equal S's;
2. no acknowledged ack is undone: an acked job is never in S and never delivered
   again, and a second ack of it never succeeds;
3. attempts never go backwards and never exceed max_attempts: each delivery's
   attempt is exactly the one the ledger (or S) predicts, above every attempt
   seen before; S's attempt is at least the last one delivered (one more if the
   job was nacked back);
4. an acknowledged idempotency key is in S with the same job id, and after the
   restart re-enqueueing it deduplicates to that id;
5. leases are honoured: a job in flight in S under an acknowledged lease has
   exactly that deadline (or that of an in-doubt extend, within its send/loss
   window); a lease that ended before the crash had a deadline no later than the
   kill; no delivery comes before the deadline, schedule or retry delay that
   holds the job back (a lower bound from the client's wall clock taken before
   sending: the server's clock is the same clock and never runs behind it); the
   next delivery after a lapsed lease carries the attempt raised by one; an ack
   or extend refused (fenced) although its answer came before the lease's
   deadline is a violation; a nack's dead_lettered flag is exactly what the
   directive and max_attempts imply;
6. atomic batches are all-or-nothing across the crash: of an in-doubt atomic
   batch either every job shows up (in S or delivered) or none;
7. `sepp-log verify` passes on every crashed directory and the restarted server
   starts; after a graceful stop its final snapshot equals the replay of its log;
8. admin mutations: every per-id outcome is possible given what the ledger knew
   when it sent the call (done is a violation for a job finished before, for a
   cancel / dead-letter of a dead letter or of a job leased for sure past the
   answer with no worker acting on it; not_found for a job or dead letter that
   existed for sure); done applies it: a cancelled, deleted or purged job is gone
   like an acknowledged ack (never delivered or recovered again), a dead-lettered
   one is a dead letter the drain must return, a requeued one is Ready at attempt
   1 -- the one time an attempt may go back, allowed only then (also when the
   requeue's answer is read after that delivery, or the requeue was in doubt and
   S or a delivery shows it applied); a purge of PURGE_QUEUE deletes exactly the
   jobs the ledger holds there; no delivery from a queue after its acknowledged
   pause (decided after the answer came) until a resume is sent, and an
   acknowledged pause or resume survives the crash (S's queue table);
9. schedules (issue 17): SCHEDULE_NAME ([[schedules]] in the environment of every
   start, every_ms = TICK_EVERY_MS, catch_up = "all") fires into TICK_QUEUE,
   which the workers serve like the others; each tick's job is a job of the
   ledger (tag `tick-<tick_ms>`, key `schedule:<name>:<tick_ms>`, known from its
   first delivery or from S), so every check above holds for it too (an acked
   tick back in S or delivered again is a tick fired twice). After each crash,
   S's schedule keeps its anchor, its next tick N never goes back and lies past
   every delivered tick, no job of S is at or after N, the same tick is never
   two jobs, and every tick from the anchor up to N is known to the ledger
   (delivered, or in S): none lost. A delivered tick is on the grid and not
   before its time. At the end, a tick at least as new as the last start must
   be delivered (the missed ones caught up), and the final state is checked
   like a crash's;
10. per-queue max_in_flight (issue 17): CAP_QUEUE is capped at CAP_MAX_IN_FLIGHT.
   A lease is in flight for sure from its decision time until its deadline
   (moved by acknowledged extends) or until the first call that may end it
   (ack, nack, release, an admin call by id) was sent (`CapLease`); carried over
   a restart when in flight in S. No more than the cap may be in flight for sure
   at any decision time: checked at each delivery with what is known then, and
   for the whole lifetime at the crash check (deliveries are read out of order
   on different connections: see `Returning`).

At the end every job the ledger holds must be delivered and acked (or drained as
a dead letter) by a final worker: liveness after leases lapse, with the exact
attempt. One-sided by nature: in-doubt operations (resolved by S, never guessed),
the window of an in-doubt extend, and the liveness deadline of the final drain.

The seed fixes every choice the harness makes (workload, timings asked for, kill
moments, faults); the server's own thread and network timing is not seeded, so a
rerun with the same seed replays the same plan but not necessarily the same
interleaving (that is what `tools.sim`, fully deterministic, is for). Every
report prints `SEPP_SEED=<seed> python -m tools.crash ...` to rerun it.

Layering: `tools/` normally imports only log_format, sepp.core and sepp.storage.
This module (and only `tools/crash*`) may also import `sepp.client` and
`sepp.protocol`: the harness is a client. It never imports `sepp.server` (the
server runs as a separate process). tests/test_layering.py holds the exception.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    FormatError,
    decode_segment_header,
    encode_record,
    parse_segment_file_name,
)
from log_format._compiled import build_name
from sepp.client import (
    AttemptMismatchError,
    BatchValidationError,
    ConnectError,
    EnqueueAck,
    EnqueueRequest,
    InvalidRequestError,
    Job,
    JobCtx,
    JobNotFoundError,
    JobRejectedError,
    OverloadedError,
    Payload,
    PermissionDeniedError,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    SeppError,
    TransportError,
    UnauthenticatedError,
)
from sepp.core import QueuePolicy
from sepp.core.state import IN_FLIGHT, SCHEDULED, State
from sepp.protocol import messages as pm
from sepp.protocol.framing import encode_frame
from sepp.storage import HOOK_POINTS

from .datadir import ERROR, open_data_dir
from .refmodel import policy_delay
from .replay import replay_to
from .verify import verify

__all__ = ["HarnessOptions", "Ledger", "Report", "main", "run_harness"]

# Issue 17's per-queue limit: the server caps CAP_QUEUE at CAP_MAX_IN_FLIGHT jobs
# leased at once (BASE_ENV); producers and workers use it like the others, and the
# ledger checks that no delivery ever made more of its leases certain at once.
CAP_QUEUE = "ccap"
CAP_MAX_IN_FLIGHT = 3
QUEUES = ("cq0", "cq1", "cq2", CAP_QUEUE)
# The operator's own queue: only it enqueues there and no worker reserves from it,
# so the ledger knows exactly which jobs a purge of it must delete.
PURGE_QUEUE = "cpurge"
ALL_QUEUES = (*QUEUES, PURGE_QUEUE)
# Issue 17's schedules: SCHEDULE_NAME ([[schedules]] in BASE_ENV, put again at
# every start: unchanged, so it keeps its anchor) fires a job into TICK_QUEUE every
# TICK_EVERY_MS with catch_up = "all". Nobody else enqueues there; the workers
# reserve from it like from QUEUES. The ledger knows each tick's job by its tick
# (custom `schedule_tick_ms`, tag `tick_tag`): every tick from the anchor up to
# the schedule's next tick in the recovered state fired exactly once.
SCHEDULE_NAME = "cbeat"
TICK_QUEUE = "ctick"
TICK_EVERY_MS = 1_000
TICK_MAX_ATTEMPTS = 4
WORKER_QUEUES = (*QUEUES, TICK_QUEUE)
DEFAULT_MAX_ATTEMPTS = 3
# The retry policy the server is configured with (env below): the harness
# predicts every default nack's delay exactly with the reference model's formula.
RETRY_POLICY = QueuePolicy(retry_delay_ms=40, retry_backoff="exponential", retry_delay_max_ms=400)
BASE_ENV = {
    # No admin listener: its default port (9465) is one per machine.
    "SEPP_ADMIN__LISTEN_ADDR": "off",
    "SEPP_LIMITS__RETRY_DELAY_MS": str(RETRY_POLICY.retry_delay_ms),
    "SEPP_LIMITS__RETRY_BACKOFF": RETRY_POLICY.retry_backoff,
    "SEPP_LIMITS__RETRY_DELAY_MAX_MS": str(RETRY_POLICY.retry_delay_max_ms),
    "SEPP_LIMITS__DEFAULT_MAX_ATTEMPTS": str(DEFAULT_MAX_ATTEMPTS),
    # Dead letters are kept (a day) so that every job stays accounted for.
    "SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "86400000",
    "SEPP_LOGGING__LEVEL": "info",
    "SEPP_QUEUES": f'[{{name = "{CAP_QUEUE}", max_in_flight = {CAP_MAX_IN_FLIGHT}}}]',
    "SEPP_SCHEDULES": (
        f'[{{name = "{SCHEDULE_NAME}", queue = "{TICK_QUEUE}", job_type = "tick", '
        f'every_ms = {TICK_EVERY_MS}, catch_up = "all", max_attempts = {TICK_MAX_ATTEMPTS}, '
        'payload = "tick", encoding = "text/plain"}]'
    ),
}
START_TIMEOUT_S = 30.0
# Producers pause while the ledger holds more unfinished jobs than this.
BACKLOG_MAX = 600
# Cycles between mid-run drains of every dead letter (Harness.drain_dead_letters).
DRAIN_EVERY = 20
RPC_TIMEOUT = timedelta(seconds=15)
# A cycle the harness ends itself (SIGKILL or SIGTERM) ends only after its
# workload has had at least this many operations checked, however slow the
# machine: a crash that lands before any work would check nothing. The tests
# assert this floor, which the harness guarantees, not a speed it happened to reach.
CYCLE_OPERATIONS_MIN = 100
# A server that answers none of the workload for this long is stuck: a violation.
CYCLE_STALL_S = 60.0


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def to_ms(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


# ---------------------------------------------------------------- options and report


@dataclass
class HarnessOptions:
    crashes: int = 20
    seed: int = 0
    fast: bool = False
    points: bool = True  # mix in self-inflicted crashes at storage hook points
    fuzz: bool = True  # a hostile connection alongside the workload
    admin: bool = True  # an operator alongside: admin mutations by id, pause, purge
    disk_faults: bool = True  # torn tails and flipped bits between cycles
    final: bool = True  # end with the drain-everything phase and a graceful stop
    drain_every: int = DRAIN_EVERY  # cycles between mid-run dead-letter drains (0: never)
    # Every cycle a crash at these hook points, in turn (tests of each point).
    only_points: tuple[str, ...] = ()
    workdir: str | None = None
    keep: bool = False
    verbose: bool = False
    python: str = sys.executable


@dataclass
class Report:
    seed: int
    crashes: int = 0
    restarts: int = 0
    operations: int = 0
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    workdir: str = ""

    def summary(self, command: str) -> str:
        lines = [
            f"sepp crash: {self.crashes} crashes survived, {self.restarts} restarts, "
            f"{self.operations} operations checked ({self.checks} checks), "
            f"{len(self.violations)} violations in {self.elapsed_s:.1f}s",
            f"  seed: SEPP_SEED={self.seed} (rerun: SEPP_SEED={self.seed} {command})",
            "  coverage: " + ", ".join(f"{k}={v}" for k, v in sorted(self.stats.items())),
        ]
        lines.extend(f"VIOLATION: {v}" for v in self.violations[:30])
        if self.violations:
            lines.append(f"  data and server logs kept in {self.workdir}")
        return "\n".join(lines)


# ---------------------------------------------------------------- the ledger


@dataclass
class Returning:
    """A release or nack of one lease, sent and not yet answered. Its answer and
    the delivery it makes possible travel on different connections: a worker of
    another connection can read the job's next delivery first (both answers are
    released by the same group commit). Such a delivery proves the release / nack
    was applied, so the ledger applies it then (`Ledger.delivered`); the answer,
    read later, must then be a success."""

    choice: str  # "release" / "nack" / "nack_delay"
    attempt: int  # the lease it returns
    sent: int
    delay: int  # a nack's retry delay (ms)
    applied_by: str = ""  # the delivery that proved it applied ("" while none has)
    # Before applying it: next_min_t, so a nack later fenced off (never applied)
    # can still be checked against the lease the delivery had to wait for.
    floor_before: int = 0
    delivered_at: int = 0


@dataclass
class CapLease:
    """A lease of a CAP_QUEUE job, as the client knows it: the job was in flight
    at `attempt` for sure from `start` (the server's decision time, exact) until
    `end()`: its deadline (`until`, moved by acknowledged extends), or the moment
    the first call that may end it (ack, nack, release, an admin call by id) was
    sent, whichever comes first. The server cannot have ended it sooner: its clock
    is the client's, a lease lapses at its deadline at the earliest, and every
    other end is a call applied after it was sent. Carried over a restart (in
    flight in the recovered state), it starts at the kill time instead."""

    tag: str
    attempt: int
    start: int
    until: int
    ended: int = 0  # when the first call that may end it was sent (0: none yet)

    def end(self) -> int:
        return min(self.until, self.ended) if self.ended else self.until


def leased_at_once(leases: list[CapLease]) -> tuple[int, int]:
    """The most leases that were in flight for sure at one moment, and that
    moment: at a lease's start, every lease with start <= it < end. Both ends are
    sound (see CapLease), so a count above the cap is the server's doing."""
    most, moment = 0, 0
    ends: list[int] = []
    ordered = sorted(leases, key=lambda lease: lease.start)
    i = 0
    while i < len(ordered):
        start = ordered[i].start
        while i < len(ordered) and ordered[i].start == start:
            heapq.heappush(ends, ordered[i].end())
            i += 1
        while ends and ends[0] <= start:
            heapq.heappop(ends)
        if len(ends) > most:
            most, moment = len(ends), start
    return most, moment


def tick_tag(tick: int) -> str:
    """The ledger's tag of SCHEDULE_NAME's job for `tick` (its payload is the same
    for every tick)."""
    return f"tick-{tick}"


def _tick_of(queue: str, custom: Any) -> int | None:
    """The tick of a job SCHEDULE_NAME fired (None for any other job)."""
    if queue != TICK_QUEUE or not custom or custom.get("schedule") != SCHEDULE_NAME:
        return None
    tick = custom.get("schedule_tick_ms")
    return tick if type(tick) is int else None


@dataclass
class AdminPending:
    """An admin mutation of one job by id (cancel, dead_letter, requeue, delete),
    sent and not yet answered, with what the ledger knew of the job when it was
    sent. A requeue's answer and the delivery it makes possible travel on different
    connections (like a release's, see `Returning`): a delivery at attempt 1 of a
    job known dead proves the requeue applied, so the ledger applies it then."""

    action: str
    sent: int
    gone: bool  # finished for sure (acked, cancelled, deleted, drained, never enqueued)
    dead: bool  # a dead letter for sure
    exists: bool  # a job or a dead letter for sure, and no worker acting on it
    quiet: bool  # no worker op on it in flight when sent
    acts: int  # its worker op count when sent
    applied_by: str = ""  # the delivery that proved a requeue applied


@dataclass
class JobRec:
    """What the client side knows of one job it asked to enqueue."""

    tag: str
    queue: str
    op: int
    atomic: bool
    key: str | None
    max_attempts: int
    scheduled_at: int | None
    job_id: str | None = None
    enq: str = "doubt"  # "ok" acknowledged / "doubt" / "no" (never happened)
    acked: str = "no"  # "no" / "ok" / "doubt"
    dead: str = "no"  # "no" / "ok" / "maybe"
    seen: bool = False  # evidence that it exists or existed
    last_attempt: int = 0  # the highest attempt known delivered
    next_attempt: int | None = 1  # exactly what the next delivery must carry
    next_min_t: int = 0  # no delivery before this server time
    returned: bool = False  # an acknowledged nack took last_attempt back
    lease_attempt: int = 0
    lease_deadline: int = 0  # the acknowledged deadline of that lease
    lease_until: int = 0  # in flight at lease_attempt until then, for sure (0: no)
    extend_doubt: list[tuple[int, int]] = field(default_factory=list)  # (lo, hi) deadlines
    returning: Returning | None = None  # a release / nack of the lease awaiting its answer
    acting: int = 0  # worker ops on it in flight (ack, nack, extend, release, ...)
    acts: int = 0  # worker ops on it ever started
    removed: str = ""  # the admin action that deleted it (cancel, delete, purge)
    admin: AdminPending | None = None  # an admin mutation of it awaiting its answer
    requeue_doubt: int = 0  # sent time of an in-doubt requeue of it (0: none)
    cap_lease: CapLease | None = None  # its current lease, in CAP_QUEUE


class Ledger:
    def __init__(self, report: Report) -> None:
        self.report = report
        self.jobs: dict[str, JobRec] = {}
        self.by_id: dict[str, JobRec] = {}
        # Tags of jobs not finished for sure (finished: an ack the recovered state
        # confirmed, or an enqueue that never happened): what a crash re-checks.
        self.active: set[str] = set()
        # Atomic batches since the last crash check.
        self.atomic_ops: dict[int, list[JobRec]] = {}
        # Jobs whose idempotency key is durable, and those acknowledged since the
        # last crash check (all of which that check covers; older ones by sample).
        self.durable_keys: list[JobRec] = []
        self.fresh_keys: list[JobRec] = []
        self._backlog = 0
        self._backlog_at = 0.0
        self.next_op = 0
        # Per queue: "no" / "ok" (an acknowledged pause, no resume sent since) /
        # "pausing" / "resuming" (sent, not answered) / "maybe" (in doubt).
        self.paused: dict[str, str] = dict.fromkeys(ALL_QUEUES, "no")
        # When the acknowledged pause was answered: any delivery the server decided
        # later (t > this) from that queue is a violation (0: since the restart).
        self.paused_at: dict[str, int] = dict.fromkeys(ALL_QUEUES, 0)
        # SCHEDULE_NAME: its anchor (first tick) and next tick in the last
        # recovered state (None / 0 until one holds it), every tick the ledger
        # knows a job of (delivered, or in a recovered state), the newest delivered.
        self.anchor: int | None = None
        self.schedule_next = 0
        self.ticks: set[int] = set()
        self.tick_delivered_max = 0
        # CAP_QUEUE's leases of this server lifetime (and those carried over it).
        self.cap_leases: list[CapLease] = []

    def violation(self, text: str) -> None:
        self.report.violations.append(text)

    def check(self, ok: bool, text: str) -> None:
        self.report.checks += 1
        if not ok:
            self.violation(text)

    def op_id(self) -> int:
        self.next_op += 1
        return self.next_op

    def outcome(self) -> None:
        """One operation whose outcome (answered, or in doubt) the ledger checks."""
        self.report.operations += 1

    def add(self, rec: JobRec) -> None:
        self.jobs[rec.tag] = rec
        if rec.enq != "no":
            self.active.add(rec.tag)

    def backlog(self) -> int:
        """Jobs still to be worked (not acked, not dead), recounted every 50 ms."""
        now = time.monotonic()
        if now - self._backlog_at > 0.05:
            jobs = self.jobs
            self._backlog = sum(
                1 for tag in self.active if jobs[tag].acked != "ok" and jobs[tag].dead != "ok"
            )
            self._backlog_at = now
        return self._backlog

    def key_durable(self, rec: JobRec) -> None:
        if rec.key is not None:
            self.durable_keys.append(rec)
            self.fresh_keys.append(rec)

    def learn_id(self, rec: JobRec, job_id: str) -> None:
        if rec.job_id is not None and rec.job_id != job_id:
            self.violation(f"{rec.tag}: job id changed from {rec.job_id} to {job_id}")
        rec.job_id = job_id
        other = self.by_id.get(job_id)
        if other is not None and other is not rec:
            self.violation(f"job id {job_id} given to both {other.tag} and {rec.tag}")
        self.by_id[job_id] = rec

    # -- deliveries ------------------------------------------------------------

    def delivered(self, job: Job, lease_ms: int) -> JobRec | None:
        ctx = job.ctx
        deadline = to_ms(ctx.lease_expires_at)
        t = deadline - lease_ms
        tick = _tick_of(ctx.queue, ctx.custom)
        if tick is not None:
            tag = tick_tag(tick)
            self.check(tick <= t, f"{tag} ({ctx.id}): delivered at {t}, before its tick")
            self.tick_delivered_max = max(self.tick_delivered_max, tick)
            if tag not in self.jobs:
                self._tick_known(tick, f"delivered ({ctx.id})")
                fired = self._tick_rec(tick, "ok")
                self.add(fired)
                self.key_durable(fired)  # delivered: its enqueue (and key) is durable
                self.report.stats["schedule_ticks_first_seen_delivered"] += 1
        else:
            tag = job.payload.data.decode() if job.payload is not None else "?"
        rec = self.jobs.get(tag)
        if rec is None:
            self.violation(f"delivered a job nobody enqueued: {ctx.id} payload {tag!r}")
            return None
        a = ctx.attempt
        where = f"{tag} ({ctx.id}) attempt {a} at {t}"
        self._requeued_by_delivery(rec, a, where)
        self._returned_by_delivery(rec, a, t, where)
        self.check(
            self.paused.get(ctx.queue) != "ok" or t <= self.paused_at.get(ctx.queue, 0),
            f"{where}: delivered from queue {ctx.queue}, paused (acknowledged at "
            f"{self.paused_at.get(ctx.queue, 0) or 'the restart'}) and not resumed",
        )
        self.check(rec.enq != "no", f"{where}: delivered, but its enqueue never happened")
        self.check(
            rec.acked != "ok",
            f"{where}: delivered again after an acknowledged {rec.removed or 'ack'}",
        )
        self.check(rec.dead != "ok", f"{where}: delivered after it was dead-lettered")
        self.check(rec.dead != "drained", f"{where}: delivered after its dead letter was drained")
        self.check(
            ctx.max_attempts == rec.max_attempts,
            f"{where}: max_attempts {ctx.max_attempts}, enqueued with {rec.max_attempts}",
        )
        self.check(1 <= a <= rec.max_attempts, f"{where}: attempt above max_attempts")
        self.check(a > rec.last_attempt, f"{where}: attempt not above {rec.last_attempt}")
        if rec.next_attempt is not None:
            self.check(a == rec.next_attempt, f"{where}: expected attempt {rec.next_attempt}")
        self.check(
            t >= rec.next_min_t,
            f"{where}: delivered {rec.next_min_t - t} ms before its lease, schedule or "
            f"retry delay allowed ({rec.next_min_t})",
        )
        self.learn_id(rec, ctx.id)
        rec.seen = True
        if rec.acked == "doubt":
            rec.acked = "no"  # that ack did not happen
        rec.dead = "no" if rec.dead == "maybe" else rec.dead
        rec.last_attempt = a
        rec.next_attempt = a + 1
        rec.next_min_t = deadline
        rec.returned = False
        rec.lease_attempt = a
        rec.lease_until = rec.lease_deadline = deadline
        rec.extend_doubt = []
        if ctx.queue == CAP_QUEUE:
            self._cap_delivered(rec, CapLease(tag, a, t, deadline), where)
        return rec

    # -- CAP_QUEUE's max_in_flight (issue 17) ---------------------------------------

    def _cap_delivered(self, rec: JobRec, lease: CapLease, where: str) -> None:
        """A delivery from CAP_QUEUE: with every lease known now, no more than the
        cap may have been in flight for sure at its decision time. (Deliveries read
        out of order on other connections are counted by `check_cap` later.)"""
        rec.cap_lease = lease
        self.cap_leases.append(lease)
        t = lease.start
        at_once = sum(1 for other in self.cap_leases if other.start <= t < other.end())
        self.check(
            at_once <= CAP_MAX_IN_FLIGHT,
            f"{where}: {at_once} jobs of {CAP_QUEUE} leased at once, max_in_flight is "
            f"{CAP_MAX_IN_FLIGHT}",
        )
        self.report.stats["cap_deliveries"] += 1
        self.report.stats["cap_deliveries_at_the_cap"] += at_once == CAP_MAX_IN_FLIGHT

    def ending(self, rec: JobRec, sent: int) -> None:
        """A call that may end the job's lease (ack, nack, release, an admin call by
        id) is about to be sent at `sent`: its CAP_QUEUE lease is certain only
        until then."""
        lease = rec.cap_lease
        if lease is not None and not lease.ended:
            lease.ended = sent

    def extended(self, rec: JobRec, attempt: int, expiry: int) -> None:
        """An acknowledged extend of `attempt` to `expiry`: applied while that lease
        was in flight (else it would have been fenced off), so in flight until then."""
        lease = rec.cap_lease
        if lease is not None and lease.attempt == attempt:
            lease.until = max(lease.until, expiry)

    def check_cap(self, what: str) -> None:
        """The whole lifetime's CAP_QUEUE leases, every answer read: never more than
        the cap in flight for sure at once."""
        most, moment = leased_at_once(self.cap_leases)
        self.check(
            most <= CAP_MAX_IN_FLIGHT,
            f"{what}: {most} jobs of {CAP_QUEUE} leased at once at {moment}, max_in_flight "
            f"is {CAP_MAX_IN_FLIGHT}: "
            + ", ".join(
                f"{x.tag} attempt {x.attempt} [{x.start}, {x.end()})"
                for x in self.cap_leases
                if x.start <= moment < x.end()
            ),
        )

    # -- SCHEDULE_NAME's ticks (issue 17) ---------------------------------------------

    def _tick_rec(self, tick: int, enq: str) -> JobRec:
        return JobRec(
            tag=tick_tag(tick),
            queue=TICK_QUEUE,
            op=0,
            atomic=False,
            key=f"schedule:{SCHEDULE_NAME}:{tick}",
            max_attempts=TICK_MAX_ATTEMPTS,
            scheduled_at=None,
            enq=enq,
        )

    def _tick_known(self, tick: int, how: str) -> None:
        """A job of `tick` seen for the first time: on the schedule's grid, from
        its anchor, and below its next tick (when known)."""
        self.ticks.add(tick)
        if self.anchor is not None:
            self.check(
                tick >= self.anchor and (tick - self.anchor) % TICK_EVERY_MS == 0,
                f"{tick_tag(tick)}: {how}, not a tick of {SCHEDULE_NAME} (anchor "
                f"{self.anchor}, every {TICK_EVERY_MS} ms)",
            )

    def in_doubt(
        self,
        rec: JobRec,
        choice: str,
        *,
        sent: int,
        now: int,
        lease_ms: int,
        nack_delay: int,
        nack_kills: bool,
    ) -> None:
        """An ack / nack / extend sent at `sent` whose answer was lost: what it may
        have done, for the next crash check to decide. A job already finished for
        sure (not active: its ack confirmed, or its dead letter drained while a
        worker still held it) is left alone: the server can only have refused it."""
        if rec.tag not in self.active:
            return
        if choice == "ack" and rec.acked != "ok":
            rec.acked = "doubt"
        if choice == "extend":
            rec.extend_doubt.append((sent + lease_ms, now + lease_ms))
            rec.next_min_t = min(rec.next_min_t, sent + lease_ms)
            rec.lease_until = min(rec.lease_until, sent + lease_ms)
        if choice.startswith("nack"):
            rec.next_min_t = min(rec.next_min_t, sent + nack_delay)
            rec.lease_until = 0
            if nack_kills:
                rec.dead = "maybe"
        if choice == "release":
            # Applied: Ready again under the same attempt; not applied: in flight
            # until its lease lapses (then attempt + 1, or dead on the last one).
            rec.last_attempt = min(rec.last_attempt, rec.lease_attempt - 1)
            rec.next_attempt = None
            rec.next_min_t = min(rec.next_min_t, sent)
            rec.lease_until = 0
            if rec.lease_attempt >= rec.max_attempts:
                rec.dead = "maybe"

    def _returned_by_delivery(self, rec: JobRec, a: int, t: int, where: str) -> None:
        """A delivery while a release / nack of the held lease awaits its answer on
        another connection: if that release / nack explains it (the same attempt
        again after a release; the next one after a nack), apply it first."""
        pending = rec.returning
        if pending is None or pending.applied_by or pending.attempt != rec.lease_attempt:
            return
        if pending.choice == "release":
            if a != pending.attempt:
                return
            self.released(rec, pending.attempt, pending.sent)
        else:
            if a != pending.attempt + 1:
                return
            # Explained by the nack (its retry time) or by the lease's expiry (the
            # nack then gets fenced off): either floor; the answer tells which.
            pending.floor_before = rec.next_min_t
            self.nacked(rec, min(rec.next_min_t, pending.sent + pending.delay))
        pending.applied_by = where
        pending.delivered_at = t
        self.report.stats[f"{pending.choice}_answer_read_after_the_delivery"] += 1

    def returning_answered(self, rec: JobRec, pending: Returning) -> bool:
        """The release / nack `pending` succeeded: False if a delivery already
        applied it (nothing more to do), True if the caller applies it now."""
        if rec.returning is pending:
            rec.returning = None
        if pending.applied_by and pending.choice != "release":
            retry_at = pending.sent + pending.delay
            self.check(
                pending.delivered_at >= retry_at,
                f"{pending.applied_by}: delivered {retry_at - pending.delivered_at} ms before "
                f"the retry delay of the nack that returned it allowed ({retry_at})",
            )
        return not pending.applied_by

    def returning_fenced(self, rec: JobRec, pending: Returning) -> None:
        """The release / nack `pending` was refused (never applied): a delivery that
        took it for applied must be explained otherwise."""
        if rec.returning is pending:
            rec.returning = None
        if not pending.applied_by:
            return
        # Refused, so the delivery came from the lease's expiry: a release's
        # same-attempt redelivery cannot; a nack's next attempt, only after the lease.
        self.check(
            pending.choice != "release",
            f"{pending.applied_by}: delivered again at the same attempt, but the "
            "release of that attempt was refused",
        )
        self.check(
            pending.delivered_at >= pending.floor_before,
            f"{pending.applied_by}: delivered {pending.floor_before - pending.delivered_at} "
            f"ms before its lease allowed ({pending.floor_before}); the nack was refused",
        )

    def returning_in_doubt(self, rec: JobRec, pending: Returning) -> bool:
        """The release / nack `pending` got no answer: False if a delivery proved
        it applied (nothing in doubt), True if the caller records the doubt."""
        if rec.returning is pending:
            rec.returning = None
        return not pending.applied_by

    def nacked(self, rec: JobRec, retry_at: int) -> None:
        """An acknowledged nack (not to the dead letters) of the held lease."""
        rec.lease_until = 0
        rec.returned = True
        rec.next_min_t = retry_at

    def released(self, rec: JobRec, attempt: int, sent: int) -> None:
        """An acknowledged release of `attempt`: the job is Ready again at once and
        the next delivery carries the same attempt (it was not counted)."""
        rec.last_attempt = attempt - 1
        rec.next_attempt = attempt
        rec.next_min_t = sent
        rec.returned = False
        rec.lease_until = 0

    def fenced(self, rec: JobRec, attempt: int, received: int, what: str) -> None:
        """An ack/nack/extend of `attempt` was refused (not_found / mismatch)."""
        self.check(
            not (rec.lease_attempt == attempt and received < rec.lease_until),
            f"{rec.tag}: {what} of attempt {attempt} fenced off at {received}, before its "
            f"lease deadline {rec.lease_until}",
        )
        if rec.lease_attempt == attempt:
            rec.lease_until = 0

    # -- admin mutations (issue 15): by ids, pause / resume, purge ---------------------

    def _requeued_by_delivery(self, rec: JobRec, a: int, where: str) -> None:
        """A delivery at attempt 1 of a job known dead while a requeue of it awaits
        its answer (or got none): only the requeue explains it; apply it first."""
        if a != 1 or rec.dead != "ok":
            return
        pending = rec.admin
        if pending is not None and pending.action == "requeue" and not pending.applied_by:
            self.requeued(rec, pending.sent)
            pending.applied_by = where
            self.report.stats["requeue_answer_read_after_the_delivery"] += 1
        elif rec.requeue_doubt:
            self.requeued(rec, rec.requeue_doubt)

    def requeued(self, rec: JobRec, sent: int) -> None:
        """A requeue of the dead letter applied: Ready again at once, at attempt 1
        (the one time an attempt may go back)."""
        rec.dead = "no"
        rec.last_attempt = 0
        rec.next_attempt = 1
        rec.next_min_t = sent
        rec.returned = False
        rec.lease_attempt = rec.lease_until = rec.lease_deadline = 0
        rec.extend_doubt = []
        rec.requeue_doubt = 0

    def admin_sent(self, rec: JobRec, action: str, sent: int) -> AdminPending:
        """`action` of `rec` by id is about to be sent: what the ledger knows now."""
        self.ending(rec, sent)
        quiet = rec.acting == 0
        pending = AdminPending(
            action,
            sent,
            gone=rec.acked == "ok" or rec.dead == "drained" or rec.enq == "no",
            dead=rec.dead == "ok" and rec.acked == "no",
            exists=quiet
            and rec.seen
            and rec.enq == "ok"
            and rec.acked == "no"
            and rec.dead in ("no", "ok", "maybe")
            and not rec.requeue_doubt,
            quiet=quiet,
            acts=rec.acts,
        )
        rec.admin = pending
        return pending

    def admin_answered(
        self, rec: JobRec, pending: AdminPending, outcome: str, received: int
    ) -> None:
        """The per-id outcome of `pending`, answered at `received`: checked against
        what the ledger knew, then applied (done: cancel / delete = gone, like an
        acknowledged ack; dead_letter = dead; requeue = Ready at attempt 1)."""
        if rec.admin is pending:
            rec.admin = None
        action = pending.action
        where = f"{rec.tag} ({rec.job_id}): {action} sent at {pending.sent} answered {outcome}"
        by_id = action in ("cancel", "dead_letter")  # live jobs; else dead letters
        # No worker acted on it from before the send to the answer.
        quiet = pending.quiet and rec.acting == 0 and rec.acts == pending.acts
        if outcome == "done":
            self.check(
                not pending.gone, f"{where}, but it was finished before ({rec.removed or 'acked'})"
            )
            if by_id:
                self.check(not pending.dead, f"{where}, but it was a dead letter")
                # Leased for sure past the answer: the server saw it in flight.
                self.check(
                    not (quiet and rec.lease_until > received),
                    f"{where}, but it was in flight (attempt {rec.lease_attempt}) until "
                    f"{rec.lease_until} for sure",
                )
            if action in ("cancel", "delete"):
                rec.acked = "ok"
                rec.removed = action
                rec.dead = "no" if rec.dead == "ok" else rec.dead
                rec.lease_until = 0
            elif action == "dead_letter":
                rec.dead = "ok"
                rec.lease_until = 0
                rec.next_attempt = None
            elif not pending.applied_by:
                self.requeued(rec, pending.sent)
            return
        self.check(
            not pending.applied_by,
            f"{pending.applied_by}: delivered at attempt 1 after it was dead-lettered, but "
            f"its requeue answered {outcome}",
        )
        if outcome == "not_found":
            if by_id:
                self.check(not (pending.exists and quiet), f"{where}, but the job existed")
            else:
                self.check(not pending.dead, f"{where}, but it was a dead letter")
        elif outcome == "wrong_state":
            self.check(by_id, f"{where}: a {action} by id answers done or not_found")
            self.check(not pending.gone, f"{where}, but it was gone (finished) before")
        else:
            self.violation(f"{where}: an outcome the protocol does not have")

    def admin_in_doubt(self, rec: JobRec, pending: AdminPending) -> None:
        """`pending` got no answer: it may or may not have been applied; the next
        crash check decides (a delivery may tell before, for a requeue)."""
        if rec.admin is pending:
            rec.admin = None
        if pending.applied_by or rec.tag not in self.active:
            return
        if pending.action in ("cancel", "delete") and rec.acked == "no":
            rec.acked = "doubt"
        if pending.action == "delete" and rec.dead == "ok":
            rec.dead = "maybe"
        if pending.action == "dead_letter" and rec.dead == "no":
            rec.dead = "maybe"
        if pending.action == "requeue" and rec.dead == "ok":
            rec.requeue_doubt = pending.sent

    def admin_refused(self, rec: JobRec, pending: AdminPending, error: str) -> None:
        """`pending` was refused as a whole (never applied)."""
        if rec.admin is pending:
            rec.admin = None
        self.check(
            not pending.applied_by,
            f"{pending.applied_by}: delivered at attempt 1 after it was dead-lettered, but "
            f"its requeue was refused ({error})",
        )

    def purge_candidates(self) -> tuple[list[JobRec], list[JobRec]]:
        """The jobs of PURGE_QUEUE: live (Ready or Scheduled: nobody reserves
        there) for sure, and those that may be live (an in-doubt operation)."""
        sure: list[JobRec] = []
        maybe: list[JobRec] = []
        for tag in self.active:
            rec = self.jobs[tag]
            if rec.queue != PURGE_QUEUE:
                continue
            if rec.enq == "ok" and rec.acked == "no" and rec.dead == "no":
                sure.append(rec)
            elif rec.acked != "ok" and (
                (rec.enq != "no" and rec.dead != "ok") or rec.requeue_doubt
            ):
                maybe.append(rec)
        return sure, maybe

    def purged(self, sure: list[JobRec], maybe: list[JobRec], purged: int, remaining: int) -> None:
        """An acknowledged purge of PURGE_QUEUE (under one chunk): every job live
        for sure when it was sent is gone, and it counted exactly those (plus any
        of the in-doubt ones)."""
        self.check(
            len(sure) <= purged <= len(sure) + len(maybe) and remaining == 0,
            f"purge of {PURGE_QUEUE} answered purged={purged} remaining={remaining}; the "
            f"ledger holds {len(sure)} jobs there for sure and {len(maybe)} maybe",
        )
        for rec in sure:
            rec.acked = "ok"
            rec.removed = "purge"
        if purged > len(sure):
            for rec in maybe:
                rec.acked = "doubt"

    def purge_in_doubt(self, sure: list[JobRec], maybe: list[JobRec]) -> None:
        for rec in (*sure, *maybe):
            if rec.acked == "no":
                rec.acked = "doubt"

    def pause_sent(self, queue: str, pause: bool) -> str:
        """A pause / resume of `queue` is about to be sent; deliveries from it are
        allowed until the answer (they may have been decided before). Returns
        the state before, for `pause_answered`."""
        before = self.paused[queue]
        self.paused[queue] = "pausing" if pause else "resuming"
        return before

    def pause_answered(
        self, queue: str, pause: bool, before: str, paused: bool, changed: bool, received: int
    ) -> None:
        self.check(
            paused == pause, f"{'pause' if pause else 'resume'} of {queue} answered paused={paused}"
        )
        if before in ("no", "ok"):
            self.check(
                changed == ((before == "ok") != pause),
                f"{'pause' if pause else 'resume'} of {queue} answered changed={changed}, "
                f"the queue was {'paused' if before == 'ok' else 'running'}",
            )
        self.paused[queue] = "ok" if pause else "no"
        self.paused_at[queue] = received

    def pause_in_doubt(self, queue: str) -> None:
        self.paused[queue] = "maybe"

    def pause_refused(self, queue: str, before: str) -> None:
        self.paused[queue] = before

    def _check_paused(self, state: State) -> None:
        """An acknowledged pause survives the crash, an acknowledged resume too;
        in-doubt ones are what S says. Adopts S."""
        for queue in ALL_QUEUES:
            q = state.queues.get(queue)
            paused = q is not None and q.paused
            mine = self.paused[queue]
            if mine in ("no", "ok"):
                self.check(
                    paused == (mine == "ok"),
                    f"queue {queue}: paused={paused} in the recovered state, but its "
                    f"{'pause' if mine == 'ok' else 'resume'} was acknowledged",
                )
            else:
                self.report.stats["in_doubt_pause_resolved"] += 1
            self.paused[queue] = "ok" if paused else "no"
            self.paused_at[queue] = 0

    # -- the crash: check against S, then adopt S ------------------------------------

    def check_recovered(self, state: State, kill_ms: int) -> None:
        self.check_cap("the lifetime before the crash")
        self.cap_leases = []
        by_tag: dict[str, tuple[str, Any]] = {}
        items: list[tuple[str, Any, Any]] = [("job", job, job) for job in state.jobs.values()]
        for job_id, dead in state.dead.items():
            items.append(("dead", dead, dead.job))
            if dead.job.job_id != job_id:  # pragma: no cover - state invariant
                self.violation(f"dead letter {job_id} holds job {dead.job.job_id}")
        schedule = state.schedules.get(SCHEDULE_NAME)
        for kind, item, job in items:
            tick = _tick_of(job.queue, job.custom)
            tag = _tag_of(job.payload_data) if tick is None else tick_tag(tick)
            if tag in by_tag:
                self.violation(
                    f"{tag}: two jobs in the recovered state ({by_tag[tag][1]} and {job.job_id})"
                    + (": a tick fired twice" if tick is not None else "")
                )
            by_tag[tag] = (kind, item)
            if tick is not None and tag not in self.jobs:
                # Fired by the server, never delivered: the ledger learns of it here.
                self._tick_known(tick, f"in the recovered state ({job.job_id})")
                self.add(self._tick_rec(tick, "doubt"))
                self.report.stats["schedule_ticks_first_seen_recovered"] += 1
            if tick is not None and schedule is not None:
                self.check(
                    tick < schedule.next_ms,
                    f"{tag} ({job.job_id}) in the recovered state, at or after the "
                    f"schedule's next tick {schedule.next_ms}",
                )
        self._check_schedule(schedule)
        for tag in by_tag:
            rec = self.jobs.get(tag)
            self.check(rec is not None, f"recovered state holds a job nobody enqueued: {tag!r}")
            if rec is not None and tag not in self.active:
                # Finished for sure: acked (and confirmed gone) or never enqueued.
                self.violation(f"{tag}: back in the recovered state after it was finished")
        finished = []
        for tag in self.active:
            rec = self.jobs[tag]
            found = by_tag.get(tag)
            if found is None:
                self._missing(rec)
                if rec.acked == "ok" or rec.enq == "no":
                    finished.append(tag)
            elif found[0] == "job":
                self._present(rec, found[1], state, kill_ms)
            else:
                self._dead(rec, found[1])
        self.active.difference_update(finished)
        for op, members in self.atomic_ops.items():
            existed = [m.seen for m in members]
            self.check(
                all(existed) or not any(existed),
                f"atomic batch {op}: only {sum(existed)} of {len(members)} jobs exist",
            )
        self.atomic_ops.clear()
        self._check_paused(state)
        sample = random.Random(kill_ms).sample(self.durable_keys, min(len(self.durable_keys), 200))
        for rec in [*self.fresh_keys, *sample]:
            if rec.job_id is not None:
                entry = state.dedup.get((rec.queue, rec.key or ""))
                self.check(
                    entry is not None and entry[0] == rec.job_id,
                    f"{rec.tag}: idempotency key {rec.key} maps to {entry}, not {rec.job_id}",
                )
        self.fresh_keys.clear()

    def _check_schedule(self, schedule: Any) -> None:
        """SCHEDULE_NAME in a recovered state: there once it was, its anchor kept,
        its next tick never going back, on the grid, and past every tick delivered
        (a delivered tick was durable); every tick from the anchor up to its next
        tick known to the ledger -- delivered, or a job of the recovered state --
        so none was skipped or lost (catch_up = "all"); none fired twice (the same
        tick as two jobs, or back after an acknowledged ack: the job checks)."""
        if schedule is None:
            self.check(self.anchor is None, f"schedule {SCHEDULE_NAME} lost in the crash")
            self.check(not self.ticks, f"{SCHEDULE_NAME} fired ticks, then was not recovered")
            return
        anchor, nxt = schedule.spec.next_ms, schedule.next_ms
        self.check(
            schedule.spec.every_ms == TICK_EVERY_MS
            and schedule.spec.catch_up == "all"
            and not schedule.paused,
            f"schedule {SCHEDULE_NAME} recovered as {schedule.spec}, paused={schedule.paused}",
        )
        if self.anchor is None:
            self.anchor = anchor
            for tick in self.ticks:  # delivered before the ledger knew the anchor
                self._tick_known(tick, "delivered")
        self.check(
            anchor == self.anchor,
            f"schedule {SCHEDULE_NAME}'s anchor moved from {self.anchor} to {anchor}",
        )
        self.check(
            nxt >= self.schedule_next
            and nxt > self.tick_delivered_max
            and (nxt - anchor) % TICK_EVERY_MS == 0,
            f"schedule {SCHEDULE_NAME} recovered with next tick {nxt}: the last recovered "
            f"state had {self.schedule_next}, tick {self.tick_delivered_max} was delivered, "
            f"anchor {anchor}",
        )
        lost = [
            tick
            for tick in range(max(anchor, self.schedule_next), nxt, TICK_EVERY_MS)
            if tick not in self.ticks
        ]
        self.check(
            not lost,
            f"schedule {SCHEDULE_NAME}: ticks {lost[:10]} (of {len(lost)}) below its next tick "
            f"{nxt} never delivered and not in the recovered state: lost",
        )
        self.report.stats["schedule_ticks_fired"] += (
            max(0, nxt - max(anchor, self.schedule_next)) // TICK_EVERY_MS
        )
        self.schedule_next = max(self.schedule_next, nxt)

    def _missing(self, rec: JobRec) -> None:
        where = f"{rec.tag} ({rec.job_id})"
        rec.cap_lease = None
        rec.requeue_doubt = 0  # applied or not, the job (or its dead letter) stays
        if rec.enq == "ok" or rec.seen:
            self.check(
                rec.acked in ("ok", "doubt"),
                f"{where}: acknowledged job lost (not in the recovered state, never acked)",
            )
            self.check(rec.dead != "ok", f"{where}: dead letter lost")
            rec.acked = "ok"
        elif rec.enq == "doubt":
            rec.enq = "no"  # the enqueue never happened: it must never show up

    def _present(self, rec: JobRec, job: Any, state: State, kill_ms: int) -> None:
        status, attempt, due = job.status, job.attempt, job.due_ms
        where = f"{rec.tag} ({job.job_id}) recovered with attempt {attempt}, status {status}"
        if rec.requeue_doubt:
            self.requeued(rec, rec.requeue_doubt)  # live again: the in-doubt requeue applied
        self.check(rec.enq != "no", f"{where}: its enqueue never happened")
        self.check(rec.acked != "ok", f"{where}: an acknowledged {rec.removed or 'ack'} was undone")
        self.check(rec.dead != "ok", f"{where}: a dead letter came back")
        self.check(job.max_attempts == rec.max_attempts, f"{where}: max_attempts changed")
        self.check(attempt <= job.max_attempts, f"{where}: attempt above max_attempts")
        floor = rec.last_attempt + (1 if rec.returned or status != IN_FLIGHT else 0)
        self.check(attempt >= floor, f"{where}: attempt went back below {floor}")
        if rec.lease_until and rec.lease_attempt == attempt and status == IN_FLIGHT:
            allowed = [(rec.lease_deadline, rec.lease_deadline), *rec.extend_doubt]
            self.check(
                any(lo <= due <= hi for lo, hi in allowed),
                f"{where}: lease deadline {due}, acknowledged {rec.lease_deadline}"
                f" (in-doubt extends {rec.extend_doubt})",
            )
        elif rec.lease_until:
            # A lease held for sure until lease_until ended before the crash: only
            # its expiry can end it (a sweep at or after the deadline, so the
            # deadline was no later than the kill).
            self.check(
                rec.lease_until <= kill_ms,
                f"{where}: lease held until {rec.lease_until} ended before the kill at {kill_ms}",
            )
        self.learn_id(rec, job.job_id)
        if rec.enq == "doubt":
            self.key_durable(rec)
        rec.seen = True
        rec.enq = "ok"
        rec.acked = "no"
        rec.dead = "no"
        rec.returned = False
        rec.extend_doubt = []
        if status == IN_FLIGHT:
            rec.last_attempt = max(rec.last_attempt, attempt)
            rec.next_attempt, rec.next_min_t = attempt + 1, due
            rec.lease_attempt, rec.lease_until, rec.lease_deadline = attempt, due, due
            if job.queue == CAP_QUEUE:
                # In flight from the restart (any decision of the next lifetime
                # comes after the kill) until its deadline or a call that ends it.
                rec.cap_lease = CapLease(rec.tag, attempt, kill_ms, due)
                self.cap_leases.append(rec.cap_lease)
        else:
            rec.cap_lease = None
            rec.last_attempt = max(rec.last_attempt, attempt - 1)
            rec.next_attempt = attempt
            rec.next_min_t = due if status == SCHEDULED else 0
            rec.lease_attempt, rec.lease_until = 0, 0

    def _dead(self, rec: JobRec, dead: Any) -> None:
        where = f"{rec.tag} ({dead.job.job_id}) dead-lettered at attempt {dead.final_attempt}"
        rec.cap_lease = None
        rec.requeue_doubt = 0  # still a dead letter: the in-doubt requeue did not apply
        self.check(rec.enq != "no", f"{where}: its enqueue never happened")
        self.check(rec.acked != "ok", f"{where}: an acknowledged ack was undone")
        floor = rec.last_attempt + (1 if rec.returned else 0)
        self.check(dead.final_attempt >= floor, f"{where}: attempt went back below {floor}")
        self.learn_id(rec, dead.job.job_id)
        if rec.enq == "doubt":
            self.key_durable(rec)
        rec.seen = True
        rec.enq = "ok"
        rec.acked = "no"
        rec.dead = "ok"
        rec.lease_until = 0

    def drained(self, job_ids: list[str]) -> None:
        """A complete drain of every queue's dead letters (nothing could crash it):
        every job the ledger holds as a dead letter comes out, and nothing that
        could not be one (a job may also have died since the last crash check, by
        a lease lapsing on its final attempt or an in-doubt nack to the dead-letter
        queue). Drained jobs leave the active set for good: one that comes back
        after a crash is a violation."""
        self.check(len(set(job_ids)) == len(job_ids), "drain returned a dead letter twice")
        got = set(job_ids)
        for tag in self.active:
            rec = self.jobs[tag]
            if rec.dead == "ok":
                self.check(rec.job_id in got, f"{tag} ({rec.job_id}): dead letter not drained")
        for job_id in got:
            found = self.by_id.get(job_id)
            if found is None or found.tag not in self.active:
                self.violation(f"drained {job_id}, which the ledger holds as finished or unknown")
                continue
            could_die = found.dead in ("ok", "maybe") or (
                found.lease_until and found.lease_attempt >= found.max_attempts
            )
            self.check(
                bool(could_die) and found.acked != "ok",
                f"{found.tag} ({job_id}): drained as a dead letter, but the ledger has it "
                f"acked={found.acked} dead={found.dead} at attempt {found.lease_attempt}",
            )
            found.dead = "drained"
            found.lease_until = 0
            self.active.discard(found.tag)

    def expected_totals(self, state: State) -> dict[str, int]:
        totals: Counter[str] = Counter()
        for job in state.jobs.values():
            totals[job.queue] += 1
        for dead in state.dead.values():
            totals[dead.job.queue] += 1
        return dict(totals)


def _tag_of(data: bytes | None) -> str:
    return data.decode(errors="replace") if data else "?"


# ---------------------------------------------------------------- the server process


class ServerProcess:
    """One `sepp serve` child on 127.0.0.1:0, started and stopped by PID."""

    def __init__(self, python: str, data_dir: str, log_path: str, env: dict[str, str]) -> None:
        self.python = python
        self.data_dir = data_dir
        self.log_path = log_path
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.address = ""
        self.exit_code: int | None = None
        self.killed_by_us = False
        self.kill_ms = 0

    async def start(self) -> bool:
        """True once it listens; False if it exited first (see `exit_code`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
        env.update(self.env)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {datetime.now(UTC).isoformat()} env {self.env}\n".encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "sepp.server.cli",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                self.data_dir,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
            )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            self.proc.kill()
            line = b""
        text = line.decode(errors="replace").strip()
        if not text.startswith("sepp listening on "):
            self.exit_code = await self.proc.wait()
            return False
        self.address = text.removeprefix("sepp listening on ")
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.killed_by_us = True
            self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.killed_by_us = True
            self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            code = await self.proc.wait()
        # The latest moment the process could have acted: now, when it is known to be
        # dead -- not when the signal was sent (a process keeps running, and may commit
        # a lease expiry due a millisecond later, until the signal lands). The checks
        # use it as an upper bound: "a lease that ended before the crash had a
        # deadline no later than kill_ms". (Taking it before the signal made the 1,000
        # crash soak of 2026-11-30 report 4 false violations from one kill.)
        self.kill_ms = wall_ms()
        self.exit_code = code
        return code

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- one cycle's workload


def _in_doubt(exc: BaseException) -> bool:
    """Whether a failed call may still have been applied."""
    if isinstance(exc, JobNotFoundError | AttemptMismatchError | InvalidRequestError):
        return False
    if isinstance(exc, OverloadedError | UnauthenticatedError | ConnectError):
        return False  # refused, or never sent
    return not (isinstance(exc, TransportError) and exc.code == "unavailable")


@dataclass
class Held:
    job: Job
    rec: JobRec
    lease_ms: int


class Workload:
    """The clients of one server lifetime. Stops when the server dies."""

    def __init__(
        self, harness: Harness, server: ServerProcess, rng: random.Random, duration_s: float
    ) -> None:
        self.h = harness
        self.ledger = harness.ledger
        self.server = server
        self.rng = rng
        self.duration_s = duration_s
        self.stopping = False
        self.clients: list[SeppClient] = []

    async def client(self) -> SeppClient:
        client = SeppClient(self.server.address, rpc_timeout=RPC_TIMEOUT)
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(SeppError, OSError):
                await client.close()

    # -- producers ---------------------------------------------------------------

    def _request(
        self, op: int, i: int, atomic: bool, keyed: bool, queue: str | None = None
    ) -> tuple[EnqueueRequest, JobRec]:
        rng = self.rng
        tag = f"{self.h.run_tag}-e{op}-{i}"
        queue = queue or rng.choice(QUEUES)
        key = f"k-{tag}" if keyed else None
        max_attempts = rng.choice((None, 1, 2, 3, 5))
        scheduled = None
        if rng.random() < 0.15:
            scheduled = wall_ms() + rng.randrange(50, 1_500)
        request = EnqueueRequest(
            queue=queue,
            job_type="crash-test",
            payload=Payload(tag.encode(), "text/plain"),
            idempotency_key=key,
            priority=rng.choice((None, 0, 5, 9)),
            max_attempts=max_attempts,
            scheduled_at=None
            if scheduled is None
            else datetime.fromtimestamp(scheduled / 1000, tz=UTC),
        )
        rec = JobRec(
            tag=tag,
            queue=queue,
            op=op,
            atomic=atomic,
            key=key,
            max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
            scheduled_at=scheduled,
            next_min_t=scheduled or 0,
        )
        self.ledger.add(rec)
        return request, rec

    async def producer(self, client: SeppClient) -> None:
        rng, ledger = self.rng, self.ledger
        while not self.stopping and self.server.alive:
            if ledger.backlog() > BACKLOG_MAX:
                # Keep the backlog (and so each crash check) bounded on long runs.
                await asyncio.sleep(0.01)
                continue
            op = ledger.op_id()
            kind = rng.choices(("single", "batch", "atomic", "dedup"), (35, 30, 25, 10))[0]
            if kind == "dedup" and await self.dedup_one(client, op):
                continue
            size = 1 if kind in ("single", "dedup") else rng.randrange(2, 6)
            atomic = kind == "atomic"
            pairs = [self._request(op, i, atomic, rng.random() < 0.3) for i in range(size)]
            if atomic:
                ledger.atomic_ops[op] = [rec for _, rec in pairs]
            requests = [req for req, _ in pairs]
            try:
                if atomic:
                    results: list[Any] = await client.enqueue_atomic(requests)
                elif size == 1:
                    results = [await client.enqueue(requests[0])]
                else:
                    results = await client.enqueue_batch(requests)
            except (JobRejectedError, BatchValidationError) as exc:
                ledger.violation(f"enqueue op {op}: valid jobs rejected: {exc}")
                for _, rec in pairs:
                    rec.enq = "no"
                continue
            except SeppError as exc:
                self._enqueue_failed(pairs, exc)
                continue
            for rec, ack in self._enqueued(pairs, results):
                ledger.check(not ack.deduplicated, f"{rec.tag}: fresh key deduplicated")
                ledger.key_durable(rec)

    def _enqueue_failed(self, pairs: list[tuple[EnqueueRequest, JobRec]], exc: SeppError) -> None:
        """An enqueue that raised: refused (none of `pairs` enqueued) or in doubt."""
        if not _in_doubt(exc):
            for _, rec in pairs:
                rec.enq = "no"
            self.refused(exc)
        else:
            self.ledger.outcome()
            self.h.report.stats["in_doubt_enqueue"] += 1

    def _enqueued(
        self, pairs: list[tuple[EnqueueRequest, JobRec]], results: list[Any]
    ) -> list[tuple[JobRec, EnqueueAck]]:
        """An enqueue's answers, one per pair, into the ledger: each acknowledged job
        enqueued with its id, any other answer a violation. Returns the acknowledged."""
        ledger = self.ledger
        ledger.outcome()
        acked: list[tuple[JobRec, EnqueueAck]] = []
        for (_, rec), result in zip(pairs, results, strict=True):
            if not isinstance(result, EnqueueAck):
                ledger.violation(f"{rec.tag}: rejected: {result}")
                rec.enq = "no"
                continue
            rec.enq = "ok"
            rec.seen = True
            ledger.learn_id(rec, result.job_id)
            acked.append((rec, result))
        return acked

    async def dedup_one(self, client: SeppClient, op: int) -> bool:
        """Re-enqueue a known durable key: must answer the original id, deduplicated."""
        keyed = self.ledger.durable_keys
        if not keyed:
            return False
        rec = self.rng.choice(keyed)
        probe = f"{self.h.run_tag}-d{op}"
        self.ledger.add(JobRec(probe, rec.queue, op, False, None, 1, None, enq="no"))
        request = EnqueueRequest(
            queue=rec.queue,
            job_type="crash-test",
            payload=Payload(probe.encode(), "text/plain"),
            idempotency_key=rec.key,
        )
        try:
            ack = await client.enqueue(request)
        except SeppError as exc:
            self.refused(exc)
            return True  # a dedup hit stores nothing: in doubt or not, nothing to learn
        self.ledger.outcome()
        self.ledger.check(
            ack.deduplicated and ack.job_id == rec.job_id,
            f"{rec.tag}: key {rec.key} answered {ack}, expected {rec.job_id} deduplicated",
        )
        return True

    # -- workers ---------------------------------------------------------------------

    async def worker(self, client: SeppClient, name: str, held: list[Held]) -> None:
        rng = self.rng
        while not self.stopping and self.server.alive:
            if held and rng.random() < 0.6:
                item = held.pop(rng.randrange(len(held)))
                await self.act(client, item, held)
                continue
            lease_ms = rng.randrange(300, 2_500)
            queues = rng.sample(WORKER_QUEUES, rng.randrange(1, len(WORKER_QUEUES) + 1))
            options = ReserveOptions(
                queues=queues,
                lease_duration=timedelta(milliseconds=lease_ms),
                wait_timeout=timedelta(milliseconds=rng.choice((0, 20, 100))),
                worker_id=name,
                max_jobs=rng.randrange(1, 5),
            )
            self.ledger.op_id()
            try:
                jobs = await client.reserve(options)
            except SeppError as exc:
                if _in_doubt(exc):
                    self.h.report.stats["in_doubt_reserve"] += 1
                    self.ledger.outcome()
                else:
                    self.refused(exc)
                continue
            self.ledger.outcome()
            for job in jobs or ():
                rec = self.ledger.delivered(job, lease_ms)
                if rec is not None:
                    held.append(Held(job, rec, lease_ms))

    async def act(self, client: SeppClient, item: Held, held: list[Held]) -> None:
        rec = item.rec
        rec.acting += 1
        rec.acts += 1
        try:
            await self._act(client, item, held)
        finally:
            rec.acting -= 1

    async def _act(self, client: SeppClient, item: Held, held: list[Held]) -> None:
        rng, ledger = self.rng, self.ledger
        ctx, rec = item.job.ctx, item.rec
        ledger.op_id()
        choice = rng.choices(
            ("ack", "nack", "nack_delay", "nack_dead", "extend", "abandon", "stale", "release"),
            (40, 10, 10, 5, 15, 12, 8, 6),
        )[0]
        sent = wall_ms()
        if choice in ("ack", "nack", "nack_delay", "nack_dead", "release"):
            ledger.ending(rec, sent)
        pending: Returning | None = None
        if choice == "release" or (
            choice.startswith("nack") and not self._nack_kills(item, choice)
        ):
            delay = self._nack_delay(item, choice) if choice != "release" else 0
            pending = rec.returning = Returning(choice, ctx.attempt, sent, delay)
        try:
            if choice == "ack":
                await client.ack(ctx)
                ledger.check(
                    rec.acked != "ok" and ctx.attempt == rec.last_attempt,
                    f"{rec.tag}: ack of attempt {ctx.attempt} succeeded (acked {rec.acked}, "
                    f"last attempt {rec.last_attempt})",
                )
                rec.acked = "ok"
                rec.lease_until = 0
            elif choice.startswith("nack"):
                await self.nack(client, item, choice, sent, pending)
            elif choice == "extend":
                await self.extend(client, item, sent, held)
            elif choice == "release":
                await client.release(ctx)
                assert pending is not None
                if ledger.returning_answered(rec, pending):
                    ledger.released(rec, ctx.attempt, sent)
            elif choice == "abandon":
                self.h.report.stats["leases_left_to_expire"] += 1
            else:
                await self.stale(client, item)
            if choice != "abandon":
                ledger.outcome()
        except (JobNotFoundError, AttemptMismatchError):
            ledger.outcome()
            if pending is not None:
                ledger.returning_fenced(rec, pending)
            ledger.fenced(rec, ctx.attempt, wall_ms(), choice)
        except SeppError as exc:
            if isinstance(exc, InvalidRequestError | UnauthenticatedError):
                ledger.violation(f"{rec.tag}: {choice} refused unexpectedly: {exc!r}")
                return
            if not _in_doubt(exc):
                # Never applied (the server was gone or busy): the lease is still ours.
                if pending is not None:
                    ledger.returning_fenced(rec, pending)
                self.refused(exc)
                held.append(item)
                return
            ledger.outcome()
            self.h.report.stats[f"in_doubt_{choice}"] += 1
            if pending is not None and not ledger.returning_in_doubt(rec, pending):
                return  # a delivery already proved it applied
            nack = choice.startswith("nack")
            ledger.in_doubt(
                rec,
                choice,
                sent=sent,
                now=wall_ms(),
                lease_ms=item.lease_ms,
                nack_delay=self._nack_delay(item, choice) if nack else 0,
                nack_kills=nack and self._nack_kills(item, choice),
            )

    def _nack_delay(self, item: Held, choice: str) -> int:
        if choice == "nack_delay":
            return 50 + item.rec.op % 400
        return policy_delay(RETRY_POLICY, item.job.ctx.id, item.job.ctx.attempt)

    def _nack_kills(self, item: Held, choice: str) -> bool:
        return choice == "nack_dead" or item.job.ctx.attempt >= item.rec.max_attempts

    def refused(self, exc: SeppError) -> None:
        """Not applied: refused, or never sent. A refused connection means the
        server is gone: this lifetime's workload stops."""
        self.h.report.stats[f"refused_{type(exc).__name__}"] += 1
        if isinstance(exc, ConnectError) or (
            isinstance(exc, TransportError) and exc.code == "unavailable"
        ):
            self.stopping = True  # the server is gone, or going

    async def nack(
        self, client: SeppClient, item: Held, choice: str, sent: int, pending: Returning | None
    ) -> None:
        ctx, rec = item.job.ctx, item.rec
        directive = {
            "nack": RetryDirective.DEFAULT,
            "nack_delay": RetryDirective.after(
                timedelta(milliseconds=self._nack_delay(item, choice))
            ),
            "nack_dead": RetryDirective.DEAD_LETTER,
        }[choice]
        dead_lettered = await client.nack(ctx, directive, reason=f"crash-test {choice}")
        expected = self._nack_kills(item, choice)
        self.ledger.check(
            dead_lettered == expected,
            f"{rec.tag}: nack ({choice}) of attempt {ctx.attempt}/{rec.max_attempts} said "
            f"dead_lettered={dead_lettered}",
        )
        if dead_lettered:
            if pending is not None:
                self.ledger.returning_answered(rec, pending)
            rec.lease_until = 0
            rec.dead = "ok"
            rec.next_attempt = None
        elif pending is None or self.ledger.returning_answered(rec, pending):
            self.ledger.nacked(rec, sent + self._nack_delay(item, choice))

    async def extend(self, client: SeppClient, item: Held, sent: int, held: list[Held]) -> None:
        ctx, rec = item.job.ctx, item.rec
        lease = item.lease_ms
        expiry = to_ms(await client.extend(ctx, timedelta(milliseconds=lease)))
        received = wall_ms()
        self.ledger.check(
            sent + lease <= expiry <= received + lease,
            f"{rec.tag}: extend by {lease} ms sent at {sent}, answered at {received}, "
            f"gave deadline {expiry}",
        )
        if rec.lease_attempt == ctx.attempt:
            rec.lease_until = rec.lease_deadline = expiry
            rec.next_min_t = expiry
        self.ledger.extended(rec, ctx.attempt, expiry)
        held.append(item)

    async def stale(self, client: SeppClient, item: Held) -> None:
        """Fencing: an ack of an older attempt, or of a job already acked, must fail."""
        ctx, rec = item.job.ctx, item.rec
        if ctx.attempt == 1:
            self.h.report.stats["stale_skipped"] += 1
            return
        stale = JobCtx(
            id=ctx.id,
            queue=ctx.queue,
            job_type=ctx.job_type,
            priority=ctx.priority,
            attempt=ctx.attempt - 1,
            max_attempts=ctx.max_attempts,
            enqueued_at=ctx.enqueued_at,
            custom=ctx.custom,
            trace_context=ctx.trace_context,
            lease_expires_at=ctx.lease_expires_at,
        )
        try:
            await client.ack(stale)
        except (JobNotFoundError, AttemptMismatchError):
            self.h.report.stats["fenced_stale_ack"] += 1
            return
        self.ledger.violation(f"{rec.tag}: an ack of stale attempt {ctx.attempt - 1} succeeded")
        rec.acked = "ok"

    # -- an operator (issue 15's admin mutations) ------------------------------------

    async def operator(self, client: SeppClient) -> None:
        """One operator, one call at a time, over the native admin methods: cancels
        and dead-letters jobs by id, requeues and deletes dead letters by id,
        pauses and resumes queues, fills and purges PURGE_QUEUE; every call with a
        reason. Each per-id outcome is checked and applied by the ledger."""
        rng = self.rng
        while not self.stopping and self.server.alive:
            await asyncio.sleep(rng.uniform(0.01, 0.06))  # pacing, not a wait
            if self.stopping:
                return
            kind = rng.choices(
                ("cancel", "dead_letter", "requeue", "delete", "pause", "fill", "purge"),
                (18, 18, 18, 8, 16, 14, 8),
            )[0]
            self.ledger.op_id()
            if kind == "pause":
                await self.pause_or_resume(client)
            elif kind == "fill":
                await self.fill_purge_queue(client)
            elif kind == "purge":
                await self.purge(client)
            else:
                await self.admin_by_ids(client, kind)

    def _admin_failed(self, what: str, exc: SeppError) -> bool:
        """An admin call failed: True if it may have been applied (in doubt)."""
        if isinstance(exc, InvalidRequestError | UnauthenticatedError | PermissionDeniedError):
            self.ledger.violation(f"{what} refused unexpectedly: {exc!r}")
            return False
        if not _in_doubt(exc):
            self.refused(exc)
            return False
        self.ledger.outcome()
        self.h.report.stats[f"in_doubt_{what.split()[0]}"] += 1
        return True

    async def admin_by_ids(self, client: SeppClient, kind: str) -> None:
        rng, ledger = self.rng, self.ledger
        active = [ledger.jobs[tag] for tag in ledger.active]
        if kind in ("requeue", "delete"):
            # Dead letters no worker still holds a lease of: a requeue resets the
            # attempt to 1, and an old lease of the same attempt number would fence
            # nothing (the attempt is the fencing token).
            held = {id(item.rec) for items in self.h.held for item in items}
            pool = [r for r in active if r.dead == "ok" and r.acting == 0 and id(r) not in held]
        else:
            pool = [r for r in active if r.job_id is not None and r.acked != "ok"]
            if rng.random() < 0.7:  # mostly jobs likely Ready or Scheduled (done)
                pool = [r for r in pool if r.dead == "no" and not r.lease_until] or pool
        picked = rng.sample(pool, min(len(pool), rng.randrange(1, 4)))
        if rng.random() < 0.1 and ledger.by_id:
            other = rng.choice(list(ledger.by_id.values()))  # any job: finished ones too
            if other not in picked and (kind in ("cancel", "dead_letter") or other in pool):
                picked.append(other)
        unknown: str | None = None
        if not picked or rng.random() < 0.1:
            unknown = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        ids = [r.job_id or "" for r in picked] + ([unknown] if unknown else [])
        sent = wall_ms()
        pendings = [(r, ledger.admin_sent(r, kind, sent)) for r in picked]
        method = {
            "cancel": client.cancel_jobs,
            "dead_letter": client.dead_letter_jobs,
            "requeue": client.requeue_dead_letters,
            "delete": client.delete_dead_letters,
        }[kind]
        try:
            answer = await method(ids, reason=f"crash-test {kind}")
        except SeppError as exc:
            in_doubt = self._admin_failed(f"{kind} by id", exc)
            for rec, pending in pendings:
                if in_doubt:
                    ledger.admin_in_doubt(rec, pending)
                else:
                    ledger.admin_refused(rec, pending, repr(exc))
            return
        received = wall_ms()
        ledger.outcome()
        outcomes = dict(answer.outcomes)
        ledger.check(
            len(answer.outcomes) == len(ids) and set(outcomes) == set(ids),
            f"{kind} of {ids} answered for {[jid for jid, _ in answer.outcomes]}",
        )
        for rec, pending in pendings:
            outcome = outcomes.get(rec.job_id or "", "missing")
            ledger.admin_answered(rec, pending, outcome, received)
            self.h.report.stats[f"admin_{kind}_{outcome}"] += 1
        if unknown is not None:
            ledger.check(
                outcomes.get(unknown) == "not_found",
                f"{kind} of an id nobody enqueued answered {outcomes.get(unknown)}",
            )

    async def pause_or_resume(self, client: SeppClient) -> None:
        rng, ledger = self.rng, self.ledger
        paused = [q for q in QUEUES if ledger.paused[q] != "no"]
        if paused and rng.random() < 0.8:
            queue, pause = rng.choice(paused), False
        else:
            # Now and then pause a paused queue again (changed=False), or resume a
            # running one; else pause one of the workers' queues for a while.
            queue, pause = rng.choice(QUEUES), rng.random() < 0.85
        before = ledger.pause_sent(queue, pause)
        call = client.pause_queue if pause else client.resume_queue
        action = "pause" if pause else "resume"
        try:
            change = await call(queue, reason=f"crash-test {action}")
        except SeppError as exc:
            if self._admin_failed(f"{action} of {queue}", exc):
                ledger.pause_in_doubt(queue)
            else:
                ledger.pause_refused(queue, before)
            return
        ledger.outcome()
        ledger.check(change.queue == queue, f"{action} of {queue} answered for {change.queue}")
        ledger.pause_answered(queue, pause, before, change.paused, change.changed, wall_ms())
        self.h.report.stats[f"admin_{action}{'' if change.changed else '_unchanged'}"] += 1

    async def fill_purge_queue(self, client: SeppClient) -> None:
        """Enqueue a few jobs to PURGE_QUEUE (some scheduled): its only producer."""
        rng, ledger = self.rng, self.ledger
        op = ledger.op_id()
        pairs = [
            self._request(op, i, False, False, PURGE_QUEUE) for i in range(rng.randrange(1, 5))
        ]
        try:
            results = await client.enqueue_batch([req for req, _ in pairs])
        except SeppError as exc:
            self._enqueue_failed(pairs, exc)
            return
        self._enqueued(pairs, results)

    async def purge(self, client: SeppClient) -> None:
        ledger = self.ledger
        sure, maybe = ledger.purge_candidates()
        try:
            result = await client.purge_queue(PURGE_QUEUE, reason="crash-test purge")
        except SeppError as exc:
            if self._admin_failed("purge", exc):
                ledger.purge_in_doubt(sure, maybe)
            return
        ledger.outcome()
        ledger.check(result.queue == PURGE_QUEUE, f"purge answered for {result.queue}")
        ledger.purged(sure, maybe, result.purged, result.remaining)
        self.h.report.stats["admin_purge"] += 1
        self.h.report.stats["admin_purged_jobs"] += result.purged

    # -- a hostile neighbour -------------------------------------------------------------

    async def fuzzer(self) -> None:
        rng = self.rng
        host, _, port = self.server.address.rpartition(":")
        while not self.stopping:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                return
            try:
                hello = encode_frame(pm.encode_request(1, "hello", {"protocol": 1}))
                junk = _junk(rng)
                writer.write(hello + junk if rng.random() < 0.7 else junk)
                if rng.random() < 0.5:
                    writer.write_eof()  # half-close: answers must still come
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(65536), 0.05)
                self.h.report.stats["fuzz_connections"] += 1
            except (OSError, ConnectionError):
                pass
            finally:
                writer.close()
                with contextlib.suppress(OSError, ConnectionError):
                    await writer.wait_closed()
            await asyncio.sleep(0.01)

    # -- the lifetime ------------------------------------------------------------------

    async def run(self, held_by_worker: list[list[Held]], until_dead: Awaitable[Any]) -> None:
        tasks: list[asyncio.Task[None]] = []
        for _ in range(2):
            tasks.append(asyncio.create_task(self.producer(await self.client())))
        for i, held in enumerate(held_by_worker):
            tasks.append(asyncio.create_task(self.worker(await self.client(), f"w{i}", held)))
        if self.h.options.admin:
            tasks.append(asyncio.create_task(self.operator(await self.client())))
        if self.h.options.fuzz:
            tasks.append(asyncio.create_task(self.fuzzer()))
        await until_dead
        self.stopping = True
        await asyncio.gather(*tasks, return_exceptions=False)
        await self.close()


def _junk(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))
    if kind == 1:  # a length far over the frame limit
        return (0xFFFFFFF0).to_bytes(4, "big") + rng.randbytes(8)
    if kind == 2:  # wrong types in a real operation
        body: dict[str, Any] = {
            "jobs": rng.choice(([1, 2], "x", [{"queue": 5}], None)),
            "atomic": "yes",
        }
        return encode_frame(pm.encode_request(2, "enqueue", body))
    if kind == 3:  # an ack of a job that does not exist
        body = {"job_id": "00000000-0000-4000-8000-000000000000", "attempt": 1}
        return encode_frame(pm.encode_request(3, "ack", body))
    frame = bytearray(encode_frame(pm.encode_request(4, "reserve", {"queues": ["cq0"]})))
    frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
    return bytes(frame[: rng.randrange(1, len(frame) + 1)])


# ---------------------------------------------------------------- the harness


class Harness:
    def __init__(self, options: HarnessOptions) -> None:
        self.options = options
        self.rng = random.Random(f"sepp-crash:{options.seed}")
        self.report = Report(seed=options.seed)
        self.ledger = Ledger(self.report)
        self.run_tag = f"s{options.seed}"
        self.workdir = options.workdir or tempfile.mkdtemp(prefix="sepp-crash-")
        os.makedirs(self.workdir, exist_ok=True)
        self.data_dir = os.path.join(self.workdir, "data")
        self.log_path = os.path.join(self.workdir, "server.log")
        self.report.workdir = self.workdir
        self.held: list[list[Held]] = [[] for _ in range(3)]
        self.state: State | None = None  # S: the state the next start recovers

    def storage_env(self, point: str | None) -> dict[str, str]:
        rng = self.rng
        env = dict(BASE_ENV)
        modes: tuple[str, ...] = ("sync_all", "sync_data", "buffer")
        if point == "wal.after_sync":
            modes = modes[:2]  # buffer mode syncs on a timer, past that hook
        env["SEPP_STORAGE__PERSIST_MODE"] = rng.choice(modes)
        env["SEPP_STORAGE__SEGMENT_BYTES_MAX"] = str(rng.choice((4096, 8192, 65536)))
        env["SEPP_STORAGE__SNAPSHOT_EVERY_BYTES"] = str(rng.choice((8192, 32768, 262144)))
        env["SEPP_STORAGE__SNAPSHOTS_KEPT"] = str(rng.choice((1, 2)))
        if point is not None:
            if self.options.only_points:
                # Reach the point soon: tiny segments, a snapshot every 8 KiB, one
                # kept (so each snapshot deletes files).
                env["SEPP_STORAGE__SEGMENT_BYTES_MAX"] = "4096"
                env["SEPP_STORAGE__SNAPSHOT_EVERY_BYTES"] = "8192"
                env["SEPP_STORAGE__SNAPSHOTS_KEPT"] = "1"
            env["SEPP_FAULT_CRASH_AT"] = f"{point}:{rng.randrange(1, 4)}"
        return env

    def say(self, text: str) -> None:
        if self.options.verbose:
            print(text, flush=True)

    async def start(self, env: dict[str, str]) -> ServerProcess:
        server = ServerProcess(self.options.python, self.data_dir, self.log_path, env)
        if not await server.start():
            if "SEPP_FAULT_CRASH_AT" in env and server.exit_code == -signal.SIGKILL:
                raise CrashedWhileStarting(server)  # the hook point came up in Engine.open
            raise HarnessAbort(
                f"the server did not start on {self.data_dir} (exit code {server.exit_code}):\n"
                + server.log_tail()
            )
        self.report.restarts += 1
        return server

    async def probe(self, server: ServerProcess) -> None:
        """Right after a restart: totals per queue, and durable idempotency keys."""
        if self.state is None:
            return
        client = SeppClient(server.address, rpc_timeout=RPC_TIMEOUT)
        try:
            await self._probe(client)
        except SeppError as exc:
            # A server set to kill itself at a hook point may do so right away.
            if server.alive and _in_doubt(exc) and server.proc is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(server.proc.wait(), 1.0)
            if server.alive:
                self.ledger.violation(f"probing the restarted server failed: {exc!r}")
            else:
                self.report.stats["probe_interrupted"] += 1
        finally:
            await client.close()

    async def _probe(self, client: SeppClient) -> None:
        assert self.state is not None
        expected = self.ledger.expected_totals(self.state)
        stats = {s.name: s for s in await client.queue_stats(list(ALL_QUEUES))}
        for queue in ALL_QUEUES:
            s = stats[queue]
            total = s.ready + s.scheduled + s.in_flight + s.dead_lettered
            self.ledger.check(
                total == expected.get(queue, 0),
                f"after restart queue {queue} holds {total} jobs, the log {expected.get(queue, 0)}",
            )
        durable = self.ledger.durable_keys
        keyed = self.rng.sample(durable, min(len(durable), 64))
        if keyed:
            op = self.ledger.op_id()
            requests = []
            for i, rec in enumerate(keyed):
                probe = f"{self.run_tag}-p{op}-{i}"
                self.ledger.add(JobRec(probe, rec.queue, op, False, None, 1, None, enq="no"))
                requests.append(
                    EnqueueRequest(
                        queue=rec.queue,
                        job_type="crash-test",
                        payload=Payload(probe.encode(), "text/plain"),
                        idempotency_key=rec.key,
                    )
                )
            results = await client.enqueue_batch(requests)
            for rec, result in zip(keyed, results, strict=True):
                self.ledger.check(
                    isinstance(result, EnqueueAck)
                    and result.deduplicated
                    and result.job_id == rec.job_id,
                    f"{rec.tag}: after restart key {rec.key} answered {result}, "
                    f"expected {rec.job_id} deduplicated",
                )

    async def cycle(self, index: int) -> None:
        rng = self.rng
        kinds = ["kill"] * 7 + ["term"]
        if self.options.points:
            kinds += ["point"] * 4
        kind = rng.choice(kinds)
        point = rng.choice(HOOK_POINTS) if kind == "point" else None
        if self.options.only_points:
            kind, point = "point", self.options.only_points[index % len(self.options.only_points)]
        env = self.storage_env(point)
        try:
            server = await self.start(env)
        except CrashedWhileStarting as crashed:
            # E.g. a rotation while opening the log, at rotate.*: a crash like any other.
            self.report.stats[f"self_killed_while_starting_at_{point}"] += 1
            self.report.crashes += 1
            self.check_directory(crashed.server.kill_ms or wall_ms())
            return
        await self.probe(server)
        every = self.options.drain_every
        if every and kind != "point" and index % every == every - 1:
            await self.drain_dead_letters(server)
        duration = rng.uniform(0.3, 1.2) if self.options.fast else rng.uniform(0.5, 3.0)
        if self.options.only_points:
            duration = 30.0  # the point comes first; SIGKILL only if it never does
        workload = Workload(self, server, rng, duration)

        operations_before = self.report.operations

        async def lifetime() -> None:
            assert server.proc is not None
            waiting = asyncio.create_task(server.proc.wait())
            done, _ = await asyncio.wait({waiting}, timeout=duration)
            if not done and not await self._busy_enough(waiting, operations_before):
                if kind == "term":
                    server.terminate()
                else:
                    server.kill()
            await waiting

        await workload.run(self.held, lifetime())
        code = await server.wait()
        self.say(f"cycle {index}: {kind} {point or ''} exit {code}")
        if kind == "term":
            self.ledger.check(code == 0, f"graceful stop exited {code}:\n{server.log_tail()}")
            self.report.stats["graceful_stops"] += 1
        elif code != -signal.SIGKILL:
            self.ledger.violation(
                f"server exited with {code} instead of being killed:\n{server.log_tail()}"
            )
        elif not server.killed_by_us:
            self.report.stats[f"self_killed_at_{point}"] += 1
        else:
            self.report.stats["sigkills"] += 1
        if kind != "term":
            self.report.crashes += 1
        if self.options.disk_faults and kind != "term":
            await self.damage()
        self.check_directory(server.kill_ms)

    async def _busy_enough(self, exited: asyncio.Task[int], operations_before: int) -> bool:
        """Wait until this cycle's workload has had CYCLE_OPERATIONS_MIN operations
        checked; True if the server exited by itself first (a hook point)."""
        deadline = time.monotonic() + CYCLE_STALL_S
        progress = self.report.operations
        while self.report.operations - operations_before < CYCLE_OPERATIONS_MIN:
            if exited.done():
                return True
            if self.report.operations != progress:
                progress = self.report.operations
                deadline = time.monotonic() + CYCLE_STALL_S
            elif time.monotonic() > deadline:
                self.ledger.violation(
                    f"the workload got no answer for {CYCLE_STALL_S:.0f}s "
                    f"({self.report.operations - operations_before} operations this cycle)"
                )
                return False
            await asyncio.sleep(0.01)
        return exited.done()

    async def damage(self) -> None:
        """Between cycles, what a crash can do to the disk."""
        r = self.rng.random()
        if r < 0.2:
            self.tear_tail()
        elif r < 0.3:
            await self.flipped_bit_refuses_to_start()

    def _segments(self) -> list[str]:
        wal = os.path.join(self.data_dir, "wal")
        names = sorted(n for n in os.listdir(wal) if parse_segment_file_name(n) is not None)
        return [os.path.join(wal, n) for n in names]

    def tear_tail(self) -> None:
        segments = self._segments()
        if not segments:
            return
        with open(segments[-1], "rb") as f:
            head = f.read(FILE_HEADER_BYTES)
        try:
            decode_segment_header(head)
        except FormatError:
            # A segment created but whose header never made it (a crash at
            # rotate.after_create): no record can have been torn into it.
            return
        if self.rng.random() < 0.5:
            tail = bytes(self.rng.randrange(1, 300))  # a preallocated, never written block
        else:
            next_seq = replay_to(open_data_dir(self.data_dir)).seq + 1
            record = encode_record(next_seq, RECORD_KIND_COMMAND, self.rng.randbytes(100))
            tail = record[: self.rng.randrange(1, len(record))]  # a record cut mid-write
        with open(segments[-1], "ab") as f:
            f.write(tail)
        self.report.stats["torn_tails"] += 1

    async def flipped_bit_refuses_to_start(self) -> None:
        sealed = self._segments()[:-1]
        if not sealed:
            return
        path = self.rng.choice(sealed)
        with open(path, "rb") as f:
            original = f.read()
        offset = self.rng.randrange(len(original))
        damaged = bytearray(original)
        damaged[offset] ^= 1 << self.rng.randrange(8)
        with open(path, "wb") as f:
            f.write(damaged)
        try:
            report = verify(open_data_dir(self.data_dir))
            errors = [p for p in report.problems if p.severity == ERROR]
            self.ledger.check(bool(errors), f"sepp-log verify missed a flipped bit in {path}")
            server = ServerProcess(
                self.options.python, self.data_dir, self.log_path, dict(BASE_ENV)
            )
            started = await server.start()
            if started:
                server.kill()
                await server.wait()
            if errors and all(p.kind == "damaged-history" for p in errors):
                # Wholly below the snapshot recovery starts from (recovery rows 15,
                # 16): the server starts with every job and says what is damaged.
                tail = server.log_tail(40)
                self.ledger.check(
                    started and "damaged history" in tail and os.path.basename(path) in tail,
                    f"damaged history at {path}:{offset} did not start the server, or went "
                    f"unreported (exit {server.exit_code}): {tail}",
                )
                self.report.stats["started_past_damaged_history"] += 1
                return
            self.ledger.check(
                not started and server.exit_code == 1,
                f"a flipped bit at {path}:{offset} did not stop the server (exit {server.exit_code})",
            )
            if errors:
                first = errors[0]
                tail = server.log_tail(5)
                self.ledger.check(
                    "cannot start" in tail
                    and os.path.basename(path) in tail
                    and f"offset {first.offset}" in tail
                    and "sepp-log verify" in tail,
                    f"refusal does not name {first.file} offset {first.offset}: {tail}",
                )
            self.report.stats["refused_flipped_bit"] += 1
        finally:
            with open(path, "wb") as f:
                f.write(original)

    def check_directory(self, kill_ms: int) -> None:
        report = verify(open_data_dir(self.data_dir))
        errors = [p.human() for p in report.problems if p.severity == ERROR]
        self.ledger.check(not errors, f"sepp-log verify failed after a crash: {errors[:3]}")
        result = replay_to(open_data_dir(self.data_dir))
        if result.state is None:
            raise HarnessAbort(f"the crashed directory does not replay: {result.problems}")
        self.state = result.state
        self.ledger.check_recovered(result.state, kill_ms)

    async def drain_dead_letters(self, server: ServerProcess) -> None:
        """Every DRAIN_EVERY cycles, before the workload starts and before any crash
        is armed: drain all dead letters. Keeps a long soak's state (and so each
        restart, replay and check) from growing without bound, and checks the drain:
        complete, exact, and durable (no drained job may come back after a crash)."""
        client = SeppClient(server.address, rpc_timeout=RPC_TIMEOUT)
        drained: list[str] = []
        try:
            while batch := await client.drain_dead_letters(None, 256):
                drained.extend(record.job_id for record in batch)
        except SeppError as exc:
            self.ledger.violation(f"draining the dead letters failed: {exc!r}")
            return
        finally:
            await client.close()
        self.ledger.drained(drained)
        self.report.stats["dead_letter_drains"] += 1
        self.report.stats["dead_letters_drained"] += len(drained)

    async def final(self) -> None:
        """Restart once more and work every job to its end: each is delivered (after
        its lease or schedule) with the predicted attempt and acked, or it dies as a
        dead letter (a lease lapsing on its final attempt); then a graceful stop
        whose final snapshot must equal the replay of the log."""
        server = await self.start(self.storage_env(None))
        # Every tick missed while the server was down fires now (catch_up = all):
        # the drain below goes on until a tick at least this new is delivered.
        final_start = wall_ms()
        await self.probe(server)
        client = SeppClient(server.address, rpc_timeout=RPC_TIMEOUT)
        ledger = self.ledger
        try:
            for queue in ALL_QUEUES:  # the operator may have left a queue paused
                if ledger.paused[queue] != "no":
                    before = ledger.pause_sent(queue, False)
                    change = await client.resume_queue(queue, reason="crash-test final")
                    ledger.pause_answered(
                        queue, False, before, change.paused, change.changed, wall_ms()
                    )
            live = [
                r
                for r in ledger.jobs.values()
                if r.seen and r.acked != "ok" and r.dead not in ("ok", "drained")
            ]
            # In flight on its final attempt: its lease lapses into a dead letter.
            dying = {r.tag for r in live if r.lease_until and r.lease_attempt >= r.max_attempts}
            pending = {r.tag for r in live} - dying
            deadline = time.monotonic() + 30.0
            while (
                pending or ledger.tick_delivered_max < final_start
            ) and time.monotonic() < deadline:
                options = ReserveOptions(
                    queues=[*ALL_QUEUES, TICK_QUEUE],
                    lease_duration=timedelta(seconds=20),
                    wait_timeout=timedelta(milliseconds=200),
                    max_jobs=64,
                )
                for job in await client.reserve(options) or ():
                    rec = ledger.delivered(job, 20_000)
                    ledger.report.operations += 1
                    if rec is not None:
                        ledger.ending(rec, wall_ms())
                    try:
                        await client.ack(job.ctx)
                    except SeppError as exc:
                        ledger.violation(f"final ack of {job.ctx.id} failed: {exc!r}")
                        continue
                    if rec is not None:
                        rec.acked = "ok"
                        pending.discard(rec.tag)
            ledger.check(
                not pending,
                "never delivered again after the last restart: "
                + ", ".join(
                    f"{tag} (id {r.job_id}, acked={r.acked}, dead={r.dead}, "
                    f"attempt {r.last_attempt}/{r.max_attempts}, "
                    f"{'active' if tag in ledger.active else 'not active'})"
                    for tag in sorted(pending)[:10]
                    for r in (ledger.jobs[tag],)
                ),
            )
            ledger.check(
                ledger.tick_delivered_max >= final_start,
                f"schedule {SCHEDULE_NAME} did not catch up: the newest tick delivered is "
                f"{ledger.tick_delivered_max}, the last start was at {final_start}",
            )
            for tag in dying:
                ledger.jobs[tag].dead = "ok"
            # Wait for those leases to lapse (the sweep runs at each deadline): in
            # every queue, the schedule's too (a tick on its final attempt dies the
            # same way). Leases are at most a few seconds, so their own deadline.
            lapse_deadline = time.monotonic() + 30.0
            held: dict[str, int] = {}
            while time.monotonic() < lapse_deadline:
                stats = await client.queue_stats([*ALL_QUEUES, TICK_QUEUE])
                held = {s.name: s.in_flight for s in stats if s.in_flight}
                if not held:
                    break
                await asyncio.sleep(0.05)
            ledger.check(not held, f"leases still held 30 s after the final phase: {held}")
            dead: list[str] = []
            while batch := await client.drain_dead_letters(None, 256):
                dead.extend(record.job_id for record in batch)
            expected_dead = sorted(r.job_id or "?" for r in ledger.jobs.values() if r.dead == "ok")
            ledger.check(
                sorted(dead) == expected_dead,
                f"dead letters drained {len(dead)}, ledger expects {len(expected_dead)}: "
                f"{sorted(set(dead) ^ set(expected_dead))[:5]}",
            )
            ledger.drained(dead)
            stats = await client.queue_stats([*ALL_QUEUES, TICK_QUEUE])
            # Ticks fired since the last reserve may wait in TICK_QUEUE; nothing else.
            left = {
                s.name: (
                    0 if s.name == TICK_QUEUE else s.ready,
                    s.scheduled,
                    s.in_flight,
                    s.dead_lettered,
                )
                for s in stats
            }
            ledger.check(
                all(v == (0, 0, 0, 0) for v in left.values()), f"jobs left at the end: {left}"
            )
        finally:
            await client.close()
        server.terminate()
        code = await server.wait()
        ledger.check(code == 0, f"final graceful stop exited {code}")
        report = verify(open_data_dir(self.data_dir))
        errors = [p.human() for p in report.problems if p.severity == ERROR]
        ledger.check(not errors, f"sepp-log verify after the final stop: {errors[:3]}")
        ledger.check(
            any(s.verdict in ("match", "base") for s in report.snapshots),
            "no snapshot was compared with the log after the final stop",
        )
        # The state after the graceful stop, checked like a crash's: every job
        # finished, the schedule's ticks all fired once (those since the last
        # reserve still queued), no more than the cap leased at once.
        result = replay_to(open_data_dir(self.data_dir))
        if result.state is None:
            raise HarnessAbort(f"the final directory does not replay: {result.problems}")
        ledger.check_recovered(result.state, server.kill_ms)

    async def run(self) -> Report:
        started = time.monotonic()
        try:
            index = 0
            while self.report.crashes < self.options.crashes:
                before = self.report.crashes
                await self.cycle(index)
                index += 1
                if self.report.crashes != before and self.report.crashes % 50 == 0:
                    print(
                        f"  {self.report.crashes} crashes, {self.report.operations} operations, "
                        f"{len(self.report.violations)} violations "
                        f"({time.monotonic() - started:.0f}s)",
                        flush=True,
                    )
            if self.options.final:
                await self.final()
        except HarnessAbort as exc:
            self.report.violations.append(str(exc))
        self.report.elapsed_s = time.monotonic() - started
        return self.report


class HarnessAbort(RuntimeError):
    """The run cannot go on (the server does not start, the log does not replay)."""


class CrashedWhileStarting(Exception):
    """A server told to kill itself at a hook point did so before it listened."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__("crashed while starting")
        self.server = server


def run_harness(options: HarnessOptions) -> Report:
    harness = Harness(options)
    report = asyncio.run(harness.run())
    if not report.violations and not options.keep and options.workdir is None:
        shutil.rmtree(harness.workdir, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.crash",
        description="SIGKILL a real sepp server again and again; check what survived.",
    )
    parser.add_argument("--crashes", type=int, default=20, help="crash/restart cycles")
    parser.add_argument("--seed", type=int, help="seed (default: $SEPP_SEED, else random)")
    parser.add_argument("--fast", action="store_true", help="short cycles (the CI setting)")
    parser.add_argument("--no-points", action="store_true", help="no crashes at hook points")
    parser.add_argument("--no-fuzz", action="store_true", help="no hostile connection")
    parser.add_argument("--no-admin", action="store_true", help="no operator (admin mutations)")
    parser.add_argument("--no-disk-faults", action="store_true", help="no torn tails or bit flips")
    parser.add_argument("--workdir", help="keep data and logs here (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir even on success")
    parser.add_argument(
        "--drain-every",
        type=int,
        default=DRAIN_EVERY,
        help=f"cycles between drains of every dead letter (default {DRAIN_EVERY}; 0: never)",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.seed is not None:
        seed = args.seed
    elif os.environ.get("SEPP_SEED"):
        seed = int(os.environ["SEPP_SEED"])
    else:
        seed = random.SystemRandom().randrange(2**32)
    options = HarnessOptions(
        crashes=args.crashes,
        seed=seed,
        fast=args.fast,
        points=not args.no_points,
        fuzz=not args.no_fuzz,
        admin=not args.no_admin,
        disk_faults=not args.no_disk_faults,
        drain_every=args.drain_every,
        workdir=args.workdir,
        keep=args.keep,
        verbose=args.verbose,
    )
    print(f"sepp crash: {args.crashes} cycles, SEPP_SEED={seed}, build {build_name()}", flush=True)
    report = run_harness(options)
    flags = " ".join(
        f
        for f, on in (
            ("--fast", args.fast),
            ("--no-points", args.no_points),
            ("--no-fuzz", args.no_fuzz),
            ("--no-admin", args.no_admin),
            ("--no-disk-faults", args.no_disk_faults),
            (f"--drain-every {args.drain_every}", args.drain_every != DRAIN_EVERY),
        )
        if on
    )
    print(report.summary(f"python -m tools.crash --crashes {args.crashes} {flags}".rstrip()))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
