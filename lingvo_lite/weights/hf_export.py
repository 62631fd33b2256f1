"""A model's parameters out as a Hugging Face folder that transformers' `from_pretrained` loads.

The folder holds config.json (the family's `HfNames.config()`, models/format_names.py), the
tensors the family names (`tensors()`, the same `TensorName`s import reads, converted the other
way) as safetensors,
split into shards of at most `max_shard_bytes` with a `model.safetensors.index.json` where
they do not fit in one file, and lingvo_lite's manifest.json (which job and step, the dtype,
each file's size).

A model the format cannot express is refused in one line before anything is written: the
family's config is read back through its own `fields`, and every field it `expressed()` that
reads back other than this model's (a tied output scaled by 1/sqrt(dim), a norm or activation
the architecture does not have) is named. Parameters the format has no tensor for must be zero
after the family folds them (`export_params`: GPT-J's embedding bias goes into the rows).

`HfExport` is the format's writer for `--mode=export --export_format=hf` (weights/formats.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from etils import epath

from lingvo_lite import file_writes
from lingvo_lite.data import pretrained_tokenizer, vocabulary_tokenizer
from lingvo_lite.data.source import text_vocabulary
from lingvo_lite.errors import UsageError
from lingvo_lite.models import layer_layout
from lingvo_lite.models.checkpoint_names import TensorName
from lingvo_lite.weights.exports import size_text
from lingvo_lite.weights.hf_checkpoint import CONFIG_FILE, INDEX_FILE, SINGLE_FILE, names_of

KIND = "hf_export"
GENERATION_CONFIG_FILE = "generation_config.json"
# transformers' own default shard size (`save_pretrained(max_shard_size="5GB")`).
MAX_SHARD_BYTES = 5 * 10**9
DTYPES = ("float32", "bfloat16")
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def check_expressible(model: Any) -> dict[str, Any]:
  """The model's Hugging Face config.json, when that config describes this very model.

  Raises:
    UsageError: the family exports no Hugging Face folder, or a field the format cannot
      express (one line naming `model.<field>`, its value and what the format would make).
  """
  names = names_of(model)
  unexpressed = names.unexpressed()
  if unexpressed:
    name, theirs = next(iter(unexpressed.items()))
    raise UsageError(f"model.{name}={getattr(model, name)!r}: a Hugging Face "
                     f"{names.model_type} model cannot express it (its config makes "
                     f"{theirs!r}); export another format (slim), or train with the "
                     "family's setting")
  return names.config()


@dataclasses.dataclass(frozen=True)
class ShardPlan:
  """Which tensors go to which file.

  Attributes:
    files: File name -> the tensors it holds, in order.
  """

  files: dict[str, list[TensorName]]
  tokenizer: Any = None  # The pretrained tokenizer's files (data/pretrained_tokenizer.py).

  @property
  def names(self) -> tuple[str, ...]:
    """Every file the folder gets (the index too, where there is one; the tokenizer's where
    the model has one)."""
    files = tuple(self.files)
    tokenizer = pretrained_tokenizer.HF_FILES if self.tokenizer is not None else ()
    return (files + ((INDEX_FILE,) if len(files) > 1 else ())
            + (CONFIG_FILE, GENERATION_CONFIG_FILE) + tokenizer)


def plan_shards(tensors: Sequence[TensorName], shapes: Mapping[str, tuple[int, ...]],
                dtype: str, max_shard_bytes: int = MAX_SHARD_BYTES,
                tokenizer: Any = None) -> ShardPlan:
  """Tensors in order into files of at most `max_shard_bytes` (a larger tensor alone in its
  own), named as transformers names them; the tokenizer's files where `tokenizer` is a
  pretrained tokenizer's."""
  itemsize = np.dtype(_numpy_dtype(dtype)).itemsize
  groups: list[list[TensorName]] = [[]]
  size = 0
  for tensor in tensors:
    nbytes = int(np.prod(tensor.format_shape([shapes[p] for p in tensor.paths]))) * itemsize
    if groups[-1] and size + nbytes > max_shard_bytes:
      groups.append([])
      size = 0
    groups[-1].append(tensor)
    size += nbytes
  if len(groups) == 1:
    return ShardPlan({SINGLE_FILE: groups[0]}, tokenizer)
  count = len(groups)
  return ShardPlan({f"model-{i + 1:05d}-of-{count:05d}.safetensors": group
                    for i, group in enumerate(groups)}, tokenizer)


def _numpy_dtype(dtype: str) -> Any:
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def write(folder: epath.Path, model: Any, params: Mapping[str, Any], dtype: str,
          plan: ShardPlan, config: dict[str, Any]) -> dict[str, Any]:
  """Writes the folder's files (not the manifest): config.json, generation_config.json, the
  shards and their index, and the tokenizer's files where the plan has a tokenizer (the model's
  vocabulary may be padded past the tokenizer's: config.json's vocab_size is the model's, as
  transformers expects; the manifest records both).

  Args:
    folder: Where (an empty folder).
    model: The family instance.
    params: Host parameters in the unrolled layer layout (`layer_N`), after the family's
      `export_params`, as nested dicts of NumPy arrays.
    dtype: float32 or bfloat16: what every tensor is written as.
    plan: `plan_shards`' files.
    config: `check_expressible`'s config.json.

  Returns:
    {"files": name -> bytes} for the manifest, and "tensors": how many.

  Raises:
    UsageError: a parameter the format has no tensor for is not zero.
  """
  named = NamedTensors(model, params)
  target = _numpy_dtype(dtype)
  weight_map, files = {}, {}
  for file, tensors in plan.files.items():
    shard = {t.name: named[t.name].astype(target) for t in tensors}
    with file_writes.writing(folder / file):
      _save_safetensors(shard, folder / file)
      os.chmod(os.fspath(folder / file), 0o666 & ~_umask())  # safetensors writes it 0600.
    weight_map.update({name: file for name in shard})
    del shard
  if len(plan.files) > 1:
    total = sum(os.path.getsize(os.fspath(folder / f)) for f in plan.files)
    with file_writes.writing(folder / INDEX_FILE):
      (folder / INDEX_FILE).write_text(json.dumps(
          {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
  special = {}
  vocabulary: dict[str, Any] = {"model": int(model.vocab_size)}
  if plan.tokenizer is not None:
    special = {name: value for name, value in (("bos_token_id", plan.tokenizer.bos_id),
                                               ("eos_token_id", plan.tokenizer.eos_id))
               if value is not None}
    vocabulary["tokenizer"] = plan.tokenizer.vocab_size
    pretrained_tokenizer.write_hf_files(plan.tokenizer, os.fspath(folder),
                                        int(model.max_length))
  with file_writes.writing(folder / CONFIG_FILE):
    (folder / CONFIG_FILE).write_text(json.dumps(dict(config, torch_dtype=dtype, **special),
                                                 indent=2) + "\n")
  generation = dict(plan.tokenizer.generation if plan.tokenizer is not None else (), **special)
  with file_writes.writing(folder / GENERATION_CONFIG_FILE):
    (folder / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2) + "\n")
  for name in plan.names:
    files[name] = os.path.getsize(os.fspath(folder / name))
  return {"files": files, "tensors": len(weight_map), "vocabulary": vocabulary}


def _save_safetensors(tensors: dict[str, np.ndarray], path: epath.Path) -> None:
  """safetensors' `save_file`, its failure to write (a full disk) an OSError with its errno:
  the Rust writer reports one as a SafetensorError whose text ends `(os error 28)`."""
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  try:
    save_file(tensors, str(path), metadata={"format": "pt"})
  except SafetensorError as e:
    number = _OS_ERROR.search(str(e))
    if number is None:
      raise
    code = int(number.group(1))
    raise OSError(code, os.strerror(code), str(path)) from e


def check_absent(model: Any, params: Mapping[str, Any]) -> None:
  """Raises UsageError when a parameter the format has no tensor for is not zero."""
  names = names_of(model)
  for path in names.absent():
    if np.any(_at(params, path)):
      raise UsageError(f"model: parameter {path} is not zero and a Hugging Face "
                       f"{names.model_type} model has no tensor for it; export as slim "
                       "weights")


class NamedTensors(Mapping[str, np.ndarray]):
  """Every Hugging Face tensor of `params` (the layout `write` takes), by its name, each made
  from the parameters when it is read: a writer that takes them one at a time holds one
  tensor beside the parameters, not a second copy of the model."""

  def __init__(self, model: Any, params: Mapping[str, Any]):
    check_absent(model, params)
    self._tensors = {t.name: t for t in names_of(model).tensors()}
    self._params = params

  def __getitem__(self, name: str) -> np.ndarray:
    tensor = self._tensors[name]
    return tensor.from_ours([np.asarray(_at(self._params, p)) for p in tensor.paths])

  def __iter__(self):
    return iter(self._tensors)

  def __len__(self) -> int:
    return len(self._tensors)

  def shape(self, name: str) -> tuple[int, ...]:
    """The tensor's shape, without making it."""
    tensor = self._tensors[name]
    return tuple(tensor.format_shape([np.shape(_at(self._params, p)) for p in tensor.paths]))


def _at(tree: Mapping[str, Any], path: str) -> Any:
  node: Any = tree
  for key in path.split("/"):
    node = node[key]
  return node


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def tokenizer_files(setup: Any) -> tuple[Any, str]:
  """The tokenizer files an export carries (the task vocabulary's: a pretrained tokenizer's
  own, or bytes and SentencePiece converted, data/vocabulary_tokenizer.py), or None and why
  there are none."""
  try:
    return vocabulary_tokenizer.tokenizer_files(text_vocabulary(setup.train_data)), ""
  except vocabulary_tokenizer.NotConvertible as e:
    return None, str(e)


class HfExport:
  """`--export_format=hf`: the folder (formats.Export). Checked when made: the model's config
  must describe it, and the shards are planned from the parameters' shapes.

  Host memory: the restored parameters are read as NumPy arrays (on a CPU, views of the device
  buffers; on an accelerator, one host copy), and each tensor is made from them as it is
  written: the host holds one shard (`--export_shard_bytes`) beside them.
  """

  kind = KIND
  dtypes = DTYPES
  dtype_note = ""

  def __init__(self, request: Any):
    self._request = request
    model = request.setup.model
    self._config = check_expressible(model)
    self._check_format(model)
    self._model = model.clone(parent=None, scan_layers=False)  # The format's layer layout.
    self._names = names_of(self._model)
    shapes = {"/".join(str(k.key) for k in path): tuple(leaf.shape) for path, leaf in
              jax.tree_util.tree_flatten_with_path(request.params.shapes(self._model).abstract)[0]}
    self.tokenizer, self._no_tokenizer = tokenizer_files(request.setup)
    self._plan = plan_shards(self._names.tensors(), shapes, request.dtype, request.shard_bytes,
                             self.tokenizer)
    self.names = self._plan.names
    self._host: Any = None
    self._read_bytes = 0

  def _check_format(self, model: Any) -> None:
    """What a format written from the Hugging Face tensors also refuses (before any shape is
    traced); this one nothing more."""
    del model

  def take(self, params: Any) -> None:
    host = jax.tree.map(np.asarray, jax.device_get(params))
    if self._request.setup.model.scan_layers:
      host = layer_layout.unstack_layers(host)
    self._host = self._names.export_params(host)
    self._read_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(self._host))

  def write(self, folder: epath.Path) -> dict[str, Any]:
    return write(folder, self._model, self._host, self._request.dtype, self._plan, self._config)

  def _files_text(self, written: dict[str, Any]) -> str:
    del written
    return f"{len(self._plan.files)} safetensors file(s)"

  def summary(self, written: dict[str, Any]) -> str:
    model = self._request.setup.model
    return (f"{written['tensors']} tensors in {self._files_text(written)}, "
            f"{size_text(sum(written['files'].values()))} (the parameters read: "
            f"{size_text(self._read_bytes)} {model.param_dtype})")

  def details(self, written: dict[str, Any]) -> list[str]:
    lines = [f"  {os.path.join(self._request.export_dir, name)}  "
             f"{size_text(written['files'][name])}" for name in self.names]
    if self._no_tokenizer:
      lines.append(f"  no tokenizer files: {self._no_tokenizer}")
    return lines
