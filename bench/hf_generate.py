"""Greedy decode throughput of Hugging Face `transformers` GPT-J `generate` on torch CPU.

The reference side of bench/decode_bench.py. It runs in its own virtual environment, never in
the project's (.venv must not get torch). To create it (torch from the local CPU wheel in
/opt/wheels; any other torch version pulls a multi-GB CUDA build):

  python3 -m venv ~/.cache/lingvo_lite/hf-bench-venv
  ~/.cache/lingvo_lite/hf-bench-venv/bin/pip install torch==2.13.0 transformers==5.23.0 \
      numpy==2.4.6

(which also brings in huggingface_hub 2.4.0, tokenizers 0.23.3 and safetensors 0.8.0). Then:

  ~/.cache/lingvo_lite/hf-bench-venv/bin/python bench/hf_generate.py [--batch 1] [--repeats 3]
      [--prompt_length 32] [--new_tokens 256] [--threads N] [--seed 0]

The model is `GPTJForCausalLM` built from a `GPTJConfig` (4 layers, n_embd 256, 4 heads of 64,
rotary_dim 64, MLP 4 x 256 = 1024, gelu_new, vocab 8192, n_positions 2048: 7,355,904
parameters, the same count as lingvo_lite's `architectures.gptj` at these sizes with
embedding_bias=False) with a seeded random init, float32, eval mode, no download; attention
is the library's default for GPT-J ("eager": GPT-J has no SDPA path), the KV cache its default
`DynamicCache`. Prompts are `--batch` rows of `--prompt_length` random ids in [1, vocab)
from numpy's `default_rng(seed)` (bench/decode_bench.py's lingvo_lite side draws the same),
all-ones attention mask. Everything runs under `torch.inference_mode()` with
`torch.set_num_threads(--threads)`, by default os.cpu_count() (2 on the project's machines:
one intra-op thread per core, the same cores that XLA's CPU thread pool uses on the other
side), and one inter-op thread.

Each repeat measures, after one untimed warm-up of each:
  generate: `model.generate(input_ids, attention_mask, max_new_tokens=N, min_new_tokens=N,
            do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)`, wall time
            of the whole call (prefill included); tokens_per_s = batch * N / seconds. The
            config has no EOS (eos_token_id=None), so generation never stops early; every
            run checks that exactly N tokens came out per row.
  ttft:     the same `generate` with max_new_tokens=1: time to the first token, i.e. the
            prefill forward over the prompt plus generate's own setup and the first greedy
            pick, what a caller waits before the first token;
  prefill:  a bare `model(input_ids, attention_mask, use_cache=True)` forward over the prompt
            (fresh cache) and the argmax of the last position: the prefill floor, without
            generate's overhead.
One JSON line per measurement on stdout; with --serve, instead, the model is built once and
each stdin line `{"batch": B, "repeats": R}` (plus optional prompt_length / new_tokens) gets
its JSON lines followed by `{"done": true}`: how bench/decode_bench.py alternates this side
with lingvo_lite's in one sitting without paying torch's import and the warm-ups each time.
Standalone: no lingvo_lite import.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import transformers

VOCAB = 8192


def _parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--prompt_length", type=int, default=32)
  parser.add_argument("--new_tokens", type=int, default=256)
  parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                      help="torch intra-op threads (default: os.cpu_count())")
  parser.add_argument("--seed", type=int, default=0, help="seeds the init and the prompts")
  parser.add_argument("--serve", action="store_true",
                      help="read {\"batch\": B, \"repeats\": R} lines from stdin (see docstring)")
  args = parser.parse_args()
  if min(args.batch, args.repeats, args.prompt_length, args.new_tokens, args.threads) < 1:
    parser.error("--batch, --repeats, --prompt_length, --new_tokens and --threads must be "
                 "at least 1")
  return args


def build_model(seed: int) -> transformers.GPTJForCausalLM:
  config = transformers.GPTJConfig(
      vocab_size=VOCAB, n_positions=2048, n_embd=256, n_layer=4, n_head=4, rotary_dim=64,
      n_inner=None, activation_function="gelu_new", bos_token_id=None, eos_token_id=None,
      pad_token_id=0, tie_word_embeddings=False)
  torch.manual_seed(seed)
  model = transformers.GPTJForCausalLM(config).to(torch.float32).eval()
  # No EOS anywhere, so nothing can end a row before max_new_tokens.
  model.generation_config.eos_token_id = None
  model.generation_config.bos_token_id = None
  model.generation_config.pad_token_id = 0
  return model


def prompts(seed: int, batch: int, prompt_length: int) -> np.ndarray:
  """[batch, prompt_length] int32 ids in [1, VOCAB): the same on both sides of the bench."""
  return np.random.default_rng(seed).integers(1, VOCAB, (batch, prompt_length), dtype=np.int32)


class Bench:
  """The model, built once, and the measurements at any batch size (each warmed up once)."""

  def __init__(self, args: argparse.Namespace):
    self.seed = args.seed
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    self.threads = torch.get_num_threads()
    self.model = build_model(args.seed)
    self.num_params = sum(p.numel() for p in self.model.parameters())
    self._warm: set[tuple[int, int, int]] = set()

  def _generate(self, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> float:
    started = time.perf_counter()
    out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, use_cache=True,
                              pad_token_id=0, eos_token_id=None)
    seconds = time.perf_counter() - started
    if tuple(out.shape) != (ids.shape[0], ids.shape[1] + new_tokens):
      raise RuntimeError(f"generate returned {tuple(out.shape)}, not "
                         f"{(ids.shape[0], ids.shape[1] + new_tokens)}: it stopped early")
    return seconds

  def _prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> float:
    started = time.perf_counter()
    logits = self.model(input_ids=ids, attention_mask=mask, use_cache=True).logits
    logits[:, -1].argmax(-1)
    return time.perf_counter() - started

  def run(self, batch: int, repeats: int, prompt_length: int, new_tokens: int):
    """Yields one dict per measurement: `repeats` x (generate, ttft, prefill)."""
    ids = torch.from_numpy(prompts(self.seed, batch, prompt_length)).to(torch.long)
    mask = torch.ones_like(ids)
    common = {"side": "hf", "batch": batch, "prompt_length": prompt_length,
              "new_tokens": new_tokens, "threads": self.threads}
    with torch.inference_mode():
      key = (batch, prompt_length, new_tokens)
      if key not in self._warm:
        self._generate(ids, mask, new_tokens)
        self._generate(ids, mask, 1)
        self._prefill(ids, mask)
        self._warm.add(key)
      for repeat in range(repeats):
        seconds = self._generate(ids, mask, new_tokens)
        yield {**common, "kind": "generate", "repeat": repeat, "seconds": seconds,
               "tokens_per_s": batch * new_tokens / seconds}
        yield {**common, "kind": "ttft", "repeat": repeat,
               "seconds": self._generate(ids, mask, 1)}
        yield {**common, "kind": "prefill", "repeat": repeat,
               "seconds": self._prefill(ids, mask)}


def _emit(record: dict) -> None:
  print(json.dumps(record), flush=True)


def main() -> None:
  args = _parse_args()
  bench = Bench(args)
  _emit({"side": "hf", "kind": "info", "torch": torch.__version__,
         "transformers": transformers.__version__, "threads": bench.threads,
         "interop_threads": torch.get_num_interop_threads(), "cores": os.cpu_count(),
         "params": bench.num_params,
         "attn_implementation": bench.model.config._attn_implementation})
  if not args.serve:
    for record in bench.run(args.batch, args.repeats, args.prompt_length, args.new_tokens):
      _emit(record)
    return
  for line in sys.stdin:
    if not line.strip():
      continue
    request = json.loads(line)
    for record in bench.run(int(request["batch"]), int(request.get("repeats", 1)),
                            int(request.get("prompt_length", args.prompt_length)),
                            int(request.get("new_tokens", args.new_tokens))):
      _emit(record)
    _emit({"done": True})


if __name__ == "__main__":
  main()
