"""Decode step time against the memory roofline: SmolLM2-135M's shape and one with heads of 128.

  python bench/tpu_decode.py [--batches 1,8,64] [--layouts unrolled,scanned]
      [--attention einsum,paged] [--shapes smollm2,head128] [--prompt_length 128] [--new_tokens 128]
      [--xla project,none] [--cache_layouts auto,heads,positions] [--json FILE] [--aot v5e-1]

Layouts: "unrolled" (model.scan_layers=False) and "scanned" (model.scan_layers=True, which a
decode on an accelerator unrolls: `LanguageModel.for_decoding`). Attention: each
`model.attention_implementation` compared ("einsum": the written-out cache attention, which
"auto" decodes with, reading the span of entries the longest slot filled; "paged": on a TPU
the decode kernel of models/decode_attention.py, which reads only each slot's filled pages).

A decode step must read every parameter once and every filled key/value entry of every slot;
on an accelerator nothing else should cost as much, so its time is bounded below by those
bytes over the memory bandwidth. For each layer layout (`model.scan_layers`) and batch (the
number of slots), this builds the decode functions that `--mode=decode` and `--mode=serve`
run (`decode/jitted.DecodeSteps`) for SmolLM2-135M's shape (30 layers, d_model 576, 9 query
and 3 key/value heads of 64, SwiGLU 1536, vocabulary 49,152, tied embeddings) in bfloat16
with random parameters (the weights do not change the time; no GGUF file is needed), fills
every slot with a random prompt of --prompt_length tokens, compiles the generate loop ahead
of time (its compile time is a row of its own), warms it up, then times one call of
--new_tokens greedy steps. Per layout and batch it prints the step time, tokens/s, and the
bandwidth the step reaches: (parameter bytes as stored + the filled key/value entries, the
mean over the timed steps) / step time, beside the device's copy bandwidth measured here
(the best of 10 copies of a 1 GiB array: read once, written once) and the datasheet's.

With `--aot TOPOLOGY` it needs no chip: each row's generate loop is compiled for the topology
on this host, and it prints the step estimate of the optimized HLO (its HBM bytes and time
by part) and the layouts XLA keeps one layer's cache in there (`aot`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite import chips, executor
from lingvo_lite import target as targets
from lingvo_lite.decode import steps as decoding
from lingvo_lite.decode import jitted as decode_jitted
from lingvo_lite.decode.jitted import DecodeSteps
from lingvo_lite.models import transformer
from lingvo_lite.programs.compile import step_estimate
from lingvo_lite.weights import job_params
# pylint: enable=wrong-import-position

# SmolLM2-135M (experiments/lm/smollm2.py reads it from its GGUF file; its shape, written out).
SMOLLM2_SHAPE = ("model.vocab_size=49152", "model.num_layers=30", "model.dim=576",
                 "model.num_heads=9", "model.num_kv_heads=3", "model.head_dim=64",
                 "model.mlp_dim=1536", "model.rotary_base=100000.0", "model.max_length=8192",
                 "model.tie_embeddings=True", "model.dtype='bfloat16'",
                 "model.param_dtype='bfloat16'", "model.remat_policy='none'",
                 "train_data.vocab_size=49152", "eval_data.vocab_size=49152")
# The kernel of models/decode_attention.py takes heads of 128 only: a Qwen3-0.6B-like shape
# (28 layers, d_model 1024, 16 query and 8 key/value heads of 128, SwiGLU 3072; a 32k
# vocabulary, tied), Llama's blocks, 0.5B parameters.
HEAD128_SHAPE = ("model.vocab_size=32000", "model.num_layers=28", "model.dim=1024",
                 "model.num_heads=16", "model.num_kv_heads=8", "model.head_dim=128",
                 "model.mlp_dim=3072", "model.rotary_base=1000000.0", "model.max_length=8192",
                 "model.tie_embeddings=True", "model.dtype='bfloat16'",
                 "model.param_dtype='bfloat16'", "model.remat_policy='none'",
                 "train_data.vocab_size=32000", "eval_data.vocab_size=32000")
SHAPES = {"smollm2": SMOLLM2_SHAPE, "head128": HEAD128_SHAPE}
# Datasheet HBM bandwidth (GB/s) by device kind.
DATASHEET_BANDWIDTH = {"TPU v5 lite": 819.0, "TPU v5e": 819.0, "TPU v4": 1200.0,
                       "TPU v5p": 2765.0, "TPU v6 lite": 1640.0}


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="1,8,64")
  parser.add_argument("--layouts", default="unrolled,scanned")
  parser.add_argument("--attention", default="einsum,paged")
  parser.add_argument("--xla", default="project",
                      help="project: the decode functions compiled with decode/jitted.py's "
                           "COMPILER_OPTIONS for the platform; none: with XLA's defaults")
  parser.add_argument("--shapes", default="smollm2,head128")
  parser.add_argument("--prompt_length", type=int, default=128)
  parser.add_argument("--new_tokens", type=int, default=112)
  parser.add_argument("--set", action="append", default=[])
  parser.add_argument("--json")
  parser.add_argument("--cache_layouts", default="auto",
                      help="auto (the model's own), heads, positions: the decode cache's "
                           "layout, forced (`force_cache_layout`), comma-separated")
  parser.add_argument("--aot", metavar="TOPOLOGY",
                      help="no chip: compile the generate loop for TOPOLOGY (v5e-1) here and "
                           "print the step estimate of its optimized HLO and the layouts of "
                           "the cache in it (`aot`)")
  return parser.parse_args()


def copy_bandwidth(gib: int = 1, repeats: int = 10) -> float:
  """Bytes/s of the best of `repeats` copies of a `gib` GiB array (read + written)."""
  x = jnp.ones((gib * 2**28,), jnp.float32)
  copy = jax.jit(lambda a: a * 1.0001)
  copy(x).block_until_ready()
  best = min(_timed(lambda: copy(x).block_until_ready()) for _ in range(repeats))
  return 2 * x.nbytes / best


def _timed(function) -> float:
  started = time.perf_counter()
  function()
  return time.perf_counter() - started


def prefilled(steps: DecodeSteps, params, batch: int, prompt_length: int, cache_length: int):
  """The decode state with every slot holding a random prompt of `prompt_length` tokens,
  greedy, allowed to run to the end of its cache."""
  prompts = np.random.default_rng(0).integers(17, steps.model.vocab_size,
                                              (batch, prompt_length))
  lengths = np.full((batch,), prompt_length, np.int32)
  sampling = decoding.sampling.sampling_params(batch, temperature=[0.0] * batch)
  seeds = np.stack([decoding.key_data(seed) for seed in range(batch)])
  with steps.activated():
    return steps.prefill(params, steps.empty_state(), prompts, lengths, np.ones(batch, bool),
                         np.full((batch,), cache_length - 1, np.int32), sampling, seeds)


# model.scan_layers of each layout.
LAYOUTS = {"unrolled": False, "scanned": True}


# Greedy steps run before the timed call.
WARM = 8


def _setup(shape: str, batch: int, layout: str, attention: str, prompt_length: int,
           new_tokens: int, sets: list[str]):
  """The experiment of one row, and its cache length."""
  # A TPU stores the cache with positions in its 128-wide lanes: a length of a multiple of
  # 128 is not padded.
  cache_length = -(-(prompt_length + WARM + new_tokens + 8) // 128) * 128
  setup = executor.build_experiment("Llama1B", [
      *SHAPES[shape], f"model.scan_layers={LAYOUTS[layout]}", f"decode.slots={batch}",
      f"decode.cache_length={cache_length}", f"decode.prefill_buckets=({prompt_length},)",
      "decode.stop_at_eos=False", f"decode.max_new_tokens={new_tokens}",
      f"model.attention_implementation='{attention}'", *sets])
  return setup, cache_length


def force_cache_layout(layout: str) -> None:
  """Every TransformerLM's decode cache in `layout` ("heads", "positions"), whatever its
  kernel's decode forms keep (models/kv_cache.py), so one run compares both; "auto" leaves
  the choice to them. A measurement's knob, not the project's: a step the paged kernel would
  take over "heads" is written out over "positions"."""
  if layout == "auto":
    transformer.TransformerLM.cache_layout = _CHOSEN_LAYOUT
  else:
    transformer.TransformerLM.cache_layout = lambda self: layout


_CHOSEN_LAYOUT = transformer.TransformerLM.cache_layout


def measure(shape: str, batch: int, layout: str, attention: str, prompt_length: int,
            new_tokens: int, sets: list[str]) -> dict:
  warm = WARM
  setup, cache_length = _setup(shape, batch, layout, attention, prompt_length, new_tokens,
                               sets)
  scanned = LAYOUTS[layout]
  model = setup.model
  steps = DecodeSteps(setup)
  params = steps.decode_form(jax.jit(model.init)(jax.random.key(0),
                                                 jnp.zeros((1, 8), jnp.int32))["params"])
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  started = time.perf_counter()
  generate = steps.lower_generate().compile()
  compile_s = time.perf_counter() - started
  state = prefilled(steps, params, batch, prompt_length, cache_length)
  finished = jnp.zeros((batch,), bool)
  with steps.activated():
    state = generate(params, state, jnp.int32(warm), finished)
    state.tokens.block_until_ready()
    started = time.perf_counter()
    state = generate(params, state, jnp.int32(new_tokens), finished)
    state.tokens.block_until_ready()
    seconds = time.perf_counter() - started
  generated = int(np.asarray(state.lengths).min()) - prompt_length - warm
  assert generated == new_tokens, (generated, new_tokens)
  step_s = seconds / new_tokens
  # Filled entries per step: each slot holds prompt + warm + i entries at step i.
  entry_bytes = 2 * model.num_layers * model.resolved_num_kv_heads * model.resolved_head_dim * 2
  mean_filled = prompt_length + warm + (new_tokens - 1) / 2
  kv_bytes = batch * mean_filled * entry_bytes
  return {"batch": batch, "scan_layers": scanned, "compile_s": compile_s,
          "cache_layout_used": steps.model.cache_layout(),
          "step_ms": step_s * 1e3, "tokens_per_s": batch / step_s,
          "param_bytes": param_bytes, "kv_bytes": kv_bytes,
          "bandwidth_gbs": (param_bytes + kv_bytes) / step_s / 1e9,
          "cache_read_bytes": batch * cache_length * entry_bytes}


def aot(shape: str, batch: int, layout: str, attention: str, prompt_length: int,
        new_tokens: int, sets: list[str], topology: str) -> dict:
  """The generate loop compiled for `topology` from this host, no chip: the project's step
  estimate of its optimized HLO (programs/compile/step_estimate.py: the loop's body counted
  once, as its trip count is not known when it is compiled, so about one step and the
  loop's entry; not calibrated against the chip for this loop, so compare rows, not
  seconds) and the layouts XLA gives one layer's cache array there (a tile's padding shows
  in them: `T(4,128)` over 3 heads of 64 moves 2.67x the bytes)."""
  setup, cache_length = _setup(shape, batch, layout, attention, prompt_length, new_tokens,
                               sets)
  target = targets.compile_target(topology)
  with targets.active(target):
    steps = DecodeSteps(setup, job_params.mesh_of(setup, target.devices))
    started = time.perf_counter()
    hlo = steps.lower_generate().compile().as_text()
    compile_s = time.perf_counter() - started
    model = steps.model
    array = model.cache_shapes(batch, cache_length)[0]
    dtype = {"bfloat16": "bf16", "float32": "f32"}[jnp.dtype(array.dtype).name]
    layout_of_cache = getattr(model, "cache_layout", lambda: None)()
  text = f"{dtype}[{','.join(map(str, array.shape))}]"
  layouts = collections.Counter(re.findall(re.escape(text) + r"(\{[^}]*\})", hlo))
  estimate = step_estimate.estimate(hlo, chips.chip_of(target.device_kind), target.devices)
  return {"batch": batch, "topology": topology, "compile_s": compile_s,
          "cache_layout": layout_of_cache, "cache_array": text,
          "hlo_layouts": dict(layouts.most_common()), "hbm_bytes": estimate.hbm_bytes,
          "estimate_ms": {part: seconds * 1e3 for part, seconds in estimate.seconds.items()
                          if seconds}}


def _aot_main(args: argparse.Namespace, runs: list[tuple]) -> list[dict]:
  rows = []
  for shape, layout, attention, xla, cache, batch in runs:
    force_cache_layout(cache)
    row = aot(shape, batch, layout, attention, args.prompt_length, args.new_tokens, args.set,
              args.aot)
    row.update(shape=shape, layout=layout, attention=attention, xla=xla, forced=cache)
    rows.append(row)
    top = ", ".join(f"{name} x{count}" for name, count in
                    list(row["hlo_layouts"].items())[:3])
    print(f"{shape} {layout:<9} {attention:<7} batch {batch:>3} on {args.aot} (compiled here in "
          f"{row['compile_s']:.0f} s): cache {row['cache_layout']!r} {row['cache_array']}, its "
          f"layouts in the HLO {top}; estimate of the loop: hbm_bytes {row['hbm_bytes']:.3e}, "
          + ", ".join(f"{part} {ms:.2f} ms" for part, ms in row["estimate_ms"].items()),
          flush=True)
  return rows


def main() -> None:
  args = _args()
  runs = [(shape, layout, attention, xla, cache, batch) for shape in args.shapes.split(",")
          for layout in args.layouts.split(",") for attention in args.attention.split(",")
          for xla in args.xla.split(",") for cache in args.cache_layouts.split(",")
          for batch in (int(b) for b in args.batches.split(","))]
  if args.aot:
    rows = _aot_main(args, runs)
    if args.json:
      with open(args.json, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(dict(row, jax=jax.__version__)) + "\n" for row in rows)
    return
  device = jax.devices()[0]
  copy = copy_bandwidth() / 1e9
  datasheet = DATASHEET_BANDWIDTH.get(device.device_kind)
  print(f"jax {jax.__version__}, {device.device_kind}; copy bandwidth measured here "
        f"{copy:.0f} GB/s; datasheet {datasheet or '?'} GB/s", flush=True)
  rows = []
  project_options = dict(decode_jitted.COMPILER_OPTIONS)
  for shape, layout, attention, xla, cache, batch in runs:
    force_cache_layout(cache)
    decode_jitted.COMPILER_OPTIONS.clear()
    if xla == "project":
      decode_jitted.COMPILER_OPTIONS.update(project_options)
    row = measure(shape, batch, layout, attention, args.prompt_length, args.new_tokens,
                  args.set)
    row.update(shape=shape, layout=layout, attention=attention, xla=xla, cache_layout=cache,
               of_copy=row["bandwidth_gbs"] / copy)
    rows.append(row)
    print(f"{shape} {layout:<9} {attention:<7} xla {xla:<7} cache {cache:<9} batch "
          f"{batch:>3}: step "
          f"{row['step_ms']:.3f} "
          f"ms, {row['tokens_per_s']:,.0f} tokens/s, {row['bandwidth_gbs']:.0f} GB/s = "
          f"{row['of_copy']:.0%} of the measured copy bandwidth (parameters "
          f"{row['param_bytes'] / 1e6:.0f} MB + filled KV {row['kv_bytes'] / 1e6:.0f} MB); "
          f"generate compiled in {row['compile_s']:.1f} s", flush=True)
  if args.json:
    with open(args.json, "a", encoding="utf-8") as f:
      for row in rows:
        f.write(json.dumps(dict(row, jax=jax.__version__, device=device.device_kind,
                                copy_gbs=copy, datasheet_gbs=datasheet)) + "\n")


if __name__ == "__main__":
  main()
