"""A Hugging Face folder as a weight source: its config.json as the model's config, its
safetensors as the model's parameters.

`HfCheckpoint(path)` names a folder as transformers' `save_pretrained` writes it: config.json
and `model.safetensors`, or shards listed by `model.safetensors.index.json`. The family whose
Hugging Face names (models/format_names.py: `HfNames`) read its `model_type` says which fields
the config sets (`fields`) and which tensor holds which parameter (`tensors`), so this module
names no family. Tensors are read with `safetensors`' NumPy API (memory-mapped; no torch), one
at a time (safetensors_files.py), converted to the parameter's layout and dtype, and placed into
its sharding at once (placing.py, after the checks every weight source gets, tensor_checks.py:
float widths convert, an integer tensor is refused, a tensor no part of the model reads is
named in one warning): the host holds about one tensor (with scanned layers, one stacked
parameter) at any time.

The fingerprint of what was loaded is `sha256:` over every tensor read (name, dtype, shape
and the CRC-32 of its bytes, in the order the model names them), as a job checkpoint's is
over its files' CRC-32s: run_info.jsonl says which weights a run started from. CRC-32 reads
3 GB/s here where SHA-256 reads 1.45: hashing every byte with SHA-256 took half of a 355M
model's import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from lingvo_lite import input_files
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family as families, format_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.format_names import HfNames
from lingvo_lite.weights import tensor_checks
from lingvo_lite.weights.placing import Placer, content_crc
from lingvo_lite.weights.safetensors_files import SafetensorsFiles
from lingvo_lite.weights.weight_source import PathSource

FIELD = "train.init_from"
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FOLDER_FIX = "give a folder that transformers' save_pretrained wrote"
_MISSING_FIX = ("the folder lacks it (copy it again), or the model's sizes are not the folder's: "
                "set them as its config.json does (drop the --fdl.model overrides that change "
                "them)")


@dataclasses.dataclass(frozen=True)
class HfCheckpoint(PathSource):
  """The parameters (and model config) of a Hugging Face folder.

  Attributes:
    path: The folder: config.json and its safetensors (relative to the working directory).
  """

  scheme = "hf"
  holds = "a Hugging Face folder (config.json and model.safetensors)"
  folder_fix = ("give a folder that transformers' save_pretrained wrote (config.json, "
                "model.safetensors)")

  def describes_model(self) -> bool:
    return True

  def origin(self) -> str:
    """The file the model's fields come from, for config.txt."""
    return os.path.join(self.path, CONFIG_FILE)

  def config(self) -> HfConfig:
    """The folder's config.json.

    Raises:
      UsageError: no folder, no config.json, not JSON, or no `model_type`.
    """
    where = os.path.join(self.path, CONFIG_FILE)
    file = self.folder() / CONFIG_FILE
    if not file.exists():
      raise UsageError(f"{where}: no such file; a Hugging Face folder holds its model's "
                       "config.json beside the safetensors")
    try:
      values = input_files.json_value(input_files.read_bytes(file, where, _FOLDER_FIX))
    except OSError as e:  # A folder, no permission.
      raise UsageError(f"{where}: cannot be read ({e.strerror or e}); {_FOLDER_FIX}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
      raise UsageError(f"{where}: not JSON ({e}); give the config.json transformers "
                       "wrote") from None
    if not isinstance(values, dict) or not values.get("model_type"):
      known = sorted(names.model_type for _, names in format_names.families_with(HfNames))
      raise UsageError(f"{where}: no model_type; a Hugging Face config.json names its "
                       f"architecture ({', '.join(known)}, ...)")
    return HfConfig(values, where)

  def model_fields(self) -> tuple[type[families.LanguageModel], dict[str, Any]]:
    """The family that reads this folder and the fields its config.json sets."""
    config = self.config()
    family, names = family_reading(config.values["model_type"], config.where)
    fields = {k: v for k, v in names.fields(config).items() if v is not None}
    return family, fields

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    """(this folder's parameters in `mesh_params`' model layout and shardings (a
    `checkpoints.params.MeshParams`), what was loaded as `hf:PATH sha256:<digest of the
    tensors>`)."""
    return self.read_params(mesh_params.model, mesh_params.abstract)

  def read_params(self, model: Any, abstract: Any) -> tuple[Any, str]:
    """The parameters of `model` (whose shapes, dtypes and shardings `abstract` gives) from
    this folder's tensors.

    Raises:
      UsageError: the folder, a file or a tensor is missing or unreadable, or a tensor's shape
        is not the model's (one line naming it and the fix).
    """
    self.config()  # A folder without config.json is not a checkpoint, whatever it holds.
    names = names_of(model)
    digest = hashlib.sha256()
    placer = Placer(model, abstract, f"hf:{self.path}", names)
    with SafetensorsFiles(self.folder(), self.path, names.file_names, SINGLE_FILE, INDEX_FILE,
                          f"hf:{self.path}", _FOLDER_FIX, _MISSING_FIX) as tensors:
      for name in names.tensors():
        tensor, file = tensors.get(name.name)
        digest.update(f"{name.name}|{tensor.dtype}|{tensor.shape}|{content_crc(tensor)}|"
                      .encode())
        placer.put(name, tensor, file)
      params = placer.finish()
      tensor_checks.warn_unread(f"hf:{self.path}", tensors.unread())
    return params, f"hf:{self.path} sha256:{digest.hexdigest()}"


def family_reading(model_type: Any, where: str) -> tuple[type, type[HfNames]]:
  """(the registered family whose Hugging Face names read `model_type`, those names).

  Raises:
    UsageError: no family reads it (the message lists those that do).
  """
  readers = format_names.families_with(HfNames)
  for family, names in readers:
    if names.reads(model_type):
      return family, names
  raise format_names.refuse_unknown(where, "model_type", model_type,
                                    [names.model_type for _, names in readers])


def names_of(model: Any) -> HfNames:
  """`model`'s Hugging Face names.

  Raises:
    UsageError: its family has none (it has no Hugging Face format).
  """
  names = format_names.bound(model, HfNames)
  if names is None:
    raise UsageError(f"model: the {type(model).family_name} family has no Hugging Face "
                     "format; export it as slim weights")
  return names
