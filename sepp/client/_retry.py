"""The connection-level retry policy: which failures a call may repeat, and how
long to wait between tries.

Owns: `RetryPolicy` (the sepp-py dataclass, plus an optional seeded `rng`),
`is_transient` (the failures worth retrying) and `backoff_delays` (exponential
backoff, each delay times a random factor in [0.5, 1.0)).

Whether an *operation* may be retried at all is the caller's decision
(`SeppClient` passes ``retry_safe``): reserve and drain_dead_letters never are,
and an enqueue only when every job carries an idempotency key.

Must not import: asyncio, sockets, sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from sepp.client.errors import (
    ConnectError,
    MessageTooLargeError,
    OverloadedError,
    TransportError,
    UnsupportedProtocolError,
)

__all__ = ["RetryPolicy", "backoff_delays", "is_transient"]


@dataclass
class RetryPolicy:
    """How to retry calls that failed for a transient reason: the server was
    overloaded (``resource_exhausted``) or shutting down (``unavailable``), the
    connection dropped, a deadline passed, or reconnecting failed.

    The default makes **no** retries (``max_attempts == 1``): pass a policy to
    `SeppClient.connect` to opt in. Retries cover ack, nack, extend,
    get_server_info, queue_stats and health, and an enqueue only when every
    job in it has an idempotency key (the server then drops the repeat). A
    reserve and a drain are never retried: a lost answer to either already
    changed the server. (A cluster node's ``not_leader`` refusal is another
    matter: nothing was done, and the client sends any request on to the
    leader, policy or not; see `SeppClient.connect`.)

    The n-th wait is ``min(initial_backoff * multiplier**(n-1), max_backoff)``,
    times a random factor in [0.5, 1.0) when `jitter` is on. `rng` (a sepp
    addition) makes that factor reproducible in tests.
    """

    max_attempts: int = 1
    initial_backoff: timedelta = timedelta(milliseconds=100)
    max_backoff: timedelta = timedelta(seconds=10)
    multiplier: float = 2.0
    jitter: bool = True
    rng: random.Random | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Out-of-range values are raised to the floor, as sepp-py does.
        self.max_attempts = max(1, self.max_attempts)
        self.multiplier = max(1.0, self.multiplier)


def is_transient(error: BaseException) -> bool:
    """Whether `error` may go away if the same request is sent again later."""
    if isinstance(error, MessageTooLargeError | UnsupportedProtocolError):
        return False
    return isinstance(error, TransportError | OverloadedError | ConnectError)


def backoff_delays(policy: RetryPolicy) -> Iterator[float]:
    """The waits, in seconds, before the 2nd, 3rd, ... try."""
    rng = policy.rng if policy.rng is not None else random.Random()
    backoff = policy.initial_backoff.total_seconds()
    cap = policy.max_backoff.total_seconds()
    while True:
        delay = min(backoff, cap)
        if policy.jitter:
            delay *= 0.5 + 0.5 * rng.random()
        yield delay
        backoff = min(backoff * policy.multiplier, cap)
