#!/usr/bin/env bash
# Install everything the tests need into the current Python environment, then run them on every
# core (pytest-xdist), printing the 15 slowest tests and the total.
# torch is pinned to the CPU build that pip finds on this kind of machine: never a CUDA wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip byte-compiles every module it installs (torch's and ray's thousands: 70 of the install's
# 140 s on 2 cores); the tests import a fraction, compiled on first import instead and kept for
# every later process. Where the environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE,
# set by some images) it goes under the prefix the harness gives its own workers
# (harness/execute/pycache.py), else every process would compile torch again.
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ -z "${PYTHONPYCACHEPREFIX:-}" ] \
   && [ "${HARNESS_PYCACHE:-1}" != 0 ]; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/kernel-lab/pycache"
fi
NOCOMPILE=--no-compile
[ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && NOCOMPILE=   # none can be written later: pip's now
python -m pip install -q $NOCOMPILE torch==2.13.0
python -m pip install -q $NOCOMPILE -e '.[test,ray]'   # ray: the --ray local smoke test
if ! command -v chromium >/dev/null 2>&1; then   # Debian's chromium for the dashboard e2e test
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
# -n: one test process per core (HARNESS_TEST_WORKERS=0 runs in this process);
# --dist loadgroup: tests marked xdist_group share a process (see tests/conftest.py)
python -m pytest -q -n "${HARNESS_TEST_WORKERS:-auto}" --dist loadgroup --durations=15 "$@"
