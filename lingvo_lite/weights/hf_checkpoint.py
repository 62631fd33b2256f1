"""A Hugging Face folder as a weight source: its config.json as the model's config, its
safetensors as the model's parameters.

`HfCheckpoint(path)` names a folder as transformers' `save_pretrained` writes it: config.json
and `model.safetensors`, or shards listed by `model.safetensors.index.json`. The family whose
Hugging Face names (models/format_names.py: `HfNames`) read its `model_type` says which fields
the config sets (`fields`) and which tensor holds which parameter (`tensors`), so this module
names no family. Tensors are read with `safetensors`' NumPy API (memory-mapped; no torch), one
at a time, converted to the parameter's layout and dtype, and placed into its sharding at once:
the host holds about one tensor (with scanned layers, one stacked parameter) at any time.

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
import zlib
from typing import Any, Callable, Iterator

import jax
import numpy as np
from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family as families, format_names
from lingvo_lite.models.checkpoint_names import HfConfig, TensorName
from lingvo_lite.models.format_names import HfNames

FIELD = "train.init_from"
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


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
      values = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
      raise UsageError(f"{where}: not JSON ({e}); give the config.json transformers "
                       "wrote") from None
    if not isinstance(values, dict) or not values.get("model_type"):
      raise UsageError(f"{where}: no model_type; a Hugging Face config.json names its "
                       "architecture (llama, gpt2, ...)")
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
    placer = Placer(model, abstract, f"hf:{self.path}")
    with _Tensors(self.folder(), self.path, names.optional_prefix) as tensors:
      for name in names.tensors():
        tensor = tensors.get(name.name)
        digest.update(f"{name.name}|{tensor.dtype}|{tensor.shape}|{content_crc(tensor)}|"
                      .encode())
        placer.put(name, tensor)
    return placer.finish(names.absent()), f"hf:{self.path} sha256:{digest.hexdigest()}"


def family_reading(model_type: Any, where: str) -> tuple[type, type[HfNames]]:
  """(the registered family whose Hugging Face names read `model_type`, those names).

  Raises:
    UsageError: no family reads it (the message lists those that do).
  """
  readers = format_names.families_with(HfNames)
  for family, names in readers:
    if names.model_type == model_type:
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

  def __init__(self, folder: epath.Path, shown: str, optional_prefix: str):
    self._folder, self._shown, self._prefix = folder, shown, optional_prefix
    self._files: dict[str, Any] = {}
    self._keys: dict[str, frozenset[str]] = {}
    index = folder / INDEX_FILE
    if index.exists():
      try:
        weight_map = json.loads(index.read_text())["weight_map"]
      except (ValueError, KeyError, TypeError, UnicodeDecodeError):
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

  def _file_of(self, name: str) -> str | None:
    if self._where is None:
      return SINGLE_FILE
    return self._where.get(name)

  def get(self, name: str) -> np.ndarray:
    """The tensor `name` (or, where the family allows it, `name` without its optional
    prefix) as a NumPy array.

    Raises:
      UsageError: no such tensor, or its bytes cannot be read.
    """
    from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
    candidates = [name]
    if self._prefix and name.startswith(self._prefix):
      candidates.append(name[len(self._prefix):])
    for candidate in candidates:
      file = self._file_of(candidate)
      if file is None:
        continue
      handle = self._open(file)
      if candidate not in self._names(file, handle):
        continue
      try:
        return handle.get_tensor(candidate)
      except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{os.path.join(self._shown, file)}: tensor {candidate} cannot be "
                         f"read ({e}); the file may be truncated: copy it again") from None
    raise UsageError(f"hf:{self._shown}: no tensor {name}, which this model needs: its sizes "
                     "are not the source's; set them as its config.json does (drop the "
                     "--fdl.model overrides that change them)")


class Placer:
  """Puts converted tensors into the model's parameter tree, each leaf on its devices as soon
  as every tensor it takes is in (scanned layers: a leaf takes one tensor per layer)."""

  def __init__(self, model: Any, abstract: Any, where: str):
    self._where = where
    self._scanned = bool(getattr(model, "scan_layers", False))
    self._abstract = abstract
    self._leaves: dict[tuple[str, ...], Any] = {}
    self._pending: dict[tuple[str, ...], tuple[np.ndarray, set[int]]] = {}
    self._layers = int(getattr(model, "num_layers", 0))

  def _locate(self, path: str) -> tuple[tuple[str, ...], int | None, Any]:
    """(the leaf's key path, the layer it is one row of (scanned layers) or None, its
    abstract value)."""
    keys = tuple(path.split("/"))
    layer = None
    if self._scanned and keys[0].startswith("layer_"):
      layer, keys = int(keys[0][len("layer_"):]), ("layers",) + keys[1:]
    node = self._abstract
    for key in keys:
      if not isinstance(node, dict) or key not in node:
        raise UsageError(f"{self._where}: the model has no parameter {path}; its family's "
                         "names do not match its config (a bug: report it)")
      node = node[key]
    return keys, layer, node

  def put(self, name: TensorName, tensor: np.ndarray) -> None:
    located = [self._locate(path) for path in name.paths]
    shapes = [leaf.shape[1:] if layer is not None else leaf.shape
              for _, layer, leaf in located]
    parts = name.to_ours(tensor, [tuple(s) for s in shapes], self._where)
    for (keys, layer, leaf), part in zip(located, parts):
      part = part.astype(leaf.dtype, copy=False)
      if layer is None:
        self._place(keys, leaf, part)
        continue
      stacked, seen = self._pending.get(keys) or (np.empty(leaf.shape, leaf.dtype), set())
      stacked[layer] = part
      seen.add(layer)
      self._pending[keys] = (stacked, seen)
      if len(seen) == self._layers:
        self._place(keys, leaf, self._pending.pop(keys)[0])

  def _place(self, keys: tuple[str, ...], leaf: Any, value: np.ndarray) -> None:
    self._leaves[keys] = jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                                      lambda index: value[index])

  def finish(self, absent: tuple[str, ...]) -> Any:
    """The whole tree: what was put, zeros for the `absent` parameters.

    Raises:
      UsageError: a parameter no tensor filled (a family's names missing one: a bug).
    """
    for path in absent:
      keys, _, leaf = self._locate(path)
      self._place(keys, leaf, np.zeros(leaf.shape, leaf.dtype))
    missing = [path for path, _ in _walk(self._abstract) if path not in self._leaves]
    if missing or self._pending:
      names = ["/".join(p) for p in missing] + ["/".join(k) for k in self._pending]
      raise UsageError(f"{self._where}: no tensor for the parameters {', '.join(names[:5])}; "
                       "the family's names miss them (a bug: report it)")
    return _rebuild(self._abstract, lambda path: self._leaves[path])


def content_crc(array: np.ndarray) -> int:
  """CRC-32 of an array's bytes, in memory order (a fingerprint's part: fast, not secret)."""
  return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).reshape(-1))


def _walk(tree: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
  if isinstance(tree, dict):
    for key, value in tree.items():
      yield from _walk(value, prefix + (key,))
  else:
    yield prefix, tree


def _rebuild(tree: Any, value_at: Callable[[tuple[str, ...]], Any],
             prefix: tuple[str, ...] = ()) -> Any:
  if isinstance(tree, dict):
    return {key: _rebuild(value, value_at, prefix + (key,)) for key, value in tree.items()}
  return value_at(prefix)
