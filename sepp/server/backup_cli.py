"""`sepp backup DEST`: a consistent copy of a running server's data directory,
through its admin API (`POST /admin/api/v1/backup`, sepp/admin/backup.py).

    sepp backup DEST [--admin-addr URL] [--admin-key-file FILE] [--tls-ca FILE]
                     [--max-rate MB_PER_S] [--json]

Owns: the command (`add_backup_command`, `run_backup`) and writing the stream of
sepp/admin/backup_format.py into DEST.

Promises:
- DEST must be absent or an empty directory: anything else is refused before the
  server is asked (exit 2). DEST is created 0700 (it holds every payload).
- While the copy is written, DEST holds INCOMPLETE_MARKER (written and synced
  first); it is removed, and DEST synced, only once every file is written and
  synced and the trailer matched every file's size and checksum. A copy without
  the marker is complete.
- A stream that ends early or does not check (the server failed, the connection
  broke, a checksum differs) is exit 1 with one line on stderr, and what was
  written is removed (DEST is left as it was found, or removed if created here).
  If `sepp backup` itself is killed, the marker stays: such a DEST is not a
  backup (delete it and run the backup again).
- The copy is paced to --max-rate MB/s (default DEFAULT_MAX_RATE_MB; 0: no
  limit): the server sends only as fast as it is read, so its cost is spread.
- A progress bar (bytes, percent, rate) goes to stderr when it is a terminal.
  The result goes to stdout: one line, or a JSON object with --json.

Exit codes: 0 complete; 1 refused by the server, unreachable, cut or unwritable;
2 an argument the command cannot use (a non-empty DEST, an unreadable key file);
130 interrupted (Ctrl-C; what was written is removed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import ssl
import sys
import time
import urllib.parse
from dataclasses import dataclass
from typing import IO, Any

from sepp.admin.backup_format import (
    CONTENT_TYPE,
    BackupCut,
    BackupDecoder,
    BackupFormatError,
    FileData,
    FileEnd,
    FileStart,
    Manifest,
    Trailer,
)
from sepp.storage.fs import make_private_dirs, private_opener

DEFAULT_ADMIN_ADDR = "http://127.0.0.1:9465"
BACKUP_PATH = "/admin/api/v1/backup"
INCOMPLETE_MARKER = "BACKUP-INCOMPLETE"
# One read from the connection (and one write to a file) at most.
READ_BYTES = 1024 * 1024
# No byte from the server for this long: give up (the server waits for one
# group commit before its first byte, then streams).
SOCKET_TIMEOUT_S = 60.0
# Sync what was written every this many bytes, and drop it from the page cache:
# one fsync per 64 MiB segment would hand the disk a burst that the server's own
# log syncs (on the same disk, often) wait behind; a copy of the whole data
# directory would also push the server's hot pages out of memory.
SYNC_EVERY_BYTES = 8 * 1024 * 1024
# The progress bar redraws at most this often.
PROGRESS_EVERY_S = 0.2
MIB = 1024 * 1024
# The copy's default pace, MB (10^6 bytes) per second. A backup as fast as it
# goes costs the server about a second of its request throughput per GB read and
# sent (benchmarks/bench_backup.py: a 25-30 % drop over the copy's few seconds);
# paced, the same cost is spread thin (50 MB/s: a few %). Elasticsearch's
# snapshots default to 40 MB/s for the same reason. `--max-rate 0`: no limit.
DEFAULT_MAX_RATE_MB = 50.0


class BackupFailed(Exception):
    """The copy is not complete: exit `code`, `str(self)` on stderr."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class BackupResult:
    dest: str
    seq: int
    snapshot_seq: int
    files: int
    bytes: int
    seconds: float


def add_backup_command(sub: Any) -> None:
    """Add `sepp backup` to the `sepp` command's subparsers."""
    parser = sub.add_parser(
        "backup",
        help="copy a running server's data directory (snapshot + log) into DEST",
        description="Write a consistent copy of a running server's data directory into "
        "DEST (absent or empty) through its admin API: the newest snapshot and the log up "
        "to a durable sequence number. `sepp serve --data-dir DEST` starts from it.",
    )
    parser.add_argument("dest", metavar="DEST", help="the directory to create (or an empty one)")
    parser.add_argument(
        "--admin-addr",
        default=os.environ.get("SEPP_ADMIN_ADDR", DEFAULT_ADMIN_ADDR),
        help=f"the admin listener (default $SEPP_ADMIN_ADDR, else {DEFAULT_ADMIN_ADDR}; "
        "https:// for TLS)",
    )
    parser.add_argument(
        "--admin-key-file",
        default=os.environ.get("SEPP_ADMIN_KEY_FILE"),
        metavar="FILE",
        help="a file whose first line is an admin key of role admin (default "
        "$SEPP_ADMIN_KEY_FILE; none: a loopback listener without admin keys)",
    )
    parser.add_argument("--tls-ca", metavar="FILE", help="verify an https:// listener with it")
    parser.add_argument(
        "--max-rate",
        type=_rate,
        default=DEFAULT_MAX_RATE_MB,
        metavar="MB_PER_S",
        help=f"copy at most this many MB (10^6 bytes) per second (default {DEFAULT_MAX_RATE_MB:g}; "
        "0 = as fast as it goes)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    progress = sys.stderr if sys.stderr.isatty() else None
    try:
        result = run_backup(
            args.dest,
            admin_addr=args.admin_addr,
            key_file=args.admin_key_file,
            tls_ca=args.tls_ca,
            progress=progress,
            max_rate_mb=args.max_rate,
        )
    except BackupFailed as exc:
        print(f"sepp backup: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:  # run_backup removed what it wrote on the way out
        print("sepp backup: interrupted, nothing kept", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(_as_dict(result)))
    else:
        print(
            f"backup of seq {result.seq} (snapshot {result.snapshot_seq}): {result.files} "
            f"files, {result.bytes / MIB:.1f} MiB in {result.seconds:.1f}s written to "
            f"{result.dest}"
        )
    return 0


def _rate(text: str) -> float | None:
    """--max-rate: MB/s above 0, or 0 for no limit (None)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 (no limit) or above")
    return value or None


def _as_dict(result: BackupResult) -> dict[str, object]:
    return {name: getattr(result, name) for name in BackupResult.__slots__}


def _read_key(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BackupFailed(f"cannot read {path}: {exc}", 2) from None
    if not key:
        raise BackupFailed(f"{path} holds no key (its first line is empty)", 2)
    return key


def _prepare_dest(dest: str) -> bool:
    """Check DEST (absent or an empty directory); create it. True if created."""
    if os.path.lexists(dest):
        if not os.path.isdir(dest):
            raise BackupFailed(f"{dest} exists and is not a directory", 2)
        if os.listdir(dest):
            raise BackupFailed(f"{dest} is not empty: a backup goes into a new directory", 2)
    try:
        return make_private_dirs(dest)
    except OSError as exc:
        raise BackupFailed(f"cannot create {dest}: {exc}") from None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _connect(admin_addr: str, tls_ca: str | None) -> tuple[http.client.HTTPConnection, str]:
    addr = admin_addr if "://" in admin_addr else "http://" + admin_addr
    url = urllib.parse.urlsplit(addr)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise BackupFailed(f"--admin-addr {admin_addr!r}: expected http(s)://HOST:PORT", 2)
    try:
        port = url.port
    except ValueError:
        raise BackupFailed(f"--admin-addr {admin_addr!r}: bad port", 2) from None
    prefix = url.path.rstrip("/")
    if url.scheme == "https" or tls_ca is not None:
        try:
            context = ssl.create_default_context(cafile=tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise BackupFailed(f"--tls-ca {tls_ca}: {exc}") from None
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            url.hostname, port, timeout=SOCKET_TIMEOUT_S, context=context
        )
    else:
        connection = http.client.HTTPConnection(url.hostname, port, timeout=SOCKET_TIMEOUT_S)
    return connection, prefix + BACKUP_PATH


class _Progress:
    def __init__(self, out: IO[str] | None) -> None:
        self.out = out
        self.total = 0
        self.started = time.monotonic()
        self.last = 0.0

    def show(self, done: int, final: bool = False) -> None:
        if self.out is None:
            return
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        elapsed = max(now - self.started, 1e-6)
        percent = 100.0 * done / self.total if self.total else 100.0
        width = 30
        filled = int(width * percent / 100)
        bar = "#" * filled + "-" * (width - filled)
        self.out.write(
            f"\rbackup [{bar}] {done / MIB:8.1f} / {self.total / MIB:.1f} MiB "
            f"{percent:5.1f}%  {done / MIB / elapsed:7.1f} MiB/s"
        )
        if final:
            self.out.write("\n")
        self.out.flush()


class _Writer:
    """Writes the decoder's events into DEST: each file created exclusively,
    synced when it ends."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self.fd: int | None = None
        self.dirs: set[str] = set()
        self.unsynced = 0

    def start(self, name: str) -> None:
        path = os.path.join(self.dest, name)
        directory = os.path.dirname(path)
        if directory not in self.dirs:
            make_private_dirs(directory)
            self.dirs.add(directory)
        self.fd = private_opener(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def write(self, data: bytes | memoryview) -> None:
        fd = self.fd
        assert fd is not None
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        self.unsynced += len(data)
        if self.unsynced >= SYNC_EVERY_BYTES:
            self._sync(fd)

    def _sync(self, fd: int) -> None:
        os.fdatasync(fd)
        self.unsynced = 0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def end(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                self._sync(fd)
                os.fsync(fd)  # the size and times too
            finally:
                os.close(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _receive(
    response: http.client.HTTPResponse,
    writer: _Writer,
    progress: _Progress,
    max_rate_bytes: float | None = None,
) -> tuple[Manifest, Trailer]:
    decoder = BackupDecoder()
    # One buffer for the whole copy: the file bytes go from it to the files
    # without a copy (a fresh megabyte per read costs page faults, measured at
    # about half of the command's CPU time).
    buffer = memoryview(bytearray(READ_BYTES))
    began = time.monotonic()
    while True:
        try:
            size = response.readinto(buffer)
        except (OSError, http.client.HTTPException) as exc:
            raise BackupCut(f"the connection broke: {exc!r}") from exc
        data = buffer[:size]
        for event in decoder.feed(data):
            if type(event) is FileData:
                writer.write(event.data)
            elif type(event) is FileStart:
                writer.start(event.name)
            elif type(event) is FileEnd:
                writer.end()
            elif type(event) is Manifest:
                progress.total = event.bytes
        progress.show(decoder.received_bytes)
        if max_rate_bytes is not None:
            # --max-rate: the server waits for us (flow control), so pacing the
            # reads paces its disk reads and CPU as well.
            ahead = decoder.received_bytes / max_rate_bytes - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
        if not size:
            trailer = decoder.finish()
            manifest = decoder.manifest
            assert manifest is not None
            progress.show(decoder.received_bytes, final=True)
            return manifest, trailer


def _error_message(response: http.client.HTTPResponse) -> str:
    body = response.read(64 * 1024)
    try:
        error = json.loads(body)["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace").strip() or response.reason


def run_backup(
    dest: str,
    *,
    admin_addr: str = DEFAULT_ADMIN_ADDR,
    key_file: str | None = None,
    tls_ca: str | None = None,
    progress: IO[str] | None = None,
    max_rate_mb: float | None = None,
) -> BackupResult:
    """Copy the server's data directory into `dest`, at most `max_rate_mb` MB per
    second (None: no limit). Raises BackupFailed."""
    headers = {"Accept": CONTENT_TYPE}
    if key_file is not None:
        headers["Authorization"] = f"Bearer {_read_key(key_file)}"
    connection, path = _connect(admin_addr, tls_ca)
    dest = os.path.abspath(dest)
    created = _prepare_dest(dest)
    began = time.monotonic()
    marker = os.path.join(dest, INCOMPLETE_MARKER)
    writer = _Writer(dest)
    complete = False
    try:
        try:
            with open(marker, "x", encoding="utf-8", opener=private_opener) as f:
                f.write("sepp backup is writing this directory; it is not a backup until "
                        "this file is gone\n")  # fmt: skip
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(dest)
        except OSError as exc:
            raise BackupFailed(f"cannot write into {dest}: {exc}") from None
        try:
            connection.request("POST", path, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise BackupFailed(f"cannot reach {admin_addr}: {exc}") from None
        if response.status != 200:
            raise BackupFailed(
                f"the server refused the backup ({response.status}): {_error_message(response)}"
            )
        try:
            rate = None if max_rate_mb is None else max_rate_mb * 1e6
            manifest, _trailer = _receive(response, writer, _Progress(progress), rate)
        except (BackupCut, BackupFormatError) as exc:
            raise BackupFailed(f"the backup is incomplete, nothing kept: {exc}") from None
        except OSError as exc:
            raise BackupFailed(f"cannot write into {dest}: {exc}") from None
        try:
            for directory in writer.dirs:
                _fsync_dir(directory)
            os.remove(marker)
            _fsync_dir(dest)
            _fsync_dir(os.path.dirname(dest))
        except OSError as exc:
            raise BackupFailed(f"cannot finish {dest}: {exc}") from None
        complete = True
    finally:
        writer.close()
        connection.close()
        if not complete:
            _remove_partial(dest, created)
    return BackupResult(
        dest=dest,
        seq=manifest.seq,
        snapshot_seq=manifest.snapshot_seq,
        files=len(manifest.files),
        bytes=manifest.bytes,
        seconds=time.monotonic() - began,
    )


def _remove_partial(dest: str, created: bool) -> None:
    """Remove what an incomplete backup wrote: DEST itself if it was created
    here, else its contents (it was empty)."""
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for name in os.listdir(dest):
        path = os.path.join(dest, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
