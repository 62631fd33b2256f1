#!/usr/bin/env bash
# Runs the test suite.
#
#   bin/test.sh [bazel flags/targets]   bin/setup.sh, then `bazel test //...` (flags from
#                                       .bazelrc); the last line is "N passed, M failed[, K
#                                       skipped]", counting pytest test cases over every test
#                                       target (a target with no report -- failed to build,
#                                       timed out, ... -- counts as 1 failed).
#   bin/test.sh --pytest [pytest args]  plain `pytest tests` in the venv (for developers); the
#                                       last line is pytest's own summary.
#
# Exits non-zero when Bazel does or when any test case failed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="$(bash bin/setup.sh)"

if [ "${1:-}" = "--pytest" ]; then
  shift
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  exec "$venv/bin/python" -m pytest tests "$@"
fi

# Every tests/**/test_*.py needs its own py_test in the BUILD.bazel beside it, or Bazel would skip it.
test_files=()
while IFS= read -r f; do test_files+=("$f"); done < <(find tests -name 'test_*.py' | sort)
missing=()
for f in "${test_files[@]}"; do
  name="$(basename "$f" .py)"
  grep -qsE "^[[:space:]]*name = \"$name\"," "$(dirname "$f")/BUILD.bazel" || missing+=("$f")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: no py_pytest_test in the BUILD.bazel beside: ${missing[*]} (add one target per tests/**/test_*.py)" >&2
  exit 1
fi

has_target=0
for a in "$@"; do case $a in -*) ;; *) has_target=1 ;; esac; done
[ $has_target = 1 ] || set -- "$@" //...

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
bep="$work/bep.json"

set +e
bazel test --build_event_json_file="$bep" "$@"
rc=$?
set -e

testlogs="$(bazel info bazel-testlogs 2>/dev/null || true)"

# Which test targets ran, from the build event log; pytest's JUnit report (test.xml) of each
# gives the case counts. Targets Bazel did not run or that left no report count as 1 failed.
summary="$("$venv/bin/python" - "$bep" "$testlogs" "${test_files[@]}" <<'PY'
import json, os, sys
import xml.etree.ElementTree as ET

bep, testlogs, files = sys.argv[1], sys.argv[2], sys.argv[3:]
targets = set()   # Every test target in the request (configured), plus one per tests/**/test_*.py.
status = {}       # label -> overall status (testSummary)
ran = set()       # labels with a testResult event: their test.xml is from this invocation.
requested_all = True
if os.path.exists(bep):
  with open(bep) as f:
    for line in f:
      try:
        event = json.loads(line)
      except ValueError:
        continue
      id_ = event.get("id", {})
      if "targetConfigured" in id_ and event.get("configured", {}).get("targetKind", "").endswith("_test rule"):
        targets.add(id_["targetConfigured"]["label"])
      elif "testSummary" in id_:
        status[id_["testSummary"]["label"]] = event.get("testSummary", {}).get("overallStatus", "")
      elif "testResult" in id_:
        ran.add(id_["testResult"]["label"])
      elif "pattern" in id_:
        requested_all = requested_all and all(p in ("//...", "...") for p in id_["pattern"].get("pattern", []))
if requested_all:
  targets.update(f"//{os.path.dirname(f)}:{os.path.basename(f)[:-3]}" for f in files)

passed = failed = skipped = 0
for label in sorted(targets):
  counts = None
  if label in ran and testlogs:
    package, _, name = label.lstrip("/").partition(":")
    xml = os.path.join(testlogs, package, name, "test.xml")
    try:
      root = ET.parse(xml).getroot()
      suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
      counts = [0, 0, 0]  # tests, failures + errors, skipped
      for s in suites:
        counts[0] += int(s.get("tests", 0))
        counts[1] += int(s.get("failures", 0)) + int(s.get("errors", 0))
        counts[2] += int(s.get("skipped", 0))
    except (OSError, ET.ParseError, ValueError):
      counts = None
  ok = status.get(label) in ("PASSED", "FLAKY")
  if counts is None:
    failed += 0 if ok else 1
    if not ok:
      print(f"test.sh: {label}: {status.get(label) or 'NO STATUS'} (no test report)", file=sys.stderr)
    continue
  tests, bad, skip = counts
  if not ok and bad == 0:
    bad = 1  # e.g. pytest exited non-zero without a failing case, or a timeout.
  passed += max(tests - bad - skip, 0)
  failed += bad
  skipped += skip
line = f"{passed} passed, {failed} failed"
if skipped:
  line += f", {skipped} skipped"
print(line)
print(failed)
PY
)" || summary=$'0 passed, 1 failed\n1'

echo "${summary%$'\n'*}"
failed="${summary##*$'\n'}"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
if [ "$failed" != 0 ]; then exit 1; fi
