#!/bin/bash
# The re-judge compiles: bash run_rows.sh rows.txt, from anywhere; one row per line
# "NAME|EXP|TOPOLOGY|ARGS" compiled from the checkout's root into /tmp/rj/NAME (a row whose
# report exists is skipped), each one's seconds appended to /tmp/rj/times.txt.
rows="$(realpath "$1")"
cd "$(dirname "$0")/../../../.." || exit 1
PY=${PY:-/root/.cache/lingvo_lite/venv-3db9fd7a27830c57/bin/python}
mkdir -p /tmp/rj
while IFS='|' read -r name exp topo rest; do
  [ -z "$name" ] && continue
  [ -e /tmp/rj/$name/compile/report.json ] && continue
  eval "args=($rest)"
  start=$(date +%s)
  PYTHONPATH=$PWD nice -n 10 $PY -m lingvo_lite --exp=$exp --mode=compile --compile_topology=$topo \
     --job_log_dir=/tmp/rj/$name "${args[@]}" > /tmp/rj/$name.out 2>&1
  echo "$name rc=$? $(( $(date +%s) - start )) s" >> /tmp/rj/times.txt
done < "$rows"
