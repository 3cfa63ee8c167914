"""`sepp serve` with its periodic garbage-collector refreeze stretched, for
benchmarks/bench_metrics_instructions.py only:

    python -m benchmarks.serve_stretched SECONDS serve --listen ...

The refreeze (sepp/server/gcpolicy.py) sweeps the whole heap while it is small,
after a quiet 5 s interval or once a minute under load, so its cost per second
depends on what the heap holds at that moment:
under a load generator, on how many jobs are in flight, and so on how long the
run took. Under cachegrind the run lengths of two variants differ by tens of
seconds on a shared machine, and that cost would land in the per-job figure.
With the refreeze stretched past the run, a job run counts only per-job and
per-second work; the benchmark's idle runs (on the ordinary server) price the
refreeze itself.
"""

from __future__ import annotations

import sys

from sepp.server import gcpolicy
from sepp.server.cli import main

if __name__ == "__main__":
    gcpolicy.FREEZE_INTERVAL_S = float(sys.argv.pop(1))
    sys.exit(main(sys.argv[1:]))
