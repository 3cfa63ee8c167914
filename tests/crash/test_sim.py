"""The deterministic simulation (`tools/sim.py`): a few hundred seeds of random
workloads and crashes (power loss and process kill at random moments, file
operations and hook points; torn writes; crashes during recovery; EIO and ENOSPC
on writes and syncs; a full disk; flipped bits in segments and snapshots) against
the reference model. Also: that the simulation is deterministic and that it does
catch a storage engine that acknowledges before it is durable.
"""

from __future__ import annotations

from typing import Any

import pytest

from sepp.storage import recovery, wal
from tools import sim

CI_SEEDS = 300


def _first_seed(seed: int) -> int:
    return seed % 10**9


def test_hundreds_of_simulated_seeds_hold_every_promise(seed: int) -> None:
    first = _first_seed(seed)
    summary = sim.run_seeds(range(first, first + CI_SEEDS))
    failures = [
        f"{r.violation}\n  replay: {sim.replay_command(r.seed)}" for r in summary.failures[:5]
    ]
    assert not failures, "\n".join(failures)
    assert summary.seeds == CI_SEEDS
    stats = summary.stats
    assert summary.cycles >= 3 * CI_SEEDS, summary.cycles
    # Every kind of fault happened, and the crashes cut where it matters.
    for fault in sim.FAULTS:
        assert stats[f"fault_{fault}"] > 0, fault
    for counter in (
        "truncated",
        "kept_in_doubt",
        "lost_in_doubt",
        "crashed_in_recovery",
        "failed_for_good",
        "refused_flipped_bit",
        "died_before_fsync",
        "died_at_wal.after_write",
        "power_loss_pages",
        "cut_unsynced_hole",
        # Issue 17: schedules fired under each catch-up policy (ScheduleAudit),
        # capped queues leased up to their max_in_flight (check_max_in_flight).
        "schedule_ticks_fired_every_all",
        "schedule_ticks_fired_every_one",
        "schedule_ticks_fired_every_none",
        "max_in_flight_reached",
    ):
        assert stats[counter] > 0, (counter, dict(stats))
    cron_ticks = sum(v for k, v in stats.items() if k.startswith("schedule_ticks_fired_cron_"))
    assert cron_ticks > 0, dict(stats)


def test_the_same_seed_replays_the_same_run(seed: int) -> None:
    first = _first_seed(seed)
    runs = [sim.run_seed(first) for _ in range(2)]
    assert runs[0].violation is None, runs[0].violation
    assert (runs[0].cycles, runs[0].operations, runs[0].stats) == (
        runs[1].cycles,
        runs[1].operations,
        runs[1].stats,
    )


def test_an_engine_that_skips_its_syncs_is_caught_with_a_replayable_seed(
    seed: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mutation test of the simulation itself: with every log sync turned into a
    no-op, some seed must report an acknowledged record lost to a power loss, print
    the command that replays it, and fail the same way when replayed."""

    def no_sync(self: Any, handle: int) -> None:
        return None

    monkeypatch.setattr(wal.SegmentWriter, "_sync", no_sync)
    first = _first_seed(seed)
    code = sim.main(["--seeds", "40", "--seed", str(first), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "an acknowledged record was lost" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("VIOLATION seed "))
    failing = int(line.split()[2].rstrip(":"))
    assert f"replay: SEPP_SEED={failing} python -m tools.sim --seeds 1" in out
    assert sim.run_seed(failing).violation == sim.run_seed(failing).violation is not None


def test_a_recovery_that_refuses_every_hole_is_caught_by_out_of_order_writeback(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mutation test of the writeback fault: with recovery treating every hole
    followed by valid records as corruption (sepp before FORMAT.md 5.4), an
    ordinary power cut must make some seed refuse to start."""
    monkeypatch.setattr(recovery, "unsynced_hole", lambda *args, **kwargs: None)
    first = _first_seed(seed)
    summary = sim.run_seeds(range(first, first + 60))
    refusals = [r for r in summary.failures if "corrupt record" in (r.violation or "")]
    assert refusals, [r.violation for r in summary.failures[:5]]
    assert "unexpected RecoveryError" in (refusals[0].violation or "")


@pytest.mark.soak
def test_soak_a_hundred_thousand_seeds(seed: int) -> None:
    first = _first_seed(seed)
    summary = sim.run_seeds(range(first, first + 100_000), jobs=2)
    assert not summary.failures, [
        (r.seed, r.violation, sim.replay_command(r.seed)) for r in summary.failures[:5]
    ]
