"""Snapshots: round trip, publication order, the fork mode on real files,
retention of snapshots and segments, and damaged snapshot files.

States are compared through `State.canonical()` against a replay of the logged
decisions (`helpers.History.state_at(seq)`), never against the engine itself.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import msgpack
import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_BODY_BYTES_MAX,
    RECORD_KIND_SNAPSHOT_JOBS,
    Record,
    encode_snapshot_header,
    scan_snapshot_records,
    snapshot_file_name,
)
from sepp.core import (
    RETRY_DEAD_LETTER,
    Enqueue,
    Nack,
    NewJob,
    Reserve,
    State,
    check_invariants,
)
from sepp.core.state import IN_FLIGHT, READY, SCHEDULED
from sepp.storage import Engine, RealFileSystem, RecoveryError, StorageOptions
from sepp.storage.faultfs import FaultyFileSystem
from sepp.storage.iopriority import IOPRIO_CLASS_IDLE, io_priority_class
from sepp.storage.snapshots import (
    RECORD_BYTES_BUDGET,
    SnapshotError,
    SnapshotRowTooLarge,
    _record_bodies,
    encode_snapshot,
    load_snapshot,
    write_snapshot_file,
)
from tests.storage.helpers import (
    CONFIG,
    DATA_DIR,
    SNAP_DIR,
    T0,
    WAL_DIR,
    History,
    Workload,
    durable_log_seq,
    enqueue_one,
    inline_options,
    numbered_id,
    open_engine,
    segment_paths,
    segment_records,
    snapshot_paths,
)

WAIT_S = 20.0


def snap_path(seq: int, snap_dir: str = SNAP_DIR) -> str:
    return os.path.join(snap_dir, snapshot_file_name(seq))


def rich_history(engine: Engine, history: History, rng: Any, commands: int) -> int:
    """Every kind of content a snapshot must carry: Ready, Scheduled and In-flight
    jobs, dedup keys, dead letters; then `commands` random ones. Flushed."""
    now = T0
    keyed = NewJob(job_id=numbered_id(1), queue="a", job_type="t", idempotency_key="k1")
    later = NewJob(job_id=numbered_id(2), queue="b", job_type="t", scheduled_at=T0 + 50_000)
    doomed = NewJob(job_id=numbered_id(3), queue="c", job_type="t", custom={"x": 1, "y": "z"})
    steps: list[Any] = [
        Enqueue(
            jobs=(keyed, later, doomed, NewJob(job_id=numbered_id(4), queue="a", job_type="u"))
        ),
        Reserve(queues=("c",), lease_ms=60_000),
        Nack(job_id=numbered_id(3), attempt=1, retry=RETRY_DEAD_LETTER, reason="bad"),
        Reserve(queues=("a",), lease_ms=60_000),
    ]
    for command in steps:
        history.executed(*engine.execute(command, now))
    workload = Workload(rng)
    for _ in range(commands):
        now = workload.advance(now)
        history.executed(*engine.execute(workload.command(engine.state, now), now))
        if rng.random() < 0.3:
            engine.flush()
    engine.flush()
    return now


def _has_every_kind_of_content(state: State) -> bool:
    statuses = {job.status for job in state.jobs.values()}
    return {READY, SCHEDULED, IN_FLIGHT} <= statuses and bool(state.dedup) and bool(state.dead)


# ---------------------------------------------------------------- round trip


def test_snapshot_round_trip_restores_the_same_state(rng: Any) -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(segment_bytes_max=4096))
    history = History()
    rich_history(engine, history, rng, commands=0)
    assert _has_every_kind_of_content(engine.state)
    seq = engine.snapshot_now()
    assert seq == engine.appended_seq == engine.snapshot_seq
    expected = history.state_at(seq).canonical()
    state, last_seq = load_snapshot(fs, snap_path(seq), CONFIG)
    assert last_seq == seq
    assert state.canonical() == expected
    check_invariants(state)
    engine.close()
    again = open_engine(fs, inline_options(segment_bytes_max=4096))
    report = again.recovery_report
    assert (report.snapshot_path, report.snapshot_seq) == (snap_path(seq), seq)
    assert report.records_replayed == 0  # from the snapshot alone
    assert again.state.canonical() == expected
    # And the restored state goes on like the original would.
    decision, barrier = again.execute(Reserve(queues=("a", "b"), lease_ms=1_000), T0 + 10**6)
    history.executed(decision, barrier)
    assert again.state.canonical() == history.state_at(barrier).canonical()


def test_snapshot_round_trip_of_random_states(rng: Any) -> None:
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=8192, snapshots_kept=3)
    engine = open_engine(fs, options)
    history = History()
    workload = Workload(rng)
    now = T0
    for _round in range(15):
        for _ in range(rng.randrange(5, 60)):
            now = workload.advance(now)
            history.executed(*engine.execute(workload.command(engine.state, now), now))
        seq = engine.snapshot_now()
        if seq == 0:
            # Nothing was logged yet (every command so far was refused or a no-op):
            # there is nothing to snapshot.
            assert engine.appended_seq == 0
            continue
        state, last_seq = load_snapshot(fs, snap_path(seq), CONFIG)
        assert last_seq == seq
        assert state.canonical() == history.state_at(seq).canonical() == engine.state.canonical()


# ---------------------------------------------------------------- large jobs

MIB = 1024 * 1024


def _snapshot_records(data: bytes) -> list[Any]:
    return [item for item in scan_snapshot_records(data) if isinstance(item, Record)]


def test_seventy_live_jobs_of_one_mib_make_a_loadable_snapshot() -> None:
    # 64 jobs of 1 MiB filled one 2,048-row record past the 64 MiB record limit:
    # every snapshot failed (issue 13 §3). Records are now cut by bytes.
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options())
    history = History()
    payload = bytes(range(256)) * (4 * 1024)  # 1 MiB, one object shared by every job
    for n in range(70):
        job = NewJob(
            job_id=numbered_id(n),
            queue=f"q{n // 32}",
            job_type="big",
            payload_data=payload,
            payload_encoding="raw",
        )
        history.executed(*engine.execute(Enqueue(jobs=(job,)), T0 + n))
    engine.flush()
    seq = engine.snapshot_now()
    assert seq == engine.appended_seq == 70
    data = fs.read(snap_path(seq))
    bodies = [len(r.body) for r in _snapshot_records(data)]
    assert max(bodies) <= RECORD_BYTES_BUDGET
    state, last_seq = load_snapshot(fs, snap_path(seq), CONFIG)
    assert last_seq == seq
    assert len(state.jobs) == 70
    assert state.canonical() == history.state_at(seq).canonical()
    engine.close()


def _state_with_jobs(sizes: list[int]) -> tuple[State, History]:
    """A state holding one ready job per entry of `sizes`, its payload that long."""
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options())
    history = History()
    for n, size in enumerate(sizes):
        job = NewJob(
            job_id=numbered_id(n),
            queue=f"q{n // 32}",
            job_type="t",
            payload_data=b"x" * size,
            payload_encoding="raw",
        )
        history.executed(*engine.execute(Enqueue(jobs=(job,)), T0 + n))
    assert len(engine.state.jobs) == len(sizes)
    return engine.state, history


@pytest.mark.parametrize("budget", [1, 3_000, 10_000, 50_000])
def test_snapshot_records_are_cut_by_bytes_and_a_larger_row_goes_alone(
    budget: int, rng: Any
) -> None:
    sizes = [rng.choice((1, 10, 500, 2_000, 9_000, 20_000)) for _ in range(60)]
    state, _history = _state_with_jobs(sizes)
    data = b"".join(encode_snapshot(state, 60, record_bytes_budget=budget))
    jobs_records = [r for r in _snapshot_records(data) if r.kind == RECORD_KIND_SNAPSHOT_JOBS]
    rows = [msgpack.unpackb(r.body) for r in jobs_records]
    assert sum(len(chunk) for chunk in rows) == 60
    for record, chunk in zip(jobs_records, rows, strict=True):
        # Within the budget, or one row alone that is larger than it.
        assert len(record.body) <= budget or len(chunk) == 1
    # Greedy: a record was cut only because its next row would have passed the budget.
    for record, following in zip(jobs_records, rows[1:], strict=False):
        assert len(record.body) + len(msgpack.packb(following[0])) > budget
    fs = FaultyFileSystem()
    fs.makedirs(SNAP_DIR)
    write_snapshot_file(fs, snap_path(60), state, 60, record_bytes_budget=budget)
    loaded, _seq = load_snapshot(fs, snap_path(60), CONFIG)
    assert loaded.canonical() == state.canonical()


def test_snapshot_records_still_hold_at_most_2048_rows() -> None:
    state, _history = _state_with_jobs([1] * 2_100)
    data = b"".join(encode_snapshot(state, 2_100))
    counts = [
        len(msgpack.unpackb(r.body))
        for r in _snapshot_records(data)
        if r.kind == RECORD_KIND_SNAPSHOT_JOBS
    ]
    assert counts == [2_048, 52]


def test_a_row_too_large_for_any_record_fails_the_snapshot_with_a_typed_error() -> None:
    huge = ["x" * (RECORD_BODY_BYTES_MAX - 4)]
    with pytest.raises(SnapshotRowTooLarge, match="does not fit in one record"):
        list(_record_bodies(iter([huge]), 2048, RECORD_BYTES_BUDGET))


# ---------------------------------------------------------------- publication


@pytest.mark.parametrize("mode", ["sync_all", "sync_data", "buffer"])
def test_snapshot_is_published_only_after_the_log_up_to_its_seq_is_durable(mode: str) -> None:
    fs = FaultyFileSystem()
    seen: list[tuple[int, int]] = []

    def hook(point: str) -> None:
        if point == "snapshot.before_rename":
            seen.append((engine.durable_seq, durable_log_seq(fs)))

    options = inline_options(persist_mode=mode)
    engine = open_engine(fs, options, hook=hook)
    for n in range(5):
        engine.execute(enqueue_one(n), T0 + n)
    engine.flush()
    engine.sync()
    for n in range(5, 9):
        engine.execute(enqueue_one(n), T0 + n)  # buffered, not written
    assert engine.start_snapshot()
    # The temp file is complete, but records 6..9 are not durable: the snapshot
    # must wait. (A bounded join gives a wrong implementation time to misbehave.)
    engine.wait_snapshot(timeout=0.2)
    assert engine.snapshot_running()
    assert snapshot_paths(fs) == [] and seen == []
    assert fs.listdir(SNAP_DIR) == [snapshot_file_name(9) + ".tmp"]
    engine.flush()
    engine.wait_snapshot(timeout=WAIT_S)
    assert not engine.snapshot_running() and engine.snapshot_error is None
    assert snapshot_paths(fs) == [snap_path(9)] and engine.snapshot_seq == 9
    ((durable_seq, on_disk),) = seen
    assert durable_seq >= 9 and on_disk >= 9  # the log under it was on disk first
    assert snap_path(9) in fs.durable_files()  # published = renamed and dir synced
    fs.crash()
    again = open_engine(fs, options)
    assert again.recovery_report.snapshot_seq == 9 and again.appended_seq == 9


def test_snapshot_in_buffer_mode_survives_a_crash() -> None:
    # Regression: in buffer mode `durable_seq` means written, not synced. The
    # snapshot was published over an unsynced log, a crash kept the snapshot and
    # lost the log, and recovery refused to start (snapshot newer than the log).
    fs = FaultyFileSystem()
    options = inline_options(persist_mode="buffer")
    engine = open_engine(fs, options)
    history = History()
    for n in range(6):
        history.executed(*engine.execute(enqueue_one(n), T0 + n))
    assert engine.snapshot_now() == 6
    fs.crash()
    again = open_engine(fs, options)
    assert again.recovery_report.snapshot_seq == 6
    assert again.state.canonical() == history.state_at(6).canonical()


def test_nothing_new_means_no_new_snapshot() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    assert engine.start_snapshot() is False  # the empty log
    engine.execute(enqueue_one(0), T0)
    assert engine.snapshot_now() == 1
    assert engine.start_snapshot() is False
    assert engine.snapshot_now() == 1
    assert snapshot_paths(fs) == [snap_path(1)]


# ---------------------------------------------------------------- fork mode


def test_fork_snapshot_is_loadable_while_the_parent_keeps_executing(
    tmp_path: Any, rng: Any
) -> None:
    fs = RealFileSystem()
    data_dir = str(tmp_path / "data")
    options = StorageOptions(snapshot_mode="fork", segment_bytes_max=64 * 1024)
    engine = Engine.open(data_dir, CONFIG, options, fs=fs)
    assert engine.snapshot_mode == "fork"
    history = History()
    now = rich_history(engine, history, rng, commands=1_500)
    workload = Workload(rng)
    for _ in range(3):  # some not yet durable when the child starts
        now = workload.advance(now)
        history.executed(*engine.execute(workload.command(engine.state, now), now))
    seq = engine.appended_seq
    assert engine.start_snapshot()
    assert engine.snapshot_running()
    # The parent goes on deciding and logging while the child writes its copy.
    for _ in range(300):
        now = workload.advance(now)
        history.executed(*engine.execute(workload.command(engine.state, now), now))
        engine.flush()
    engine.wait_snapshot(timeout=WAIT_S)
    assert not engine.snapshot_running()
    assert engine.snapshot_error is None and engine.snapshot_seq == seq
    path = snap_path(seq, os.path.join(data_dir, "snapshots"))
    assert os.listdir(os.path.join(data_dir, "snapshots")) == [os.path.basename(path)]
    state, last_seq = load_snapshot(fs, path, CONFIG)
    assert last_seq == seq
    assert state.canonical() == history.state_at(seq).canonical()
    assert engine.appended_seq > seq
    live = engine.state.canonical()
    engine.close()
    again = Engine.open(data_dir, CONFIG, options, fs=fs)
    assert again.recovery_report.snapshot_seq == seq
    assert again.state.canonical() == live == history.state_at(again.appended_seq).canonical()
    again.close()


class _PriorityRecordingFS(RealFileSystem):
    """Writes, from whichever process creates the snapshot's temp file, that
    process's I/O priority class and whether it is the test process."""

    def __init__(self, record: str) -> None:
        super().__init__()
        self.record = record

    def create(self, path: str) -> int:
        if path.endswith(".tmp"):
            with open(self.record, "w") as f:
                f.write(f"{os.getpid()} {io_priority_class()}")
        return super().create(path)


@pytest.mark.skipif(io_priority_class() is None, reason="ioprio_get unknown on this platform")
def test_the_fork_snapshot_writer_runs_in_the_idle_io_class(tmp_path: Any) -> None:
    # Issue 13 §3: the log's syncs go before the snapshot's writes.
    record = str(tmp_path / "priority")
    fs = _PriorityRecordingFS(record)
    options = StorageOptions(snapshot_mode="fork")
    engine = Engine.open(str(tmp_path / "data"), CONFIG, options, fs=fs)
    engine.execute(enqueue_one(0), T0)
    own_class = io_priority_class()
    assert engine.snapshot_now() == 1
    engine.close()
    with open(record) as f:
        pid, klass = f.read().split()
    assert int(pid) != os.getpid()  # written by the child
    assert int(klass) == IOPRIO_CLASS_IDLE != own_class
    assert io_priority_class() == own_class  # the server's own priority is unchanged


class _SnapshotTimingFS(RealFileSystem):
    """Appends to `record`, from the process writing a snapshot temp file, the
    monotonic times of its writes ("w t") and syncs ("s start end")."""

    def __init__(self, record: str) -> None:
        super().__init__()
        self.record = record
        self.snapshot_handles: set[int] = set()

    def create(self, path: str) -> int:
        handle = super().create(path)
        if path.endswith(".tmp"):
            self.snapshot_handles.add(handle)
        return handle

    def _note(self, line: str) -> None:
        with open(self.record, "a") as f:
            f.write(line + "\n")

    def write(self, handle: int, data: bytes | bytearray | memoryview) -> None:
        if handle in self.snapshot_handles:
            self._note(f"w {time.monotonic()}")
        super().write(handle, data)

    def fdatasync(self, handle: int) -> None:
        started = time.monotonic()
        super().fdatasync(handle)
        if handle in self.snapshot_handles:
            self._note(f"s {started} {time.monotonic()}")


def test_the_fork_snapshot_writer_leaves_the_disk_idle_as_long_as_each_sync_took(
    tmp_path: Any,
) -> None:
    # Issue 13: back-to-back snapshot chunks made the log's syncs queue behind them.
    record = str(tmp_path / "timing")
    fs = _SnapshotTimingFS(record)
    engine = Engine.open(
        str(tmp_path / "data"), CONFIG, StorageOptions(snapshot_mode="fork"), fs=fs
    )
    for n in range(600):  # a snapshot of ~2.4 MB: a chunk and a rest
        engine.execute(enqueue_one(n, payload_bytes=4000), T0 + n)
    assert engine.snapshot_now() == 600
    engine.close()
    with open(record) as f:
        events = [line.split() for line in f]
    gaps = [
        (float(after[1]) - float(sync[2]), float(sync[2]) - float(sync[1]))
        for sync, after in itertools.pairwise(events)
        if sync[0] == "s" and after[0] == "w"
    ]
    assert gaps, events
    for idle, synced in gaps:
        assert idle >= synced


def test_an_inline_snapshot_does_not_pause_between_chunks(tmp_path: Any, monkeypatch: Any) -> None:
    # Inline, the writer thread itself writes it: every pause would hold the log.
    fs = _SnapshotTimingFS(str(tmp_path / "timing"))
    engine = Engine.open(
        str(tmp_path / "data"), CONFIG, StorageOptions(snapshot_mode="inline"), fs=fs
    )
    for n in range(600):
        engine.execute(enqueue_one(n, payload_bytes=4000), T0 + n)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert engine.snapshot_now() == 600
    engine.close()
    assert slept == []


# ---------------------------------------------------------------- retention


def _segment_spans(fs: FaultyFileSystem) -> list[tuple[str, int, int]]:
    """(path, first_seq, last_seq) of each segment, from its bytes."""
    spans = []
    for path in segment_paths(fs):
        first_seq, records, _end = segment_records(fs.read(path))
        spans.append((path, first_seq, records[-1].seq if records else first_seq - 1))
    return spans


def test_retention_keeps_only_the_newest_snapshots() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(snapshots_kept=2))
    taken = []
    for n in range(5):
        engine.execute(enqueue_one(n), T0 + n)
        taken.append(engine.snapshot_now())
    assert taken == [1, 2, 3, 4, 5]
    assert snapshot_paths(fs) == [snap_path(4), snap_path(5)]
    durable = {p for p in fs.durable_files() if p.startswith(SNAP_DIR)}
    assert durable == {snap_path(4), snap_path(5)}


@pytest.mark.parametrize("kept", [1, 2, 3])
def test_retention_deletes_segments_wholly_below_the_oldest_kept_snapshot(kept: int) -> None:
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=4096, snapshots_kept=kept)
    engine = open_engine(fs, options)
    history = History()
    n = 0
    for _round in range(6):
        for _ in range(17):
            history.executed(*engine.execute(enqueue_one(n, payload_bytes=200), T0 + n))
            engine.flush()
            n += 1
        before = _segment_spans(fs)
        engine.snapshot_now()
        snaps = snapshot_paths(fs)
        assert len(snaps) == min(kept, _round + 1)
        base = int(os.path.basename(snaps[0]).split(".")[0])
        expected = [p for p, _first, last in before[:-1] if last > base] + [before[-1][0]]
        assert segment_paths(fs) == expected
        assert _segment_spans(fs)[0][1] <= base + 1  # the log reaches the oldest snapshot
        assert [s.path for s in engine.segments] == expected
    assert len(before) > len(segment_paths(fs))  # something was deleted
    fs.crash()
    again = open_engine(fs, options)
    assert again.state.canonical() == history.state_at(n).canonical()


def test_retention_keeps_the_segment_holding_the_record_after_the_oldest_snapshot() -> None:
    # Three ~1.4 KB records per 4 KiB segment: segments 1..3, 4..6, 7..9, 10..12.
    # Snapshots at 5 and 12, two kept: the oldest kept is 5, so records 6.. are
    # needed and segment 4..6 must stay even though only its last record is.
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=4096, snapshots_kept=2)
    engine = open_engine(fs, options)
    history = History()
    for n in range(12):
        history.executed(*engine.execute(enqueue_one(n, payload_bytes=1300), T0 + n))
        engine.flush()
        if n + 1 in (5, 12):
            engine.snapshot_now()
    spans = [(first, last) for _path, first, last in _segment_spans(fs)]
    assert spans == [(4, 6), (7, 9), (10, 12)]  # 1..3 is gone, 4..6 is not
    engine.close()
    fs.flip_bit(snap_path(12), FILE_HEADER_BYTES + 30, 0)
    again = open_engine(fs, options)
    assert again.recovery_report.snapshot_seq == 5
    assert again.state.canonical() == history.state_at(12).canonical()


def test_retention_falls_back_to_the_oldest_kept_snapshot_after_deleting() -> None:
    # Segments are kept down to the oldest kept snapshot, so a damaged newest one
    # still has an older one and the log behind it (row 11 after retention ran).
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=4096, snapshots_kept=2)
    engine = open_engine(fs, options)
    history = History()
    for n in range(60):
        history.executed(*engine.execute(enqueue_one(n, payload_bytes=200), T0 + n))
        engine.flush()
        if n % 20 == 19:
            engine.snapshot_now()
    engine.close()
    older, newest = snapshot_paths(fs)
    fs.flip_bit(newest, FILE_HEADER_BYTES + 30, 2)
    again = open_engine(fs, options)
    assert again.recovery_report.snapshot_path == older
    assert again.state.canonical() == history.state_at(60).canonical()


def test_log_retention_keeps_covered_segments_until_they_are_old_enough() -> None:
    fs = FaultyFileSystem()
    retention = 25_000
    options = inline_options(segment_bytes_max=4096, snapshots_kept=1, log_retention_ms=retention)
    engine = open_engine(fs, options)
    history = History()
    times: dict[int, int] = {}
    for n in range(80):
        decision, barrier = engine.execute(enqueue_one(n, payload_bytes=200), T0 + 1_000 * n)
        history.executed(decision, barrier)
        times[barrier] = T0 + 1_000 * n
        engine.flush()

    def expected_after_retention(clock: int, base: int) -> list[str]:
        spans = _segment_spans(fs)
        keep = []
        for index, (path, _first, last) in enumerate(spans):
            active = index == len(spans) - 1
            deletable = last <= base and times[last] <= clock - retention
            if active or not deletable or keep:
                keep.append(path)
        return keep

    all_segments = segment_paths(fs)
    assert len(all_segments) >= 5
    expected = expected_after_retention(engine.state.clock_ms, 80)
    assert engine.snapshot_now() == 80
    assert segment_paths(fs) == expected
    assert all_segments[0] not in expected  # old and covered: gone
    assert len(expected) >= 2  # covered but younger than the retention: kept
    # The segments' ages survive a restart (for segments the snapshot covers, the
    # time of their last record is decoded without replaying them).
    engine.close()
    engine = open_engine(fs, options)
    assert engine.apply_retention() == []
    assert segment_paths(fs) == expected
    # Time passes (a logged command moves the state clock); now they are old.
    later = T0 + 1_000 * 79 + retention
    history.executed(*engine.execute(enqueue_one(99), later))
    engine.flush()
    removed = engine.apply_retention()
    assert removed == expected[:-1]
    assert segment_paths(fs) == expected[-1:]  # the active segment stays
    fs.crash()
    again = open_engine(fs, options)
    assert again.state.canonical() == history.state_at(81).canonical()


def test_log_retention_boundary_is_inclusive() -> None:
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=4096, snapshots_kept=1, log_retention_ms=5_000)
    engine = open_engine(fs, options)
    for n in range(12):
        engine.execute(enqueue_one(n, payload_bytes=600), T0)
        engine.flush()
    first = segment_paths(fs)[0]
    assert len(segment_paths(fs)) >= 2
    engine.execute(enqueue_one(100), T0 + 4_999)
    engine.snapshot_now()
    assert first in segment_paths(fs)  # newest record 4_999 ms old: kept
    engine.execute(enqueue_one(101), T0 + 5_000)
    engine.flush()
    assert first in engine.apply_retention()  # exactly 5_000 ms old: deleted


@pytest.mark.parametrize("segments", ["one", "several"])
def test_retention_never_deletes_the_active_segment(segments: str) -> None:
    fs = FaultyFileSystem()
    limit = 64 * 1024 * 1024 if segments == "one" else 4096
    options = inline_options(segment_bytes_max=limit, snapshots_kept=1)
    engine = open_engine(fs, options)
    for n in range(30):
        engine.execute(enqueue_one(n, payload_bytes=200), T0 + n)
        engine.flush()
    active = engine.segments[-1].path
    assert engine.snapshot_now() == 30  # covers every record, the active ones too
    assert engine.apply_retention() == []
    assert segment_paths(fs) == [active]
    engine.execute(enqueue_one(31), T0 + 100)
    assert engine.flush() == 31
    engine.close()
    again = open_engine(fs, options)
    assert again.appended_seq == 31


# ---------------------------------------------------------------- damaged snapshots


def _written_with_snapshots(rng: Any) -> tuple[FaultyFileSystem, History, StorageOptions]:
    """Rich random content, two snapshots (kept=2), at least four segments below
    the newest one, and a few records after it."""
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=4096, snapshots_kept=2)
    engine = open_engine(fs, options)
    history = History()
    now = rich_history(engine, history, rng, commands=40)
    engine.snapshot_now()
    workload = Workload(rng)
    while len(engine.segments) < 4:
        now = workload.advance(now)
        history.executed(*engine.execute(workload.command(engine.state, now), now))
        engine.flush()
    engine.snapshot_now()
    for _ in range(10):
        now = workload.advance(now)
        history.executed(*engine.execute(workload.command(engine.state, now), now))
    engine.close()
    return fs, history, options


def _clone(fs: FaultyFileSystem) -> FaultyFileSystem:
    copy = FaultyFileSystem()
    copy.makedirs(WAL_DIR)
    copy.makedirs(SNAP_DIR)
    for path, data in fs.durable_files().items():
        copy.put(path, data)
    return copy


def test_flipped_bit_anywhere_in_a_snapshot_is_refused_and_recovery_falls_back(
    rng: Any,
) -> None:
    fs, history, options = _written_with_snapshots(rng)
    older, newest = snapshot_paths(fs)
    size = len(fs.read(newest))
    last_seq = history.records[-1].seq
    expected = history.state_at(last_seq).canonical()
    for _ in range(30):
        damaged = _clone(fs)
        damaged.flip_bit(newest, rng.randrange(size), rng.randrange(8))
        with pytest.raises(SnapshotError) as info:
            load_snapshot(damaged, newest, CONFIG)
        assert info.value.path == newest
        engine = Engine.open(DATA_DIR, CONFIG, options, fs=damaged)
        report = engine.recovery_report
        assert report.snapshot_path == older
        assert report.skipped_snapshots == [(newest, info.value.reason)]
        assert engine.state.canonical() == expected


def _end_record_offset(data: bytes) -> int:
    records = [item for item in scan_snapshot_records(data) if hasattr(item, "kind")]
    return int(records[-1].offset)


DAMAGES = {
    # name: (make the damaged bytes from the good ones, SnapshotError reason)
    "missing_end": (
        lambda d, seq: d[: _end_record_offset(d)],
        "incomplete snapshot: no end record",
    ),
    "cut_mid_record": (lambda d, seq: d[: _end_record_offset(d) - 5], None),
    "trailing_bytes": (
        lambda d, seq: d + b"\x00\x01",
        "trailing data after snapshot end record",
    ),
    "forged_header_last_seq": (
        lambda d, seq: encode_snapshot_header(seq + 3) + d[FILE_HEADER_BYTES:],
        "last_seq {forged} does not match file name",
    ),
    "truncated_header": (lambda d, seq: d[:20], "bad header: truncated header"),
    "empty": (lambda d, seq: b"", "bad header: truncated header"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_snapshot_file_is_refused_with_snapshot_error(damage: str, rng: Any) -> None:
    fs, history, options = _written_with_snapshots(rng)
    older, newest = snapshot_paths(fs)
    seq = int(os.path.basename(newest).split(".")[0])
    make, reason = DAMAGES[damage]
    fs.put(newest, make(fs.read(newest), seq))
    with pytest.raises(SnapshotError) as info:
        load_snapshot(fs, newest, CONFIG)
    if reason is not None:
        assert info.value.reason == reason.format(forged=seq + 3)
    # Recovery: an older snapshot and the log cover -> fall back (row 11) ...
    engine = Engine.open(DATA_DIR, CONFIG, options, fs=_clone(fs))
    assert engine.recovery_report.snapshot_path == older
    assert engine.recovery_report.skipped_snapshots == [(newest, info.value.reason)]
    assert engine.state.canonical() == history.state_at(history.records[-1].seq).canonical()
    # ... without the older one, and the log trimmed as retention would, -> refuse
    # (row 12).
    fs.remove(older)
    for path, _first, last in _segment_spans(fs)[:-1]:
        if last <= seq:
            fs.remove(path)
    assert segment_records(fs.read(segment_paths(fs)[0]))[0] > 1
    with pytest.raises(RecoveryError) as refused:
        Engine.open(DATA_DIR, CONFIG, options, fs=fs)
    assert refused.value.path == newest
    assert refused.value.reason == (
        f"no usable snapshot ({info.value.reason}) and the log does not start at seq 1"
    )


def test_forged_header_and_begin_record_disagreeing_is_refused(rng: Any) -> None:
    # A header forged with a valid checksum *and* a matching file name still
    # disagrees with the BEGIN record inside.
    fs, _history, _options = _written_with_snapshots(rng)
    _older, newest = snapshot_paths(fs)
    seq = int(os.path.basename(newest).split(".")[0])
    forged = snap_path(seq + 1)
    fs.put(forged, encode_snapshot_header(seq + 1) + fs.read(newest)[FILE_HEADER_BYTES:])
    with pytest.raises(SnapshotError) as info:
        load_snapshot(fs, forged, CONFIG)
    assert info.value.reason == "BEGIN last_seq disagrees with the header"


def test_paced_retention_pauses_in_proportion_to_each_segment_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forked snapshot's retention pauses between deletions (unlinking a 64 MiB
    segment stalls the next fdatasync); a small segment pauses in proportion, so
    hundreds of 4 KiB segments do not hold off the next snapshot for seconds."""
    from sepp.storage import engine as engine_module

    fs = FaultyFileSystem()
    day = 86_400_000
    options = inline_options(segment_bytes_max=4096, snapshots_kept=1, log_retention_ms=day)
    engine = open_engine(fs, options)
    for n in range(60):
        engine.execute(enqueue_one(n, payload_bytes=200), T0 + n)
        engine.flush()
    engine.snapshot_now()  # covered, but not a day old: nothing deleted yet
    sizes = [s.size for s in engine.segments]
    assert len(sizes) > 3
    engine.execute(enqueue_one(60, payload_bytes=200), T0 + 2 * day)  # a day later
    engine.flush()
    pauses: list[float] = []
    monkeypatch.setattr(engine_module.time, "sleep", pauses.append)
    removed = engine.apply_retention(pace_s=0.05)
    deleted = len(removed)
    assert deleted >= 3
    scale = engine_module.RETENTION_PACE_BYTES
    # No pause before the first deletion; then one per segment, by its size.
    assert pauses == pytest.approx([0.05 * size / scale for size in sizes[1:deleted]])
