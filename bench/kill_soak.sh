#!/usr/bin/env bash
# Kill -9 at many moments of one training run (tests/test_faults.py's soak at full size): every
# other kill lands while a checkpoint save is in flight, the rest after a random number of
# steps; each time the same command resumes, and at the end the curve, the final state and the
# rows equal an uninterrupted run's, one row per step, no temporary folder left. The suite runs
# the soak with 2 kills (one of each kind); this runs it with KILLS (default 6) over
# 20 * KILLS + 20 steps, a few minutes on 2 cores.
#
#   bash bench/kill_soak.sh [KILLS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$(bash bin/setup.sh)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
LINGVO_LITE_SOAK_KILLS="${1:-6}" exec "$venv/bin/python" -m pytest tests/test_faults.py -q -s \
  -k test_kill_9_soak_loses_nothing
