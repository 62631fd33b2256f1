"""What to change when a compiled step does not fit: one line that names the next knob.

The verdict says how many bytes a device needs; this says which of the config's own fields
moves them, in the order a user would try them. The state (parameters and optimizer moments)
and the activations are moved by different knobs, so the report's count of the state from its
shapes (`analytic`) decides which kind of knob comes first:

  state larger than the device:  FSDP over the slices too (partitioner.dcn_fsdp), FSDP over
      every chip of a slice (partitioner.ici_fsdp=-1), bfloat16 moments
      (optimizer.moment_dtype), moments in host memory (optimizer.offload_state), then pipeline
      stages where the partitioner has them, or a larger target;
  activations (the rest):  a remat policy that keeps nothing (model.remat_policy='full'),
      micro-batches (train.grad_accum_steps, while a micro-batch keeps a row per data-parallel
      device), then more tensor parallelism (partitioner.ici_tensor) or pipeline stages.
"""

from __future__ import annotations

from typing import Any


def _state_knob(setup: Any, target: Any, mesh: dict[str, int]) -> str | None:
  partitioner, optimizer = setup.partitioner, setup.optimizer
  slices = target.num_slices
  if slices > 1 and getattr(partitioner, "dcn_fsdp", 1) == 1:
    return (f"shard the parameters and optimizer over the {slices} slices too "
            f"(partitioner.dcn_fsdp={slices}, partitioner.dcn_data=1: FSDP over the "
            "data-center network)")
  per_slice = target.num_devices // max(slices, 1)
  within = mesh.get("fsdp", 1) // max(getattr(partitioner, "dcn_fsdp", 1), 1)
  if within * mesh.get("tensor", 1) * mesh.get("expert", 1) < per_slice:
    # Data parallelism within a slice holds the rest of its chips: it gives them up.
    data = mesh.get("data", 1) // max(getattr(partitioner, "dcn_data", 1), 1)
    return ("shard the parameters and optimizer over every chip of a slice "
            "(partitioner.ici_fsdp=-1" + (", partitioner.ici_data=1)" if data > 1 else ")"))
  if hasattr(optimizer, "moment_dtype") and optimizer.moment_dtype is None:
    return "keep Adam's moments in bfloat16 (optimizer.moment_dtype='bfloat16')"
  if (hasattr(optimizer, "offload_state") and not optimizer.offload_state
      and target.platform in ("tpu", "gpu")):
    return "keep the optimizer state in host memory (optimizer.offload_state=True)"
  return None


def _activation_knob(setup: Any, program: str, mesh: dict[str, int]) -> str | None:
  policy = getattr(setup.model, "remat_policy", None)
  if policy is not None and policy != "full":
    return (f"a remat policy that keeps less: model.remat_policy='full' (now {policy!r}; "
            "the backward recomputes each block)")
  if program != "train":
    return "a smaller eval batch (eval_data.global_batch_size)"
  data_parallel = mesh.get("data", 1) * mesh.get("fsdp", 1) * mesh.get("expert", 1)
  steps = setup.train.grad_accum_steps
  rows = setup.train_data.global_batch_size // steps
  if rows % (2 * data_parallel) == 0:
    return (f"micro-batches: train.grad_accum_steps={2 * steps} (each micro-batch "
            f"{rows // 2} rows, half the activations)")
  return None


def _last_knob(setup: Any) -> str:
  stages = hasattr(setup.partitioner, "ici_stage")
  return ("more tensor parallelism (partitioner.ici_tensor)"
          + (", pipeline stages (partitioner.ici_stage)" if stages else "")
          + ", or a larger target")


def next_knob(setup: Any, target: Any, program: str, mesh: dict[str, int],
              state_bytes: int, available: int | None) -> str:
  """The knob to turn first for a step that does not fit, in words with its config field.

  Args:
    setup: The compiled config's Setup.
    target: Its lingvo_lite.target.Target.
    program: "train" or "eval".
    mesh: Mesh axis sizes ({axis: size}, the report's `mesh`).
    state_bytes: Parameters, optimizer moments and other state per device (from shapes).
    available: The device's bytes (None where unknown: the activations' knobs then).
  """
  if available is not None and state_bytes > available:
    what = "the parameters and optimizer state alone exceed the device"
    knob = _state_knob(setup, target, mesh)
  else:
    what = "the activations and temporaries exceed what the state leaves"
    knob = _activation_knob(setup, program, mesh)
  knob = knob or _last_knob(setup)
  return f"does not fit: {what}; next knob: {knob}"
