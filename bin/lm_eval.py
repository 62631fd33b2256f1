#!/usr/bin/env python3
"""lm-evaluation-harness's own command line, with lingvo_lite's model registered:

  python bin/lm_eval.py --model lingvo_lite --model_args job_log_dir=runs/smol \\
      --tasks lingvo_lite_pycode_choice --include_path tasks/lm_eval

An out-of-tree lm_eval model is registered by importing it, which lm_eval's `lm_eval`
console script cannot do; this script imports lingvo_lite/harness/lm_eval_model.py and runs
the same CLI with the same arguments, held to the house's contract: a wrong command is one line
on stderr and exit 2. What it adds and checks: lingvo_lite/harness/lm_eval_cli.py.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

_BIN = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_BIN)
# Python puts this script's folder first on the path, where this file would shadow the
# `lm_eval` package it runs; the checkout's root goes there instead (run without installing).
# Compared with links resolved: Python puts the folder of the script's real file there (under
# Bazel the script is a link into the source tree).
_BIN_FOLDERS = {_BIN, os.path.dirname(os.path.realpath(__file__))}
sys.path[:] = [_ROOT] + [p for p in sys.path
                         if os.path.abspath(p or ".") not in _BIN_FOLDERS
                         and os.path.realpath(p or ".") not in _BIN_FOLDERS]


def main() -> None:
  # lm_eval's bootstrapped errors and HumanEval's test runs start processes; forked from a
  # process with JAX's threads running they can deadlock, so they are spawned.
  multiprocessing.set_start_method("spawn", force=True)
  from lingvo_lite.harness import lm_eval_cli  # pylint: disable=g-import-not-at-top
  lm_eval_cli.main(sys.argv)


if __name__ == "__main__":
  main()
