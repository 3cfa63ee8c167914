"""Asynchronous file syncs through Linux native AIO (`io_submit` with
`IOCB_CMD_FDSYNC` / `IOCB_CMD_FSYNC`), called with ctypes.

Owns: `AioSync` — one kernel AIO context and one eventfd. `submit(fd, datasync,
token)` queues a sync of `fd` and returns at once (the kernel runs it on a worker
thread of its own); when it completes the eventfd becomes readable and `reap()`
returns `(token, result)` pairs (result 0, or a negative errno). Also
`aio_unavailable()`: why this machine cannot use it (None when it can).

Why: with a Python flushing thread every group commit passes the GIL between the
event-loop thread and that thread about a dozen times (benchmarks/README.md,
finding 13); here the loop thread writes the batch itself and only the sync runs
elsewhere, with no Python thread and no GIL involved.

Promises: a completed sync reports the kernel's result unchanged (a failure is
never retried here: the caller treats it as permanent); `close()` waits for every
submitted sync to finish before the context is destroyed.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import struct
import sys
import tempfile

# x86-64 and arm64 syscall numbers (the only ones tried; others fall back).
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),  # io_setup, io_destroy, io_getevents, io_submit
    "aarch64": (0, 1, 4, 2),
}
IOCB_CMD_FSYNC = 2
IOCB_CMD_FDSYNC = 3
IOCB_FLAG_RESFD = 1

# struct iocb (64 bytes, little endian): aio_data u64, aio_key u32, aio_rw_flags
# u32, aio_lio_opcode u16, aio_reqprio s16, aio_fildes u32, aio_buf u64,
# aio_nbytes u64, aio_offset s64, aio_reserved2 u64, aio_flags u32, aio_resfd u32.
_IOCB = struct.Struct("<QIIHhIQQqQII")
# struct io_event (32 bytes): data u64, obj u64, res s64, res2 s64.
_EVENT = struct.Struct("<QQqq")
_MAX_EVENTS = 64


def _syscall_numbers() -> tuple[int, int, int, int] | None:
    if sys.platform != "linux" or sys.byteorder != "little":
        return None
    return _SYSCALLS.get(platform.machine())


def aio_unavailable() -> str | None:
    """None if AIO syncs work here, else the reason they do not. Probes once per
    process: a real `fdatasync` of a temporary file through AIO (kernels before
    4.18 refuse IOCB_CMD_FDSYNC at submit)."""
    global _PROBED
    if _PROBED is None:
        _PROBED = (_probe(),)
    return _PROBED[0]


_PROBED: tuple[str | None] | None = None
_PROBE_WAIT_S = 10.0


def _probe() -> str | None:
    if _syscall_numbers() is None:
        return f"Linux AIO syscalls unknown on {sys.platform}/{platform.machine()}"
    if not hasattr(os, "eventfd"):
        return "os.eventfd is missing (needs Python 3.10+ on Linux)"
    try:
        aio = AioSync(1)
    except OSError as exc:
        return f"io_setup failed: {exc}"
    try:
        with tempfile.TemporaryFile() as probe:
            probe.write(b"sepp")
            probe.flush()
            aio.submit(probe.fileno(), True, 1)
            readable, _, _ = select.select([aio.eventfd], [], [], _PROBE_WAIT_S)
            if not readable:
                return "an AIO fdatasync did not complete"
            done = aio.reap()
            if done != [(1, 0)]:
                return f"an AIO fdatasync failed: {done}"
    except OSError as exc:
        return f"an AIO fdatasync was refused: {exc}"
    finally:
        aio.close()
    return None


class AioSync:
    """Submits file syncs to a kernel AIO context; completion wakes an eventfd."""

    def __init__(self, depth: int = 8) -> None:
        numbers = _syscall_numbers()
        if numbers is None:
            raise OSError("Linux AIO is not available on this platform")
        self._setup, self._destroy, self._getevents, self._submit = numbers
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        # io_submit and a non-blocking io_getevents return at once: called with
        # the GIL held (PyDLL). Released, as CDLL does, the loop thread had to win
        # the GIL back after each -- from a thread copying a large batch, which
        # holds it for milliseconds (tens of ms per 8 MiB request, measured).
        self._quick_syscall = ctypes.PyDLL(None, use_errno=True).syscall
        self._quick_syscall.restype = ctypes.c_long
        self._ctx = ctypes.c_ulong(0)
        if self._syscall(self._setup, depth, ctypes.byref(self._ctx)) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"io_setup: {os.strerror(errno)}")
        self.depth = depth
        try:
            self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            self._syscall(self._destroy, self._ctx)
            raise
        self._iocb = ctypes.create_string_buffer(_IOCB.size)
        self._iocb_list = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_EVENT.size * _MAX_EVENTS)
        self._no_wait = ctypes.create_string_buffer(16)  # struct timespec {0, 0}
        self.in_flight = 0
        self.closed = False

    def submit(self, fd: int, datasync: bool, token: int) -> None:
        """Queue a sync of `fd` (fdatasync if `datasync`, else fsync); `token` comes
        back from `reap` with its result. Raises OSError if it cannot be queued."""
        if self.closed:
            raise OSError("AIO context is closed")
        if self.in_flight >= self.depth:
            raise OSError(f"{self.in_flight} syncs already in flight")
        opcode = IOCB_CMD_FDSYNC if datasync else IOCB_CMD_FSYNC
        _IOCB.pack_into(
            self._iocb, 0, token, 0, 0, opcode, 0, fd, 0, 0, 0, 0, IOCB_FLAG_RESFD, self.eventfd
        )
        if self._quick_syscall(self._submit, self._ctx, 1, self._iocb_list) != 1:
            errno = ctypes.get_errno()
            raise OSError(errno, f"io_submit: {os.strerror(errno)}")
        self.in_flight += 1

    def reap(self, wait: bool = False) -> list[tuple[int, int]]:
        """The syncs completed since the last call, as (token, result) with result
        0 or -errno. `wait`: block until at least one completes (if any is in flight)."""
        if wait and self.in_flight:
            count = self._get_events(1, None)
        else:
            try:  # noqa: SIM105 - per commit: no context-manager object
                os.eventfd_read(self.eventfd)
            except BlockingIOError:
                pass
            count = self._get_events(0, self._no_wait)
        done = [
            (token, result)
            for token, _, result, _ in (
                _EVENT.unpack_from(self._events, i * _EVENT.size) for i in range(count)
            )
        ]
        self.in_flight -= count
        return done

    def _get_events(self, min_nr: int, timeout: ctypes.Array[ctypes.c_char] | None) -> int:
        # Waiting (min_nr > 0) releases the GIL; a non-blocking look keeps it.
        syscall = self._syscall if min_nr else self._quick_syscall
        while True:
            count = int(
                syscall(self._getevents, self._ctx, min_nr, _MAX_EVENTS, self._events, timeout)
            )
            if count >= 0:
                return count
            errno = ctypes.get_errno()
            if errno != 4:  # EINTR: retry
                raise OSError(errno, f"io_getevents: {os.strerror(errno)}")

    def close(self) -> list[tuple[int, int]]:
        """Wait for every submitted sync, then free the context and the eventfd.
        Returns the completions not reaped before, like `reap`."""
        if self.closed:
            return []
        done = []
        while self.in_flight:
            done += self.reap(wait=True)
        self.closed = True
        self._syscall(self._destroy, self._ctx)
        os.close(self.eventfd)
        return done
