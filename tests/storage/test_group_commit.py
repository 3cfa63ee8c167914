"""Group commit, persist modes and rotation of the write-ahead log.

Counts file operations on the fake file system (`record_ops`) to check that a
flush is one write and one sync whatever the number of commands, that the persist
modes use the sync call they promise, and that a new segment's header and
directory entry are durable before any record lands in it. The group committer
runs on a real thread; waits use events with a deadline, never sleeps.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from log_format import FILE_HEADER_BYTES, parse_segment_file_name, segment_file_name
from log_format.envelope import ENVELOPE_PART_BYTES_MIN
from sepp.core import Ack, Enqueue, NewJob, Reserve, Sweep
from sepp.core.results import CommandError, EnqueueResult, ReserveResult
from sepp.storage import GroupCommitter, StorageFailed
from sepp.storage.faultfs import FaultyFileSystem
from tests.storage.helpers import (
    T0,
    WAL_DIR,
    Oracle,
    Workload,
    durable_log_seq,
    enqueue_one,
    inline_options,
    numbered_id,
    open_engine,
    segment_paths,
    segment_records,
)

WAIT_S = 20.0  # a deadline for events on a loaded machine, never a sleep
SYNC_OPS = ("write", "fsync", "fdatasync")


def wal_ops(fs: FaultyFileSystem) -> list[str]:
    """The write/sync operations on segment files since the last reset."""
    return [op for op, path in fs.ops if op in SYNC_OPS and path.startswith(WAL_DIR + "/")]


def start_recording(fs: FaultyFileSystem) -> None:
    fs.ops.clear()
    fs.record_ops = True


class Collector:
    """on_durable / on_failure callbacks of a GroupCommitter, with waits."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.failures: list[BaseException] = []
        self._cond = threading.Condition()

    def on_durable(self, seq: int) -> None:
        with self._cond:
            self.seqs.append(seq)
            self._cond.notify_all()

    def on_failure(self, exc: BaseException) -> None:
        with self._cond:
            self.failures.append(exc)
            self._cond.notify_all()

    def wait_for(self, seq: int) -> None:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: (self.seqs and self.seqs[-1] >= seq) or self.failures, WAIT_S
            )
        assert ok and not self.failures, (self.seqs, self.failures)


class GatedFileSystem(FaultyFileSystem):
    """A slow disk: each fsync signals `entered` and waits for `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.synced = threading.Event()

    def _block(self) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT_S), "test never opened the gate"

    def fsync(self, handle: int) -> None:
        self._block()
        super().fsync(handle)
        self.synced.set()

    def fdatasync(self, handle: int) -> None:
        self._block()
        super().fdatasync(handle)
        self.synced.set()


# ---------------------------------------------------------------- one flush


@pytest.mark.parametrize(("mode", "sync_op"), [("sync_all", "fsync"), ("sync_data", "fdatasync")])
def test_one_flush_is_one_write_and_one_sync_for_many_commands(
    mode: str, sync_op: str, rng: Any
) -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode=mode))
    oracle = Oracle()
    workload = Workload(rng)
    now = T0
    for _round in range(5):
        start_recording(fs)
        for _ in range(40):
            now = workload.advance(now)
            oracle.executed(*engine.execute(workload.command(engine.state, now), now))
        appended = engine.appended_seq
        assert engine.durable_seq == oracle.released_seq  # nothing released yet
        assert wal_ops(fs) == []  # execute never touches a file
        assert engine.flush() == appended == engine.durable_seq
        expected = ["write", sync_op] if appended > oracle.released_seq else []
        assert wal_ops(fs) == expected
        oracle.release(engine.durable_seq)
    assert engine.stats["flushes"] <= 5
    assert engine.stats["records"] == engine.appended_seq
    engine.close()
    again = open_engine(fs, inline_options(persist_mode=mode))
    assert again.state.canonical() == oracle.ref.canonical()


def test_flush_with_nothing_buffered_touches_no_file() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    engine.execute(enqueue_one(0), T0)
    engine.flush()
    start_recording(fs)
    assert engine.flush() == 1
    assert engine.execute(Sweep(), T0 + 1)[1] == 1  # nothing due: nothing logged
    assert engine.flush() == 1
    assert fs.ops == []


def test_records_with_large_payloads_are_written_in_one_write_and_replay_the_same() -> None:
    # A payload of at least ENVELOPE_PART_BYTES_MIN is buffered as the object it
    # is (no copy on the event loop) and joined by the batch's write.
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    sizes = [ENVELOPE_PART_BYTES_MIN, 10, ENVELOPE_PART_BYTES_MIN * 2 + 1, 0, 3]
    for n, size in enumerate(sizes):
        engine.execute(enqueue_one(n, payload_bytes=size), T0 + n)
    assert engine.pending_bytes() > 3 * ENVELOPE_PART_BYTES_MIN
    start_recording(fs)
    assert engine.flush() == len(sizes) == engine.stats["records"]
    assert wal_ops(fs) == ["write", "fsync"] and engine.pending_bytes() == 0
    [path] = segment_paths(fs)
    _first_seq, records, _end = segment_records(fs.read(path))
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    engine.close()
    again = open_engine(fs)
    for n, size in enumerate(sizes):
        job = again.state.jobs[numbered_id(n)]
        assert job.payload_data == enqueue_one(n, payload_bytes=size).jobs[0].payload_data
    assert again.state.canonical() == engine.state.canonical()


# ---------------------------------------------------------------- barriers


def test_command_that_logs_nothing_waits_for_the_last_appended_record() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    # Before any record: nothing to wait for.
    decision, barrier = engine.execute(Ack(job_id=numbered_id(0), attempt=1), T0)
    assert isinstance(decision, CommandError) and barrier == 0
    keyed = NewJob(job_id=numbered_id(1), queue="a", job_type="t", idempotency_key="k")
    _, first = engine.execute(Enqueue(jobs=(keyed,)), T0)
    assert first == 1
    cases: list[tuple[str, Any]] = [
        ("rejected", Ack(job_id=numbered_id(99), attempt=1)),
        ("empty reserve", Reserve(queues=("empty",), lease_ms=1_000)),
        ("dedup hit", Enqueue(jobs=(keyed._replace(job_id=numbered_id(2)),))),
        ("nothing due", Sweep()),
    ]
    for name, command in cases:
        decision, barrier = engine.execute(command, T0 + 1)
        assert barrier == 1, name
        assert not getattr(decision, "events", ()), name
    hit = engine.execute(Enqueue(jobs=(keyed._replace(job_id=numbered_id(3)),)), T0)
    assert isinstance(hit[0].reply, EnqueueResult)
    assert hit[0].reply.results[0].deduplicated and hit[1] == 1
    # A second record moves the barrier of later no-ops; earlier ones keep theirs.
    _, second = engine.execute(Reserve(queues=("a",), lease_ms=1_000), T0 + 2)
    assert second == 2
    decision, barrier = engine.execute(Reserve(queues=("a",), lease_ms=1_000), T0 + 3)
    assert isinstance(decision.reply, ReserveResult) and decision.reply.jobs == ()
    assert barrier == 2
    assert engine.durable_seq == 0
    assert engine.flush() == 2


def test_barriers_are_released_in_log_order(rng: Any) -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    workload = Workload(rng)
    collector = Collector()
    committer = GroupCommitter(engine, collector.on_durable, collector.on_failure)
    waiting: list[int] = []  # barriers of replies not yet released, in arrival order
    released: list[int] = []
    committer.start()
    now = T0
    for _ in range(400):
        now = workload.advance(now)
        _decision, barrier = engine.execute(workload.command(engine.state, now), now)
        waiting.append(barrier)
        committer.wake()
        durable = engine.durable_seq
        while waiting and waiting[0] <= durable:
            released.append(waiting.pop(0))
    committer.stop()
    assert not collector.failures
    assert engine.durable_seq == engine.appended_seq
    released.extend(waiting)
    assert released == sorted(released)  # barriers never go back in arrival order
    assert collector.seqs == sorted(set(collector.seqs))
    assert collector.seqs[-1] == engine.appended_seq
    assert durable_log_seq(fs) == engine.appended_seq


# ---------------------------------------------------------------- the committer


def test_group_committer_serves_every_command_that_arrived_during_a_sync() -> None:
    fs = GatedFileSystem()
    engine = open_engine(fs)
    collector = Collector()
    committer = GroupCommitter(engine, collector.on_durable, collector.on_failure)
    committer.start()
    fs.gate.clear()
    fs.entered.clear()
    fs.record_ops = True
    fs.ops.clear()
    engine.execute(enqueue_one(0), T0)
    committer.wake()
    assert fs.entered.wait(WAIT_S)  # the flusher is inside the sync of record 1
    for n in range(1, 10):
        _, barrier = engine.execute(enqueue_one(n), T0 + n)  # the writer goes on
        assert barrier == n + 1
        committer.wake()
    assert engine.durable_seq == 0 and collector.seqs == []
    fs.gate.set()
    collector.wait_for(10)
    committer.stop()
    assert collector.seqs == [1, 10]
    assert wal_ops(fs) == ["write", "fsync", "write", "fsync"]
    assert engine.stats["flushes"] == 2


def test_group_committer_reports_increasing_seqs_and_flushes_everything_on_stop(
    rng: Any,
) -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(segment_bytes_max=4096))
    oracle = Oracle()
    workload = Workload(rng)
    collector = Collector()
    committer = GroupCommitter(engine, collector.on_durable, collector.on_failure)
    committer.start()
    now = T0
    for _ in range(600):
        now = workload.advance(now)
        oracle.executed(*engine.execute(workload.command(engine.state, now), now))
        committer.wake()
    committer.stop()
    assert not collector.failures
    assert collector.seqs == sorted(set(collector.seqs))
    assert collector.seqs[-1] == engine.durable_seq == engine.appended_seq == oracle.appended_seq
    assert engine.stats["records"] == engine.appended_seq
    assert len(segment_paths(fs)) > 1
    oracle.release(engine.durable_seq)
    fs.crash()  # nothing unsynced may be lost: stop() made everything durable
    again = open_engine(fs, inline_options(segment_bytes_max=4096))
    assert again.state.canonical() == oracle.ref.canonical()


# ---------------------------------------------------------------- persist modes

# mode -> (ops of a flush, ops of engine.sync() right after it)
PERSIST_TABLE = {
    "sync_all": (["write", "fsync"], []),
    "sync_data": (["write", "fdatasync"], []),
    "buffer": (["write"], ["fsync"]),
}


@pytest.mark.parametrize("mode", sorted(PERSIST_TABLE))
def test_persist_mode_uses_its_sync_call(mode: str) -> None:
    flush_ops, sync_ops = PERSIST_TABLE[mode]
    fs = FaultyFileSystem()
    engine = open_engine(fs, inline_options(persist_mode=mode))
    for n in range(3):
        engine.execute(enqueue_one(n), T0 + n)
    start_recording(fs)
    assert engine.flush() == 3
    assert wal_ops(fs) == flush_ops
    fs.ops.clear()
    engine.sync()
    assert wal_ops(fs) == sync_ops
    fs.ops.clear()
    engine.sync()  # nothing written since: nothing to sync
    assert wal_ops(fs) == []
    assert durable_log_seq(fs) == 3


@pytest.mark.parametrize("mode", sorted(PERSIST_TABLE))
def test_crash_after_flush_keeps_what_the_persist_mode_promises(mode: str) -> None:
    fs = FaultyFileSystem()
    options = inline_options(persist_mode=mode)
    engine = open_engine(fs, options)
    for n in range(3):
        engine.execute(enqueue_one(n), T0 + n)
    engine.flush()
    engine.sync()
    for n in range(3, 6):
        engine.execute(enqueue_one(n), T0 + n)
    engine.flush()  # buffer: written, not synced
    fs.crash()
    again = open_engine(fs, options)
    assert again.appended_seq == (3 if mode == "buffer" else 6)


def test_buffer_mode_group_committer_syncs_periodically() -> None:
    fs = GatedFileSystem()
    options = inline_options(persist_mode="buffer", buffer_flush_interval_ms=5)
    engine = open_engine(fs, options)
    collector = Collector()
    committer = GroupCommitter(engine, collector.on_durable, collector.on_failure)
    fs.synced.clear()
    committer.start()
    for n in range(5):
        engine.execute(enqueue_one(n), T0 + n)
    committer.wake()
    collector.wait_for(5)
    # Nobody calls engine.sync() or stop(): the committer's timer must sync.
    assert fs.synced.wait(WAIT_S)
    assert durable_log_seq(fs) == 5
    committer.stop()
    assert not collector.failures


def test_buffer_mode_committer_syncs_on_stop() -> None:
    fs = FaultyFileSystem()
    options = inline_options(persist_mode="buffer", buffer_flush_interval_ms=3_600_000)
    engine = open_engine(fs, options)
    collector = Collector()
    committer = GroupCommitter(engine, collector.on_durable, collector.on_failure)
    committer.start()
    for n in range(4):
        engine.execute(enqueue_one(n), T0 + n)
    committer.wake()
    collector.wait_for(4)
    committer.stop()
    assert durable_log_seq(fs) == 4


# ---------------------------------------------------------------- rotation


@pytest.mark.parametrize("mode", sorted(PERSIST_TABLE))
def test_rotation_at_segment_bytes_max_keeps_sequence_numbers_contiguous(mode: str) -> None:
    fs = FaultyFileSystem()
    limit = 4096
    options = inline_options(persist_mode=mode, segment_bytes_max=limit)
    engine = open_engine(fs, options)
    for n in range(60):
        engine.execute(enqueue_one(n, payload_bytes=250), T0 + n)
        engine.flush()
    engine.close()
    paths = segment_paths(fs)
    assert len(paths) >= 4
    expected = 1
    for index, path in enumerate(paths):
        data = fs.read(path)
        first_seq, records, end = segment_records(data)
        assert parse_segment_file_name(path.rsplit("/", 1)[1]) == first_seq == expected
        assert type(end).__name__ == "CleanEnd"
        assert [r.seq for r in records] == list(range(first_seq, first_seq + len(records)))
        expected = first_seq + len(records)
        if index < len(paths) - 1:
            # Sealed right after crossing the limit: without its last record it
            # was still below it.
            assert len(data) >= limit
            assert records[-1].offset < limit
        else:
            assert len(data) < limit + 1024
    assert expected == 61
    assert paths[0] == f"{WAL_DIR}/{segment_file_name(1)}"
    assert open_engine(fs, options).appended_seq == 60


@pytest.mark.parametrize("mode", sorted(PERSIST_TABLE))
def test_new_segment_header_and_directory_are_synced_before_records_land_in_it(
    mode: str,
) -> None:
    fs = FaultyFileSystem()
    timeline: list[tuple[str, str]] = []
    fs.hook = lambda op, path: timeline.append((op, path))
    options = inline_options(persist_mode=mode, segment_bytes_max=4096)
    engine = open_engine(fs, options, hook=lambda point: timeline.append(("hook", point)))
    for n in range(40):
        engine.execute(enqueue_one(n, payload_bytes=250), T0 + n)
        engine.flush()
    engine.close()
    paths = segment_paths(fs)
    assert len(paths) >= 3
    for index, path in enumerate(paths):
        start = timeline.index(("create", path))
        if index > 0:
            # The segment before it was sealed durable before this one began: its
            # last batch synced, then its preallocated zeros cut (a durable
            # truncate) -- a sealed segment ends with its last record.
            previous = [op for op, p in timeline[:start] if p == paths[index - 1]]
            assert previous[-2:] in (["fsync", "truncate"], ["fdatasync", "truncate"]), previous
            assert len(fs.read(paths[index - 1])) == len(fs.durable_files()[paths[index - 1]])
        relevant = [
            (op, p)
            for op, p in timeline[start:]
            if p in (path, WAL_DIR) or (op == "hook" and p.startswith("rotate."))
        ]
        assert relevant[:8] == [
            ("create", path),
            ("hook", "rotate.after_create"),
            ("write", path),  # the header
            ("fsync", path),
            ("hook", "rotate.after_header_sync"),
            ("fsync_dir", WAL_DIR),
            ("hook", "rotate.after_dir_sync"),
            ("write", path),  # the first records
        ]
        assert fs.durable_files()[path][:FILE_HEADER_BYTES] == fs.read(path)[:FILE_HEADER_BYTES]


def test_storage_failure_is_reported_by_the_committer_and_nothing_is_retried() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs)
    collector = Collector()
    committer = GroupCommitter(engine, collector.on_durable, collector.on_failure)
    committer.start()
    engine.execute(enqueue_one(0), T0)
    committer.wake()
    collector.wait_for(1)
    fs.fail("fsync", path_contains="/wal/")
    start_recording(fs)
    engine.execute(enqueue_one(1), T0 + 1)
    committer.wake()
    committer.stop()  # the thread ended on the failure; stop() just joins it
    assert collector.seqs == [1]
    assert len(collector.failures) == 1 and isinstance(collector.failures[0], StorageFailed)
    assert wal_ops(fs) == ["write", "fsync"]
    with pytest.raises(StorageFailed):
        engine.execute(enqueue_one(2), T0 + 2)
    with pytest.raises(StorageFailed):
        engine.flush()
    assert wal_ops(fs) == ["write", "fsync"]
