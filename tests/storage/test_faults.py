"""Crash and fault injection on the fake file system (LevelDB's fault-injection env).

A seeded simulation runs random workloads (every command kind, time advancing,
snapshots, tiny segments, retention) and kills the "process" at random points:
between batches, before a chosen file operation (mid-write, between write and
sync, mid-rotation, mid-snapshot, mid-retention), at each named hook point, and
even during recovery. The file system then loses everything that was not durable,
optionally keeping a torn prefix of unsynced bytes. After every reopen:

- every command whose barrier was released (durable before the crash) is there,
  and nothing but a prefix of the unreleased tail: the state equals (canonical())
  a State rebuilt from exactly those records (`helpers.Oracle`);
- the invariants hold, the newest durable snapshot was used, and the engine
  accepts new commands (the next cycle runs on it).

Write and sync errors (EIO, ENOSPC, a full disk) fail the engine for good: every
later call raises StorageFailed and no write or sync is ever attempted again; a
reopen once the fault is gone recovers everything acknowledged.

`SEPP_SEED=... pytest tests/storage/test_faults.py` replays a run; the soak
variant (`-m soak`) runs many more cycles.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import Counter
from typing import Any

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    FormatError,
    decode_segment_header,
)
from sepp.core import check_invariants
from sepp.core.events import EVENT_CLASSES
from sepp.storage import Engine, RecoveryError, StorageFailed, StorageOptions
from sepp.storage.faultfs import MUTATING_OPS, Crasher, FaultyFileSystem, SimulatedCrash
from tests.storage.helpers import (
    CONFIG,
    DATA_DIR,
    SNAP_DIR,
    T0,
    WAL_DIR,
    History,
    Oracle,
    Workload,
    enqueue_one,
    inline_options,
    segment_paths,
    segment_records,
    snapshot_paths,
)

HOOK_POINTS = (
    "rotate.after_create",
    "rotate.after_header_sync",
    "rotate.after_dir_sync",
    "wal.after_write",
    "wal.after_sync",
    "snapshot.before_rename",
    "snapshot.after_rename",
    "snapshot.published",
    "retention.before_delete",
    "retention.after_delete",
)
DISK_OPS = MUTATING_OPS - {"truncate"}


@pytest.fixture(autouse=True)
def _dead_threads_die_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash raised inside the engine's snapshot thread ends that thread: that is
    the simulated process dying, not an error. Anything else is still reported."""
    previous = threading.excepthook

    def hook(args: Any) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, SimulatedCrash):
            return
        previous(args)

    monkeypatch.setattr(threading, "excepthook", hook)


def kill(engine: Engine) -> None:
    """The process is gone: wake a snapshot thread that waits for durability (it
    then meets the dead file system and ends) and wait for it."""
    if engine.snapshot_running():
        logger = logging.getLogger("sepp.storage")
        logger.disabled = True  # "storage failed permanently": expected here
        try:
            engine._fail(SimulatedCrash("process died"))
        finally:
            logger.disabled = False
    engine.wait_snapshot()


class Sim:
    """One data directory, one engine, the oracle, and crash/recover cycles."""

    def __init__(
        self,
        rng: Any,
        options: StorageOptions,
        *,
        snapshot_p: float = 0.12,
        commands_max: int = 6,
    ) -> None:
        self.rng = rng
        self.options = options
        self.snapshot_p = snapshot_p
        self.commands_max = commands_max
        self.buffered = options.persist_mode == "buffer"
        self.fs = FaultyFileSystem()
        self.crasher = Crasher()
        self.fs.hook = self.crasher.fs_hook
        self.oracle = Oracle()
        self.workload = Workload(rng)
        self.now = T0
        self.stats: Counter[str] = Counter()
        self.events_seen: Counter[str] = Counter()
        self.engine = self.open()

    # -- the process ---------------------------------------------------------

    def open(self) -> Engine:
        while True:
            try:
                return Engine.open(
                    DATA_DIR, CONFIG, self.options, fs=self.fs, hook=self.crasher.engine_hook
                )
            except SimulatedCrash:
                self.stats["crashed_during_recovery"] += 1
                self.fs.crash(self.rng, tear=True)
                self.crasher.reset()

    def step(self) -> None:
        """One batch of commands, one flush, sometimes a sync or a snapshot.
        Raises SimulatedCrash when the process dies."""
        engine, rng = self.engine, self.rng
        for _ in range(rng.randrange(1, self.commands_max + 1)):
            self.now = self.workload.advance(self.now)
            command = self.workload.command(engine.state, self.now)
            decision, barrier = engine.execute(command, self.now)
            self.oracle.executed(decision, barrier)
            for event in getattr(decision, "events", ()):
                self.events_seen[type(event).__name__] += 1
        engine.flush()
        if not self.buffered:
            self.oracle.release(engine.durable_seq)
        elif rng.random() < 0.5:
            engine.sync()  # buffer mode: only a sync makes written records durable
            self.oracle.release(engine.durable_seq)
        if rng.random() < self.snapshot_p:
            engine.snapshot_now()
            self.stats["snapshots"] += 1
        if self.crasher.dead:
            raise SimulatedCrash("died in the snapshot thread")

    def crash_and_recover(self, *, tear: bool, crash_in_recovery: bool = False) -> None:
        self.crasher.dead = True
        kill(self.engine)
        self.fs.crash(self.rng, tear=tear)
        self.crasher.reset()
        newest = (snapshot_paths(self.fs) or [None])[-1]
        if crash_in_recovery:
            self.crasher.arm_ops(self.rng.randrange(1, 4))
        self.engine = self.open()
        self.crasher.reset()
        self.check_recovered(newest)

    def check_recovered(self, newest_snapshot: str | None) -> None:
        engine = self.engine
        report = engine.recovery_report
        released, appended = self.oracle.released_seq, self.oracle.appended_seq
        self.oracle.recovered(engine.appended_seq)
        assert engine.state.canonical() == self.oracle.ref.canonical()
        check_invariants(engine.state)
        assert engine.durable_seq == engine.appended_seq == report.last_seq
        assert report.snapshot_path == newest_snapshot and report.skipped_snapshots == []
        assert not [n for n in self.fs.listdir(SNAP_DIR) if n.endswith(".tmp")]
        self.stats["cycles"] += 1
        self.stats["kept_unreleased"] += engine.appended_seq > released
        self.stats["lost_unreleased"] += engine.appended_seq < appended
        self.stats["truncated"] += report.truncated is not None
        self.stats["removed_torn_segment"] += any("/wal/" in f for f in report.removed_files)

    def run_until_crash(self, steps_max: int) -> None:
        for _ in range(steps_max):
            try:
                self.step()
            except SimulatedCrash:
                return
        raise AssertionError(f"the process never died in {steps_max} steps ({self.crasher.hits})")

    def finish(self) -> None:
        """A clean shutdown and restart keeps everything; commands go on after it."""
        for _round in range(2):
            self.engine.close()  # flushes and syncs: all of it is durable now
            self.oracle.release(self.engine.durable_seq)
            assert self.oracle.unreleased == []
            self.engine = self.open()
            self.check_recovered((snapshot_paths(self.fs) or [None])[-1])
            for _ in range(5):
                self.step()


def run_random_crashes(sim: Sim, cycles: int) -> None:
    rng = sim.rng
    for _cycle in range(cycles):
        if rng.random() < 0.3:
            # Die between batches: whatever was buffered but not flushed is lost.
            for _ in range(rng.randrange(0, 10)):
                sim.step()
        else:
            # Die right before one of the next file operations: mid-write, between
            # a write and its sync, mid-rotation, mid-snapshot, mid-retention.
            sim.crasher.arm_ops(rng.randrange(1, 120))
            sim.run_until_crash(400)
            op = (sim.crasher.killed_at or "").split(" ")[1]
            sim.stats["died_sync" if op in ("fsync", "fdatasync") else f"died_{op}"] += 1
        sim.crash_and_recover(tear=rng.random() < 0.5, crash_in_recovery=rng.random() < 0.15)
    sim.finish()


RANDOM_CYCLES = 800
RANDOM_CRASH_OPTIONS = {
    "sync_all": inline_options(persist_mode="sync_all", segment_bytes_max=4096),
    "sync_data_with_log_retention": inline_options(
        persist_mode="sync_data", segment_bytes_max=4096, log_retention_ms=3_000
    ),
    "buffer": inline_options(persist_mode="buffer", segment_bytes_max=4096, snapshots_kept=1),
}


@pytest.mark.parametrize("setup", sorted(RANDOM_CRASH_OPTIONS))
def test_random_crashes_never_lose_a_released_command(setup: str, rng: Any) -> None:
    sim = Sim(rng, RANDOM_CRASH_OPTIONS[setup])
    run_random_crashes(sim, cycles=RANDOM_CYCLES)
    stats = sim.stats
    assert stats["cycles"] >= RANDOM_CYCLES
    # The simulation reached the interesting places, not just the easy ones.
    assert stats["truncated"] >= 3, stats
    assert stats["kept_unreleased"] >= 3 and stats["lost_unreleased"] >= 10, stats
    assert stats["snapshots"] >= 10 and stats["died_sync"] >= 5, stats
    assert set(sim.events_seen) == {cls.__name__ for cls in EVENT_CLASSES}, sim.events_seen


@pytest.mark.soak
@pytest.mark.parametrize("setup", sorted(RANDOM_CRASH_OPTIONS))
def test_soak_random_crashes_never_lose_a_released_command(setup: str, rng: Any) -> None:
    sim = Sim(rng, RANDOM_CRASH_OPTIONS[setup])
    run_random_crashes(sim, cycles=20_000)
    assert sim.stats["cycles"] >= 20_000


# The setup that reaches each hook point quickly: kept=1 makes every snapshot
# delete the previous one and the segments below it.
HOOK_CYCLES = 50
HOOK_OPTIONS = inline_options(segment_bytes_max=4096, snapshots_kept=1)


@pytest.mark.parametrize("point", HOOK_POINTS)
def test_crash_at_each_hook_point_loses_no_released_command(point: str, rng: Any) -> None:
    sim = Sim(rng, HOOK_OPTIONS, snapshot_p=0.3)
    for cycle in range(HOOK_CYCLES):
        sim.crasher.arm_point(point, rng.randrange(1, 4))
        sim.run_until_crash(400)
        assert sim.crasher.killed_at == point
        sim.crash_and_recover(tear=cycle % 2 == 1)
    sim.finish()
    assert sim.stats["cycles"] == HOOK_CYCLES + 2


@pytest.mark.soak
@pytest.mark.parametrize("point", HOOK_POINTS)
def test_soak_crash_at_each_hook_point_loses_no_released_command(point: str, rng: Any) -> None:
    sim = Sim(rng, HOOK_OPTIONS, snapshot_p=0.3)
    for cycle in range(2_000):
        sim.crasher.arm_point(point, rng.randrange(1, 6))
        sim.run_until_crash(1_000)
        sim.crash_and_recover(tear=cycle % 2 == 1, crash_in_recovery=rng.random() < 0.15)
    sim.finish()


def test_crash_between_write_and_sync_with_a_torn_write_truncates_the_tail(rng: Any) -> None:
    sim = Sim(rng, inline_options(segment_bytes_max=64 * 1024), snapshot_p=0.0, commands_max=12)
    for _ in range(25):
        sim.crasher.arm_point("wal.after_write", 1)
        sim.run_until_crash(10)
        sim.crash_and_recover(tear=True)
    assert sim.stats["truncated"] + sim.stats["kept_unreleased"] >= 5
    assert sim.stats["lost_unreleased"] >= 5


# ---------------------------------------------------------------- write and sync errors

# (failing op, errno, persist mode, path filter)
FAULTS = [
    pytest.param(op, error, mode, where, id=f"{op}-{errno.errorcode[error]}-{mode}")
    for op, error, mode, where in [
        ("fsync", errno.EIO, "sync_all", "/wal/0"),
        ("fsync", errno.ENOSPC, "sync_all", "/wal/0"),
        ("fdatasync", errno.EIO, "sync_data", "/wal/0"),
        ("fdatasync", errno.ENOSPC, "sync_data", "/wal/0"),
        ("write", errno.ENOSPC, "sync_all", "/wal/0"),
        ("write", errno.EIO, "sync_data", "/wal/0"),
        ("fsync", errno.EIO, "buffer", "/wal/0"),  # the periodic sync
        ("create", errno.ENOSPC, "sync_all", "/wal/0"),  # rotation
        ("fsync_dir", errno.EIO, "sync_all", "/wal"),  # rotation
    ]
]


def _disk_ops_since(fs: FaultyFileSystem, mark: int) -> list[tuple[str, str]]:
    return [(op, path) for op, path in fs.ops[mark:] if op in DISK_OPS]


def _assert_failed_for_good(sim: Sim, mark: int) -> None:
    engine = sim.engine
    for attempt in (
        lambda: engine.execute(enqueue_one(50_000), sim.now),
        engine.flush,
        engine.sync,
        lambda: engine.execute(enqueue_one(50_001), sim.now),
    ):
        with pytest.raises(StorageFailed):
            attempt()
    assert engine.start_snapshot() is False
    engine.close()
    # Never retried: not one more write or sync after the failure.
    assert _disk_ops_since(sim.fs, mark) == []


@pytest.mark.parametrize("restart", ["after_crash", "after_clean_exit"])
@pytest.mark.parametrize(("op", "error", "mode", "where"), FAULTS)
def test_failed_write_or_sync_fails_the_engine_for_good(
    op: str, error: int, mode: str, where: str, restart: str, rng: Any
) -> None:
    sim = Sim(rng, inline_options(persist_mode=mode, segment_bytes_max=4096), snapshot_p=0.1)
    for _ in range(rng.randrange(3, 15)):
        sim.step()
    # From here on no snapshots: a failed snapshot is reported by snapshot_now and
    # the log goes on (test_failed_snapshot_write_leaves_the_log_working); this
    # test is about the log's own writes and syncs.
    sim.snapshot_p = 0.0
    sim.fs.fail(op, error, path_contains=where, times=1)  # a retry would succeed
    sim.fs.record_ops = True
    for _ in range(500):
        try:
            sim.step()
        except StorageFailed:
            break
    else:
        raise AssertionError(f"{op} was never called")
    failure = sim.engine.failure
    assert isinstance(failure, OSError) and failure.errno == error
    _assert_failed_for_good(sim, len(sim.fs.ops))
    if restart == "after_crash":
        sim.fs.crash(rng, tear=True)
    sim.engine = sim.open()
    sim.check_recovered((snapshot_paths(sim.fs) or [None])[-1])
    sim.finish()


@pytest.mark.parametrize("restart", ["after_crash", "after_clean_exit"])
def test_full_disk_fails_the_engine_for_good_and_loses_nothing_acknowledged(
    restart: str, rng: Any
) -> None:
    sim = Sim(rng, inline_options(segment_bytes_max=4096, snapshots_kept=1), snapshot_p=0.2)
    for _ in range(rng.randrange(2, 10)):
        sim.step()
    active = sim.engine.segments[-1]
    zeros = sim.fs.size(active.path) - active.size  # preallocated: freed at rotation
    used = sum(len(data) for data in sim.fs.durable_files().values()) - zeros
    sim.fs.capacity_bytes = used + rng.randrange(2_000, 30_000)
    # Only the log grows from here (snapshots and their retention would free
    # space): its records fill the disk. The preallocated zeros that do not fit
    # are done without, never a failure (tests/storage/test_preallocate.py).
    sim.snapshot_p = 0.0
    sim.fs.record_ops = True
    snapshot_failures = 0
    for _ in range(2_000):
        try:
            sim.step()
        except StorageFailed:
            if sim.engine.failure is not None:
                break
            snapshot_failures += 1  # a snapshot that did not fit: the log goes on
    else:
        raise AssertionError("the disk never filled up")
    failure = sim.engine.failure
    assert isinstance(failure, OSError) and failure.errno == errno.ENOSPC
    _assert_failed_for_good(sim, len(sim.fs.ops))
    sim.fs.capacity_bytes = None  # space is back
    if restart == "after_crash":
        sim.fs.crash(rng, tear=True)
    sim.engine = sim.open()
    sim.check_recovered((snapshot_paths(sim.fs) or [None])[-1])
    sim.finish()


def test_failed_snapshot_write_leaves_the_log_working(rng: Any) -> None:
    sim = Sim(rng, inline_options(segment_bytes_max=4096), snapshot_p=0.0)
    for _ in range(5):
        sim.step()
    # Something the snapshot must write: a seed whose steps left nothing new
    # since the last snapshot (a recovery takes one) would write no file at all.
    for _ in range(100):
        if sim.engine.appended_seq > sim.engine.snapshot_seq:
            break
        sim.step()
    assert sim.engine.appended_seq > sim.engine.snapshot_seq
    sim.fs.fail("write", errno.ENOSPC, path_contains="/snapshots/", times=1)
    with pytest.raises(StorageFailed, match="snapshot failed"):
        sim.engine.snapshot_now()
    assert sim.engine.failure is None
    assert sim.fs.listdir(SNAP_DIR) == []  # no half-written temp file is left
    sim.step()
    seq = sim.engine.snapshot_now()  # the next attempt works
    assert seq == sim.engine.appended_seq and snapshot_paths(sim.fs)
    sim.crash_and_recover(tear=True)


# ---------------------------------------------------------------- flipped bits


def _written(rng: Any) -> tuple[FaultyFileSystem, History]:
    """At least 60 records of random sizes in 4 KiB segments, one per flush, and
    at least 3 of them in the last segment."""
    fs = FaultyFileSystem()
    engine = Engine.open(DATA_DIR, CONFIG, inline_options(segment_bytes_max=4096), fs=fs)
    history = History()
    n = 0
    while n < 60 or engine.segments[-1].last_seq - engine.segments[-1].first_seq < 2:
        decision, barrier = engine.execute(
            enqueue_one(n, payload_bytes=rng.randrange(50, 400)), T0 + n
        )
        history.executed(decision, barrier)
        engine.flush()
        n += 1
    engine.close()
    return fs, history


def _clone(fs: FaultyFileSystem) -> FaultyFileSystem:
    copy = FaultyFileSystem()
    copy.makedirs(WAL_DIR)
    copy.makedirs(SNAP_DIR)
    for path, data in fs.durable_files().items():
        copy.put(path, data)
    return copy


def _record_at(records: list[Any], offset: int) -> tuple[int, Any]:
    index = max(i for i, r in enumerate(records) if r.offset <= offset)
    return index, records[index]


def _expected_refusal(data: bytes, path: str, offset: int) -> tuple[str, int | None, int | None]:
    """(reason, offset, seq) recovery must report for a sealed segment whose
    byte at `offset` was damaged; the undamaged copy is `data`."""
    if offset < FILE_HEADER_BYTES:
        damaged_header = bytearray(data[:FILE_HEADER_BYTES])
        damaged_header[offset] ^= 1 << 0  # the caller flips bit 0 too
        with pytest.raises(FormatError) as info:
            decode_segment_header(bytes(damaged_header))
        return f"bad segment header: {info.value.reason}", 0, None
    _first, records, _end = segment_records(data)
    index, record = _record_at(records, offset)
    part = "header" if offset < record.offset + RECORD_HEADER_BYTES else "body"
    if index == len(records) - 1:
        return f"sealed segment ends in damage (bad {part} checksum)", record.offset, record.seq
    return f"corrupt record (bad {part} checksum)", record.offset, record.seq


def test_flipped_bit_anywhere_in_a_sealed_segment_refuses_to_start(rng: Any) -> None:
    fs, _history = _written(rng)
    sealed = segment_paths(fs)[:-1]
    assert len(sealed) >= 3
    for _ in range(40):
        damaged = _clone(fs)
        path = rng.choice(sealed)
        data = fs.read(path)
        offset = rng.randrange(len(data))
        damaged.flip_bit(path, offset, 0)
        reason, at, seq = _expected_refusal(data, path, offset)
        with pytest.raises(RecoveryError) as info:
            Engine.open(DATA_DIR, CONFIG, inline_options(segment_bytes_max=4096), fs=damaged)
        error = info.value
        assert (error.path, error.offset, error.seq, error.reason) == (path, at, seq, reason)
        assert "sepp-log verify" in str(error)


def test_flipped_bit_in_last_record_of_last_segment_is_truncated(rng: Any) -> None:
    fs, history = _written(rng)
    path = segment_paths(fs)[-1]
    data = fs.read(path)
    last = segment_records(data)[1][-1]
    expected = history.state_at(last.seq - 1).canonical()
    for _ in range(25):
        damaged = _clone(fs)
        damaged.flip_bit(path, rng.randrange(last.offset, len(data)), rng.randrange(8))
        engine = Engine.open(DATA_DIR, CONFIG, inline_options(segment_bytes_max=4096), fs=damaged)
        assert engine.recovery_report.truncated == (path, last.offset, len(data) - last.offset)
        assert engine.appended_seq == last.seq - 1
        assert engine.state.canonical() == expected
        assert damaged.durable_files()[path] == data[: last.offset]
        _decision, barrier = engine.execute(enqueue_one(70_000), T0 + 10**6)
        assert barrier == last.seq


def test_flipped_bit_before_the_last_record_of_last_segment_refuses_to_start(rng: Any) -> None:
    fs, _history = _written(rng)
    path = segment_paths(fs)[-1]
    data = fs.read(path)
    records = segment_records(data)[1]
    assert len(records) >= 3
    for _ in range(25):
        damaged = _clone(fs)
        offset = rng.randrange(records[0].offset, records[-1].offset)
        damaged.flip_bit(path, offset, 0)
        _index, record = _record_at(records, offset)
        part = "header" if offset < record.offset + RECORD_HEADER_BYTES else "body"
        with pytest.raises(RecoveryError) as info:
            Engine.open(DATA_DIR, CONFIG, inline_options(segment_bytes_max=4096), fs=damaged)
        error = info.value
        assert (error.path, error.offset, error.seq) == (path, record.offset, record.seq)
        assert error.reason == f"corrupt record (bad {part} checksum)"
