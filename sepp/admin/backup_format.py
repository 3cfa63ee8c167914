"""The online backup's stream format (version 1): what `POST /admin/api/v1/backup`
sends and `sepp backup` reads. Sans-I/O: bytes in, events out.

Owns: the line encoders (`manifest_line`, `file_line`, `trailer_line`), the
incremental `BackupDecoder` (feed bytes, get events; `finish` at end of stream),
the typed errors `BackupFormatError` (bytes that are not this format) and
`BackupCut` (the stream ended before its trailer, or it disagrees with what came),
and `stream_length`.

The stream, every line one JSON object ending in "\\n":

    {"format": "sepp-backup", "version": 1, "seq": B, "snapshot_seq": S,
     "bytes": T, "files": [{"name": "snapshots/...", "size": N}, ...]}
    {"file": "snapshots/...", "size": N}      then exactly N bytes of the file
    {"file": "wal/...", "size": N}            then N bytes ... (one per manifest entry)
    {"end": true, "seq": B, "bytes": T,
     "files": [{"name": ..., "size": N, "crc32c": C}, ...]}

and nothing after the trailer. B is the last log record the copy holds (durable
when the backup started), S the snapshot it starts from (0: none, the log starts
at seq 1), T the sum of the file sizes, C the CRC-32C of each file's bytes as 8
hex digits (a fixed width: the stream's length is known before its first byte,
and the HTTP answer sends it as its Content-Length). Names
are `snapshots/<snapshot file name>` or `wal/<segment file name>` (log_format's
names, so no path ever leaves the destination). A reader trusts a copy only once
the trailer came, agrees with the manifest and every file's size and checksum,
and the stream ended right after it: a server that fails mid-way closes the
connection without a trailer.

Promises: every line is at most LINE_BYTES_MAX bytes (the decoder refuses longer
ones); garbage raises BackupFormatError, never anything else; a stream cut at any
byte raises BackupCut from `finish`.

Must not import: asyncio, sockets, aiohttp.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import crc32c

FORMAT_NAME = "sepp-backup"
FORMAT_VERSION = 1
CONTENT_TYPE = "application/vnd.sepp.backup"
# A manifest of many tiny segments is the longest line: 16 MiB holds ~200,000.
LINE_BYTES_MAX = 16 * 1024 * 1024
WAL_PREFIX = "wal/"
SNAPSHOTS_PREFIX = "snapshots/"


class BackupFormatError(ValueError):
    """The bytes are not a sepp backup stream of a version this reader knows."""


class BackupCut(ValueError):
    """The stream ended before a complete, checked trailer: the copy is incomplete."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    seq: int
    snapshot_seq: int
    bytes: int
    files: tuple[FileEntry, ...]


@dataclass(frozen=True, slots=True)
class FileStart:
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class FileData:
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class FileEnd:
    name: str
    crc32c: int


@dataclass(frozen=True, slots=True)
class Trailer:
    seq: int
    bytes: int


Event = Manifest | FileStart | FileData | FileEnd | Trailer


# The exact names the server writes (log_format's segment and snapshot file names:
# 20 digits), so no name can reach outside the destination ("wal/../../x.log").
_NAME = re.compile(r"(?:wal/[0-9]{20}\.log|snapshots/[0-9]{20}\.snap)\Z")


def check_name(name: object) -> str:
    """A file name of the stream, checked: `snapshots/<snapshot name>` or
    `wal/<segment name>`. Raises BackupFormatError."""
    if not isinstance(name, str) or _NAME.match(name) is None:
        raise BackupFormatError(
            f"file name {name!r} is neither snapshots/<20 digits>.snap nor wal/<20 digits>.log"
        )
    return name


def _line(value: dict[str, Any]) -> bytes:
    line = json.dumps(value, separators=(",", ":")).encode() + b"\n"
    if len(line) > LINE_BYTES_MAX:
        raise ValueError(f"a backup stream line of {len(line)} bytes (max {LINE_BYTES_MAX})")
    return line


def manifest_line(manifest: Manifest) -> bytes:
    return _line(
        {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "seq": manifest.seq,
            "snapshot_seq": manifest.snapshot_seq,
            "bytes": manifest.bytes,
            "files": [{"name": f.name, "size": f.size} for f in manifest.files],
        }
    )


def file_line(entry: FileEntry) -> bytes:
    return _line({"file": entry.name, "size": entry.size})


def crc_text(crc: int) -> str:
    """A CRC-32C as the trailer writes it: 8 hex digits (a fixed width, so the
    stream's length is known before the first byte)."""
    return f"{crc:08x}"


def trailer_line(manifest: Manifest, crcs: list[int]) -> bytes:
    return _line(
        {
            "end": True,
            "seq": manifest.seq,
            "bytes": manifest.bytes,
            "files": [
                {"name": f.name, "size": f.size, "crc32c": crc_text(crc)}
                for f, crc in zip(manifest.files, crcs, strict=True)
            ],
        }
    )


def stream_length(manifest: Manifest) -> int:
    """The whole stream's length in bytes (the HTTP answer's Content-Length)."""
    length = len(manifest_line(manifest)) + manifest.bytes
    length += sum(len(file_line(entry)) for entry in manifest.files)
    return length + len(trailer_line(manifest, [0] * len(manifest.files)))


def _int(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise BackupFormatError(f"{what} {value!r} is not a non-negative integer")
    return value


def _object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise BackupFormatError(f"a line that is not JSON: {line[:80]!r}") from exc
    if not isinstance(value, dict):
        raise BackupFormatError(f"a line that is not a JSON object: {line[:80]!r}")
    return value


def _manifest(value: dict[str, Any]) -> Manifest:
    if value.get("format") != FORMAT_NAME:
        raise BackupFormatError(f"not a sepp backup stream (format {value.get('format')!r})")
    if value.get("version") != FORMAT_VERSION:
        raise BackupFormatError(
            f"backup stream version {value.get('version')!r}; this reader knows {FORMAT_VERSION}"
        )
    files = value.get("files")
    if not isinstance(files, list):
        raise BackupFormatError("the manifest has no file list")
    entries = []
    for item in files:
        if not isinstance(item, dict):
            raise BackupFormatError(f"manifest entry {item!r} is not an object")
        entries.append(FileEntry(check_name(item.get("name")), _int(item.get("size"), "size")))
    if len({e.name for e in entries}) != len(entries):
        raise BackupFormatError("the manifest names a file twice")
    manifest = Manifest(
        seq=_int(value.get("seq"), "seq"),
        snapshot_seq=_int(value.get("snapshot_seq"), "snapshot_seq"),
        bytes=_int(value.get("bytes"), "bytes"),
        files=tuple(entries),
    )
    if manifest.bytes != sum(e.size for e in entries):
        raise BackupFormatError("the manifest's byte count is not the sum of its files")
    return manifest


class BackupDecoder:
    """Feed the stream's bytes in any pieces; get events in order. `finish()` at
    the end of the stream: raises BackupCut unless a trailer that matches every
    file came and nothing followed it."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.manifest: Manifest | None = None
        self.trailer: Trailer | None = None
        self._index = 0  # the next manifest entry
        self._current: FileEntry | None = None
        self._remaining = 0
        self._crc = 0
        self._crcs: list[int] = []
        self.received_bytes = 0  # file bytes so far (for a progress bar)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """The events the next bytes complete. A FileData inside `data` is a view
        of it, not a copy: valid until `data` changes (write it out first)."""
        view = memoryview(data).cast("B")
        events: list[Event] = []
        at = 0
        end = len(view)
        while True:
            if self.trailer is not None:
                if at < end or self._buffer:
                    raise BackupFormatError("bytes after the trailer")
                break
            if self._current is not None:
                if self._buffer:  # file bytes that came with a line: a copy
                    take = min(self._remaining, len(self._buffer))
                    chunk: bytes | memoryview = bytes(self._buffer[:take])
                    del self._buffer[:take]
                elif at < end:  # the common case: a view of the input
                    take = min(self._remaining, end - at)
                    chunk = view[at : at + take]
                    at += take
                else:
                    break
                self._crc = crc32c.crc32c(chunk, self._crc)
                self._remaining -= take
                self.received_bytes += take
                events.append(FileData(chunk))
                if self._remaining == 0:
                    events.append(self._end_file())
                continue
            # Line mode (once per file): gather the rest of the input.
            if at < end:
                self._buffer += view[at:end]
                at = end
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > LINE_BYTES_MAX:
                    raise BackupFormatError(f"a line longer than {LINE_BYTES_MAX} bytes")
                break
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            event = self._line(_object(line))
            events.append(event)
            if type(event) is FileStart and event.size == 0:
                events.append(self._end_file())
        return events

    def _end_file(self) -> FileEnd:
        entry = self._current
        assert entry is not None
        self._crcs.append(self._crc)
        self._current = None
        self._index += 1
        return FileEnd(entry.name, self._crc)

    def _line(self, value: dict[str, Any]) -> Event:
        manifest = self.manifest
        if manifest is None:
            self.manifest = _manifest(value)
            return self.manifest
        if "file" in value:
            if self._index >= len(manifest.files):
                raise BackupFormatError(f"a file the manifest does not list: {value!r}")
            expected = manifest.files[self._index]
            if value.get("file") != expected.name or value.get("size") != expected.size:
                raise BackupFormatError(f"file {value!r} where the manifest says {expected}")
            self._current = expected
            self._remaining = expected.size
            self._crc = 0
            return FileStart(expected.name, expected.size)
        if value.get("end") is True:
            return self._trailer(manifest, value)
        raise BackupFormatError(f"an unknown line: {value!r}")

    def _trailer(self, manifest: Manifest, value: dict[str, Any]) -> Trailer:
        if self._index != len(manifest.files):
            raise BackupCut(f"the trailer came after {self._index} of {len(manifest.files)} files")
        if value.get("seq") != manifest.seq or value.get("bytes") != manifest.bytes:
            raise BackupCut(f"the trailer {value.get('seq')!r} disagrees with the manifest")
        files = value.get("files")
        if not isinstance(files, list) or len(files) != len(manifest.files):
            raise BackupCut("the trailer's file list disagrees with the manifest")
        for entry, crc, item in zip(manifest.files, self._crcs, files, strict=True):
            if not isinstance(item, dict) or (item.get("name"), item.get("size")) != (
                entry.name,
                entry.size,
            ):
                raise BackupCut(f"the trailer's entry {item!r} disagrees with {entry}")
            if item.get("crc32c") != crc_text(crc):
                raise BackupCut(
                    f"{entry.name}: checksum {crc_text(crc)} received, the server sent "
                    f"{item.get('crc32c')!r}"
                )
        self.trailer = Trailer(manifest.seq, manifest.bytes)
        return self.trailer

    def finish(self) -> Trailer:
        """The stream ended: the checked trailer, or BackupCut."""
        if self.trailer is None:
            if self.manifest is None:
                raise BackupCut("the stream ended before its manifest")
            where = (
                f"in {self._current.name} with {self._remaining} bytes missing"
                if self._current is not None
                else f"after {self._index} of {len(self.manifest.files)} files"
            )
            raise BackupCut(f"the stream ended without its trailer ({where})")
        return self.trailer
