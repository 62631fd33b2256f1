"""LoRA against full fine-tuning on SmolLM2-135M: train step time and peak host memory, on CPU.

  python bench/lora_step_bench.py [--batch 4] [--length 512] [--steps 3] [--rounds 1]
                                  [--rank 16] [--out FILE.json]

Each side is the experiment `SmolLM2_135M` (its model, AdamW, remat) training on synthetic
tokens of its vocabulary, initialized from `train.seed` (no weights file read: the load's own
peak is not the step's), through the same `JittedSteps` the train program uses: full
fine-tuning (every parameter trained, Adam moments for each), and LoRA (`--fiddler=lora`: rank
16 on every attention projection and MLP matrix, the base frozen: no gradient, no moments).
Each runs in a fresh child process, one after the other, `--rounds` times alternating which
goes first: one compile step, then `--steps` timed steps (the median is kept). The peak is the
child's peak resident set (its `ru_maxrss`, from start to exit); the state is the bytes of the
arrays the step holds between steps (parameters, optimizer state, frozen base). The memory
verdict's own prediction (lingvo_lite/memory_fit.py) is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--rank", type=int, default=16)
  parser.add_argument("--out", default=None, help="write the measurements as JSON here")
  parser.add_argument("--side", choices=("full", "lora"), default=None,
                      help=argparse.SUPPRESS)  # A child's own side.
  return parser.parse_args()


def _setup(side: str, args: argparse.Namespace):
  import fiddle as fdl  # pylint: disable=g-import-not-at-top
  from lingvo_lite import executor  # pylint: disable=g-import-not-at-top
  from lingvo_lite.config import fiddlers, registry  # pylint: disable=g-import-not-at-top
  from lingvo_lite.data.synthetic import SyntheticData  # pylint: disable=g-import-not-at-top
  cfg = registry.lookup("SmolLM2_135M").config()
  cfg.train_data = fdl.Config(SyntheticData, vocab_size=cfg.model.vocab_size,
                              sequence_length=args.length, global_batch_size=args.batch)
  cfg.eval_data = None
  cfg.train.init_from = None
  if side == "lora":
    fiddlers.lora(cfg)
    cfg.train.lora.rank = args.rank
    cfg.train.lora.alpha = 2.0 * args.rank
  return executor.build(cfg)


def _child(args: argparse.Namespace) -> None:
  """One side: its step times, the state's bytes, the memory verdict's terms."""
  import jax  # pylint: disable=g-import-not-at-top
  from lingvo_lite import memory_fit  # pylint: disable=g-import-not-at-top
  from lingvo_lite.on_mesh.jitted import JittedSteps  # pylint: disable=g-import-not-at-top
  setup = _setup(args.side, args)
  need = memory_fit.per_device_need(setup, 1)
  jitted = JittedSteps(setup)
  with jitted.activated():
    frozen = jitted.frozen.load()[0] if jitted.frozen is not None else None
    state = jitted.init_state(frozen)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    trained = sum(x.size for x in jax.tree.leaves(state.params))
    times = []
    for step in range(args.steps + 1):
      batch = jitted.global_batch(setup.train_data.batch(step))
      started = time.perf_counter()
      state, metrics = jitted.train_step(state, batch)
      jax.block_until_ready(metrics)
      if step:  # The first compiles.
        times.append(time.perf_counter() - started)
  print(json.dumps({
      "side": args.side, "step_s": statistics.median(times), "step_times": times,
      "trained_parameters": trained, "state_gib": state_bytes / 2**30,
      "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      "predicted_gib": {name: getattr(need, name) / 2**30 for name in
                        ("parameters", "gradients", "moments", "frozen", "batch", "attention",
                         "total")}}))


def main() -> None:
  args = _args()
  if args.side:
    _child(args)
    return
  runs = {"full": [], "lora": []}
  for round_ in range(args.rounds):
    for side in (("full", "lora") if round_ % 2 == 0 else ("lora", "full")):
      command = [sys.executable, os.path.abspath(__file__), f"--side={side}",
                 f"--batch={args.batch}", f"--length={args.length}", f"--steps={args.steps}",
                 f"--rank={args.rank}"]
      done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                            env={**os.environ, "PYTHONPATH": ROOT})
      if done.returncode:
        sys.exit(f"lora_step_bench: the {side} side failed:\n{done.stderr[-3000:]}")
      measured = json.loads(done.stdout.strip().splitlines()[-1])
      runs[side].append(measured)
      print(json.dumps(measured), flush=True)
  summary = {side: {"step_s": statistics.median(r["step_s"] for r in found),
                    "peak_rss_gib": statistics.median(r["peak_rss_gib"] for r in found),
                    "state_gib": found[0]["state_gib"],
                    "trained_parameters": found[0]["trained_parameters"],
                    "predicted_gib": found[0]["predicted_gib"]}
             for side, found in runs.items()}
  summary["ratios_lora_over_full"] = {
      key: summary["lora"][key] / summary["full"][key]
      for key in ("step_s", "peak_rss_gib", "state_gib")}
  summary["shapes"] = {"batch": args.batch, "length": args.length, "rank": args.rank,
                       "steps": args.steps, "rounds": args.rounds}
  print(json.dumps(summary, indent=1))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump({"runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
  main()
