"""The TPU's numbers against the CPU's: flash attention, a 50-step training run, greedy decode.

  python bench/tpu_numerics.py --out tpu.json                      # on the TPU VM
  python bench/tpu_numerics.py --out cpu.json                      # here, on the CPU
  python bench/tpu_numerics.py --compare tpu.json cpu.json         # the verdicts

Float32 matmuls run at the highest precision on both sides (a TPU's default multiplies
float32 in bfloat16 passes: three digits). What is recorded, on whatever device runs it:

  attention:  `layers.Attention` with `implementation="splash"` (models/flash_attention.py:
              the Mosaic kernel on a TPU, Pallas's interpreter elsewhere) against "einsum" on
              the same device, outputs and input/parameter gradients, for each mask kind
              (causal; grouped-query; packed segments; a sliding window with segments), in
              float32 and bfloat16, sequence 256.
  training:   the losses of 50 steps of a tiny Llama (2 layers, width 64, float32, synthetic
              data of sequence 128, attention "auto": splash on the TPU, einsum on the CPU).
  decode:     32 greedy tokens of each tiny family (GPT-J, Llama, GPT-2, Mistral) from the same
              random parameters and prompts, through the generator `--mode=decode` runs.

`--compare` prints each verdict: attention within the stated tolerances on the TPU side
(splash against einsum there), the training losses within 1e-4 relative at every step, and
the decode tokens identical.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_default_matmul_precision", "highest")

from lingvo_lite import testing
from lingvo_lite.decode import generator as generation
from lingvo_lite.decode.requests import Request
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.models import layers
from lingvo_lite.training.train_state import strip_boxes
# pylint: enable=wrong-import-position

# Mask kinds: (query heads, key/value heads, segments, window).
MASKS = {"causal": (4, 4, False, None), "grouped_query": (8, 2, False, None),
         "segments": (8, 2, True, None), "window_segments": (8, 2, True, 64)}
# Tolerances of splash against einsum, by dtype: (outputs, gradients), max |diff| over max |x|.
TOLERANCES = {"float32": (1e-5, 1e-4), "bfloat16": (2e-2, 5e-2)}
FAMILIES = {"gptj": "PyCodeTiny", "llama": "PyCodeLlamaTiny", "gpt2": "PyCodeGpt2Tiny",
            "mistral": "Mistral7B"}
TRAIN_STEPS, LOSS_RTOL = 50, 1e-4


def _relative(a, b) -> float:
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def attention_cases() -> dict:
  results = {}
  length, dim, head_dim = 256, 128, 32
  for name, (heads, kv_heads, segmented, window) in MASKS.items():
    for dtype in ("float32", "bfloat16"):
      x = jax.random.normal(jax.random.key(0), (2, length, dim), dtype)
      positions = jnp.broadcast_to(jnp.arange(length), (2, length))
      segments = (jnp.asarray([[1] * 100 + [2] * 156, [1] * 30 + [2] * 200 + [3] * 26])
                  if segmented else None)
      make = lambda implementation, window=window, heads=heads, kv_heads=kv_heads, \
          dtype=dtype: layers.Attention(num_heads=heads, num_kv_heads=kv_heads,
                                        head_dim=head_dim, rotary_dim=head_dim,
                                        rotary_style="half", dtype=dtype,
                                        implementation=implementation, window=window)
      params = nn.meta.unbox(make("einsum").init(jax.random.key(1), x, positions,
                                                 segments)["params"])
      cotangent = jax.random.normal(jax.random.key(2), x.shape, dtype)
      outs = {}
      for implementation in ("einsum", "splash"):
        apply = jax.jit(lambda p, x, i=implementation: make(i).apply({"params": p}, x,
                                                                    positions, segments))
        grad = jax.jit(jax.grad(lambda p, x, apply=apply: jnp.sum(
            (apply(p, x) * cotangent).astype(jnp.float32)), argnums=(0, 1)))
        outs[implementation] = (apply(params, x), grad(params, x))
      output_error = _relative(outs["splash"][0], outs["einsum"][0])
      gradient_error = max(_relative(a, b) for a, b in zip(
          jax.tree.leaves(outs["splash"][1]), jax.tree.leaves(outs["einsum"][1])))
      results[f"{name}/{dtype}"] = {"output": output_error, "gradients": gradient_error}
  return results


def training_losses() -> list[float]:
  setup = testing.synthetic_tiny_setup(
      "PyCodeLlamaTiny", "model.vocab_size=256", "train_data.vocab_size=256",
      "eval_data.vocab_size=256", "train_data.sequence_length=128",
      "eval_data.sequence_length=128", "model.max_length=128", "optimizer.warmup_steps=5",
      "train_data.global_batch_size=8")
  jitted = JittedSteps(setup)
  losses = []
  with jitted.activated():
    state = jitted.init_state()
    for step in range(TRAIN_STEPS):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
    chosen = setup.model.resolved_attention_implementation()
  return losses, chosen


def decode_tokens() -> dict:
  tokens = {}
  for family, experiment in FAMILIES.items():
    setup = testing.synthetic_tiny_setup(
        experiment, "decode.cache_length=64", "decode.slots=4", "decode.max_new_tokens=32",
        "decode.stop_at_eos=False")
    params = jax.jit(setup.model.init)(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))
    generator = generation.Generator(setup, strip_boxes(params["params"]))
    requests = [Request(source=f"r{i}", prompt_ids=tuple(int(t) for t in np.random.default_rng(
        i).integers(3, 250, size=length))) for i, length in enumerate((5, 12, 1, 20))]
    tokens[family] = [list(c.completion_ids) for c in generator.generate(requests)]
  return tokens


def compare(tpu_path: str, cpu_path: str) -> int:
  with open(tpu_path, encoding="utf-8") as f:
    tpu = json.load(f)
  with open(cpu_path, encoding="utf-8") as f:
    cpu = json.load(f)
  failed = 0
  for case, errors in tpu["attention"].items():
    output_tol, gradient_tol = TOLERANCES[case.split("/")[1]]
    ok = errors["output"] <= output_tol and errors["gradients"] <= gradient_tol
    failed += not ok
    print(f"attention {case:<28} splash vs einsum on {tpu['device']}: output "
          f"{errors['output']:.1e} (<= {output_tol:.0e}), gradients {errors['gradients']:.1e} "
          f"(<= {gradient_tol:.0e}): {'ok' if ok else 'FAILED'}")
  steps = [_relative(t, c) for t, c in zip(tpu["training"]["losses"],
                                           cpu["training"]["losses"])]
  ok = max(steps) <= LOSS_RTOL
  failed += not ok
  print(f"training {TRAIN_STEPS} steps: {tpu['device']} ({tpu['training']['attention']}) vs "
        f"{cpu['device']} ({cpu['training']['attention']}): largest relative loss difference "
        f"{max(steps):.1e} at step {int(np.argmax(steps)) + 1} (<= {LOSS_RTOL:.0e}); final "
        f"{tpu['training']['losses'][-1]:.6f} vs {cpu['training']['losses'][-1]:.6f}: "
        f"{'ok' if ok else 'FAILED'}")
  for family, tokens in tpu["decode"].items():
    same = tokens == cpu["decode"][family]
    failed += not same
    print(f"decode {family:<8} 4 requests x 32 greedy tokens identical: "
          f"{'ok' if same else 'FAILED'}")
  return 1 if failed else 0


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out")
  parser.add_argument("--compare", nargs=2, metavar=("TPU_JSON", "CPU_JSON"))
  parser.add_argument("--parts", default="training,decode,attention",
                      help="what to record, comma-separated")
  args = parser.parse_args()
  if args.compare:
    sys.exit(compare(*args.compare))
  result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
  parts = args.parts.split(",")
  # Each part is written as soon as it is done: a run cut short keeps what it measured.
  for part in parts:
    if part == "training":
      losses, chosen = training_losses()
      result["training"] = {"losses": losses, "attention": chosen}
    elif part == "decode":
      result["decode"] = decode_tokens()
    elif part == "attention":
      result["attention"] = attention_cases()
    if args.out:
      with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
