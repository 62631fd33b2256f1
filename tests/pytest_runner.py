"""Bazel py_test main: runs pytest on the test files given as arguments.

Bazel starts it inside the test's runfiles tree (the working directory is the workspace root
there, next to pyproject.toml); `bazel test` sets XML_OUTPUT_FILE, where the per-case JUnit
report goes (bin/test.sh sums those).
"""

import os
import sys

import pytest

if __name__ == "__main__":
  # Python puts the *real* (source-tree) directory of this script first on sys.path, since
  # runfiles are symlinks; drop it so imports come only from the runfiles tree.
  if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]
  # --durations: the slowest cases (fixtures included) at the end of test.log, where the time
  # of a slow target is looked for first.
  args = ["-p", "no:cacheprovider", "-q", "--durations=10"] + sys.argv[1:]
  xml = os.environ.get("XML_OUTPUT_FILE")
  if xml:
    args.append("--junitxml=" + xml)
  sys.exit(pytest.main(args))
