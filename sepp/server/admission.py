"""Who may connect: the descriptor limit, the connection caps, rate-limited warnings.

Owns: `raise_descriptor_limit` (at startup, the soft RLIMIT_NOFILE raised towards
the hard limit), `open_descriptors`, `connections_for_descriptors` (how many
connections the descriptor table holds with storage's reserve kept free), `admit`
(the admission decision table, one test per row in
tests/server/test_admission.py), `WaitList` (parked long polls of one queue) and
`RateLimitedLog`.

Promises:
- Storage never starves for a descriptor because of connections: a connection
  that would eat into `server.descriptors_reserved` is refused at accept. Storage
  needs at most `STORAGE_DESCRIPTORS_PEAK` descriptors beyond those it holds
  (see below); the reserve's default is several times that.
- A connection that has not said hello yet (a TLS handshake in progress
  included) never keeps a connection out that could authenticate: when the
  unauthenticated cap or the whole connection cap is full, the oldest
  unauthenticated connection makes room; only when every connection is
  authenticated is the newcomer refused.
- A warning that a peer can trigger at will is logged at most once per
  `interval_s` per kind, with a count of the lines held back.

Must not import: asyncio, sepp.core, sepp.storage.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

# Descriptors storage may open at the same time, beyond those it holds for as
# long as it runs (the data-directory lock, the active segment, the AIO eventfd:
# open before the listener starts, so `open_descriptors` counts them):
#   3  the group-commit thread rotating the log: the old segment until it is
#      closed, the new segment, the log directory for its fsync;
#   1  the snapshot thread: one of the snapshot file (inline mode), the listing
#      of the snapshot directory, the directory for its fsync -- one at a time;
#   1  the forked snapshot writer's snapshot file (the child's descriptor table
#      is a copy of the parent's: as full as the parent's was at the fork);
#   1  a connection the kernel handed over at accept and the server then refuses.
STORAGE_DESCRIPTORS_PEAK = 6
# The default reserve: the peak, with room to spare for what the process opens
# besides storage (a library, a debugger attached by an operator).
DESCRIPTORS_RESERVED_DEFAULT = 64
# Where the hard limit is "unlimited", raise the soft limit to this (Linux's
# default fs.nr_open: a soft limit above nr_open is refused anyway).
DESCRIPTORS_TARGET_UNLIMITED = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class DescriptorLimit:
    """The soft RLIMIT_NOFILE before and after startup raised it, and the hard one
    (None: unknown, no `resource` module; `RLIM_INFINITY` stays as the OS says)."""

    soft_before: int | None
    soft: int | None
    hard: int | None
    error: str | None = None

    def describe(self) -> str:
        if self.soft is None:
            return "descriptor limit unknown (no resource module)"
        if self.error is not None:
            return (
                f"descriptor limit: soft RLIMIT_NOFILE {self.soft} kept (hard {self.hard}); "
                f"raising it failed: {self.error}"
            )
        if self.soft_before != self.soft:
            return (
                f"descriptor limit: raised soft RLIMIT_NOFILE from {self.soft_before} "
                f"to {self.soft} (hard {self.hard})"
            )
        return f"descriptor limit: soft RLIMIT_NOFILE {self.soft} (hard {self.hard})"


def raise_descriptor_limit(
    getrlimit: Callable[[int], tuple[int, int]] | None = None,
    setrlimit: Callable[[int, tuple[int, int]], None] | None = None,
) -> DescriptorLimit:
    """Raise the soft RLIMIT_NOFILE to the hard limit (to
    DESCRIPTORS_TARGET_UNLIMITED where the hard limit is unlimited). Never lowers
    it; a refusal by the OS keeps the soft limit and says why. `getrlimit` /
    `setrlimit` are seams for tests."""
    if resource is None:  # pragma: no cover - not on Windows
        return DescriptorLimit(soft_before=None, soft=None, hard=None)
    get = getrlimit or resource.getrlimit
    put = setrlimit or resource.setrlimit
    which = resource.RLIMIT_NOFILE
    soft, hard = get(which)
    infinity = resource.RLIM_INFINITY
    target = DESCRIPTORS_TARGET_UNLIMITED if hard == infinity else hard
    if soft != infinity and soft < target:
        try:
            put(which, (target, hard))
        except (ValueError, OSError) as exc:
            return DescriptorLimit(soft_before=soft, soft=soft, hard=hard, error=str(exc))
        return DescriptorLimit(soft_before=soft, soft=target, hard=hard)
    return DescriptorLimit(soft_before=soft, soft=soft, hard=hard)


def open_descriptors() -> int | None:
    """How many descriptors this process has open (None where the OS does not say)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            # The listing's own descriptor is in it: not counted.
            return len(os.listdir(folder)) - 1
        except OSError:
            continue
    return None  # pragma: no cover - neither exists


def connections_for_descriptors(soft_limit: int | None, open_now: int | None, reserved: int) -> int:
    """How many connections fit in the descriptor table (one descriptor each) with
    `reserved` descriptors always left free, `open_now` being in use before any
    connection. Unknown limits: no bound from descriptors (a very large number)."""
    if soft_limit is None or open_now is None or soft_limit >= 2**62:
        return 2**62
    return max(0, soft_limit - open_now - reserved)


# -- admission ---------------------------------------------------------------------

ADMIT = "admit"
ADMIT_EVICTING_OLDEST = "admit_evicting_oldest_unauthenticated"
REFUSE_SHUTTING_DOWN = "refuse_shutting_down"
REFUSE_CONNECTIONS = "refuse_max_connections"
REFUSE_DESCRIPTORS = "refuse_descriptors"


def admit(
    *,
    stopping: bool,
    connections: int,
    unauthenticated: int,
    max_connections: int,
    max_unauthenticated: int,
    descriptor_connections: int,
) -> str:
    """What to do with a connection just accepted. `connections` counts every open
    connection (authenticated or not, TLS handshakes included), `unauthenticated`
    those without a successful hello.

    | row | condition                                                  | outcome |
    |-----|------------------------------------------------------------|---------|
    | 1   | the server is stopping                                     | refuse (shutting_down) |
    | 2   | below both caps and below the descriptor bound             | admit |
    | 3   | unauthenticated cap full                                   | admit, close the oldest unauthenticated |
    | 4   | connection cap or descriptor bound full, some unauthenticated | admit, close the oldest unauthenticated |
    | 5   | descriptor bound full, all authenticated                   | refuse (descriptors) |
    | 6   | connection cap full, all authenticated                     | refuse (too many connections) |
    """
    if stopping:
        return REFUSE_SHUTTING_DOWN
    full_descriptors = connections >= descriptor_connections
    full_connections = connections >= max_connections
    if unauthenticated < max_unauthenticated and not (full_descriptors or full_connections):
        return ADMIT
    if unauthenticated > 0:
        return ADMIT_EVICTING_OLDEST
    if full_descriptors:
        return REFUSE_DESCRIPTORS
    return REFUSE_CONNECTIONS


# -- parked long polls --------------------------------------------------------------

T = TypeVar("T")


class WaitList(Generic[T]):
    """The parked reserves of one queue, oldest first. Appending, removing any
    one of them and taking the oldest are O(1) (an OrderedDict: a hash table
    over a linked list), so ending 10k parked reserves -- their connections reset
    at once -- costs 10k steps, not 10k scans of the list (issue 13 §5)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: OrderedDict[T, None] = OrderedDict()

    def append(self, item: T) -> None:
        self._items[item] = None

    def remove(self, item: T) -> None:
        """Remove `item` if present (a no-op otherwise)."""
        self._items.pop(item, None)

    def first(self) -> T:
        """The oldest item (IndexError when empty)."""
        for item in self._items:
            return item
        raise IndexError("empty wait list")

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))


# -- rate-limited warnings ------------------------------------------------------------


class RateLimitedLog:
    """At most one warning per `interval_s` per kind; the next line of a kind says
    how many were held back. Kinds are a fixed, small set of strings (never a
    peer address), so this holds a bounded amount of state."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        # kind -> [when the last line was logged, lines held back since]
        self._state: dict[str, list[float]] = {}

    def warning(self, kind: str, message: str, *args: Any) -> bool:
        """Log `message % args` unless a line of `kind` was logged less than
        `interval_s` ago. True if it was logged."""
        now = self.clock()
        state = self._state.get(kind)
        if state is not None and now - state[0] < self.interval_s:
            state[1] += 1
            return False
        held = int(state[1]) if state is not None else 0
        self._state[kind] = [now, 0]
        if held:
            message += " (%d similar line(s) held back in the last %.0fs)"
            args = (*args, held, now - state[0]) if state is not None else args
        self.logger.warning(message, *args)
        return True
