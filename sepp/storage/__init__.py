"""sepp's storage: the write-ahead log, group commit, snapshots and recovery.

Synchronous and thread-based (no asyncio): the server drives it from its event
loop and a flushing thread. All file operations go through the `fs.FileSystem`
seam so tests can crash it (`faultfs.FaultyFileSystem`).
"""

from sepp.storage.engine import (
    SNAPSHOT_FORK,
    SNAPSHOT_INLINE,
    Engine,
    GroupCommitter,
    StorageFailed,
    StorageOptions,
)
from sepp.storage.fs import FileSystem, RealFileSystem
from sepp.storage.recovery import RecoveryError, RecoveryReport
from sepp.storage.wal import (
    HOOK_POINTS,
    PERSIST_BUFFER,
    PERSIST_MODES,
    PERSIST_SYNC_ALL,
    PERSIST_SYNC_DATA,
)

__all__ = [
    "HOOK_POINTS",
    "PERSIST_BUFFER",
    "PERSIST_MODES",
    "PERSIST_SYNC_ALL",
    "PERSIST_SYNC_DATA",
    "SNAPSHOT_FORK",
    "SNAPSHOT_INLINE",
    "Engine",
    "FileSystem",
    "GroupCommitter",
    "RealFileSystem",
    "RecoveryError",
    "RecoveryReport",
    "StorageFailed",
    "StorageOptions",
]
