"""`sepp-log stats`: counts of segments, bytes, records and events by type and by
command, the seq and time ranges, and the per-minute event-rate histogram."""

from __future__ import annotations

from collections import Counter

from tests.tools.helpers import LiveLog, flip_bit, locate
from tools.datadir import open_data_dir
from tools.stats import MINUTE_MS, collect_stats, histogram_rows, minute_label

T0_MINUTE = 1_700_000_000_000 // MINUTE_MS  # 2023-11-14T22:13Z


def test_stats_count_everything_in_the_log(scripted: LiveLog) -> None:
    stats = collect_stats(open_data_dir(str(scripted.data_dir)))
    assert stats.problems == []
    assert (stats.segments, stats.records, stats.events) == (3, 40, 43)
    assert stats.log_bytes == sum(p.stat().st_size for p in (scripted.data_dir / "wal").iterdir())
    assert (stats.first_seq, stats.last_seq) == (1, 40)
    assert (stats.first_time_ms, stats.last_time_ms) == (scripted.times[1], scripted.times[40])
    assert dict(stats.by_type) == {
        "JobEnqueued": 25,
        "JobReserved": 6,
        "JobAcked": 2,
        "JobNacked": 1,
        "JobPromoted": 1,
        "JobLeaseExtended": 1,
        "JobDeadLettered": 3,
        "DeadLetterDrained": 1,
        "JobLeaseExpired": 1,
        "DedupExpired": 1,
        "DeadLetterExpired": 1,
    }
    assert dict(stats.by_command) == {
        "enqueue": 25,
        "reserve": 5,
        "ack": 2,
        "nack": 3,
        "sweep": 2,
        "extend": 1,
        "dead_letter_jobs": 1,
        "drain_dead_letters": 1,
    }
    # seqs 1..38 fall in 22:13 (seq 33 holds two events), 39..40 in 22:14.
    assert dict(stats.per_minute) == {T0_MINUTE: 39, T0_MINUTE + 1: 4}


def test_stats_go_on_after_damage_and_report_it(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 10)
    flip_bit(path, record.offset + 30)
    stats = collect_stats(open_data_dir(str(scripted.data_dir)))
    assert [(p.kind, p.seq) for p in stats.problems] == [("corruption", 10)]
    assert (stats.records, stats.exit_code) == (39, 1)


def test_histogram_has_a_row_per_minute_including_quiet_ones() -> None:
    rows = histogram_rows(Counter({100: 10, 103: 40}), bar_width=8)
    assert rows == [
        (100, 1, 10.0, "##"),
        (101, 1, 0.0, ""),
        (102, 1, 0.0, ""),
        (103, 1, 40.0, "########"),
    ]
    assert minute_label(T0_MINUTE) == "2023-11-14T22:13Z"


def test_histogram_of_a_long_range_averages_several_minutes_a_row() -> None:
    rows = histogram_rows(Counter({0: 30, 5: 60, 9: 1}), rows_max=4, bar_width=10)
    # 10 minutes in at most 4 rows: 3 minutes a row.
    assert rows == [
        (0, 3, 10.0, "#####"),
        (3, 3, 20.0, "##########"),
        (6, 3, 0.0, ""),
        (9, 3, 1 / 3, "."),
    ]
    assert histogram_rows(Counter()) == []
