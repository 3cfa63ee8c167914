"""Schedules at scale (issue 17): 10,000 schedules in one state, the cost of the sweep
that fires their ticks, per fired tick, and of a sweep when nothing is due.

In process, on the core alone (decide + apply, as the server runs a sweep; no log
write: the WAL's cost per record is bench_wal's). Targets: <= 1 ms per fired tick,
and a sweep with nothing due that does not grow with the number of schedules (a
heap of next ticks, not a scan). Compared against: the same state with 10
schedules (the nothing-due sweep must cost the same).

    python -m benchmarks.bench_schedules [--schedules 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

from benchmarks.common import machine_line, median, print_table
from sepp.core import CoreConfig, State, Sweep, apply_record, decide
from sepp.core.commands import PutSchedule
from sepp.core.decide import Decision

T0 = 1_700_000_000_000
EVERY_MS = 60_000


def build(count: int, spread_ms: int) -> State:
    """`count` every-minute schedules, their first ticks spread over `spread_ms`."""
    state = State(CoreConfig(sweep_limit=100_000))
    for i in range(count):
        now = T0 + (i * spread_ms) // count
        decision = decide(
            state,
            PutSchedule(
                actor="bench", role="admin", name=f"s{i}", queue=f"q{i % 50}",
                job_type="tick", every_ms=EVERY_MS,
            ),
            now,
        )  # fmt: skip
        assert isinstance(decision, Decision), decision
        apply_record(state, decision.time_ms, decision.events)
    return state


def sweep_once(state: State, now: int) -> tuple[float, int]:
    start = time.perf_counter()
    decision = decide(state, Sweep(), now)
    assert isinstance(decision, Decision)
    apply_record(state, decision.time_ms, decision.events)
    elapsed = time.perf_counter() - start
    return elapsed, decision.reply.schedule_ticks_fired  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine_line())
    rows = []
    for count in (10, args.schedules):
        idle_us, per_tick_us, fired_total = [], [], 0
        for _ in range(args.rounds):
            # First ticks spread over the first minute after T0 + EVERY_MS.
            state = build(count, EVERY_MS)
            # Nothing due: 1,000 sweeps just before the earliest tick.
            start = time.perf_counter()
            for _ in range(1_000):
                decision = decide(state, Sweep(), T0 + EVERY_MS - 1)
                assert isinstance(decision, Decision) and not decision.events
            idle_us.append((time.perf_counter() - start) / 1_000 * 1e6)
            # Every tick due at once (the worst case: one sweep fires them all),
            # then a second minute fired by sweeps every 100 ms (the usual case).
            elapsed, fired = sweep_once(state, T0 + 2 * EVERY_MS)
            spent, fired_steady = 0.0, 0
            for step in range(1, 601):
                e, f = sweep_once(state, T0 + 2 * EVERY_MS + step * 100)
                spent += e
                fired_steady += f
            fired_total += fired + fired_steady
            per_tick_us.append((elapsed + spent) / max(fired + fired_steady, 1) * 1e6)
        rows.append(
            (
                count,
                f"{median(idle_us):.1f}",
                f"{median(per_tick_us):.1f}",
                fired_total // args.rounds,
            )
        )
    print_table(
        ("schedules", "sweep, nothing due (us)", "sweep per fired tick (us)", "ticks fired/round"),
        rows,
    )
    print("targets: per fired tick <= 1000 us; nothing due: flat in the number of schedules")


if __name__ == "__main__":
    main()
