"""LoRA adapters as Hugging Face PEFT folders, both ways: `--export_format=peft` writes a LoRA
job's adapters as `adapter_config.json` + `adapter_model.safetensors` that
`peft.PeftModel.from_pretrained` reads over the base model; `--init_from=peft:PATH` reads such a
folder's adapters over a base (its `base_model_name_or_path` where that is a local folder or
file, else `peft:PATH,base=hf:FOLDER`, any other --init_from value), to continue training them or
to serve them.

Names: each adapted kernel (models/lora.py) is one of the family's Hugging Face tensors
(`HfNames.tensors()`: `layer_0/attention/query_kernel` is `model.layers.0.self_attn.q_proj.weight`,
an `nn.Linear` stored [out, in] as our [in..., out...] reshaped and transposed). PEFT's adapter of
module M is `base_model.model.M.lora_A.weight` [r, in] and `.lora_B.weight` [out, r], so that the
update is lora_B @ lora_A times lora_alpha / r: our A [in..., r] and B [r, out...] reshaped the
same way and transposed. A tensor that fuses several of our kernels (GPT-2's `c_attn`: query, key
and value) has no adapter of ours: refused in one line, both ways (export the adapters merged:
`--export_format=hf`).

Which modules have adapters, of what rank and scale, is read from adapter_config.json as peft
reads it (peft_config.py: `target_modules`, `exclude_modules`, `layers_to_transform` and
`layers_pattern`, rank and alpha patterns that give every module the same, rsLoRA); what these
adapters do not do (DoRA, `modules_to_save`, trained biases, a rank per module) is refused in one
line naming the key. Each adapter gets the checks every weight source gets (tensor_checks.py):
present, a float, of the shape this base's kernel and the rank need (a folder made for another
base is refused naming the tensor); the file's other tensors are named in one warning.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any

import jax
import numpy as np
from etils import epath

from lingvo_lite import file_writes, input_files
from lingvo_lite.errors import UsageError
from lingvo_lite.models import layer_layout, lora
from lingvo_lite.models.checkpoint_names import TensorName
from lingvo_lite.weights import peft_config, tensor_checks
from lingvo_lite.weights.exports import size_text
from lingvo_lite.weights.hf_checkpoint import names_of
from lingvo_lite.weights.safetensors_files import SafetensorsFiles
from lingvo_lite.weights.weight_source import PathSource

KIND = "peft_export"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
FIELD = "train.init_from"
_FOLDER_FIX = "give a PEFT folder"
# A LoRA adapter's tensor, as peft names it: the module, then lora_A or lora_B.
_ADAPTER = re.compile(r"(?:base_model\.model\.)?(.+)\.lora_[AB](?:\.[^.]+)?\.weight")


def modules(model: Any) -> dict[str, tuple[str, TensorName]]:
  """kernel path (unrolled layout) -> (the Hugging Face module holding it, its TensorName),
  for every kernel that is one tensor of its own; fused tensors' kernels map to None."""
  found: dict[str, Any] = {}
  for tensor in names_of(model).tensors():
    if not tensor.name.endswith(".weight") or not tensor.input_axes:
      continue
    for path in tensor.paths:
      found[path] = (tensor.name[:-len(".weight")], tensor) if len(tensor.paths) == 1 else None
  return found


def _unrolled(model: Any) -> Any:
  return model.clone(parent=None, scan_layers=False, lora=None)


# ------------------------------------------------------------------------------ export


class PeftExport:
  """`--export_format=peft`: a LoRA job's adapters as a PEFT folder (formats.Export)."""

  kind = KIND
  dtypes = ("float32", "bfloat16")
  dtype_note = " (the adapters')"
  names = (CONFIG_FILE, WEIGHTS_FILE)
  reads_adapters = True  # What the export program loads for it: JobParams.load_adapters.

  def __init__(self, request: Any):
    setup = request.setup
    if setup.train.lora is None:
      raise UsageError("--export_format=peft: the job trains no LoRA adapters (train.lora is "
                       "None); export it whole with --export_format=hf, gguf or slim")
    self._request = request
    self._settings = setup.train.lora
    self._model = _unrolled(setup.model)
    self._modules = modules(self._model)
    self._host: dict[str, np.ndarray] = {}

  def take(self, adapters: Any) -> None:
    host = jax.tree.map(np.asarray, jax.device_get(adapters))
    if self._request.setup.model.scan_layers:
      host = layer_layout.unstack_layers(host)
    self._host = lora.flatten(host)

  def _tensors(self) -> tuple[dict[str, np.ndarray], list[str]]:
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    dtype = ml_dtypes.bfloat16 if self._request.dtype == "bfloat16" else np.float32
    tensors, targets = {}, []
    for path in lora.kernel_paths(lora.unflatten(self._host)):
      module = self._modules.get(path)
      if module is None:
        raise UsageError(f"--export_format=peft: the adapter of {path} has no PEFT module of "
                         "its own (its Hugging Face tensor fuses it with others, as GPT-2's "
                         "c_attn does); export the adapters merged (--export_format=hf)")
      name, tensor = module
      a, b = self._host[path + lora.A_SUFFIX], self._host[path + lora.B_SUFFIX]
      rank = a.shape[-1]
      tensors[f"{PREFIX}{name}.lora_A.weight"] = np.ascontiguousarray(
          a.reshape(-1, rank).T).astype(dtype)
      tensors[f"{PREFIX}{name}.lora_B.weight"] = np.ascontiguousarray(
          b.reshape(rank, -1).T).astype(dtype)
      targets.append(name)
    return tensors, targets

  def _config(self, targets: list[str]) -> dict[str, Any]:
    settings, source = self._settings, self._request.setup.train.init_from
    base = (source.base_model_path() if source is not None else None) or str(
        self._request.export_dir)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
            "r": settings.rank, "lora_alpha": settings.alpha, "lora_dropout": settings.dropout,
            "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
            "inference_mode": True, "init_lora_weights": True, "use_rslora": False,
            "use_dora": False, "modules_to_save": None, "rank_pattern": {},
            "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None,
            "revision": None}

  def write(self, folder: epath.Path) -> dict[str, Any]:
    from lingvo_lite.weights.hf_export import _save_safetensors  # pylint: disable=g-import-not-at-top
    tensors, targets = self._tensors()
    with file_writes.writing(folder / WEIGHTS_FILE):
      _save_safetensors(tensors, folder / WEIGHTS_FILE)
      os.chmod(os.fspath(folder / WEIGHTS_FILE), 0o644)
    with file_writes.writing(folder / CONFIG_FILE):
      (folder / CONFIG_FILE).write_text(json.dumps(self._config(targets), indent=2) + "\n")
    return {"files": {name: os.path.getsize(os.fspath(folder / name)) for name in self.names},
            "tensors": len(tensors), "adapted": len(targets)}

  def summary(self, written: dict[str, Any]) -> str:
    return (f"LoRA adapters of {written['adapted']} modules (rank {self._settings.rank}, alpha "
            f"{self._settings.alpha:g}), {size_text(sum(written['files'].values()))}")

  def details(self, written: dict[str, Any]) -> list[str]:
    return [f"  {os.path.join(self._request.export_dir, name)}  "
            f"{size_text(written['files'][name])}" for name in self.names]


# ------------------------------------------------------------------------------ import


def flag_arguments(value: str, flag: str = "--init_from") -> dict[str, Any]:
  """`PeftCheckpoint`'s arguments for `--init_from=peft:PATH[,base=SOURCE]` (SOURCE: any other
  --init_from value, which weights/formats.py builds as its format's config part).

  Raises:
    UsageError: an empty path, or a base that is itself peft:.
  """
  path, comma, rest = value.partition(",base=")
  if not path.strip():
    raise UsageError(f"{flag}=peft:{value}: give the PEFT folder after peft: "
                     "(peft:PATH, or peft:PATH,base=hf:FOLDER)")
  if not comma:
    return {"path": path}
  if not rest.strip() or rest.startswith("peft:"):
    raise UsageError(f"{flag}=peft:{value}: base= names the base model's weights (hf:FOLDER, "
                     "gguf:FILE, JOB[@STEP] or slim:FOLDER), not another adapter")
  return {"path": path, "base": rest}  # weights/formats.py builds the base's source.


def _base_from(name: Any, shown: str) -> Any:
  """The weight source a PEFT config's `base_model_name_or_path` names, where it is a local
  folder (a Hugging Face folder, or a lingvo_lite job) or a .gguf file."""
  from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_checkpoint import HfCheckpoint  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.job_checkpoint import JobCheckpoint  # pylint: disable=g-import-not-at-top
  if isinstance(name, str) and name.strip():
    local = os.path.expanduser(name)
    if os.path.isdir(os.path.join(local, "checkpoints")):
      return JobCheckpoint(name)
    if os.path.isfile(os.path.join(local, "config.json")):
      return HfCheckpoint(name)
    if os.path.isfile(local) and local.endswith(".gguf"):
      return GgufCheckpoint(name)
  raise UsageError(f"{shown}: base_model_name_or_path={name!r} is not a local Hugging Face "
                   "folder, GGUF file or job; give the base: --init_from=peft:PATH,base=hf:FOLDER")


@dataclasses.dataclass(frozen=True)
class PeftCheckpoint(PathSource):
  """A PEFT folder's LoRA adapters over a base model's weights (weight_source.py: it brings
  adapters, and describes its model where its base does).

  Attributes:
    path: The folder (adapter_config.json, adapter_model.safetensors).
    base: The base model's weight source; None: the one its config's
      `base_model_name_or_path` names (a local folder or file).
  """

  base: Any = None

  scheme = "peft"
  holds = "a PEFT folder (adapter_config.json, adapter_model.safetensors)"
  folder_fix = "give the folder peft's save_pretrained (or --export_format=peft) wrote"
  brings_adapters = True

  def adapter_config(self) -> dict[str, Any]:
    """The folder's adapter_config.json, checked: LoRA, and nothing these adapters do not do
    (peft_config.check).

    Raises:
      UsageError: one line naming the file and the key.
    """
    where = os.path.join(self.path, CONFIG_FILE)
    file = self.folder() / CONFIG_FILE
    if not file.exists():
      raise UsageError(f"{where}: no such file; a PEFT folder holds its adapter_config.json")
    try:
      values = input_files.json_value(input_files.read_bytes(file, where, _FOLDER_FIX))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
      raise UsageError(f"{where}: not JSON ({e})") from None
    return peft_config.check(values, where)

  def base_source(self) -> Any:
    if self.base is not None:
      return self.base
    return _base_from(self.adapter_config().get("base_model_name_or_path"),
                      os.path.join(self.path, CONFIG_FILE))

  def describes_model(self) -> bool:
    """Whether the base's files describe the model."""
    return self.base_source().describes_model()

  def model_fields(self) -> tuple[type, dict[str, Any]]:
    return self.base_source().model_fields()

  def origin(self) -> str:
    return self.base_source().origin()

  def describe(self) -> str:
    return f"peft:{self.path} over {self.base_source().describe()}"

  def base_model_path(self) -> str | None:
    return self.base_source().base_model_path()

  def lora_settings(self, model: Any) -> lora.LoraSettings:
    """train.lora as the config says, for `model` (the base's family): rank, alpha (rsLoRA's
    made plain), dropout, and the kernels of the modules peft adapts."""
    return self.plan(model).settings(model.num_layers)

  def _tensors(self) -> SafetensorsFiles:
    return SafetensorsFiles(self.folder(), self.path, _file_names, WEIGHTS_FILE, None,
                            os.path.join(self.path, WEIGHTS_FILE), _FOLDER_FIX,
                            "the folder lacks it: give the folder peft's save_pretrained wrote")

  def plan(self, model: Any) -> peft_config.AdapterPlan:
    """The adapters this folder gives `model` (peft_config.plan), once the file holds no
    adapter of a module the model lacks (a folder made for another base).

    Raises:
      UsageError: naming the file and the module or key.
    """
    values = self.adapter_config()
    unrolled = _unrolled(model)
    ours: dict[str, str | None] = {}
    for tensor in names_of(unrolled).tensors():
      if tensor.name.endswith(".weight") and tensor.input_axes:
        ours[tensor.name[:-len(".weight")]] = tensor.paths[0] if len(tensor.paths) == 1 else None
    shown = os.path.join(self.path, WEIGHTS_FILE)
    with self._tensors() as tensors:
      held = sorted({match.group(1) for match in map(_ADAPTER.fullmatch, tensors.held())
                     if match})
    for module in held:
      if module not in ours:
        raise UsageError(f"{shown}: adapter of module {module!r}, which this "
                         f"{type(model).family_name} model has no kernel of its own for (a "
                         "folder for another base, or a fused tensor); give its base model "
                         "(base=...)")
    return peft_config.plan(values, os.path.join(self.path, CONFIG_FILE), ours,
                            lora.adaptable_kernels(unrolled), held,
                            type(model).family_name)

  def load_base(self, mesh_params: Any) -> tuple[Any, str]:
    """The base model's parameters, into `mesh_params` (the frozen weights of a LoRA job)."""
    return self.base_source().load_params(mesh_params)

  def load_adapters(self, adapter_params: Any) -> tuple[Any, str]:
    """(the adapters, the `lora` tree of models/lora.py in `adapter_params`' shardings (a
    `MeshParams` of the adapted model's `lora` collection), what was loaded).

    Each adapter gets the checks every weight source's tensors get (tensor_checks.py): it is
    there, a float, of the shape the model's adapter needs (another base or another rank is
    refused naming the tensor); the file's tensors no adapter reads are named in a warning.

    Raises:
      UsageError: one line naming the file and the tensor, or the adapter train.lora names
        that the folder does not hold.
    """
    import hashlib  # pylint: disable=g-import-not-at-top
    model = adapter_params.model
    abstract = adapter_params.abstract
    unrolled = layer_layout.unstack_layers(abstract) if model.scan_layers else abstract
    wanted = lora.flatten(unrolled)
    shown = os.path.join(self.path, WEIGHTS_FILE)
    host: dict[str, np.ndarray] = {}
    digest = hashlib.sha256()
    with self._tensors() as tensors:
      for module, path in self.plan(model).kernels.items():
        for letter, suffix in (("A", lora.A_SUFFIX), ("B", lora.B_SUFFIX)):
          if path + suffix not in wanted:
            raise UsageError(f"{FIELD}=peft:{self.path}: module {module} has adapters, but "
                             f"train.lora.targets does not name {path}; leave train.lora as "
                             "the PEFT config sets it")
          leaf = wanted[path + suffix]
          tensor, _ = tensors.get(f"{PREFIX}{module}.lora_{letter}.weight")
          ours = tuple(leaf.shape)
          # A [in..., r] is PEFT's [r, in] transposed; B [r, out...] its [out, r] transposed.
          expected = ((ours[-1], math.prod(ours[:-1])) if letter == "A"
                      else (math.prod(ours[1:]), ours[0]))
          name = f"{PREFIX}{module}.lora_{letter}.weight"
          reads = [f"adapter {path + suffix} {list(ours)}"]
          tensor_checks.check_dtype(shown, name, tensor.dtype, reads, [leaf.dtype])
          tensor_checks.check_shape(shown, name, tensor.shape, expected, reads,
                                    "a folder for another base model, or another rank; give "
                                    "its base (base=...) and leave train.lora.rank as its r")
          values = np.asarray(tensor, np.float32)
          host[path + suffix] = np.ascontiguousarray(values.T).reshape(ours)
          digest.update(f"{name}|{values.shape}|".encode() + values.tobytes())
      tensor_checks.warn_unread(shown, tensors.unread())
    missing = sorted(set(wanted) - set(host))
    if missing:
      raise UsageError(f"{FIELD}=peft:{self.path}: train.lora.targets names {missing[0]}, which "
                       "the folder has no adapter for; leave train.lora as the PEFT config "
                       "sets it")
    # Stacked as the model's scan holds its layers (a pattern's groups, an unrolled prefix).
    tree = model.to_own_layout(lora.unflatten(host))
    shardings = jax.tree.map(lambda leaf: leaf.sharding, abstract)
    return jax.device_put(tree, shardings), f"peft:{self.path} sha256:{digest.hexdigest()}"

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    """The base's parameters with the adapters merged (a job whose train.lora was cleared)."""
    params, base_what = self.load_base(mesh_params)
    settings = self.lora_settings(mesh_params.model)
    adapted = mesh_params.model.with_adapters(settings)
    adapters, what = self.load_adapters(mesh_params.of(adapted, lora.COLLECTION))
    merged = jax.jit(lambda p, a: lora.merge(p, a, settings.scale),
                     out_shardings=jax.tree.map(lambda leaf: leaf.sharding,
                                                mesh_params.abstract))(params, adapters)
    return merged, f"{what} over {base_what}"


def _file_names(name: str) -> list[str]:
  """The names a PEFT file may give the adapter `name` (`base_model.model.M.lora_A.weight`):
  itself, without peft's prefix, or with the adapter's name (`default`) in it."""
  return [name, name[len(PREFIX):], name.replace(".weight", ".default.weight")]
