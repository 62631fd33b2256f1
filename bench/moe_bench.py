"""Mixture-of-experts benchmarks, each side by side in one process (ratios hold across machines;
absolute times move with them).

  PYTHONPATH=$PWD python bench/moe_bench.py dispatch [--experts 8,32] [--repeats 5]
  PYTHONPATH=$PWD python bench/moe_bench.py quality [--steps 800] [--out runs/moe_quality]
  PYTHONPATH=$PWD python bench/moe_bench.py decode [--batches 1,8] [--repeats 3]
  PYTHONPATH=$PWD python bench/moe_bench.py mfu --out DIR     # on an accelerator (TPU)

- dispatch: the train step (forward, backward, AdamW) of BenchSmall's shapes (4 layers, d_model
  256, 4 heads, sequence 256, batch 8, vocabulary 8192, float32) with a Mixtral block whose
  experts are 512 wide, 2 per token, at each expert count: `dropless` (grouped matmuls over
  tokens sorted by expert), `capacity` (factor 1.25) and `dense` (every expert on every token,
  the reference), measured in rotation, medians of `--repeats` means of 5 steps; ratios to
  dropless.
- quality: PyCodeMixtralTiny (8 experts of 172, 2 per token: 344 active) and PyCodeLlamaTiny
  (a dense SwiGLU of 344: the same active parameters and FLOPs per token but the router's)
  trained `--steps` steps each on the stdlib byte data, the same recipe, data and seed, then
  evaluated on the validation split: bits per byte side by side (a report at a fixed token
  budget, not a pass condition).
- decode: greedy decoding of a tiny Mixtral (2 layers, d_model 256, 8 experts of 512, 2 per
  token, vocabulary 8192, random float32 weights) by lingvo_lite's generator (what
  `--mode=decode` runs, its weights imported from the folder transformers saved) and by
  transformers' `MixtralForCausalLM.generate` (torch CPU), 32-token prompts, 128 new tokens,
  batch 1 and 8, alternating; tokens/s medians.
- mfu: on an accelerator (one TPU v5e chip: `OUT=DIR bash bench/tpu_check.sh moe`), a small
  MoE train step (8 layers, d_model 1024, 16 heads, vocabulary 32000, 8 experts of 1408, 2 per
  token, sequence 2048, batch 8, bfloat16 compute, float32 parameters, `minimal` remat) with
  `dropless` and `capacity` (factor 1.25) beside a dense Llama of the same active size (MLP
  2816): step time and MFU against the datasheet bf16 peak, FLOPs counted over the active
  experts (mfu.py), written to OUT/moe_mfu.json and printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
import fiddle as fdl
import jax
import numpy as np

from lingvo_lite import mfu
from lingvo_lite.config import building, registry
from lingvo_lite.models.llama import Llama
from lingvo_lite.models.mixtral import Mixtral
from lingvo_lite.on_mesh.jitted import JittedSteps
# pylint: enable=wrong-import-position


def _load() -> str:
  return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _setup(model: fdl.Config, sequence_length: int = 256, batch: int = 8,
           dtype: str = "float32"):
  cfg = registry.lookup("BenchSmall").config()
  cfg.model = model
  cfg.model.dtype = dtype
  cfg.train_data.sequence_length, cfg.train_data.global_batch_size = sequence_length, batch
  cfg.train_data.vocab_size = model.vocab_size
  return building.build(cfg)


def _step_timer(setup, steps: int):
  """A function timing `steps` train steps (after a compile and a warm-up step)."""
  jitted = JittedSteps(setup)
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(setup.train_data.batch(0))
    state, _ = jitted.train_step(state, batch)
    jax.block_until_ready(state)

  def run() -> float:
    nonlocal state
    with jitted.activated():
      started = time.perf_counter()
      for _ in range(steps):
        state, metrics = jitted.train_step(state, batch)
      jax.block_until_ready(metrics)
      return (time.perf_counter() - started) / steps
  return run


def dispatch(args: argparse.Namespace) -> None:
  print(_load())
  for experts in (int(e) for e in args.experts.split(",")):
    timers = {}
    for kind in ("dropless", "capacity", "dense"):
      model = fdl.Config(Mixtral, vocab_size=8192, num_layers=4, dim=256, num_heads=4,
                         mlp_dim=512, num_experts=experts, experts_per_token=2,
                         dispatch=kind, capacity_factor=1.25)
      timers[kind] = _step_timer(_setup(model), 5)
    times = {kind: [] for kind in timers}
    for _ in range(args.repeats):
      for kind, run in timers.items():
        times[kind].append(run())
    base = statistics.median(times["dropless"])
    row = ", ".join(f"{kind} {statistics.median(t) * 1e3:.1f} ms "
                    f"({statistics.median(t) / base:.2f}x)" for kind, t in times.items())
    print(f"{experts} experts, top-2, 4 layers d_model 256, batch 8 x 256: {row}", flush=True)
  print(_load())


def quality(args: argparse.Namespace) -> None:
  from lingvo_lite.testing import run_cli  # pylint: disable=g-import-not-at-top
  out = Path(args.out)
  results = {}
  for experiment in ("PyCodeMixtralTiny", "PyCodeLlamaTiny"):
    job = out / experiment
    started = time.perf_counter()
    trained = run_cli([f"--exp={experiment}", f"--job_log_dir={job}",
                       f"--fdl.train.steps={args.steps}",
                       f"--fdl.train.eval_every_steps={args.steps}"])
    assert trained.code == 0, trained.stderr[-3000:]
    rows = [json.loads(line) for line in (job / "eval_validation.jsonl").read_text()
            .splitlines()]
    setup = building.build(registry.lookup(experiment).config())
    model = setup.model
    results[experiment] = {
        "bits_per_byte": rows[-1]["bits_per_byte"], "eval_loss": rows[-1]["loss"],
        "parameters": model.num_parameters(), "active_matmul": model.matmul_parameters(),
        "train_flops_per_token": model.train_flops_per_token(128),
        "seconds": time.perf_counter() - started}
    print(experiment, json.dumps(results[experiment]), flush=True)
  (out / "moe_quality.json").write_text(json.dumps(results, indent=2) + "\n")


def decode(args: argparse.Namespace) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
  from lingvo_lite.decode.generator import Generator  # pylint: disable=g-import-not-at-top
  from lingvo_lite.decode.requests import Request  # pylint: disable=g-import-not-at-top
  from lingvo_lite.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_checkpoint import HfCheckpoint  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = transformers.MixtralConfig(
      vocab_size=8192, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=4, num_local_experts=8,
      num_experts_per_tok=2, max_position_embeddings=1024, pad_token_id=0)
  theirs = transformers.MixtralForCausalLM(config).eval()
  theirs.generation_config.eos_token_id = None  # Every row runs its 128 tokens.
  folder = Path(tempfile.mkdtemp(prefix="moe_decode_")) / "hf"
  theirs.save_pretrained(folder)
  source = HfCheckpoint(str(folder))
  _, fields = source.model_fields()
  rng = np.random.default_rng(0)
  print(_load())
  for batch in (int(b) for b in args.batches.split(",")):
    cfg = registry.lookup("BenchSmall").config()
    cfg.model = fdl.Config(Mixtral, **fields)
    cfg.train_data.vocab_size = 8192
    cfg.decode.slots, cfg.decode.cache_length = batch, 160
    cfg.decode.max_new_tokens, cfg.decode.stop_at_eos = 128, False
    setup = building.build(cfg)
    abstract = MeshParams(setup.model, 16, Partitioner(), Partitioner().make_mesh()).abstract
    generator = Generator(setup, source.read_params(setup.model, abstract)[0])
    prompts = rng.integers(1, 8192, (batch, 32))
    requests = [Request(source="bench", prompt_ids=tuple(int(t) for t in row),
                        max_new_tokens=128, temperature=0.0) for row in prompts]
    ours, hf = [], []
    for repeat in range(args.repeats + 1):  # The first: warm-up (compiles, torch's first).
      started = time.perf_counter()
      completions = generator.generate(requests)
      seconds = time.perf_counter() - started
      assert all(len(c.completion_ids) == 128 for c in completions)
      with torch.no_grad():
        started = time.perf_counter()
        out = theirs.generate(torch.tensor(prompts), attention_mask=torch.ones(
            batch, 32, dtype=torch.long), max_new_tokens=128, min_new_tokens=128,
                              do_sample=False, pad_token_id=0)
        hf_seconds = time.perf_counter() - started
      assert out.shape[1] == 32 + 128
      if repeat:
        ours.append(batch * 128 / seconds)
        hf.append(batch * 128 / hf_seconds)
    print(f"batch {batch}: lingvo_lite {statistics.median(ours):,.0f} tokens/s, transformers "
          f"{statistics.median(hf):,.0f} tokens/s, lingvo_lite / transformers "
          f"{statistics.median(o / h for o, h in zip(ours, hf)):.2f}", flush=True)
  print(_load())


def accelerator_mfu(args: argparse.Namespace) -> None:
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  sizes = dict(vocab_size=32000, num_layers=8, dim=1024, num_heads=16, dtype="bfloat16",
               param_dtype="float32", remat_policy="minimal")
  cases = {f"moe_{kind}": fdl.Config(Mixtral, mlp_dim=1408, num_experts=8,
                                     experts_per_token=2, dispatch=kind, **sizes)
           for kind in ("dropless", "capacity")}
  cases["dense_same_active"] = fdl.Config(Llama, mlp_dim=2816, **sizes)
  device = jax.devices()[0]
  peak = mfu.PEAK_BF16_TFLOPS.get(next((k for k in mfu.PEAK_BF16_TFLOPS
                                        if device.device_kind.startswith(k)), ""), None)
  results = {"device": device.device_kind, "devices": jax.device_count(),
             "peak_bf16_tflops": peak, "cases": {}}
  for name, model in cases.items():
    setup = _setup(model, sequence_length=2048, batch=args.batch, dtype="bfloat16")
    seconds = statistics.median(_step_timer(setup, 5)() for _ in range(args.repeats))
    flops = mfu.model_flops_per_step(setup.model, args.batch, 2048)
    tflops = flops / seconds / 1e12 / jax.device_count()
    results["cases"][name] = {
        "step_s": seconds, "model_tflop_per_step": flops / 1e12,
        "tflops_per_device": tflops, "mfu": tflops / peak if peak else None,
        "parameters": setup.model.num_parameters(),
        "active_matmul_parameters": setup.model.matmul_parameters()}
    print(name, json.dumps(results["cases"][name]), flush=True)
  (out / "moe_mfu.json").write_text(json.dumps(results, indent=2) + "\n")
  print(f"wrote {out / 'moe_mfu.json'}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  command = commands.add_parser("dispatch")
  command.add_argument("--experts", default="8,32")
  command.add_argument("--repeats", type=int, default=5)
  command = commands.add_parser("quality")
  command.add_argument("--steps", type=int, default=800)
  command.add_argument("--out", default="runs/moe_quality")
  command = commands.add_parser("decode")
  command.add_argument("--batches", default="1,8")
  command.add_argument("--repeats", type=int, default=3)
  command = commands.add_parser("mfu")
  command.add_argument("--out", required=True)
  command.add_argument("--batch", type=int, default=8)
  command.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  {"dispatch": dispatch, "quality": quality, "decode": decode,
   "mfu": accelerator_mfu}[args.command](args)


if __name__ == "__main__":
  main()
