"""Where a family's float32 logits on an accelerator part from the CPU's: every module's output.

  python bench/tpu_family_diff.py [--cases gemma3_scaled,gemma3,qwen3] [--json FILE]

tests/weights/test_hf_dense_families.py holds our logits to transformers' within 1e-4. On the
lent TPU v5e (2026-12-07, highest matmul precision) one case missed it: gemma3_scaled by
1.31e-4, where the CPU host is 6.4e-6 off and the other cases pass. This builds each named
case's tiny transformers model exactly as the test does, reads it with our HfCheckpoint, runs
our model once on the default device and once on the CPU in the same process (the same
program, jitted for each), both under `jax.default_matmul_precision("highest")`, with flax's
`capture_intermediates`, and prints, per module (by path), the largest
difference between the two devices' outputs beside the output's largest magnitude, then the
logits of each device against transformers'. The earliest module (by layer, then within
the layer) whose difference is far above its inputs' names the operation that parts the two. Needs torch and transformers (the
TPU machine's weights site, bench/tpu_check.sh weights).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import jax
import numpy as np

from tests.weights import hf_reference
from tests.weights import test_hf_dense_families as dense
# pylint: enable=wrong-import-position


def _run(model, params, tokens, device) -> tuple[np.ndarray, dict]:
  """(logits, {module path: output}) of `model` on `device`."""
  params = jax.device_put(params, device)
  tokens = jax.device_put(tokens, device)
  with jax.default_matmul_precision("highest"):
    logits, state = jax.jit(lambda p, t: model.apply(
        {"params": p}, t, capture_intermediates=True, mutable=["intermediates"]))(params, tokens)
  outputs = {}
  for path, value in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]:
    outputs["/".join(str(getattr(key, "key", key)) for key in path)] = np.asarray(value)
  return np.asarray(logits), outputs


def diff_case(case: str, folder: str, expected: np.ndarray, tokens: np.ndarray) -> dict:
  model, params = dense._load(folder)  # pylint: disable=protected-access
  accelerator = jax.devices()[0]
  cpu = jax.devices("cpu")[0]
  logits, outputs = _run(model, params, tokens, accelerator)
  cpu_logits, cpu_outputs = _run(model, params, tokens, cpu)
  modules = []
  for path, value in outputs.items():
    other = cpu_outputs[path]
    if value.dtype.kind != "f":
      continue
    modules.append({"module": path, "diff": float(np.abs(value - other).max()),
                    "largest": float(np.abs(other).max())})
  return {"case": case, "device": accelerator.device_kind, "jax": jax.__version__,
          "accelerator_vs_transformers": float(np.abs(logits - expected).max()),
          "cpu_vs_transformers": float(np.abs(cpu_logits - expected).max()),
          "accelerator_vs_cpu": float(np.abs(logits - cpu_logits).max()),
          "largest_logit": float(np.abs(expected).max()), "modules": modules}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default="gemma3_scaled,gemma3,qwen3_sliding")
  parser.add_argument("--json")
  args = parser.parse_args()
  tokens = dense._tokens("long")  # pylint: disable=protected-access
  rows = []
  with tempfile.TemporaryDirectory() as root:
    for case in args.cases.split(","):
      reference = dense._reference_model(case)  # pylint: disable=protected-access
      folder = os.path.join(root, case)
      reference.save_pretrained(folder)
      row = diff_case(case, folder, hf_reference.their_logits(reference, tokens), tokens)
      rows.append(row)
      print(f"{case} on {row['device']}: logits off transformers' by "
            f"{row['accelerator_vs_transformers']:.2e} (CPU {row['cpu_vs_transformers']:.2e}), "
            f"off the CPU's by {row['accelerator_vs_cpu']:.2e}; largest logit "
            f"{row['largest_logit']:.2f}", flush=True)
      for module in row["modules"]:
        print(f"  {module['diff']:9.2e} of {module['largest']:9.3g}  {module['module']}")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
