"""Runs in a child process with 8 forced CPU devices (XLA_FLAGS set by the parent test) and
prints one JSON object: for each pipelined case of CASES, how far its loss and gradients are
from one device's over 3 steps, and the stacked parameters' PartitionSpecs. The parent
(tests/test_pipeline.py) asserts on it.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.pipeline_worker
"""

import json

import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import synthetic_tiny_setup
from lingvo_lite.training.objectives.objective import Forward

SETS = ("model.vocab_size=256", "train_data.vocab_size=256", "eval_data.vocab_size=256",
        "train_data.global_batch_size=8", "eval_data.global_batch_size=8",
        "train_data.sequence_length=32", "eval_data.sequence_length=32",
        "model.scan_layers=True", "model.num_layers=8")
# A balance loss of its own weight (and a z-loss) so the MoE's auxiliary terms are checked too.
MOE_SETS = ("model.load_balance_coefficient=0.1", "model.router_z_loss_coefficient=0.01")
MESHES = {"stage4_data2": dict(stage=4, data=2),
          "stage2_fsdp2_tensor2": dict(stage=2, data=1, fsdp=2, tensor=2)}
# (name, repeats, microbatches): GPipe, and circular with 2 repeats (microbatches >= stages).
SCHEDULES = {"gpipe": (1, 2), "circular": (2, 4)}
FAMILIES = {"llama": ("PyCodeLlamaTiny", ()), "mixtral": ("PyCodeMixtralTiny", MOE_SETS)}
STEPS = 3
LEARNING_RATE = 0.1


def _jitted(experiment, sets, mesh_axes=None, repeats=1, microbatches=1):
  extra = ()
  if mesh_axes:
    extra = tuple(f"partitioner.ici_{axis}={size}" for axis, size in mesh_axes.items()) + (
        f"train.pipeline_repeats={repeats}", f"train.pipeline_microbatches={microbatches}")
  setup = synthetic_tiny_setup(experiment, *SETS, *sets, *extra)
  devices = jax.devices() if mesh_axes else jax.devices()[:1]
  return setup, JittedSteps(setup, setup.partitioner.make_mesh(devices))


def _trajectory(experiment, sets, mesh_axes=None, repeats=1, microbatches=1, start=None):
  """The loss and the gradients (flattened, on host) of STEPS steps of plain gradient descent
  from `start` (host parameters; None: the one-device initialization, returned too): each
  step's gradients come from the jitted objective on the mesh."""
  setup, jitted = _jitted(experiment, sets, mesh_axes, repeats, microbatches)
  losses, grads = [], []
  with jitted.activated():
    # One initialization placed on each mesh (the parameters do not depend on the stages):
    # a compile of the initialization per case would double the test's time.
    params = (jitted.init_state().params if start is None
              else jax.device_put(start, jitted.sharded_state.shardings.params))
    start = jax.device_get(params)

    def objective(p, batch):
      total = jitted.objective.normalizer(batch)
      value, sums = jitted.objective.loss(Forward(jitted.model), p, batch, total)
      return value, sums["cross_entropy_sum"] / total

    step = jax.jit(jax.value_and_grad(objective, has_aux=True),
                   in_shardings=(jitted.sharded_state.shardings.params, jitted.batch_sharding))
    for index in range(STEPS):
      (_, loss), g = step(params, jitted.global_batch(setup.train_data.batch(index)))
      losses.append(float(loss))
      grads.append({jax.tree_util.keystr(k): np.asarray(v)
                    for k, v in jax.tree_util.tree_flatten_with_path(g)[0]})
      params = jax.tree.map(lambda p, d: p - LEARNING_RATE * d, params, g)
  specs = {jax.tree_util.keystr(k): str(s.spec) for k, s in
           jax.tree_util.tree_flatten_with_path(jitted.sharded_state.shardings.params)[0]}
  return losses, grads, specs, start


def _distance(reference, case):
  """The largest |a - b| / max(1, |b|) over every gradient of every step, and of the loss."""
  ref_losses, ref_grads = reference[:2]
  losses, grads = case[:2]
  loss = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, ref_losses))
  grad = max(float(np.max(np.abs(step[name] - ref[name]) / np.maximum(1.0, np.abs(ref[name]))))
             for step, ref in zip(grads, ref_grads) for name in ref)
  return {"loss": loss, "grads": grad, "losses": losses, "reference": ref_losses,
          "same_names": all(set(s) == set(r) for s, r in zip(grads, ref_grads))}


def main():
  assert jax.device_count() == 8, jax.device_count()
  result = {}
  for family, (experiment, sets) in FAMILIES.items():
    reference = _trajectory(experiment, sets)
    for mesh, axes in MESHES.items():
      for schedule, (repeats, microbatches) in SCHEDULES.items():
        case = _trajectory(experiment, sets, axes, repeats, microbatches, reference[3])
        result[f"{family}/{mesh}/{schedule}"] = dict(_distance(reference, case),
                                                      specs=case[2])
  print(json.dumps(result))


if __name__ == "__main__":
  main()
