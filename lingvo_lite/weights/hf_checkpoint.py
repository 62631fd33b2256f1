"""A Hugging Face folder as a weight source: its config.json as the model's config, its
safetensors as the model's parameters.

`HfCheckpoint(path)` names a folder as transformers' `save_pretrained` writes it: config.json
and `model.safetensors`, or shards listed by `model.safetensors.index.json`. The family whose
Hugging Face names (models/format_names.py: `HfNames`) read its `model_type` says which fields
the config sets (`fields`) and which tensor holds which parameter (`tensors`), so this module
names no family. Tensors are read with `safetensors`' NumPy API (memory-mapped; no torch), one
at a time, converted to the parameter's layout and dtype, and placed into its sharding at once
(placing.py, after the checks every weight source gets, tensor_checks.py: float widths
convert, an integer tensor is refused, a tensor no part of the model reads is named in one
warning): the host holds about one
tensor (with scanned layers, one stacked parameter) at any time. Every file is checked to be a
regular file before it is opened (input_files.py): a FIFO would hang the read.

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

import numpy as np
from etils import epath

from lingvo_lite import input_files, paths
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family as families, format_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.format_names import HfNames
from lingvo_lite.weights import mxfp4, tensor_checks
from lingvo_lite.weights.placing import Placer, content_crc

FIELD = "train.init_from"
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The stored types (safetensors' names) its NumPy reader gives arrays of: floats, which
# convert to the parameters' dtype, and integers and booleans, which placing refuses by name.
_NUMPY_TYPES = frozenset({"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32",
                          "U16", "U8", "BOOL"})
_FOLDER_FIX = "give a folder that transformers' save_pretrained wrote"


@dataclasses.dataclass(frozen=True)
class HfCheckpoint:
  """The parameters (and model config) of a Hugging Face folder.

  Attributes:
    path: The folder: config.json and its safetensors (relative to the working directory).
  """

  path: str

  def __post_init__(self):
    if not isinstance(self.path, str) or not self.path.strip():
      raise UsageError(f"path={self.path!r}: must name a Hugging Face folder (config.json and "
                       "model.safetensors)")

  def describe(self) -> str:
    return f"hf:{self.path}"

  def origin(self) -> str:
    """The file the model's fields come from, for config.txt."""
    return os.path.join(self.path, CONFIG_FILE)

  def folder(self) -> epath.Path:
    folder = paths.resolve(self.path, f"{FIELD}.path")
    if not folder.is_dir():
      raise UsageError(f"hf:{self.path}: no such folder; give a folder that transformers' "
                       "save_pretrained wrote (config.json, model.safetensors)")
    return folder

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
      values = json.loads(input_files.read_bytes(file, where, _FOLDER_FIX))
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

  def load(self, jitted: Any) -> tuple[Any, str]:
    """(this folder's parameters in `jitted`'s model layout and shardings, what was loaded as
    `hf:PATH sha256:<digest of the tensors>`)."""
    return self.load_params(jitted.mesh_params())

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    """`load`'s answer for a program without a train state, into `mesh_params` (a
    `checkpoints.params.MeshParams`)."""
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
    with _Tensors(self.folder(), self.path, names.file_names) as tensors:
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


class _Tensors:
  """A folder's safetensors files, open, by tensor name (one file, or the index's shards)."""

  def __init__(self, folder: epath.Path, shown: str, file_names: Any):
    self._folder, self._shown, self._file_names = folder, shown, file_names
    self._files: dict[str, Any] = {}
    self._keys: dict[str, frozenset[str]] = {}
    self._read: set[str] = set()
    index = folder / INDEX_FILE
    if index.exists():
      try:
        weight_map = json.loads(input_files.read_bytes(
            index, os.path.join(shown, INDEX_FILE), _FOLDER_FIX))["weight_map"]
      except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError, OSError):
        weight_map = None
      if not isinstance(weight_map, dict):
        raise UsageError(f"{os.path.join(shown, INDEX_FILE)}: not a safetensors index (JSON "
                         "with a weight_map of tensor -> file)")
      self._where = {name: str(file) for name, file in weight_map.items()}
    elif (folder / SINGLE_FILE).exists():
      self._where = None
    else:
      raise UsageError(f"hf:{shown}: neither {SINGLE_FILE} nor {INDEX_FILE}; a Hugging Face "
                       "folder holds its weights as safetensors (save_pretrained writes them)")

  def __enter__(self) -> _Tensors:
    return self

  def __exit__(self, *exc_info) -> None:
    for handle in self._files.values():
      handle.__exit__(None, None, None)
    self._files.clear()

  def _open(self, file: str) -> Any:
    from safetensors import SafetensorError, safe_open  # pylint: disable=g-import-not-at-top
    if file not in self._files:
      shown = os.path.join(self._shown, file)
      if not (self._folder / file).exists():
        raise UsageError(f"{shown}: no such file (named by {INDEX_FILE}); the folder is "
                         "incomplete: copy it again")
      input_files.check(self._folder / file, shown, _FOLDER_FIX)
      try:
        handle = safe_open(str(self._folder / file), framework="np")
        handle.__enter__()
      except (SafetensorError, OSError) as e:
        raise UsageError(f"{shown}: not a readable safetensors file ({e}); it may be "
                         "truncated: copy it again") from None
      self._files[file] = handle
    return self._files[file]

  def _names(self, file: str, handle: Any) -> frozenset[str]:
    if file not in self._keys:
      self._keys[file] = frozenset(handle.keys())
    return self._keys[file]

  def unread(self) -> set[str]:
    """The tensors of the folder that no `get` read (the index's, or the single file's)."""
    if self._where is not None:
      names = set(self._where)
    else:
      names = set(self._names(SINGLE_FILE, self._open(SINGLE_FILE)))
    return names - self._read

  def _file_of(self, name: str) -> str | None:
    if self._where is None:
      return SINGLE_FILE
    return self._where.get(name)

  def _mxfp4(self, name: str) -> tuple[np.ndarray, str] | None:
    """The tensor `name` where the folder stores it as MXFP4 blocks and scales (gpt-oss's
    released experts: weights/mxfp4.py), dequantized to float32; None where it does not."""
    from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
    parts = []
    for suffix in (mxfp4.BLOCKS, mxfp4.SCALES):
      file = self._file_of(name + suffix)
      if file is None or name + suffix not in self._names(file, self._open(file)):
        return None
      parts.append((name + suffix, file))
    read = []
    for part, file in parts:
      shown = os.path.join(self._shown, file)
      try:
        read.append(self._open(file).get_tensor(part))
      except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{shown}: tensor {part} cannot be read ({e}); the file may be "
                         "truncated: copy it again") from None
    try:
      values = mxfp4.dequantize(*read)
    except ValueError as e:
      raise UsageError(f"{os.path.join(self._shown, parts[0][1])}: tensors {parts[0][0]} and "
                       f"{parts[1][0]} are not MXFP4 blocks and scales ({e}); give the "
                       "folder transformers wrote") from None
    self._read.update(part for part, _ in parts)
    return values, os.path.join(self._shown, parts[0][1])

  def get(self, name: str) -> tuple[np.ndarray, str]:
    """The tensor `name` (or another name the family's `file_names` gives it: without an
    optional prefix, under a wrapper's) as a NumPy array, and its file as messages name it.

    A tensor stored as MXFP4 blocks and scales (`NAME_blocks`, `NAME_scales`: gpt-oss's
    released experts) is read dequantized to float32.

    Raises:
      UsageError: no such tensor, a type NumPy cannot hold (float8: a quantized checkpoint,
        whose scales no family reads), or its bytes cannot be read.
    """
    from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
    for candidate in self._file_names(name):
      file = self._file_of(candidate)
      if file is None:
        continue
      handle = self._open(file)
      if candidate not in self._names(file, handle):
        continue
      shown = os.path.join(self._shown, file)
      try:
        stored = handle.get_slice(candidate).get_dtype()
        if stored not in _NUMPY_TYPES:  # safetensors' NumPy reader raises AttributeError.
          raise UsageError(f"{shown}: tensor {candidate} is {stored}, which lingvo_lite does "
                           "not read (float widths F64, F32, F16 and BF16 convert): give the "
                           "model's weights in one of them")
        self._read.add(candidate)
        return handle.get_tensor(candidate), shown
      except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{shown}: tensor {candidate} cannot be read ({e}); the file may be "
                         "truncated: copy it again") from None
    packed = self._mxfp4(name)
    if packed is not None:
      return packed
    raise tensor_checks.missing(f"hf:{self._shown}", name, "the folder lacks it (copy it "
                                "again), or the model's sizes are not the folder's: set them "
                                "as its config.json does (drop the --fdl.model overrides that "
                                "change them)")
