"""Test-only fault injection for a real `sepp serve` process: crash at an exact
storage hook point. Inert unless the environment variable is set.

    SEPP_FAULT_CRASH_AT=POINT:N[,POINT:N...]

makes the process kill itself with SIGKILL at the N-th hit of storage hook POINT
(`wal.after_write`, `wal.after_sync`, `rotate.after_create`,
`rotate.after_header_sync`, `rotate.after_dir_sync`, `snapshot.before_rename`,
`snapshot.after_rename`, `snapshot.published`, `retention.before_delete`,
`retention.after_delete`; see `sepp.storage.wal` and `sepp.storage.engine`).
The crash harness (`python -m tools.crash`) uses it to stop the server between a
write and its sync, in the middle of a segment rotation, of a snapshot
publication or of retention, then restarts it and checks what survived.

    SEPP_FAULT_HOLD_RECOVERY=PATH

holds recovery back until PATH (a FIFO the test made with os.mkfifo) has been
opened for writing and closed: the admin listener answers meanwhile, so a test
sees /readyz say 503 "recovering" for as long as it likes, deterministically.

Owns: parsing the variables and the hooks (`crash_hook_from_env`, wired into
`Engine.open(hook=...)` by `SeppServer.start`; `hold_recovery_from_env`, called
by it in the recovery thread before `Engine.open`). Without the variable the hook is
None: nothing is counted and the storage fast path is unchanged. A malformed
value is a startup error (never silently ignored: a test that thinks it injects a
fault must not pass because none was injected).

Must not import: anything beyond the standard library.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from collections.abc import Callable, Mapping

ENV_CRASH_AT = "SEPP_FAULT_CRASH_AT"
ENV_HOLD_RECOVERY = "SEPP_FAULT_HOLD_RECOVERY"


def parse_crash_at(text: str) -> dict[str, int]:
    """`"wal.after_write:3,snapshot.published:1"` -> {point: hit number}."""
    targets: dict[str, int] = {}
    for item in text.split(","):
        point, sep, count = item.strip().rpartition(":")
        if not sep or not point or not count.isdigit() or int(count) < 1:
            raise ValueError(f"{ENV_CRASH_AT}: expected POINT:N (N >= 1), got {item.strip()!r}")
        targets[point] = int(count)
    return targets


def crash_hook_from_env(env: Mapping[str, str] | None = None) -> Callable[[str], None] | None:
    """The storage hook that SIGKILLs this process at the configured hit, or None
    when the variable is unset or empty."""
    text = (os.environ if env is None else env).get(ENV_CRASH_AT, "")
    if not text.strip():
        return None
    remaining = parse_crash_at(text)
    lock = threading.Lock()  # hooks run on the flushing and snapshot threads

    def hook(point: str) -> None:
        with lock:
            left = remaining.get(point)
            if left is None:
                return
            remaining[point] = left - 1
            if left > 1:
                return
        os.kill(os.getpid(), signal.SIGKILL)

    return hook


def hold_recovery_from_env(env: Mapping[str, str] | None = None) -> Callable[[], None] | None:
    """A call that blocks until the FIFO named by SEPP_FAULT_HOLD_RECOVERY has
    been opened for writing and closed again (opening a FIFO for reading waits
    for a writer; reading returns end-of-file once it closes), or None when the
    variable is unset or empty. A path that is not a FIFO is a startup error."""
    path = (os.environ if env is None else env).get(ENV_HOLD_RECOVERY, "")
    if not path.strip():
        return None
    if not stat.S_ISFIFO(os.stat(path).st_mode):
        raise ValueError(f"{ENV_HOLD_RECOVERY}: {path} is not a FIFO")

    def hold() -> None:
        with open(path, "rb") as fifo:
            while fifo.read(4096):
                pass

    return hold
