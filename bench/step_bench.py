"""Step time of lingvo_lite's train step against a plain Flax + optax step, same shapes.

  python bench/step_bench.py [--experiment BenchSmall|BenchLarge] [--pairs 7] [--steps 5]
                             [--warmup 2] [--devices 8 --mesh data|fsdp] [--set PATH=VALUE ...]

Both run in this process in pairs, the side that goes first alternating from pair to pair,
so machine noise and cache warmth hit both alike. Each measurement is the mean of `--steps`
steps after warm-up. With `--devices N` the process gets N forced CPU devices and both steps
are jitted with the same shardings: batch split over all devices; parameters and Adam
moments replicated (`data`) or split on their model-width axis (`fsdp`). Prints each pair's
times, FLOP rates and ratio, both MFUs against the best float32 2048^3 matmul, and last the
median ratio with its quartiles.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# timed_steps imports no jax: the arguments, parsed first, say how many devices jax starts with.
from bench import timed_steps  # pylint: disable=wrong-import-position


def _parse_args() -> argparse.Namespace:
  # The first warm-up step compiles; a second settles caches. `--pairs 1 --steps 1 --warmup 1`
  # is a smoke run (tests/test_readme.py runs the README's bench commands so).
  parser = timed_steps.paired_parser(__doc__, "BenchSmall", steps=5)
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument("--mesh", choices=("data", "fsdp"), default="data")
  return timed_steps.parse_paired(parser)


ARGS = _parse_args()
if ARGS.devices > 1:  # Must precede the first jax import.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={ARGS.devices}")

# pylint: disable=wrong-import-position
import jax
from jax.sharding import NamedSharding, PartitionSpec

from bench.reference_step import Shapes, make_reference
from lingvo_lite import executor, mfu
from lingvo_lite.on_mesh.jitted import JittedSteps
# pylint: enable=wrong-import-position


def _lingvo_step(experiment: str, sets: list[str]):
  setup = executor.build_experiment(experiment, sets)
  jitted = JittedSteps(setup)
  with jitted.activated():
    state = jitted.init_state()
    batch = jitted.global_batch(setup.train_data.batch(0))
  return setup, jitted, timed_steps.timed_train_steps(jitted, state, batch)


def _reference_shardings(mesh, shapes: Shapes, params, opt_state, mesh_kind: str):
  """The reference's shardings, chosen as lingvo_lite's rules choose them for this mesh."""
  replicated = NamedSharding(mesh, PartitionSpec())

  def place(leaf):
    if mesh_kind == "data" or len(leaf.shape) < 2 or shapes.dim not in leaf.shape:
      return replicated
    spec = [None] * len(leaf.shape)
    spec[list(leaf.shape).index(shapes.dim)] = "fsdp"
    return NamedSharding(mesh, PartitionSpec(*spec))
  return jax.tree.map(place, params), jax.tree.map(place, opt_state)


def _reference_step(shapes: Shapes, local_batch, jitted, mesh_kind: str):
  if jax.device_count() == 1:
    step, params, opt_state = make_reference(shapes)
    batch = {k: jax.numpy.asarray(v) for k, v in local_batch.items()}
  else:
    abstract_params = jax.eval_shape(lambda: make_reference(shapes)[1])
    abstract_opt = jax.eval_shape(lambda: make_reference(shapes)[2])
    param_shardings, opt_shardings = _reference_shardings(
        jitted.mesh, shapes, abstract_params, abstract_opt, mesh_kind)
    batch_sharding = jitted.batch_sharding
    batch = jitted.global_batch(local_batch)
    step, params, opt_state = make_reference(
        shapes, in_shardings=(param_shardings, opt_shardings, batch_sharding),
        out_shardings=(param_shardings, opt_shardings, None))
    params = jax.device_put(params, param_shardings)
    opt_state = jax.device_put(opt_state, opt_shardings)

  def run(num_steps: int) -> float:
    nonlocal params, opt_state
    started = time.perf_counter()
    for _ in range(num_steps):
      params, opt_state, loss = step(params, opt_state, batch)
    jax.block_until_ready(loss)
    return (time.perf_counter() - started) / num_steps
  return run


def main() -> None:
  sets = list(ARGS.set)
  if ARGS.devices > 1:
    sets += ["partitioner.ici_data=-1"] if ARGS.mesh == "data" else [
        "partitioner.ici_data=1", "partitioner.ici_fsdp=-1"]
  setup, jitted, lingvo = _lingvo_step(ARGS.experiment, sets)
  model, data = setup.model, setup.train_data
  shapes = Shapes(num_layers=model.num_layers, dim=model.dim, num_heads=model.num_heads,
                  mlp_dim=model.resolved_mlp_dim, vocab_size=model.vocab_size,
                  sequence_length=data.sequence_length, batch_size=data.global_batch_size)
  reference = _reference_step(shapes, data.batch(0), jitted, ARGS.mesh)
  flops = mfu.model_flops_per_step(model, data.global_batch_size, data.sequence_length)
  peak = mfu.measured_matmul_peak()
  print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].device_kind} "
        f"device(s), mesh {dict(jitted.mesh.shape)}; {shapes}; lingvo_lite overrides: "
        f"{sets or 'none'}; {flops / 1e9:.1f} GFLOP/step (mfu.py formula); peak "
        f"{peak / 1e9:.0f} GFLOP/s (best of 10 float32 2048^3 matmuls)")
  reference(ARGS.warmup), lingvo(ARGS.warmup)  # Compile and warm up.

  ratios, reference_times, lingvo_times = [], [], []
  for pair in range(ARGS.pairs):
    # Alternate which side goes first, so neither always inherits the other's warm caches.
    if pair % 2 == 0:
      reference_times.append(reference(ARGS.steps))
      lingvo_times.append(lingvo(ARGS.steps))
    else:
      lingvo_times.append(lingvo(ARGS.steps))
      reference_times.append(reference(ARGS.steps))
    ratios.append(lingvo_times[-1] / reference_times[-1])
    print(f"pair {pair + 1}: reference {reference_times[-1]:.3f} s/step "
          f"({flops / reference_times[-1] / 1e9:.1f} GFLOP/s), lingvo_lite "
          f"{lingvo_times[-1]:.3f} s/step ({flops / lingvo_times[-1] / 1e9:.1f} GFLOP/s), "
          f"ratio {ratios[-1]:.3f}")
  for name, times in (("reference", reference_times), ("lingvo_lite", lingvo_times)):
    median = statistics.median(times)
    print(f"{name}: median {median:.3f} s/step, MFU {flops / median / peak:.1%} of the "
          "measured matmul peak (all devices share this machine's cores)")
  quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
  print(f"median ratio lingvo_lite / reference: {statistics.median(ratios):.3f} "
        f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, {len(ratios)} pairs)")


if __name__ == "__main__":
  main()
