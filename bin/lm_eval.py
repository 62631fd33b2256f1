#!/usr/bin/env python3
"""lm-evaluation-harness's own command line, with lingvo_lite's model registered:

  python bin/lm_eval.py --model lingvo_lite --model_args job_log_dir=runs/smol \\
      --tasks lingvo_lite_pycode_choice --include_path tasks/lm_eval

An out-of-tree lm_eval model is registered by importing it, which lm_eval's `lm_eval`
console script cannot do; this script imports lingvo_lite/harness/lm_eval_model.py and runs
the same CLI with the same arguments. Two additions:
  - tasks/lm_eval (lingvo_lite's offline tasks) is added to --include_path when none is given;
  - --use_cache PATH keys the request cache by the weights' checksum too (lm_eval keys it by
    the request only, and would answer from another model's cache after a fine-tune).
"""

from __future__ import annotations

import multiprocessing
import os
import sys

_BIN = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_BIN)
# Python puts this script's folder first on the path, where this file would shadow the
# `lm_eval` package it runs; the checkout's root goes there instead (run without installing).
sys.path[:] = [_ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != _BIN]


def _keyed_cache() -> None:
  """lm_eval's CachingLM opens `<use_cache>_rank<N>.db`; make it `<use_cache>-<checksum>..."""
  from lm_eval.api import model as lm_model  # pylint: disable=g-import-not-at-top
  opened = lm_model.CachingLM.__init__

  def keyed(self, lm, cache_db):
    checksum = getattr(lm, "weights_checksum", None)
    if checksum:
      root, extension = os.path.splitext(cache_db)
      cache_db = f"{root}-weights-{checksum.split(':')[-1][:16]}{extension}"
    opened(self, lm, cache_db)

  lm_model.CachingLM.__init__ = keyed


def main() -> None:
  # lm_eval's bootstrapped errors and HumanEval's test runs start processes; forked from a
  # process with JAX's threads running they can deadlock, so they are spawned.
  multiprocessing.set_start_method("spawn", force=True)
  import lingvo_lite.harness.lm_eval_model  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
  from lm_eval.__main__ import cli_evaluate  # pylint: disable=g-import-not-at-top
  if not any(arg == "--include_path" or arg.startswith("--include_path=") for arg in sys.argv):
    sys.argv += ["--include_path", os.path.join(_ROOT, "tasks", "lm_eval")]
  _keyed_cache()
  from lingvo_lite.errors import UsageError  # pylint: disable=g-import-not-at-top
  try:
    cli_evaluate()
  except UsageError as e:  # A bad --model_args value of ours: one line, not a traceback.
    print(f"lm_eval.py: error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  main()
