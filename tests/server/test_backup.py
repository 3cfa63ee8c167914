"""Online backup (issue 15 item 8): the stream format, the retention pin, the
copy of a live server under load, `sepp backup` and what it refuses.

Layers: the format is tested sans-I/O (bytes in, events out); the producer
(`stream_backup`) against an engine on a real file system in this process, so a
test decides exactly when retention runs during a backup; the route and the CLI
against real `sepp serve` processes on 127.0.0.1:0, stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sepp.admin.backup import stream_backup
from sepp.admin.backup_format import (
    BackupCut,
    BackupDecoder,
    BackupFormatError,
    FileData,
    FileEnd,
    FileEntry,
    FileStart,
    Manifest,
    file_line,
    manifest_line,
    trailer_line,
)
from sepp.server.backup_cli import INCOMPLETE_MARKER, _Progress, _rate
from sepp.storage import Engine
from tests.server.conftest import connect, job
from tests.storage.helpers import CONFIG, enqueue_one, inline_options
from tools.datadir import open_data_dir
from tools.replay import replay_to

ROOT = Path(__file__).resolve().parents[2]


def _seed() -> int:
    seed = int(os.environ.get("SEPP_SEED", random.randrange(2**32)))
    print(f"SEPP_SEED={seed}")
    return seed


# -- the format ----------------------------------------------------------------------------


def _stream(files: dict[str, bytes], seq: int = 7, snapshot_seq: int = 3) -> bytes:
    """A whole stream of `files` (name -> bytes), as the server writes it."""
    import crc32c

    entries = tuple(FileEntry(name, len(data)) for name, data in files.items())
    manifest = Manifest(seq, snapshot_seq, sum(e.size for e in entries), entries)
    out = [manifest_line(manifest)]
    for entry in entries:
        out += [file_line(entry), files[entry.name]]
    out.append(trailer_line(manifest, [crc32c.crc32c(files[e.name]) for e in entries]))
    return b"".join(out)


FILES = {
    "snapshots/00000000000000000003.snap": b"snapshot bytes\n" * 5,
    "wal/00000000000000000004.log": bytes(range(256)) * 3,
    "wal/00000000000000000006.log": b"",
}


def _decode(stream: bytes, pieces: list[int]) -> dict[str, bytes]:
    decoder = BackupDecoder()
    files: dict[str, bytearray] = {}
    current = ""
    at = 0
    for size in [*pieces, len(stream)]:
        for event in decoder.feed(stream[at : at + size]):
            if type(event) is FileStart:
                current = event.name
                files[current] = bytearray()
            elif type(event) is FileData:
                files[current] += event.data
            elif type(event) is FileEnd:
                assert event.name == current
        at += size
    decoder.finish()
    return {name: bytes(data) for name, data in files.items()}


def test_a_stream_fed_in_any_pieces_decodes_into_the_files_it_was_made_of():
    rng = random.Random(_seed())
    stream = _stream(FILES)
    for _ in range(50):
        pieces = [rng.randint(1, 40) for _ in range(rng.randint(0, 60))]
        assert _decode(stream, pieces) == FILES


def test_a_stream_cut_at_any_byte_is_reported_as_cut():
    stream = _stream(FILES)
    for cut in range(len(stream)):
        decoder = BackupDecoder()
        decoder.feed(stream[:cut])
        with pytest.raises(BackupCut):
            decoder.finish()
    decoder = BackupDecoder()
    decoder.feed(stream)
    assert decoder.finish().seq == 7


def test_a_changed_byte_in_a_file_fails_its_checksum_at_the_trailer():
    stream = bytearray(_stream(FILES))
    at = stream.index(b"snapshot bytes")
    stream[at] ^= 0x01
    decoder = BackupDecoder()
    with pytest.raises(BackupCut, match="checksum"):
        decoder.feed(bytes(stream))


def test_bytes_after_the_trailer_are_refused():
    decoder = BackupDecoder()
    with pytest.raises(BackupFormatError, match="after the trailer"):
        decoder.feed(_stream(FILES) + b"x")


@pytest.mark.parametrize(
    "name",
    ["../etc/passwd", "wal/../../x.log", "snapshots/evil", "/abs/00000000000000000001.log", 5],
)
def test_a_file_name_outside_wal_and_snapshots_is_refused(name: Any):
    line = json.dumps(
        {"format": "sepp-backup", "version": 1, "seq": 1, "snapshot_seq": 0, "bytes": 0,
         "files": [{"name": name, "size": 0}]}
    ).encode() + b"\n"  # fmt: skip
    with pytest.raises(BackupFormatError):
        BackupDecoder().feed(line)


def test_a_stream_of_another_version_is_refused():
    line = _stream(FILES).replace(b'"version":1', b'"version":2', 1)
    with pytest.raises(BackupFormatError, match="version"):
        BackupDecoder().feed(line)


# -- the producer against an engine: the retention pin ----------------------------------------


def _write_copy(stream: bytes, dest: Path) -> Manifest:
    decoder = BackupDecoder()
    out = None
    for event in decoder.feed(stream):
        if type(event) is FileStart:
            path = dest / event.name
            path.parent.mkdir(parents=True, exist_ok=True)
            out = path.open("xb")
        elif type(event) is FileData:
            assert out is not None
            out.write(event.data)
        elif type(event) is FileEnd:
            assert out is not None
            out.close()
    decoder.finish()
    assert decoder.manifest is not None
    return decoder.manifest


async def test_retention_during_a_backup_deletes_nothing_the_backup_still_reads(tmp_path: Path):
    """Tiny segments, one snapshot kept: while the backup streams its first file,
    the engine logs hundreds of segments' worth and publishes snapshots, each
    followed by retention. Without the pin, retention deletes the snapshot and
    the segments the backup has not read yet."""
    live = str(tmp_path / "live")
    options = inline_options(segment_bytes_max=4096, snapshot_every_bytes=0, snapshots_kept=1)
    engine = Engine.open(live, CONFIG, options)
    try:
        n = 0
        for _ in range(40):
            engine.execute(enqueue_one(n), n + 1)
            n += 1
        engine.flush()
        engine.snapshot_now()
        for _ in range(120):  # the log after the snapshot: several segments
            engine.execute(enqueue_one(n), n + 1)
            engine.flush()  # one batch each: a segment rotates between batches
            n += 1
        expected: dict[str, Any] = {}

        async def durable(seq: int) -> None:
            assert seq == engine.appended_seq  # nothing appended since the pin
            expected.update(engine.state.canonical())

        def churn() -> list[int]:
            """More log and two more snapshots (each runs retention)."""
            nonlocal n
            published = []
            for _ in range(2):
                for _ in range(120):
                    engine.execute(enqueue_one(n), n + 1)
                    engine.flush()
                    n += 1
                published.append(engine.snapshot_now())
            return published

        sent = bytearray()
        churned: list[int] = []

        async def write(data: bytes) -> None:
            sent.extend(data)
            if not churned and b"\n" in sent[len(sent) - len(data) :] and len(sent) > 200:
                churned.extend(await asyncio.to_thread(churn))

        summary = await stream_backup(
            engine.pin_log, engine.unpin_log, durable, write, chunk_bytes=512
        )
        assert churned and min(churned) > summary.snapshot_seq  # retention ran meanwhile
        assert engine.pinned_seqs() == []  # the pin is released
        pinned = Path(live, "snapshots", f"{summary.snapshot_seq:020d}.snap")
        assert pinned.exists()  # kept past snapshots_kept while pinned...
        churn()
        assert not pinned.exists()  # ...and deleted by the next retention after
        manifest = _write_copy(bytes(sent), tmp_path / "copy")
        assert manifest.seq == summary.seq and len(manifest.files) > 3
    finally:
        engine.close()
    copy = Engine.open(str(tmp_path / "copy"), CONFIG, options)
    try:
        assert copy.appended_seq == summary.seq
        assert copy.state.canonical() == expected
    finally:
        copy.close()


# -- a live server, sepp backup ---------------------------------------------------------------


def sepp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    return subprocess.run(
        [sys.executable, "-m", "sepp.server.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )  # fmt: skip


async def sepp_async(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sepp.server.cli", *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def admin_url_of(server: Any, timeout: float = 30.0) -> str:
    """The `sepp admin on URL` line a server started with --admin-listen prints."""
    stdout = server.proc.stdout
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no admin line; log:\n{server.log()}"
        ready, _, _ = select.select([stdout], [], [], remaining)
        if ready:
            chunk = os.read(stdout.fileno(), 1)
            assert chunk, f"the server closed its output; log:\n{server.log()}"
            line += chunk
    text = line.decode().strip()
    assert text.startswith("sepp admin on "), text
    return text.removeprefix("sepp admin on ")


def verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.sepp_log", "verify", "--no-progress", str(data_dir)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


LIVE_ENV = {
    # Tiny segments and a snapshot every few segments: the backup crosses both.
    "SEPP_STORAGE__SEGMENT_BYTES_MAX": "16384",
    "SEPP_STORAGE__SNAPSHOT_EVERY_BYTES": "65536",
    # Keep the live log (a day) so the test can replay it to the backup's seq.
    "SEPP_STORAGE__LOG_RETENTION_MS": "86400000",
}


async def test_a_backup_of_a_live_server_under_load_holds_exactly_the_state_at_its_seq(
    server_factory: Any, tmp_path: Path
):
    server = server_factory(args=["--admin-listen", "127.0.0.1:0"], env=LIVE_ENV)
    url = admin_url_of(server)
    producer = await connect(server.address)
    worker = await connect(server.address)
    # (job id, time its enqueue was answered) of the kept queue; acked work ids.
    kept: list[tuple[str, float]] = []
    acked: list[tuple[str, float]] = []
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            ids = await producer.enqueue_ids(job("keep"), job("work"))
            kept.append((ids[0], sent))

    async def consume() -> None:
        while not stop.is_set():
            for delivered in await worker.reserve(["work"], wait_ms=50):
                assert (await worker.ack(delivered)).status == "ok"
                acked.append((delivered["id"], time.monotonic()))

    load = [asyncio.create_task(produce()), asyncio.create_task(consume())]
    await wait_until_count(kept, acked, 200)
    dest = tmp_path / "copy"
    started = time.monotonic()
    code, out, err = await sepp_async("backup", str(dest), "--admin-addr", url, "--json")
    finished = time.monotonic()
    await wait_until_count(kept, acked, len(kept) + 100)  # load after the backup
    stop.set()
    await asyncio.gather(*load)
    assert code == 0, err
    result = json.loads(out)
    seq = result["seq"]
    assert not (dest / INCOMPLETE_MARKER).exists()
    assert server.stop() == 0

    checked = verify(dest)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    live = replay_to(open_data_dir(str(server.data_dir)), until_seq=seq)
    copy = replay_to(open_data_dir(str(dest)))
    assert live.ok and copy.ok and copy.seq == seq
    assert copy.state is not None and live.state is not None
    assert copy.state.canonical() == live.state.canonical()

    restored = server_factory(data_dir=dest)
    client = await connect(restored.address)
    for job_id, answered in kept:
        info = (await client.ok("get_job", {"id": job_id}))["job"]
        if answered < started:  # enqueued (durably) before the backup began
            assert info is not None, job_id
        elif answered > finished:  # sent after the backup ended
            assert info is None, job_id
    for job_id, answered in acked:
        if answered < started:
            assert (await client.ok("get_job", {"id": job_id}))["job"] is None, job_id
    assert restored.stop() == 0


async def wait_until_count(kept: list[Any], acked: list[Any], count: int) -> None:
    deadline = time.monotonic() + 60
    while len(kept) < count or len(acked) < min(count, 50):
        assert time.monotonic() < deadline, "the load did not progress"
        await asyncio.sleep(0.01)


def test_a_non_empty_dest_is_refused_before_the_server_is_asked(tmp_path: Path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    # Nothing listens on port 9 (discard): a refusal that asked would say so.
    done = sepp("backup", str(dest), "--admin-addr", "http://127.0.0.1:9")
    assert done.returncode == 2, done.stderr
    assert "is not empty" in done.stderr
    assert os.listdir(dest) == ["keep.txt"]


async def _serve_cut_stream(stream: bytes) -> tuple[web.AppRunner, str]:
    """A fake admin listener answering the backup route with `stream`, then
    closing the connection (no end of the chunked body)."""

    async def backup(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(stream)
        assert request.transport is not None
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_post("/admin/api/v1/backup", backup)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@pytest.mark.parametrize("dest_exists", [False, True])
async def test_a_cut_stream_exits_non_zero_and_keeps_nothing(tmp_path: Path, dest_exists: bool):
    stream = _stream(FILES)
    cut = stream[: stream.index(b"\x00\x01\x02") + 100]  # inside the second file
    runner, url = await _serve_cut_stream(cut)
    dest = tmp_path / "dest"
    if dest_exists:
        dest.mkdir()
    try:
        code, _out, err = await sepp_async("backup", str(dest), "--admin-addr", url)
    finally:
        await runner.cleanup()
    assert code == 1, err
    assert "incomplete" in err
    assert (os.listdir(dest) == []) if dest_exists else not dest.exists()


async def test_sepp_serve_starts_on_a_copy_and_delivers_the_jobs_it_holds(
    server_factory: Any, tmp_path: Path
):
    server = server_factory(args=["--admin-listen", "127.0.0.1:0"])
    url = admin_url_of(server)
    client = await connect(server.address)
    ids = await client.enqueue_ids(*(job("q") for _ in range(10)))
    code, out, err = await sepp_async("backup", str(tmp_path / "a"), "--admin-addr", url)
    assert code == 0, err
    assert out.startswith("backup of seq 1 ")
    assert server.stop() == 0
    restored = server_factory(data_dir=tmp_path / "a")
    client = await connect(restored.address)
    assert [j["id"] for j in await client.reserve(["q"], max_jobs=10)] == ids


KEYS = (
    '[{name = "vera", key = "viewer-secret-1", role = "viewer"}, '
    '{name = "otto", key = "operator-secret-1", role = "operator"}, '
    '{name = "ada", key = "admin-secret-1"}]'
)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (None, "(401)"),
        ("viewer-secret-1", "(403)"),
        ("operator-secret-1", "(403)"),
        ("admin-secret-1", None),
    ],
)
async def test_only_an_admin_key_may_take_a_backup(
    server_factory: Any, tmp_path: Path, key: str | None, expected: str | None
):
    server = server_factory(args=["--admin-listen", "127.0.0.1:0"], env={"SEPP_ADMIN__KEYS": KEYS})
    url = admin_url_of(server)
    dest = tmp_path / "copy"
    args = ["backup", str(dest), "--admin-addr", url]
    if key is not None:
        (tmp_path / "key").write_text(key + "\n")
        args += ["--admin-key-file", str(tmp_path / "key")]
    code, _out, err = await sepp_async(*args)
    if expected is None:
        assert code == 0, err
        assert verify(dest).returncode == 0
    else:
        assert code == 1 and expected in err, err
        assert not dest.exists()


async def test_a_second_backup_while_one_runs_is_409_and_a_reader_gone_ends_the_first(
    server_factory: Any, tmp_path: Path
):
    server = server_factory(args=["--admin-listen", "127.0.0.1:0"])
    url = admin_url_of(server)
    client = await connect(server.address)
    big = {"data": os.urandom(512 * 1024), "encoding": "application/octet-stream"}
    for _ in range(8):  # 32 MiB of log: far more than the socket buffers hold
        await client.enqueue_ids(*(job("q", payload=big) for _ in range(8)))
    host, _, port = url.removeprefix("http://").rpartition(":")
    # A reader that takes the headers and then reads nothing: the server's
    # writes stall on flow control, the first backup stays running.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect((host, int(port)))
    sock.sendall(b"POST /admin/api/v1/backup HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    code, _out, err = await sepp_async("backup", str(tmp_path / "b"), "--admin-addr", url)
    assert code == 1 and "(409)" in err and "already running" in err, err
    sock.close()  # the reader goes away: the first backup ends, its pin is released

    async def third() -> tuple[int, str, str]:
        return await sepp_async("backup", str(tmp_path / "c"), "--admin-addr", url)

    deadline = time.monotonic() + 30
    while (result := await third())[0] != 0:
        assert "(409)" in result[2] and time.monotonic() < deadline, result
    assert verify(tmp_path / "c").returncode == 0
    assert server.stop() == 0


def test_the_progress_bar_shows_bytes_percent_and_rate():
    out = io.StringIO()
    progress = _Progress(out)
    progress.total = 4 * 1024 * 1024
    progress.show(1024 * 1024, final=True)
    line = out.getvalue()
    assert "1.0 / 4.0 MiB" in line and "25.0%" in line and "MiB/s" in line
    assert line.endswith("\n")
    quiet = _Progress(None)
    quiet.show(1, final=True)  # no terminal: nothing to draw, nothing raised


@pytest.mark.parametrize(
    ("text", "expected"), [("50", 50.0), ("0.5", 0.5), ("0", None), ("-1", "error"), ("x", "error")]
)
def test_max_rate_is_a_pace_in_mb_per_second_and_0_means_no_limit(text: str, expected: Any):
    if expected == "error":
        with pytest.raises(argparse.ArgumentTypeError):
            _rate(text)
    else:
        assert _rate(text) == expected


@pytest.mark.parametrize(("stop", "exit_code"), [("SIGKILL", 1), ("SIGTERM", 1), ("Ctrl-C", 130)])
async def test_a_backup_stopped_midway_leaves_no_copy_and_a_non_zero_exit(
    server_factory: Any, tmp_path: Path, stop: str, exit_code: int
):
    """The server killed: the connection breaks. The server stopped: shutdown cuts
    the backup at once (the listener's cleanup would otherwise wait a minute for
    it) and exits 0. `sepp backup` interrupted: it removes what it wrote."""
    server = server_factory(args=["--admin-listen", "127.0.0.1:0"])
    url = admin_url_of(server)
    client = await connect(server.address)
    big = {"data": os.urandom(512 * 1024), "encoding": "application/octet-stream"}
    for _ in range(4):  # 16 MiB of log; copied at 1 MB/s it takes 16 s
        await client.enqueue_ids(*(job("q", payload=big) for _ in range(8)))
    dest = tmp_path / "copy"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sepp.server.cli", "backup", str(dest), "--admin-addr", url,
        "--max-rate", "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not any((dest / "wal").glob("*.log")):  # the copy is under way
        assert time.monotonic() < deadline and proc.returncode is None, "no copy started"
        await asyncio.sleep(0.01)
    assert (dest / INCOMPLETE_MARKER).exists()
    if stop == "SIGKILL":
        server.kill()
    elif stop == "SIGTERM":
        assert await asyncio.to_thread(server.stop) == 0
    else:
        proc.send_signal(signal.SIGINT)
    _out, err = await proc.communicate()
    assert proc.returncode == exit_code, err
    assert (b"interrupted" if stop == "Ctrl-C" else b"incomplete") in err
    assert not dest.exists()
    if stop == "Ctrl-C":  # the server is left serving, the backup's pin released
        assert await asyncio.to_thread(server.stop) == 0
