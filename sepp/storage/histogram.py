"""Plain counts for a Prometheus histogram, kept where the figure is observed.

Owns: `Histogram` (bucket counts, observation count and sum; no locking: the
loop thread observes and a scrape reads on the same thread). The server's
commit pipeline (records per group commit, commit duration), its request
timings and a cluster node (follower apply lag, leader append latency) keep
their figures in it; the admin front renders it (sepp/admin/metrics.py).

Must not import: anything (a leaf every layer may use).
"""

from __future__ import annotations

__all__ = ["Histogram"]


class Histogram:
    """Plain counts for a Prometheus histogram (loop thread only): `counts[i]`
    observations of at most `bounds[i]` (not cumulative; the last entry is above
    every bound), `commits` observations, `total` their sum."""

    __slots__ = ("bounds", "commits", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.commits = 0
        self.total: float = 0

    def observe(self, value: float) -> None:
        self.commits += 1
        self.total += value
        index = 0
        for bound in self.bounds:
            if value <= bound:
                break
            index += 1
        self.counts[index] += 1
