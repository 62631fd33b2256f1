"""Train step time under model.quantization="int8" against float32, same experiment and batch.

  python bench/int8_step_bench.py [--experiment PyCodeSpTiny] [--pairs 7] [--steps 10]
                                  [--warmup 2] [--set PATH=VALUE ...]

Both steps are lingvo_lite's jitted train step (`JittedSteps`), one built with
`model.quantization="int8"`, in this process, on the experiment's first batch; they run in
pairs, the side that goes first alternating, so machine noise and cache warmth hit both alike.
Prints each pair's times and the median ratio int8 / float32 with its quartiles, and first the
gradients of both steps on that batch from the same initial parameters: their cosine
similarity per parameter, the lowest of them (the acceptance bound is above 0.99). On CPU
XLA:CPU multiplies int8 without a fast kernel and the quantization adds work (absmax scales,
rounding, the gradients' quantization): this measures what that costs here; the speed-up int8
buys is a TPU's (the compile report's int8 step time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from bench import timed_steps
# pylint: enable=wrong-import-position


def _args() -> argparse.Namespace:
  return timed_steps.parse_paired(timed_steps.paired_parser(
      __doc__, "PyCodeSpTiny", steps=10,
      helps={"set": "PATH=VALUE override of the config, for both (repeatable)"}))


def _step(experiment: str, sets: list[str]):
  """A function running `n` train steps on the first batch, returning seconds per step; the
  initial parameters; and a function of parameters giving their gradients on that batch."""
  import jax  # pylint: disable=g-import-not-at-top
  from lingvo_lite import executor  # pylint: disable=g-import-not-at-top
  from lingvo_lite.on_mesh.jitted import JittedSteps  # pylint: disable=g-import-not-at-top
  setup = executor.build_experiment(experiment, sets)
  jitted = JittedSteps(setup)
  from lingvo_lite.training.objectives import lm  # pylint: disable=g-import-not-at-top
  from lingvo_lite.training.objectives.objective import Forward  # pylint: disable=g-import-not-at-top
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(setup.train_data.batch(0))
    initial = jax.tree.map(lambda x: x.copy(), state.params)  # The steps donate the state.
  tokens = float(batch["weights"].sum())  # The step's normalizer: gradients of the mean loss.
  gradients = jax.jit(lambda params: jax.grad(
      lambda p: lm.loss_sums(Forward(setup.model), p, batch, 0.0, tokens), has_aux=True)(
          params)[0])
  return timed_steps.timed_train_steps(jitted, state, batch), initial, gradients


def main() -> None:
  args = _args()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  float_run, params, float_gradients = _step(args.experiment, args.set)
  int8_run, _, int8_gradients = _step(args.experiment,
                                      args.set + ['model.quantization="int8"'])
  float_grads, int8_grads = float_gradients(params), int8_gradients(params)

  def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
  cosines = {jax.tree_util.keystr(path): cosine(a, b) for (path, a), b in zip(
      jax.tree_util.tree_flatten_with_path(float_grads)[0], jax.tree.leaves(int8_grads))}
  lowest = min(cosines, key=cosines.get)
  print(f"gradients on the first batch, int8 vs float32, {len(cosines)} parameters: lowest "
        f"cosine {cosines[lowest]:.5f} ({lowest}), median "
        f"{statistics.median(cosines.values()):.5f} (bound: above 0.99)")
  sides = {"float32": float_run, "int8": int8_run}
  for run in sides.values():
    run(args.warmup)  # Compile and warm up.
  times = {name: [] for name in sides}
  ratios = []
  for pair in range(args.pairs):
    order = list(sides) if pair % 2 == 0 else list(reversed(sides))
    for name in order:
      times[name].append(sides[name](args.steps))
    ratios.append(times["int8"][-1] / times["float32"][-1])
    print(f"pair {pair + 1}: float32 {times['float32'][-1] * 1e3:.1f} ms/step, int8 "
          f"{times['int8'][-1] * 1e3:.1f} ms/step, ratio {ratios[-1]:.3f}")
  quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
  print(f"{args.experiment} {' '.join(args.set)}: median float32 "
        f"{statistics.median(times['float32']) * 1e3:.1f} ms/step, int8 "
        f"{statistics.median(times['int8']) * 1e3:.1f} ms/step; median ratio int8 / float32 "
        f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
        f"{len(ratios)} pairs)")


if __name__ == "__main__":
  main()
