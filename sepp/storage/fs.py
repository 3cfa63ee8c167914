"""The file-system seam: the few file operations storage performs, behind one
small interface that tests replace with a fault-injecting fake (`faultfs.py`).

Owns: `FileSystem` (the protocol), `RealFileSystem` (plain `os` calls) and
`StorageCrash`-free error semantics: every method raises `OSError` on failure and
storage turns any `OSError` from a write or a sync into a permanent failure.

Promises: the seam is deliberately tiny, so a fake can model exactly what a crash
can lose: bytes written but not synced, files created or renamed but whose
directory was not synced. On real files, everything storage creates is private to
its user whatever the umask: directories 0700, files 0600 (the log holds every
job's payload). A directory that already exists is never chmod-ed (it may be
shared on purpose); one that its group or others can enter is warned about once.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from typing import Protocol

log = logging.getLogger("sepp.storage")

# Modes of what storage (and the tools that write into a data directory) creates,
# whatever the umask (issue 13 §6: files were 0644, directories followed the umask).
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Buffers per pwritev call (the kernel's UIO_MAXIOV; POSIX guarantees 16).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16
# What `write_zeros` writes from (the log's preallocation step; larger runs loop).
_ZEROS = bytes(1 << 20)
_ZEROS_VIEW = memoryview(_ZEROS)

# Directories already created or checked by this process: each is warned about at
# most once, and not at all below one that was (its warning covers them) or below
# one created private (nobody else can reach them).
_checked_dirs: set[str] = set()


def make_private_dirs(path: str) -> bool:
    """Create `path`, and any missing parent, with mode 0700 whatever the umask.
    True if `path` was created; False if it already was a directory (left as it
    is). Raises OSError (FileExistsError for a file in the way) otherwise."""
    if os.path.isdir(path):
        return False
    parent = os.path.dirname(os.path.abspath(path))
    if parent and not os.path.isdir(parent):
        make_private_dirs(parent)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        if os.path.isdir(path):  # created meanwhile by someone else
            return False
        raise
    os.chmod(path, PRIVATE_DIR_MODE)  # the umask may have taken bits away
    return True


def private_opener(path: str, flags: int) -> int:
    """An `opener` for `open()` that creates files 0600 whatever the umask:
    `open(path, "xb", opener=private_opener)`. A file that already existed (no
    O_EXCL) keeps its mode."""
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    if flags & os.O_CREAT and flags & os.O_EXCL:
        try:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        except BaseException:
            os.close(fd)
            raise
    return fd


def warn_if_shared(path: str) -> None:
    """Log a warning (once per process) when an existing directory of a data
    directory can be entered or listed by its group or others."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if path in _checked_dirs:
        return
    _checked_dirs.add(path)
    if parent in _checked_dirs:
        return
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        log.warning(
            "%s is open to its group or others (mode %04o): the data directory holds "
            "every job's payload; sepp creates it 0700 but leaves an existing "
            "directory as it is: chmod 700 it unless sharing it is intended",
            path,
            mode,
        )


class FileSystem(Protocol):
    def makedirs(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int: ...

    def read(self, path: str) -> bytes:
        """The whole file."""
        ...

    def create(self, path: str) -> int:
        """Create a new, empty file for writing from its start (fails if it
        exists); a handle. `write` calls follow one another; `write_at` writes at
        an offset."""
        ...

    def open_write(self, path: str) -> int:
        """Open an existing file for `write_at`; a handle."""
        ...

    def write_at(self, handle: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset`, growing the file if it ends before."""
        ...

    def write_parts_at(self, handle: int, parts: list[bytes], offset: int) -> None:
        """Write the concatenation of `parts` at `offset`, as `write_at` would,
        without concatenating them first (the real seam uses pwritev)."""
        ...

    def write_zeros(self, handle: int, offset: int, size: int) -> None:
        """Write `size` zero bytes at `offset` (real blocks, not a hole)."""
        ...

    def write(self, handle: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of `data` at the end of the file."""
        ...

    def fsync(self, handle: int) -> None: ...

    def fdatasync(self, handle: int) -> None: ...

    def drop_cache(self, handle: int, offset: int, length: int) -> None:
        """Advice, after a sync: the bytes at `offset`..`offset + length` will
        not be read again soon, so their cached pages may be freed. Never changes
        the file and never fails."""
        ...

    def close(self, handle: int) -> None: ...

    def truncate(self, path: str, size: int) -> None:
        """Cut the file to `size` bytes and make that durable."""
        ...

    def rename(self, src: str, dst: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creates, renames, removes) durable."""
        ...

    def lock(self, path: str) -> int:
        """Take an exclusive, non-blocking lock on `path` (created if missing) for
        the life of the process; a handle for `unlock`. Raises `DataDirLocked` if
        another process holds it."""
        ...

    def unlock(self, handle: int) -> None: ...

    @property
    def supports_fork(self) -> bool:
        """Whether a forked child can write through this seam (real files only)."""
        ...


_FADV_DONTNEED: int | None = getattr(os, "POSIX_FADV_DONTNEED", None)


class DataDirLocked(OSError):
    """Another process (a running server) holds the data directory."""


class RealFileSystem:
    """The seam over the real operating system."""

    supports_fork = True

    def lock(self, path: str) -> int:
        try:
            fd = private_opener(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            fd = os.open(path, os.O_RDWR)
        try:
            # flock, not fcntl locks: held per open file, so a forked snapshot
            # writer that closes its copy does not release the parent's lock.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(
                f"{path} is locked by another process (is a sepp server running?)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unlock(self, handle: int) -> None:
        os.close(handle)  # closing the only descriptor releases the flock

    def makedirs(self, path: str) -> None:
        if make_private_dirs(path):
            _checked_dirs.add(os.path.abspath(path))
        else:
            warn_if_shared(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def create(self, path: str) -> int:
        # No O_APPEND: on Linux it would make pwrite (write_at) ignore its offset.
        return private_opener(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def open_write(self, path: str) -> int:
        return os.open(path, os.O_WRONLY)

    def write_at(self, handle: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        written = os.pwrite(handle, data, offset)
        if written == len(data):  # the usual case: no copy
            return
        view = memoryview(data)[written:]
        while view:
            offset += written
            written = os.pwrite(handle, view, offset)
            if written <= 0:  # pragma: no cover - os.pwrite raises instead
                raise OSError("short write")
            view = view[written:]

    def write_parts_at(self, handle: int, parts: list[bytes], offset: int) -> None:
        # pwritev releases the GIL for the whole copy: a b"".join of a large batch
        # holds it (and so the event loop) for milliseconds.
        views = [memoryview(part) for part in parts if part]
        while views:
            batch = views[:_IOV_MAX]
            written = os.pwritev(handle, batch, offset)
            if written <= 0:  # pragma: no cover - os.pwritev raises instead
                raise OSError("short write")
            offset += written
            # Drop what was written; a part written in part keeps its rest.
            done = 0
            while done < len(views) and written >= len(views[done]):
                written -= len(views[done])
                done += 1
            del views[:done]
            if written:
                views[0] = views[0][written:]

    def write_zeros(self, handle: int, offset: int, size: int) -> None:
        # From one shared zero buffer: a fresh one per call is a calloc that
        # jemalloc serves by discarding and faulting in its pages again (a 1 MiB
        # step cost ~2 ms on the writer thread on these virtual machines).
        while size > 0:
            step = min(size, len(_ZEROS))
            self.write_at(handle, _ZEROS_VIEW[:step], offset)
            offset += step
            size -= step

    def write(self, handle: int, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = os.write(handle, view)
            if written <= 0:  # pragma: no cover - os.write raises instead
                raise OSError("short write")
            view = view[written:]

    def fsync(self, handle: int) -> None:
        os.fsync(handle)

    def fdatasync(self, handle: int) -> None:
        os.fdatasync(handle)

    def drop_cache(self, handle: int, offset: int, length: int) -> None:
        # POSIX_FADV_DONTNEED frees the clean pages of the range (a synced range
        # has no dirty ones). Only advice: an error (or no posix_fadvise, macOS)
        # changes nothing.
        if _FADV_DONTNEED is None or length <= 0:
            return
        with contextlib.suppress(OSError):
            os.posix_fadvise(handle, offset, length, _FADV_DONTNEED)

    def close(self, handle: int) -> None:
        os.close(handle)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
