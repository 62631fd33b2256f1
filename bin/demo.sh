#!/usr/bin/env bash
# The README's main job: trains and evaluates PyCodeSpTiny (a small transformer on
# this Python's standard library source); prints where the logs, config and checkpoints are and
# the final train/eval loss, then writes the run's report (JOB/report/index.html).
#
#   bin/demo.sh [JOB_LOG_DIR (default runs/pycode_tiny)] [more lingvo_lite flags]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="$(bash bin/setup.sh)"
job_log_dir="${1:-runs/pycode_sp_tiny}"
[ $# -gt 0 ] && shift
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" -m lingvo_lite --exp=PyCodeSpTiny --job_log_dir="$job_log_dir" "$@"
# Then the run's page: plots, checkpoints, config (README: "See a run"), for a job there is
# (more flags may have asked for another mode).
if [ -f "$job_log_dir/config.json" ]; then
  exec "$venv/bin/python" -m lingvo_lite --mode=report --job_log_dir="$job_log_dir"
fi
