"""An in-memory, fault-injecting file system for crash tests (LevelDB's
`FaultInjectionTestEnv`, in Python).

Owns: `FaultyFileSystem`, a fake of the `fs.FileSystem` seam that remembers what
is durable and what is not, and can

- **crash** (a power loss): forget every create, rename and remove whose directory
  was not synced since, and of every file's bytes written since its last sync keep
  nothing (the default), an in-order prefix cut at a random byte (`tear`: a torn
  last write), or -- like the page cache's writeback -- any subset of the touched
  4 KiB pages, in no particular order (`pages`: each page independently reaches
  the disk whole, not at all, or torn: each of its 512-byte sectors new or as it
  was; the file's size may reach the disk without its data, which then reads as
  zeros). Bytes synced before the crash are never changed by it;
- **fail** a chosen operation with an `OSError` (ENOSPC, EIO, ...), once or for good;
- **run a hook** before every operation (tests raise `SimulatedCrash` from it to
  stop the process at an exact point: between write and sync, mid-rotation, ...);
- **flip bits** and **cap capacity**;

and `Crasher`, the hook that kills the simulated process before the n-th mutating
file operation or at the n-th hit of a storage hook point.

Promises: with `pages`, a crash here can leave whatever a power cut leaves on ext4
(the default data=ordered mode) for the operations the seam has, and more: ext4
usually persists a new file's directory entry with the file's data, here it is
lost unless the directory was synced; ext4 writes dirty pages back in any order
and a power cut can tear a page write at a sector boundary, here any subset of the
unsynced pages survives and any subset of a torn page's sectors; ext4 data=ordered
persists a grown size only with its data, here the size may come without it. So
code that survives this model survives those crashes on real disks. Not modelled:
a sector torn inside itself (drives write a sector atomically), stale blocks of
deleted files showing through (ext4 data=writeback, XFS), and damage to synced
data (that is `flip_bit`'s job).

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import errno
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

# The unit of page-cache writeback (`crash(pages=True)`): x86-64's page size; a
# torn page is torn at sector boundaries (the unit a drive writes atomically).
PAGE_BYTES = 4096
SECTOR_BYTES = 512


class SimulatedCrash(BaseException):
    """Raised by a test hook to stop the "process" at an exact point. A
    BaseException so that no `except Exception` in the code under test eats it."""


# The operations that change the disk (a crash "before the n-th" counts these).
MUTATING_OPS = frozenset(
    ("create", "write", "fsync", "fdatasync", "truncate", "rename", "remove", "fsync_dir")
)


class Crasher:
    """When the simulated process dies: before the n-th mutating file operation
    (`fs_hook`, for `FaultyFileSystem(hook=...)`), or at the n-th hit of a named
    storage hook point (`engine_hook`, for `Engine.open(hook=...)`). Once dead,
    every file operation and hook raises, so no thread of the dead process touches
    the disk again. `killed_at` says where: `"before OP PATH"` or the point."""

    def __init__(self) -> None:
        self.dead = False
        self.killed_at: str | None = None
        self.ops_left: int | None = None
        self.point: str | None = None
        self.point_hits_left = 0
        self.hits: Counter[str] = Counter()

    def arm_ops(self, n: int) -> None:
        self.ops_left = n

    def arm_point(self, point: str, n: int) -> None:
        self.point, self.point_hits_left = point, n

    def reset(self) -> None:
        self.dead, self.killed_at, self.ops_left, self.point = False, None, None, None

    def _die(self, where: str) -> None:
        self.dead, self.killed_at = True, where
        raise SimulatedCrash(where)

    def fs_hook(self, op: str, path: str) -> None:
        if self.dead:
            raise SimulatedCrash("the process is dead")
        if self.ops_left is not None and op in MUTATING_OPS:
            self.ops_left -= 1
            if self.ops_left <= 0:
                self._die(f"before {op} {path}")

    def engine_hook(self, point: str) -> None:
        self.hits[point] += 1
        if self.dead:
            raise SimulatedCrash("the process is dead")
        if point == self.point:
            self.point_hits_left -= 1
            if self.point_hits_left <= 0:
                self._die(point)


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    # The writes since the last sync, in order: (offset, bytes). A torn crash
    # keeps a prefix of them, the last one cut short.
    pending: list[tuple[int, bytes]] = field(default_factory=list)

    def put(self, data: bytes, offset: int) -> None:
        if offset > len(self.data):
            self.data += bytes(offset - len(self.data))
        self.data[offset : offset + len(data)] = data
        self.pending.append((offset, data))

    def synced(self) -> None:
        self.durable = bytes(self.data)
        self.pending.clear()


def writeback_pages(
    durable: bytes, current: bytes, pending: list[tuple[int, bytes]], rng: random.Random
) -> bytearray:
    """What a power loss leaves of a file whose synced content is `durable` and
    whose content in the page cache is `current`, after the unsynced writes
    `pending` ((offset, bytes), in order): every 4 KiB page they touched reaches
    the disk on its own -- whole (a third of the time), not at all (a third), or
    torn (each of its 512-byte sectors current or as synced, even odds) -- so a
    lost or torn page can come before a page that was kept. The file's new size reaches the
    disk or not, or a size in between; what no kept page covers reads as the synced
    bytes, zeros past them. Never shorter than `durable`, and a byte that `pending`
    did not change is the synced one."""
    size = len(current)
    if size > len(durable):
        size = rng.choice((len(durable), size, rng.randrange(len(durable), size + 1)))
    out = bytearray(durable[:size])
    out += bytes(size - len(out))
    touched: set[int] = set()
    for offset, data in pending:
        if data:
            touched.update(range(offset // PAGE_BYTES, (offset + len(data) - 1) // PAGE_BYTES + 1))
    for page in sorted(touched):
        start = page * PAGE_BYTES
        end = min(start + PAGE_BYTES, size)
        if start >= end:
            continue
        fate = rng.randrange(3)
        if fate == 0:
            out[start:end] = current[start:end]
        elif fate == 2:
            for sector in range(start, end, SECTOR_BYTES):
                if rng.random() < 0.5:
                    stop = min(sector + SECTOR_BYTES, end)
                    out[sector:stop] = current[sector:stop]
    return out


@dataclass
class _Dir:
    entries: dict[str, _Inode] = field(default_factory=dict)
    durable: dict[str, _Inode] = field(default_factory=dict)
    subdirs: set[str] = field(default_factory=set)


@dataclass
class _Fault:
    op: str
    path_contains: str
    error: int
    remaining: int  # how many more matching calls fail; -1 = for ever
    skip: int  # matching calls to let through before failing


class FaultyFileSystem:
    supports_fork = False

    def __init__(self) -> None:
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._handles: dict[int, tuple[str, _Inode]] = {}
        self._next_handle = 3
        self._faults: list[_Fault] = []
        self.hook: Callable[[str, str], None] | None = None
        self.capacity_bytes: int | None = None
        self.ops: list[tuple[str, str]] = []
        self._locks: set[str] = set()
        self._lock_handles: dict[int, str] = {}
        self.record_ops = False
        # (path, offset, length) of every drop_cache call: advice, kept for tests.
        self.cache_drops: list[tuple[str, int, int]] = []

    # -- helpers -------------------------------------------------------------

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = os.path.normpath(path)
        return os.path.dirname(path) or "/", os.path.basename(path)

    def _dir(self, path: str) -> _Dir:
        path = os.path.normpath(path)
        d = self._dirs.get(path)
        if d is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", path)
        return d

    def _inode(self, path: str) -> _Inode:
        parent, name = self._split(path)
        inode = self._dir(parent).entries.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return inode

    def _op(self, op: str, path: str) -> None:
        if self.record_ops:
            self.ops.append((op, path))
        if self.hook is not None:
            self.hook(op, path)
        for fault in self._faults:
            if fault.op == op and fault.path_contains in path and fault.remaining != 0:
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                if fault.remaining > 0:
                    fault.remaining -= 1
                raise OSError(fault.error, f"injected {errno.errorcode[fault.error]} on {op}", path)

    def _used_bytes(self) -> int:
        return sum(len(i.data) for d in self._dirs.values() for i in d.entries.values())

    # -- fault control -------------------------------------------------------

    def fail(
        self,
        op: str,
        error: int = errno.EIO,
        *,
        path_contains: str = "",
        times: int = 1,
        after: int = 0,
    ) -> None:
        """Make the next `times` calls of `op` (after letting `after` through) whose
        path contains `path_contains` raise OSError(error). times=-1: for ever."""
        self._faults.append(_Fault(op, path_contains, error, times, after))

    def clear_faults(self) -> None:
        self._faults.clear()

    def crash(
        self, rng: random.Random | None = None, *, tear: bool = False, pages: bool = False
    ) -> None:
        """Lose everything that was not durable. With `tear`, each file keeps a
        random prefix of its unsynced bytes, as a torn last write would. With
        `pages` (and `rng`), each file keeps a random subset of its unsynced pages
        instead, each whole or torn, in no order (`writeback_pages`)."""
        for d in self._dirs.values():
            d.entries = dict(d.durable)
            inodes = {id(i): i for i in d.entries.values()}
            for inode in inodes.values():
                pending = inode.pending
                current = bytes(inode.data)
                inode.data = bytearray(inode.durable)
                inode.pending = []
                if pages and rng is not None and pending:
                    inode.data = writeback_pages(inode.durable, current, pending, rng)
                elif tear and rng is not None and pending:
                    # A torn crash: the writes since the last sync reach the disk
                    # in order up to a random one, which is cut at a random byte.
                    torn = rng.randrange(len(pending))
                    for offset, data in pending[:torn]:
                        inode.put(data, offset)
                    offset, data = pending[torn]
                    inode.put(data[: rng.randrange(len(data) + 1)], offset)
                inode.synced()
        self._handles.clear()
        self._faults.clear()
        # The crashed process's locks die with it.
        self._locks.clear()
        self._lock_handles.clear()

    def flip_bit(self, path: str, offset: int, bit: int = 0) -> None:
        inode = self._inode(path)
        inode.data[offset] ^= 1 << bit
        durable = bytearray(inode.durable)
        if offset < len(durable):
            durable[offset] ^= 1 << bit
            inode.durable = bytes(durable)

    def put(self, path: str, data: bytes) -> None:
        """Place a file with durable content (test setup, no hooks or faults)."""
        parent, name = self._split(path)
        d = self._dir(parent)
        inode = _Inode(bytearray(data), bytes(data))
        d.entries[name] = inode
        d.durable[name] = inode

    def durable_files(self) -> dict[str, bytes]:
        out = {}
        for dpath, d in self._dirs.items():
            for name, inode in d.durable.items():
                out[os.path.join(dpath, name)] = inode.durable
        return out

    # -- the seam ------------------------------------------------------------

    def lock(self, path: str) -> int:
        # One "process" per fake: a second lock of the same path means two
        # engines opened the same directory at once.
        from sepp.storage.fs import DataDirLocked

        path = os.path.normpath(path)
        if path in self._locks:
            raise DataDirLocked(f"{path} is locked by another engine")
        self._locks.add(path)
        handle = self._next_handle
        self._next_handle += 1
        self._lock_handles[handle] = path
        return handle

    def unlock(self, handle: int) -> None:
        path = self._lock_handles.pop(handle, None)
        if path is not None:
            self._locks.discard(path)

    def makedirs(self, path: str) -> None:
        path = os.path.normpath(path)
        parts = []
        while path not in self._dirs:
            parts.append(path)
            path = os.path.dirname(path) or "/"
        for p in reversed(parts):
            self._op("makedirs", p)
            self._dirs[p] = _Dir()
            self._dirs[os.path.dirname(p) or "/"].subdirs.add(os.path.basename(p))

    def listdir(self, path: str) -> list[str]:
        d = self._dir(path)
        return sorted(set(d.entries) | d.subdirs)

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        if path in self._dirs:
            return True
        parent, name = self._split(path)
        d = self._dirs.get(parent)
        return d is not None and name in d.entries

    def size(self, path: str) -> int:
        return len(self._inode(path).data)

    def read(self, path: str) -> bytes:
        self._op("read", path)
        return bytes(self._inode(path).data)

    def _open(self, path: str, inode: _Inode) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = (path, inode)
        return handle

    def create(self, path: str) -> int:
        self._op("create", path)
        parent, name = self._split(path)
        d = self._dir(parent)
        if name in d.entries:
            raise FileExistsError(errno.EEXIST, "file exists", path)
        inode = _Inode()
        d.entries[name] = inode
        return self._open(path, inode)

    def open_write(self, path: str) -> int:
        self._op("open_write", path)
        return self._open(path, self._inode(path))

    def write_at(self, handle: int, data: bytes | bytearray | memoryview, offset: int) -> None:
        path, inode = self._handle(handle)
        self._op("write", path)
        self._put_at(path, inode, bytes(data), offset)

    def write_parts_at(self, handle: int, parts: list[bytes], offset: int) -> None:
        self.write_at(handle, b"".join(parts), offset)

    def _put_at(self, path: str, inode: _Inode, data: bytes, offset: int) -> None:
        grow = max(0, offset + len(data) - len(inode.data))
        if self.capacity_bytes is not None and self._used_bytes() + grow > self.capacity_bytes:
            raise OSError(errno.ENOSPC, "no space left on device", path)
        inode.put(data, offset)

    def write_zeros(self, handle: int, offset: int, size: int) -> None:
        path, inode = self._handle(handle)
        self._op("write_zeros", path)
        if self.capacity_bytes is not None:
            # As the real seam's pwrite loop on a full disk: the zeros that fit
            # are written (a short write), then ENOSPC.
            room = self.capacity_bytes - self._used_bytes() + max(0, len(inode.data) - offset)
            if size > room:
                if room > 0:
                    inode.put(bytes(room), offset)
                raise OSError(errno.ENOSPC, "no space left on device", path)
        self._put_at(path, inode, bytes(size), offset)

    def _handle(self, handle: int) -> tuple[str, _Inode]:
        try:
            return self._handles[handle]
        except KeyError:
            raise OSError(errno.EBADF, "bad handle") from None

    def write(self, handle: int, data: bytes | bytearray | memoryview) -> None:
        path, inode = self._handle(handle)
        self._op("write", path)
        if self.capacity_bytes is not None and self._used_bytes() + len(data) > self.capacity_bytes:
            room = max(0, self.capacity_bytes - self._used_bytes())
            inode.put(bytes(data[:room]), len(inode.data))  # a short write, then the error
            raise OSError(errno.ENOSPC, "no space left on device", path)
        inode.put(bytes(data), len(inode.data))

    def fsync(self, handle: int) -> None:
        path, inode = self._handle(handle)
        self._op("fsync", path)
        inode.synced()

    def fdatasync(self, handle: int) -> None:
        path, inode = self._handle(handle)
        self._op("fdatasync", path)
        inode.synced()

    def drop_cache(self, handle: int, offset: int, length: int) -> None:
        # Advice only: no operation, no crash point; recorded for tests.
        path, _inode = self._handle(handle)
        self.cache_drops.append((path, offset, length))

    def close(self, handle: int) -> None:
        self._handles.pop(handle, None)

    def truncate(self, path: str, size: int) -> None:
        self._op("truncate", path)
        inode = self._inode(path)
        del inode.data[size:]
        inode.synced()

    def rename(self, src: str, dst: str) -> None:
        self._op("rename", dst)
        sparent, sname = self._split(src)
        dparent, dname = self._split(dst)
        sd = self._dir(sparent)
        inode = sd.entries.pop(sname, None)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", src)
        self._dir(dparent).entries[dname] = inode

    def remove(self, path: str) -> None:
        self._op("remove", path)
        parent, name = self._split(path)
        d = self._dir(parent)
        if d.entries.pop(name, None) is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)

    def fsync_dir(self, path: str) -> None:
        self._op("fsync_dir", path)
        d = self._dir(path)
        d.durable = dict(d.entries)
