#!/usr/bin/env bash
# The README's main job: trains and evaluates PyCodeSpTiny (a small transformer on
# this Python's standard library source); prints where the logs, config and checkpoints are and
# the final train/eval loss.
#
#   bin/demo.sh [JOB_LOG_DIR (default runs/pycode_tiny)] [more lingvo_lite flags]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="$(bash bin/setup.sh)"
job_log_dir="${1:-runs/pycode_sp_tiny}"
[ $# -gt 0 ] && shift
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" -m lingvo_lite --exp=PyCodeSpTiny --job_log_dir="$job_log_dir" "$@"
