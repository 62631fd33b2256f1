"""A folder's safetensors files read by tensor name, with safetensors' NumPy API (memory-mapped,
no torch), one tensor at a time: a Hugging Face folder's weights (`model.safetensors`, or the
shards `model.safetensors.index.json` lists: hf_checkpoint.py) and a PEFT folder's adapters
(`adapter_model.safetensors`: peft.py).

Every file is checked to be a regular file before it is opened (input_files.py: a FIFO would hang
the read); a file safetensors cannot parse, a shard the index names that is missing, a type NumPy
cannot hold (float8) and a tensor whose bytes cannot be read are one line each, naming the file.
What the tensors must be (dtypes, shapes, names) is tensor_checks.py's, for every source.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
from etils import epath

from lingvo_lite import input_files
from lingvo_lite.errors import UsageError
from lingvo_lite.weights import mxfp4, tensor_checks

# The stored types (safetensors' names) its NumPy reader gives arrays of: floats, which
# convert to the parameters' dtype, and integers and booleans, which tensor_checks refuses by
# name where a float belongs.
_NUMPY_TYPES = frozenset({"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32",
                          "U16", "U8", "BOOL"})


class SafetensorsFiles:
  """A folder's safetensors files, open, by tensor name: one file, or the shards an index
  lists (as `save_pretrained` writes them).

  Args:
    folder: The folder.
    shown: The folder as messages name it.
    file_names: Tensor name -> the names a file may give it, tried in order.
    single_file: The one file's name, where there is no index.
    index_file: The index's name (it maps each tensor to its shard), or None.
    source: The source as messages name it ("hf:PATH").
    fix: What to give instead of a folder that is not one.
    missing_fix: The fix of a tensor the folder lacks.
  """

  def __init__(self, folder: epath.Path, shown: str, file_names: Callable[[str], list[str]],
               single_file: str, index_file: str | None, source: str, fix: str,
               missing_fix: str):
    self._folder, self._shown, self._file_names = folder, shown, file_names
    self._single, self._index, self._source = single_file, index_file, source
    self._fix, self._missing_fix = fix, missing_fix
    self._files: dict[str, Any] = {}
    self._keys: dict[str, frozenset[str]] = {}
    self._read: set[str] = set()
    index = folder / index_file if index_file else None
    if index is not None and index.exists():
      try:
        weight_map = input_files.json_value(input_files.read_bytes(
            index, os.path.join(shown, index_file), fix))["weight_map"]
      except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError, OSError):
        weight_map = None
      if not isinstance(weight_map, dict):
        raise UsageError(f"{os.path.join(shown, index_file)}: not a safetensors index (JSON "
                         "with a weight_map of tensor -> file)")
      self._where = {name: str(file) for name, file in weight_map.items()}
    elif (folder / single_file).exists():
      self._where = None
    elif index_file:
      raise UsageError(f"{source}: neither {single_file} nor {index_file}; a Hugging Face "
                       "folder holds its weights as safetensors (save_pretrained writes them)")
    else:
      raise UsageError(f"{os.path.join(shown, single_file)}: no such file; {fix}")

  def __enter__(self) -> SafetensorsFiles:
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
        raise UsageError(f"{shown}: no such file (named by {self._index}); the folder is "
                         "incomplete: copy it again")
      input_files.check(self._folder / file, shown, self._fix)
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

  def held(self) -> set[str]:
    """Every tensor the folder holds (the index's, or the single file's)."""
    if self._where is not None:
      return set(self._where)
    return set(self._names(self._single, self._open(self._single)))

  def unread(self) -> set[str]:
    """The tensors of the folder that no `get` read."""
    return self.held() - self._read

  def _file_of(self, name: str) -> str | None:
    if self._where is None:
      return self._single
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
                           "weights in one of them")
        self._read.add(candidate)
        return handle.get_tensor(candidate), shown
      except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{shown}: tensor {candidate} cannot be read ({e}); the file may be "
                         "truncated: copy it again") from None
    packed = self._mxfp4(name)
    if packed is not None:
      return packed
    raise tensor_checks.missing(self._source, name, self._missing_fix)
