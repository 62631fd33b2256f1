"""A lingvo_lite model written as a GGUF file (llama.cpp's format) that transformers and llama.cpp
read: `--mode=export --export_format=gguf` writes EXPORT_DIR/model.gguf.

The inverse of gguf_checkpoint.py's reading: the family's GGUF names (models/format_names.py)
give the `<architecture>.*` metadata (`metadata()`) that their `hf_config` reads back, and each
GGUF tensor (`tensors()`) is its Hugging Face tensor (hf_export.py's), rearranged as
llama.cpp's converter does (`GgufTensor.from_hf`: Llama's query and key rows in the
rotary-pair order GGML's rope expects, GPT-2's `Conv1D` matrices transposed). Matrices are
written as F32 or F16; 1-D tensors (norms, biases) stay F32, as llama.cpp's converter keeps
them. A pretrained byte-level BPE tokenizer goes into `tokenizer.ggml.*`
(data/pretrained_tokenizer.py: `gguf_tokenizer`).

Refused in one line, never written wrong: a model its Hugging Face format cannot express, a
family without GGUF names, and what the family's names say its architecture cannot hold
(`check_writable`: a sliding window shorter than the context, rope scaling). `GgufExport` is
the format's writer for `--mode=export --export_format=gguf` (weights/formats.py).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from lingvo_lite import file_writes
from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.weights import hf_export
from lingvo_lite.weights.gguf_checkpoint import names_of

KIND = "gguf_export"
FILE = "model.gguf"
DTYPES = ("float32", "float16")


def check_expressible(model: Any) -> str:
  """The GGUF architecture `model` is written as.

  Raises:
    UsageError: naming what the format cannot express.
  """
  names = names_of(model)
  names.check_writable()
  return names.architecture


def write(path: str, model: Any, tensors: Any, dtype: str,
          tokenizer: Any = None) -> dict[str, Any]:
  """Writes the GGUF file at `path`, one tensor at a time: the header and every tensor's
  shape and type first (from the shapes alone), then each tensor made, converted, written and
  let go, so the host holds one tensor beside the parameters.

  Args:
    path: The file to write (in an empty folder).
    model: The family instance (unrolled layers).
    tensors: `hf_export.NamedTensors` of the parameters: Hugging Face tensor name -> array
      (made when read), and their `shape`s.
    dtype: float32 or float16, for every matrix.
    tokenizer: The model's pretrained tokenizer files, or None.

  Returns:
    What the manifest records: the tensor count, the architecture, whether a tokenizer went in.
  """
  with file_writes.writing(path):  # A failed write (a full disk) names the file.
    return _write(path, model, tensors, dtype, tokenizer)


def _write(path: str, model: Any, tensors: Any, dtype: str, tokenizer: Any) -> dict[str, Any]:
  import gguf  # pylint: disable=g-import-not-at-top
  arch = check_expressible(model)
  names = names_of(model)
  writer = gguf.GGUFWriter(path, arch)
  # The architecture's name, not the family's: transformers takes a file's name for its model
  # type where it knows that name, with that type's defaults, which a family converted to
  # another architecture (its own settings not in the file) would not have.
  writer.add_name(f"lingvo_lite {arch}")
  writer.add_file_type(int(gguf.LlamaFileType.ALL_F32 if dtype == "float32"
                           else gguf.LlamaFileType.MOSTLY_F16))
  for key, value in names.metadata().items():
    _add_value(writer, f"{arch}.{key}", value)
  has_tokenizer = _add_tokenizer(writer, tokenizer, model.vocab_size)
  matrix = np.dtype(np.float32 if dtype == "float32" else np.float16)
  tensor_names = names.tensors()
  types = {}
  for gguf_name, tensor in tensor_names.items():
    shape = tensor.shape_from_hf(tensors.shape(tensor.hf_names()[0]))
    types[gguf_name] = matrix if len(shape) > 1 else np.dtype(np.float32)  # Norms stay F32.
    writer.add_tensor_info(gguf_name, shape, types[gguf_name],
                           math.prod(shape) * types[gguf_name].itemsize)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_ti_data_to_file()
  for gguf_name, tensor in tensor_names.items():
    hf = [np.asarray(tensors[name], np.float32) for name in tensor.hf_names()]
    values = tensor.from_hf(np.stack(hf) if tensor.experts else hf[0])
    del hf
    writer.write_tensor_data(np.ascontiguousarray(values.astype(types[gguf_name]))
                             .view(_WrittenByPython))
    del values
  writer.close()
  return {"tensors": len(tensor_names), "architecture": arch, "tokenizer": has_tokenizer,
          "files": {FILE: os.path.getsize(path)}}


class _WrittenByPython(np.ndarray):
  """An array the gguf writer writes through its Python file object. NumPy's own `tofile`
  writes through C stdio, and a failed write (a full disk) comes back as `OSError: N requested
  and M written`, without its errno; the file object's write raises ENOSPC itself."""

  def tofile(self, file: Any, *args: Any, **kwargs: Any) -> None:
    del args, kwargs  # The writer passes the file alone.
    file.write(memoryview(np.ascontiguousarray(self)).cast("B"))


def _add_value(writer: Any, key: str, value: Any) -> None:
  """One metadata value in the GGUF type llama.cpp reads it as (counts uint32, settings
  float32; a list as an array: a sliding window's pattern of booleans, layer by layer)."""
  if isinstance(value, (list, tuple)):
    writer.add_array(key, list(value))
  elif isinstance(value, bool):
    writer.add_bool(key, value)
  elif isinstance(value, int):
    writer.add_uint32(key, value)
  elif isinstance(value, float):
    writer.add_float32(key, value)
  else:
    writer.add_string(key, str(value))


def _add_tokenizer(writer: Any, tokenizer: Any, vocab_size: int) -> bool:
  """tokenizer.ggml.* for a byte-level BPE tokenizer (its token list as long as the model's
  `vocab_size`); False where there is none to write."""
  if tokenizer is None:
    return False
  described = pretrained_tokenizer.gguf_tokenizer(tokenizer, vocab_size)
  if described is None:
    return False
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre(described["pre"])
  writer.add_token_list(described["tokens"])
  writer.add_token_types(described["types"])
  writer.add_token_merges(described["merges"])
  writer.add_eos_token_id(tokenizer.eos_id)
  if tokenizer.bos_id is not None:
    writer.add_bos_token_id(tokenizer.bos_id)
  if tokenizer.unk_id is not None:
    writer.add_unk_token_id(tokenizer.unk_id)
  writer.add_add_bos_token(tokenizer.add_bos)
  if tokenizer.chat_template is not None:
    writer.add_chat_template(tokenizer.chat_template)
  for name, value in tokenizer.generation:
    key = pretrained_tokenizer.GENERATION_KEYS.get(name)
    if key is not None:  # llama.cpp reads top_k as an int, the others as floats.
      _add_value(writer, key, int(value) if name == "top_k" else float(value))
  return True


class GgufExport(hf_export.HfExport):
  """`--export_format=gguf`: model.gguf (formats.Export), made from the Hugging Face tensors
  one at a time (the host holds one tensor beside the parameters). Checked when made as the
  Hugging Face folder is, then as a GGUF file of its family's architecture."""

  kind = KIND
  dtypes = DTYPES

  def __init__(self, request: Any):
    super().__init__(request)
    self.names = (FILE,)

  def _check_format(self, model: Any) -> None:
    check_expressible(model)

  def write(self, folder: Any) -> dict[str, Any]:
    return write(os.fspath(folder / FILE), self._model,
                 hf_export.NamedTensors(self._model, self._host), self._request.dtype,
                 self.tokenizer)

  def _files_text(self, written: dict[str, Any]) -> str:
    return (f"{FILE} ({written['architecture']}"
            f"{', with its tokenizer' if written['tokenizer'] else ''})")

  def details(self, written: dict[str, Any]) -> list[str]:
    lines = super().details(written)
    if not self._no_tokenizer and not written["tokenizer"]:
      lines.append(f"  no tokenizer in {FILE}: its tokenizer.ggml.* keys are written for a "
                   "pretrained byte-level BPE tokenizer only (this model's tokenizer is "
                   f"{self.tokenizer.source})")
    return lines
