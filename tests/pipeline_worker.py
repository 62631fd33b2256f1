"""Runs in a child process with 8 forced CPU devices (XLA_FLAGS set by the parent test) and
prints one JSON object: for each pipelined case of CASES, how far its loss and gradients are
from one device's over 3 steps, and the stacked parameters' PartitionSpecs. The parent
(tests/test_pipeline.py) asserts on it.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.pipeline_worker [--all]

The suite runs SUITE_CASES, a covering set of the family x mesh x schedule matrix (each pair of
values in some case, 4 compiles of the 8); `--all` runs all 8 (bench/pipeline_numerics.py).
"""

import json
import os
import sys
import tempfile

import jax
import numpy as np
from etils import epath

from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import run_cli, synthetic_tiny_setup
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
# Every pair of the three settings' values appears in one of these (an orthogonal array).
SUITE_CASES = (("llama", "stage4_data2", "gpipe"), ("llama", "stage2_fsdp2_tensor2", "circular"),
               ("mixtral", "stage4_data2", "circular"),
               ("mixtral", "stage2_fsdp2_tensor2", "gpipe"))
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
      # Placed as the step takes them: a gradient's layout is XLA's choice (a norm scale's,
      # beside activations split over tensor on their width, comes back split too).
      params = jax.device_put(jax.tree.map(lambda p, d: p - LEARNING_RATE * d, params, g),
                              jitted.sharded_state.shardings.params)
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


# The pipeline composed with the rest (a kind pattern's groups, remat policies, LoRA over a
# frozen base, experts split over their own axis): 3 train steps' losses against one device.
COMPOSED = {
    "gemma3_remat_full": ("PyCodeGemma3Tiny", ("model.num_layers=4", "model.remat_policy='full'"),
                          dict(stage=2, data=2, fsdp=2), 1, 2, False),
    "llama_lora_remat_minimal": ("PyCodeLlamaTiny", ("model.remat_policy='minimal'",),
                                 dict(stage=4, data=2), 2, 4, True),
    "mixtral_expert_axis": ("PyCodeMixtralTiny", MOE_SETS, dict(stage=2, data=2, expert=2),
                            1, 2, False),
}


def _train_losses(experiment, sets, mesh_axes, repeats, microbatches, lora):
  """3 train steps' losses (Adam, the train program's step) on the mesh, or one device."""
  from lingvo_lite.config import building, fiddlers  # pylint: disable=import-outside-toplevel
  from lingvo_lite.testing import tiny_config  # pylint: disable=import-outside-toplevel
  extra = ()
  if mesh_axes:
    extra = tuple(f"partitioner.ici_{axis}={size}" for axis, size in mesh_axes.items()) + (
        f"train.pipeline_repeats={repeats}", f"train.pipeline_microbatches={microbatches}")
  cfg = tiny_config(experiment, *SETS, *sets, *extra, synthetic=True)
  if lora:
    fiddlers.lora(cfg)
    cfg.train.lora.rank = 4
  setup = building.build(cfg)
  devices = jax.devices() if mesh_axes else jax.devices()[:1]
  jitted = JittedSteps(setup, setup.partitioner.make_mesh(devices))
  losses = []
  with jitted.activated():
    frozen = jitted.frozen.load()[0] if jitted.frozen is not None else None
    state = jitted.init_state(frozen)
    for step in range(STEPS):
      state, metrics = jitted.train_step(state, jitted.global_batch(setup.train_data.batch(step)))
      losses.append(float(metrics["loss"]))
  return losses


def _composed():
  result = {}
  for name, (experiment, sets, axes, repeats, microbatches, lora) in COMPOSED.items():
    result[name] = {"single": _train_losses(experiment, sets, None, 1, 1, lora),
                    "pipelined": _train_losses(experiment, sets, axes, repeats, microbatches,
                                               lora)}
  return result


# Settings a pipeline refuses, each one line on stderr and exit 2 (the parent names the field
# each must name). Every case has a mesh of 8 devices and scanned layers unless it says not.
STAGE4 = ("--fdl.partitioner.ici_stage=4", "--fdl.partitioner.ici_data=2",
          "--fdl.model.scan_layers=True")
BAD_SETTINGS = {
    "stages_vs_layers": [*STAGE4, "--fdl.model.num_layers=6"],
    "stages_vs_kind_period": [*STAGE4, "--fdl.model.num_layers=4",
                              "--fdl.model.layer_kinds=('sliding', 'full')",
                              "--fdl.model.window=16"],
    "microbatches_vs_rows": [*STAGE4, "--fdl.model.num_layers=4",
                             "--fdl.train.pipeline_microbatches=3"],
    "unscanned": ["--fdl.partitioner.ici_stage=2", "--fdl.model.num_layers=4",
                  "--fdl.model.scan_layers=False"],
    "circular_microbatches": [*STAGE4, "--fdl.model.num_layers=8",
                              "--fdl.train.pipeline_repeats=2",
                              "--fdl.train.pipeline_microbatches=2"],
}


def _bad_settings(folder):
  outcomes = {}
  for name, args in BAD_SETTINGS.items():
    outcome = run_cli(["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                       "--fdl.train_data.global_batch_size=8",
                       "--fdl.eval_data.global_batch_size=8", "--mode=train",
                       f"--job_log_dir={folder}/{name}", *args])
    outcomes[name] = {"code": outcome.code, "stderr": outcome.stderr}
  return outcomes


def _leaves(tree):
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}


def _resume(folder):
  """A state trained 2 steps at 4 stages (x 2 data) and saved, restored at 2 stages (x 4
  data) and at 1 (x 8 data): whether each restore holds bitwise the saved arrays, and how far
  each one's next step is from the 4-stage run's own next step."""
  sets = ("train.pipeline_microbatches=2",)
  setup, jitted = _jitted("PyCodeLlamaTiny", sets, MESHES["stage4_data2"], 1, 2)
  batches = [setup.train_data.batch(index) for index in range(3)]
  with jitted.activated():
    state = jitted.init_state()
    for batch in batches[:2]:
      state, _ = jitted.train_step(state, jitted.global_batch(batch))
    saved = _leaves(state)
    checkpointer = Checkpointer(epath.Path(folder), CheckpointSettings(every_steps=1))
    checkpointer.save(2, state, force=True, metadata=jitted.checkpoint_metadata)
    checkpointer.close()
    continued, metrics = jitted.train_step(state, jitted.global_batch(batches[2]))
    want, want_loss = _leaves(continued.params), float(metrics["loss"])
  result = {}
  for stages in (2, 1):
    setup, jitted = _jitted("PyCodeLlamaTiny", sets, dict(stage=stages, data=8 // stages), 1, 2)
    reader = Checkpointer(epath.Path(folder), CheckpointSettings(), create=False)
    with jitted.activated():
      restored = jitted.restore_state(reader, 2)
      got = _leaves(restored)
      stage_split = [str(leaf.sharding.spec) for leaf in jax.tree.leaves(
          restored.params["layers"])]
      resumed, metrics = jitted.train_step(restored, jitted.global_batch(batches[2]))
    params = _leaves(resumed.params)
    result[f"stage{stages}"] = {
        "bitwise": got.keys() == saved.keys() and all(
            np.array_equal(got[k], saved[k]) for k in saved),
        "stage_split": stage_split, "loss": abs(float(metrics["loss"]) - want_loss),
        "params": max(float(np.max(np.abs(params[k] - want[k]))) for k in want)}
  return result


def _compile_report(folder):
  """The compile program's report of a 4-stage train step (x 2 data), and the bytes of one
  stage's share of the stacked layers counted from the model's parameter shapes."""
  job = f"{folder}/compiled"
  outcome = run_cli(["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                     "--fdl.train_data.global_batch_size=8",
                     "--fdl.eval_data.global_batch_size=8", *STAGE4,
                     "--fdl.model.num_layers=4", "--fdl.train.pipeline_microbatches=2",
                     "--mode=compile", "--compile_topology=cpu:8", f"--job_log_dir={job}"])
  setup = synthetic_tiny_setup("PyCodeLlamaTiny", "model.scan_layers=True", "model.num_layers=4",
                               "train_data.global_batch_size=8", "eval_data.global_batch_size=8")
  stacked = sum(np.prod(p.shape) * p.repeats * np.dtype(p.dtype).itemsize
                for p in setup.model.parameter_shapes() if p.path.startswith("['layers']"))
  with open(f"{job}/compile/report.json", encoding="utf-8") as f:
    report = json.load(f)
  with open(f"{job}/compile/report.txt", encoding="utf-8") as f:
    text = f.read()
  return {"code": outcome.code, "stderr": outcome.stderr, "report": report, "text": text,
          "stage_layer_bytes": int(stacked) // 4}


def _folded_programs(folder):
  """A job trained 2 steps at 2 stages (x 4 data), with its eval at the end (pipelined), then
  the eval program (the stage axis folded away) on its last checkpoint, and decode."""
  job = f"{folder}/folded"
  common = ["--fdl.model.scan_layers=True", "--fdl.model.num_layers=4",
            "--fdl.partitioner.ici_stage=2", "--fdl.partitioner.ici_data=4"]
  trained = run_cli(["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                     "--fdl.train_data.global_batch_size=8",
                     "--fdl.eval_data.global_batch_size=8", "--fdl.eval_data.num_batches=1",
                     "--fdl.train.steps=2", "--fdl.checkpoint.every_steps=2", *common,
                     "--mode=train", f"--job_log_dir={job}"])
  evaluated = run_cli(["--mode=eval", f"--job_log_dir={job}"])
  prompts = f"{folder}/prompts.jsonl"
  with open(prompts, "w", encoding="utf-8") as f:  # Synthetic data: ids, not text.
    f.write(json.dumps({"prompt_ids": [5, 6, 7], "max_new_tokens": 4}) + "\n")
  decoded = run_cli(["--mode=decode", f"--job_log_dir={job}", f"--prompts_file={prompts}"])

  def rows(path):
    with open(path, encoding="utf-8") as f:
      return [json.loads(line) for line in f]
  return {"codes": [trained.code, evaluated.code, decoded.code],
          "stderr": trained.stderr + evaluated.stderr + decoded.stderr,
          "train_eval": rows(f"{job}/eval_validation.jsonl") if not trained.code else [],
          "eval": (rows(f"{job}/eval/eval_validation.jsonl") if not evaluated.code else []),
          "decoded": os.path.exists(f"{job}/decode")}


def main():
  assert jax.device_count() == 8, jax.device_count()
  every = "--all" in sys.argv[1:]
  result = {}
  for family, (experiment, sets) in FAMILIES.items():
    reference = _trajectory(experiment, sets)
    for mesh, axes in MESHES.items():
      for schedule, (repeats, microbatches) in SCHEDULES.items():
        if not every and (family, mesh, schedule) not in SUITE_CASES:
          continue
        case = _trajectory(experiment, sets, axes, repeats, microbatches, reference[3])
        result[f"{family}/{mesh}/{schedule}"] = dict(_distance(reference, case),
                                                      specs=case[2])
  with tempfile.TemporaryDirectory() as folder:
    result["resume"] = _resume(os.path.join(folder, "checkpoints"))
    result["bad"] = _bad_settings(folder)
    result["compile"] = _compile_report(folder)
    result["folded"] = _folded_programs(folder)
  result["composed"] = _composed()
  print(json.dumps(result))


if __name__ == "__main__":
  main()
