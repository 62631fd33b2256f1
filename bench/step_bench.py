"""Step time of lingvo_lite's train step against a plain Flax + optax step, same shapes.

  python bench/step_bench.py [--pairs 7] [--steps 5] [--set model.position='"rotary"']

Both run in this process, alternating reference, lingvo_lite, reference, ... so machine noise
hits both alike. Each measurement is the mean of `--steps` steps after warm-up. Prints each
pair's times and ratio; the last line is the median ratio lingvo_lite / reference.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from bench.reference_step import Shapes, make_reference, model_flops_per_step  # pylint: disable=wrong-import-position
from lingvo_lite import executor, overrides, registry  # pylint: disable=wrong-import-position
from lingvo_lite.programs.jitted import JittedSteps  # pylint: disable=wrong-import-position


def _lingvo_step(experiment: str, sets: list[str]):
  cfg = registry.lookup(experiment).config()
  directives = [overrides.Directive("set", f"--set {s}", path=s.partition("=")[0],
                                    value_text=s.partition("=")[2]) for s in sets]
  overrides.apply(cfg, directives, None)
  setup = executor.build(cfg)
  jitted = JittedSteps(setup)
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(setup.train_data.batch(0))

  def run(num_steps: int) -> float:
    nonlocal state
    with jitted.activated():
      started = time.perf_counter()
      for _ in range(num_steps):
        state, metrics = jitted.train_step(state, batch)
      jax.block_until_ready(metrics["loss"])
    return (time.perf_counter() - started) / num_steps
  return setup, run


def _reference_step(shapes: Shapes, batch):
  step, params, opt_state = make_reference(shapes)

  def run(num_steps: int) -> float:
    nonlocal params, opt_state
    started = time.perf_counter()
    for _ in range(num_steps):
      params, opt_state, loss = step(params, opt_state, batch)
    jax.block_until_ready(loss)
    return (time.perf_counter() - started) / num_steps
  return run


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="BenchSmall")
  parser.add_argument("--pairs", type=int, default=7)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--set", action="append", default=[],
                      help="PATH=VALUE override of the lingvo_lite config (repeatable)")
  args = parser.parse_args()

  setup, lingvo = _lingvo_step(args.experiment, args.set)
  model, data = setup.model, setup.train_data
  shapes = Shapes(num_layers=model.num_layers, dim=model.dim, num_heads=model.num_heads,
                  mlp_dim=model.resolved_mlp_dim, vocab_size=model.vocab_size,
                  sequence_length=data.sequence_length, batch_size=data.global_batch_size)
  batch = {k: jax.numpy.asarray(v) for k, v in data.batch(0).items()}
  reference = _reference_step(shapes, batch)
  flops = model_flops_per_step(shapes)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {shapes}; "
        f"lingvo_lite overrides: {args.set or 'none'}")
  reference(2), lingvo(2)  # Compile and warm up.

  ratios = []
  for pair in range(args.pairs):
    reference_time = reference(args.steps)
    lingvo_time = lingvo(args.steps)
    ratios.append(lingvo_time / reference_time)
    print(f"pair {pair + 1}: reference {reference_time:.3f} s/step "
          f"({flops / reference_time / 1e9:.1f} GFLOP/s), lingvo_lite {lingvo_time:.3f} s/step "
          f"({flops / lingvo_time / 1e9:.1f} GFLOP/s), ratio {ratios[-1]:.3f}")
  print(f"median ratio lingvo_lite / reference: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
  main()
