"""Saved compiled train steps: an executable and a manifest of everything it was built for.

`--mode=compile --compiled_step_out=PATH` writes PATH/executable.bin (XLA's serialized
executable) and PATH/manifest.json; `--mode=train --compiled_step_in=PATH` loads it only when
the manifest matches the run in everything that reaches the step:
  - the config fields compiled into it: the model, optimizer and partitioner, the train
    loop's steps (the learning-rate schedule is baked in), z-loss, gradient accumulation and
    norm logging, and the batch's shapes and dtypes; fields that never reach the step
    (logging and checkpoint intervals, seeds, data paths) may differ;
  - the input and output tree structures and shardings;
  - the platform, device count, device kinds and their order in the mesh (an executable
    loaded onto devices in another order computes on the wrong shards: maxtext #2580);
  - jax, jaxlib (and for TPU steps libtpu) versions, and the XLA flags in force.
Any difference is one line naming what differs, saved and current values, exit code 2; a
saved step never runs silently where it is not valid.

Trust: a serialized executable is code (deserializing it unpickles and runs it). It is loaded
only from the path given on the command line; load only steps you compiled yourself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
from typing import Any

import jax
from etils import epath
from jax.experimental import serialize_executable

from lingvo_lite import input_files, output_folders, outputs, paths, target as targets
from lingvo_lite.errors import UsageError, shown
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs.compile.aot import CompileResult

KIND = "compiled_step"
SCHEMA = outputs.schema(KIND, 1)  # "lingvo_lite.compiled_step/1"
MANIFEST, EXECUTABLE = outputs.MANIFEST, "executable.bin"
# Train-loop fields compiled into the step (the others never reach it).
_STEP_TRAIN_FIELDS = ("steps", "grad_accum_steps", "z_loss", "log_grad_norm", "objective")
# XLA flags that say how many devices exist, which the device list already compares.
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
# jax settings that change what a step computes.
_JAX_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision")


def _dataclass_fields(obj: Any, prefix: str) -> dict[str, str]:
  out = {}
  for field in dataclasses.fields(obj):
    if field.name in ("parent", "name"):  # A Flax module's place in a tree, not a setting.
      continue
    value = getattr(obj, field.name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      out.update(_dataclass_fields(value, f"{prefix}{field.name}."))
    else:
      out[f"{prefix}{field.name}"] = repr(value)
  return out


def step_config(jitted: JittedSteps) -> dict[str, str]:
  """The config fields compiled into the train step, as `path: repr`."""
  setup = jitted.setup
  fields = {}
  for part in ("model", "optimizer", "partitioner"):
    fields.update(_dataclass_fields(getattr(setup, part), f"{part}."))
  fields.update({f"train.{name}": repr(getattr(setup.train, name))
                 for name in _STEP_TRAIN_FIELDS})
  for key, (shape, dtype) in sorted(jitted.train_batch_spec().items()):
    fields[f"train_data batch {key}"] = f"{dtype}{list(shape)}"
  return fields


def _xla_flags() -> dict[str, str]:
  flags = {name: " ".join(f for f in os.environ.get(name, "").split()
                          if not f.startswith(_DEVICE_COUNT_FLAG))
           for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")}
  flags.update({name: repr(getattr(jax.config, name)) for name in _JAX_SETTINGS})
  return flags


def _versions(platform: str) -> dict[str, str]:
  versions = {"jax": jax.__version__, "jaxlib": importlib.metadata.version("jaxlib")}
  if platform == "tpu":
    try:
      versions["libtpu"] = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
      versions["libtpu"] = "not installed"
  return versions


def topology_label(target: targets.Target) -> str:
  """`cpu:8`, `v5e-8`, `8 x NVIDIA H100 80GB HBM3`: what a step was compiled for."""
  if target.platform == "cpu":
    return f"cpu:{target.num_devices}"
  if target.platform == "tpu" and not target.is_host:
    return target.name
  return f"{target.num_devices} x {target.device_kind}"


@dataclasses.dataclass(frozen=True)
class _StepTrees:
  """The train step's input and output tree structures, and its input leaves (traced once)."""

  inputs: Any
  outputs: Any
  input_leaves: list[Any]


def _step_trees(jitted: JittedSteps) -> _StepTrees:
  abstract_state, batch = jitted.sharded_state.abstract, jitted.abstract_batch()
  with jitted.activated():
    outputs = jax.eval_shape(jitted.train_step, abstract_state, batch)
  leaves, inputs = jax.tree.flatten(((abstract_state, batch), {}))
  return _StepTrees(inputs, jax.tree.structure(outputs), leaves)


def manifest(jitted: JittedSteps, trees: _StepTrees | None = None) -> dict[str, Any]:
  """What the saved step must agree with, for `jitted` on its target."""
  target = jitted.target
  trees = trees or _step_trees(jitted)
  # In the order a mismatch is reported: what the step runs on first.
  return {
      "platform": target.platform,
      "topology": topology_label(target),
      "device kinds": sorted({d.device_kind for d in target.devices}),
      "device order": [int(d.id) for d in jitted.mesh.devices.flat],
      "mesh": {axis: int(size) for axis, size in jitted.mesh.shape.items()},
      "versions": _versions(target.platform),
      "xla flags": _xla_flags(),
      "step config": step_config(jitted),
      "input tree": str(trees.inputs),
      "output tree": str(trees.outputs),
      "input shardings": hashlib.sha256(repr(
          [str(leaf.sharding.spec) for leaf in trees.input_leaves]).encode()).hexdigest()[:16],
  }


def check_out_path(value: str | None,
                   job_dir: epath.Path | None = None) -> output_folders.FolderOutput | None:
  """The --compiled_step_out folder, refused before compiling where the step cannot go there:
  a file, a place where no folder can be created, a folder with anything but a compiled step
  lingvo_lite wrote (that one is replaced), or inside a job's checkpoints (lingvo_lite/
  output_folders.py)."""
  if value is None:
    return None
  flag = f"--compiled_step_out={shown(value)}"
  if not value.strip():
    raise UsageError(f"{flag}: empty; give a folder for the compiled step, e.g. "
                     "--compiled_step_out=runs/step")
  path = paths.resolve(value, "--compiled_step_out")
  return output_folders.check_folder(path, flag, KIND, (MANIFEST, EXECUTABLE),
                                     "the compiled step", job_dir)


def save(output: output_folders.FolderOutput, result: CompileResult) -> bool:
  """Writes the executable and its manifest into a new folder, renamed into place whole
  (output_folders.write_folder): over an earlier compiled step lingvo_lite wrote there, never
  over anything else. The manifest names the executable's checksum, so a copy that lost a file is
  refused on load.

  Returns:
    Whether it replaced an earlier compiled step.

  Raises:
    OSError: the folder or a file cannot be written (a full disk, say).
    UsageError: something else was put in the folder meanwhile.
  """
  serialized, _, _ = serialize_executable.serialize(result.executable)
  data = manifest(result.jitted)
  data = {"schema": SCHEMA, "executable sha256": hashlib.sha256(serialized).hexdigest(), **data}

  def write(folder: epath.Path) -> None:
    (folder / EXECUTABLE).write_bytes(serialized)
    (folder / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")

  return output_folders.write_folder(output, write)


def _differences(saved: Any, current: Any, where: str) -> list[tuple[str, Any, Any]]:
  """(field, saved, current) for each difference, nested dicts flattened."""
  if isinstance(saved, dict) and isinstance(current, dict):
    found = []
    for key in list(saved) + [k for k in current if k not in saved]:
      found += _differences(saved.get(key, "<absent>"), current.get(key, "<absent>"),
                            f"{where}.{key}" if where else key)
    return found
  return [] if saved == current else [(where, saved, current)]


def load(value: str, jitted: JittedSteps) -> Any:
  """The saved step at --compiled_step_in=value, once its manifest matches `jitted`.

  Raises:
    UsageError: a missing or unreadable folder, or the first difference (field, saved value,
      current value).
  """
  flag = f"--compiled_step_in={shown(value)}"
  if not value.strip():
    raise UsageError(f"{flag}: empty; give the folder --compiled_step_out wrote")
  path = paths.resolve(value, "--compiled_step_in")
  try:
    saved = input_files.json_value((path / MANIFEST).read_text())
    serialized = (path / EXECUTABLE).read_bytes()
  except FileNotFoundError as e:
    raise UsageError(f"{flag}: no saved step there ({os.path.basename(str(e.filename))} is "
                     "missing); write one with --mode=compile --compiled_step_out=PATH") from None
  except (OSError, ValueError, RecursionError) as e:
    raise UsageError(f"{flag}: cannot read the saved step ({type(e).__name__}: "
                     f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
  if not isinstance(saved, dict) or saved.get("schema") != SCHEMA:
    raise UsageError(f"{flag}: {MANIFEST} is not a lingvo_lite compiled-step manifest "
                     f"(schema {shown(saved.get('schema') if isinstance(saved, dict) else None)},"
                     f" expected {SCHEMA!r})")
  if hashlib.sha256(serialized).hexdigest() != saved.get("executable sha256"):
    raise UsageError(f"{flag}: {EXECUTABLE} does not match the checksum its manifest "
                     "records (a partial copy or a changed file); compile it again")
  trees = _step_trees(jitted)
  current = manifest(jitted, trees)
  saved_fields = {k: v for k, v in saved.items() if k not in ("schema", "executable sha256")}
  differences = _differences(saved_fields, current, "")
  if differences:
    field, old, new = differences[0]
    more = f" (and {len(differences) - 1} more differences)" if len(differences) > 1 else ""
    raise UsageError(f"{flag}: compiled for a different {field.split('.')[0]}: {field} was "
                     f"{shown(old, 120)} when compiled, is {shown(new, 120)} now{more}; "
                     "recompile with --mode=compile --compiled_step_out=PATH for this run")
  try:
    return serialize_executable.deserialize_and_load(serialized, trees.inputs, trees.outputs)
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(f"{flag}: XLA cannot load the saved executable on this host "
                     f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''});"
                     " compile it again here") from None
