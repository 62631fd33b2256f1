"""A GGUF file (llama.cpp's format) as a weight source: its metadata as the model's config, its
tensors, dequantized, as the model's parameters.

A GGUF file is read as the Hugging Face folder it was converted from: the family whose GGUF
names (models/format_names.py: `GgufNames`) read its `general.architecture` turns the metadata
into that folder's config.json (`hf_config`, then its Hugging Face names' `fields`) and names
the Hugging Face tensor each GGUF tensor is (`tensors`); the rest is placing.py's, with the
checks every weight source gets (tensor_checks.py: float widths convert, integer tensors are
refused, tensors nothing reads are named in a warning). The `gguf`
package reads the file (memory-mapped, opened once per process: gguf_files.py) and dequantizes
each tensor with NumPy (F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants, ...) to float32, then to
the parameter's dtype. What llama.cpp's converter rearranged is put back
(`checkpoint_names.GgufTensor.to_hf`: Llama's query and key rows from GGML's rotary pairs to
the rotate-half order, GPT-2's `Conv1D` matrices transposed).

A file that contradicts itself is refused in one line before any tensor is read, where the
`gguf` package would read it without complaint (gguf_header.py: a tensor's bytes that are not
what its type and shape take, a metadata key that is not what the tensors and the other keys
make it, naming the key and the tensor).

The fingerprint: `sha256:` over every tensor's name, type, shape and the CRC-32 of its stored
(quantized) bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

import numpy as np

from lingvo_lite import gguf_files, input_files, paths
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family as families, format_names
from lingvo_lite.models.format_names import GgufNames
from lingvo_lite.weights import gguf_header, hf_checkpoint, tensor_checks
from lingvo_lite.weights.hf_checkpoint import FIELD
from lingvo_lite.weights.placing import Placer, content_crc
from lingvo_lite.weights.weight_source import PathSource


@dataclasses.dataclass(frozen=True)
class GgufCheckpoint(PathSource):
  """The parameters (and model config) of a GGUF file.

  Attributes:
    path: The .gguf file (relative to the working directory).
  """

  scheme = "gguf"
  holds = "a GGUF file"

  def describes_model(self) -> bool:
    return True

  def origin(self) -> str:
    """The file the model's fields come from (its metadata), for config.txt."""
    return self.path

  def _reader(self) -> Any:
    """The file opened by `gguf.GGUFReader`.

    Raises:
      UsageError: no such file, or not a readable GGUF file (truncated, another format).
    """
    file = paths.resolve(self.path, f"{FIELD}.path")
    input_files.check(file, f"gguf:{self.path}", "give a .gguf file (llama.cpp's format)")
    if not file.is_file():
      raise UsageError(f"gguf:{self.path}: no such file; give a .gguf file (llama.cpp's "
                       "format)")
    try:
      reader = gguf_files.open_reader(os.fspath(file))
    except Exception as e:  # pylint: disable=broad-except  # struct, numpy, ValueError, ...
      detail = str(e).splitlines()[0] if str(e) else "no detail"
      if "GGMLQuantizationType" in detail:  # A tensor's type id that names no type.
        raise UsageError(f"gguf:{self.path}: a tensor's type id is no GGUF type ({detail}); "
                         f"{gguf_header.CONVERT}") from None
      raise UsageError(f"gguf:{self.path}: not a readable GGUF file ({type(e).__name__}: "
                       f"{detail}); it may be truncated: copy it again") from None
    gguf_header.check_layout(reader, f"gguf:{self.path}")
    return reader

  def metadata(self, reader: Any = None) -> dict[str, Any]:
    """The file's key-value metadata (arrays of strings as lists; the token list too)."""
    reader = reader or self._reader()
    values = {}
    for name, field in reader.fields.items():
      try:
        values[name] = field.contents()
      except Exception:  # pylint: disable=broad-except  # A type gguf cannot decode.
        continue
    return values

  def model_fields(self) -> tuple[type[families.LanguageModel], dict[str, Any]]:
    """The family that reads this file and the fields its metadata sets.

    Raises:
      UsageError: the file cannot be read, or its metadata's sizes are not its tensors'
        (naming the key and the tensor).
    """
    reader = self._reader()
    metadata = self.metadata(reader)
    where = f"gguf:{self.path}"
    family, names = family_reading(metadata.get("general.architecture"), where, metadata)
    shapes = {tensor.name: tuple(int(d) for d in reversed(tensor.shape))
              for tensor in reader.tensors}
    return family, gguf_header.model_fields(family, names, metadata, shapes, where)

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    return self.read_params(mesh_params.model, mesh_params.abstract)

  def read_params(self, model: Any, abstract: Any) -> tuple[Any, str]:
    """The parameters of `model` (shapes, dtypes and shardings: `abstract`) from this file.

    Raises:
      UsageError: the file is unreadable, lacks a tensor the model needs, holds a
        quantization the `gguf` package cannot dequantize, or a shape that is not the model's.
    """
    reader = self._reader()
    where = f"gguf:{self.path}"
    hf_names = hf_checkpoint.names_of(model)
    # Hugging Face tensor -> the GGUF tensors it is made of: (name, how, which expert's row).
    wanted: dict[str, list[tuple[str, Any, int | None]]] = {}
    for gguf_name, tensor in names_of(model).tensors().items():
      for expert, hf in enumerate(tensor.hf_names()):
        wanted.setdefault(hf, []).append((gguf_name, tensor, expert if tensor.experts else None))
    placer = Placer(model, abstract, where, hf_names)
    tensors = _GgufTensors(reader, where, placer)
    for name in hf_names.tensors():
      hf = None
      for gguf_name, rearranged, expert in wanted[name.name]:
        values = rearranged.to_hf(tensors.get(gguf_name, name))
        values = values if expert is None else values[expert]
        if rearranged.columns is None:
          hf = values
          continue
        index, count = rearranged.columns  # Its columns of the Hugging Face tensor.
        if hf is None:
          hf = np.empty((*values.shape[:-1], values.shape[-1] * count), values.dtype)
        hf[..., index::count] = values
      placer.put(name, hf)
    params = placer.finish()
    tensor_checks.warn_unread(where, tensors.unread())
    return params, f"gguf:{self.path} sha256:{tensors.digest.hexdigest()}"


class _GgufTensors:
  """A GGUF file's tensors by name, dequantized to float32 (in torch's axis order) after the
  checks every source's tensors get, hashed into `digest` as they are read; the last one
  read is kept (a stacked experts' tensor is asked for once per expert, in a row)."""

  def __init__(self, reader: Any, where: str, placer: Placer):
    self._by_name = {tensor.name: tensor for tensor in reader.tensors}
    self._where, self._placer = where, placer
    self._last: dict[str, np.ndarray] = {}
    self._read: set[str] = set()
    self.digest = hashlib.sha256()

  def unread(self) -> set[str]:
    return set(self._by_name) - self._read

  def get(self, gguf_name: str, name: Any) -> np.ndarray:
    """The tensor `gguf_name`, which the model reads as (part of) the Hugging Face `name`.

    Raises:
      UsageError: the file lacks it, it is an integer where a float weight belongs, or the
        `gguf` package cannot dequantize or read it.
    """
    import gguf  # pylint: disable=g-import-not-at-top
    if gguf_name in self._last:
      return self._last[gguf_name]
    where, tensor = self._where, self._by_name.get(gguf_name)
    if tensor is None:
      raise tensor_checks.missing(where, gguf_name, "the file lacks it (copy it again), or "
                                  "the model's sizes are not the file's: set them as its "
                                  "metadata does (drop the --fdl.model overrides that change "
                                  "them)")
    kinds = gguf.GGMLQuantizationType
    integers = {kinds.I8: np.int8, kinds.I16: np.int16, kinds.I32: np.int32,
                kinds.I64: np.int64}
    # Quantized types dequantize to float32; GGUF's integer types stay integers.
    self._placer.check_dtype(name, integers.get(tensor.tensor_type, np.float32),
                             tensor.tensor_type.name, tensor=gguf_name)
    try:
      data = np.asarray(tensor.data)
      self.digest.update(f"{gguf_name}|{tensor.tensor_type.name}|{list(tensor.shape)}|"
                         f"{content_crc(data)}|".encode())
      values = gguf.quants.dequantize(data, tensor.tensor_type)
    except NotImplementedError:
      raise UsageError(f"{where}: tensor {gguf_name} is {tensor.tensor_type.name}, which the "
                       "gguf package cannot dequantize; convert the model with another "
                       "quantization (F16, Q8_0, Q4_0, Q4_1, ...)") from None
    except (ValueError, IndexError) as e:
      raise UsageError(f"{where}: tensor {gguf_name} cannot be read ({e}); the file may be "
                       "truncated: copy it again") from None
    self._last = {gguf_name: values.reshape(tuple(int(d) for d in reversed(tensor.shape)))}
    self._read.add(gguf_name)
    return self._last[gguf_name]


def family_reading(architecture: Any, where: str, metadata: Any = None
                   ) -> tuple[type, type[GgufNames]]:
  """(the family whose GGUF names read `architecture`, llama.cpp's `general.architecture`,
  and the file's `metadata`, those names): among the families of that architecture, those
  whose names read the file (`GgufNames.reads_file`: a `llama` file with experts is
  Mixtral's), the family of the architecture's name first (Mistral converts to `llama`,
  and its window is not in the file).

  Raises:
    UsageError: no family reads it (the message lists those that do).
  """
  readers = format_names.families_with(GgufNames)
  found = [(family, names) for family, names in readers if names.architecture == architecture
           and names.reads_file(metadata or {})]
  found.sort(key=lambda pair: pair[0].family_name != architecture)
  if not found:
    raise format_names.refuse_unknown(where, "general.architecture", architecture,
                                      [names.architecture for _, names in readers])
  return found[0]


def names_of(model: Any) -> GgufNames:
  """`model`'s GGUF names.

  Raises:
    UsageError: its family has none.
  """
  names = format_names.bound(model, GgufNames)
  if names is None:
    raise UsageError(f"model: a {type(model).family_name} model has no GGUF tensor names; "
                     "export --export_format=hf or slim")
  return names
