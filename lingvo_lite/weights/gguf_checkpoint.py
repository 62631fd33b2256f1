"""A GGUF file (llama.cpp's format) as a weight source: its metadata as the model's config, its
tensors, dequantized, as the model's parameters.

A GGUF file is read as the Hugging Face folder it was converted from: the family whose GGUF
names (models/format_names.py: `GgufNames`) read its `general.architecture` turns the metadata
into that folder's config.json (`hf_config`, then its Hugging Face names' `fields`) and names
the Hugging Face tensor each GGUF tensor is (`tensors`); the rest is placing.py's (float widths
convert, integer tensors are refused, tensors nothing reads are named in a warning). The `gguf`
package reads the file (memory-mapped, opened once per process: gguf_files.py) and dequantizes
each tensor with NumPy (F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants, ...) to float32, then to
the parameter's dtype. What llama.cpp's converter rearranged is put back
(`checkpoint_names.GgufTensor.to_hf`: Llama's query and key rows from GGML's rotary pairs to
the rotate-half order, GPT-2's `Conv1D` matrices transposed).

A file that contradicts itself is refused in one line before any tensor is read, where the
`gguf` package would read it without complaint: a tensor whose bytes are not what its type and
shape take (a type id changed: `_check_layout`; an id that names no type fails the reader), a
metadata size that is not its tensors' (`<arch>.block_count` against the `blk.N.` blocks held,
and each size key the family's GGUF names list in `sizes()`: `vocab_size`, `embedding_length`,
`feed_forward_length`, the head counts, a learned context length), naming the key and the
tensor. Quantized types (Q4_1, Q8_0, the K-quants) are sized by their blocks, and so pass.

The fingerprint: `sha256:` over every tensor's name, type, shape and the CRC-32 of its stored
(quantized) bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Any

import numpy as np

from lingvo_lite import gguf_files, input_files, paths
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family as families, format_names
from lingvo_lite.models.checkpoint_names import GgufSize, HfConfig
from lingvo_lite.models.format_names import GgufNames, HfNames
from lingvo_lite.weights import hf_checkpoint
from lingvo_lite.weights.hf_checkpoint import FIELD
from lingvo_lite.weights.placing import Placer, content_crc, not_a_float_weight, warn_unread

# llama.cpp's names put each block's tensors under `blk.N.`.
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_CONVERT = "the file contradicts itself (edited or damaged): convert the model again"


@dataclasses.dataclass(frozen=True)
class GgufCheckpoint:
  """The parameters (and model config) of a GGUF file.

  Attributes:
    path: The .gguf file (relative to the working directory).
  """

  path: str

  def __post_init__(self):
    if not isinstance(self.path, str) or not self.path.strip():
      raise UsageError(f"path={self.path!r}: must name a GGUF file")

  def describe(self) -> str:
    return f"gguf:{self.path}"

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
                         f"{_CONVERT}") from None
      raise UsageError(f"gguf:{self.path}: not a readable GGUF file ({type(e).__name__}: "
                       f"{detail}); it may be truncated: copy it again") from None
    _check_layout(reader, f"gguf:{self.path}")
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
    config = names.hf_config(metadata, shapes)
    fields = format_names.names_of(family, HfNames).fields(
        HfConfig(config, f"{where} (its metadata)"))
    fields = {k: v for k, v in fields.items() if v is not None}
    _check_sizes(names(family(**fields)), metadata, shapes, where)
    return family, fields

  def load(self, jitted: Any) -> tuple[Any, str]:
    return self.load_params(jitted.mesh_params())

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    return self.read_params(mesh_params.model, mesh_params.abstract)

  def read_params(self, model: Any, abstract: Any) -> tuple[Any, str]:
    """The parameters of `model` (shapes, dtypes and shardings: `abstract`) from this file.

    Raises:
      UsageError: the file is unreadable, lacks a tensor the model needs, holds a
        quantization the `gguf` package cannot dequantize, or a shape that is not the model's.
    """
    import gguf  # pylint: disable=g-import-not-at-top
    reader = self._reader()
    where = f"gguf:{self.path}"
    by_name = {tensor.name: tensor for tensor in reader.tensors}
    hf_names = hf_checkpoint.names_of(model)
    # Hugging Face tensor -> the GGUF tensors it is made of: (name, how, which expert's row).
    wanted: dict[str, list[tuple[str, Any, int | None]]] = {}
    for gguf_name, tensor in names_of(model).tensors().items():
      for expert, hf in enumerate(tensor.hf_names()):
        wanted.setdefault(hf, []).append((gguf_name, tensor, expert if tensor.experts else None))
    digest = hashlib.sha256()
    placer = Placer(model, abstract, where)
    read: dict[str, np.ndarray] = {}  # The last GGUF tensor read (its experts come in a row).
    kinds = gguf.GGMLQuantizationType
    integers = (kinds.I8, kinds.I16, kinds.I32, kinds.I64)

    def dequantized(gguf_name: str, name: Any) -> np.ndarray:
      if gguf_name in read:
        return read[gguf_name]
      tensor = by_name.get(gguf_name)
      if tensor is None:
        raise UsageError(f"{where}: no tensor {gguf_name}, which this model needs: its sizes "
                         "are not the file's; set them as its metadata does (drop the "
                         "--fdl.model overrides that change them)")
      if tensor.tensor_type in integers:
        raise not_a_float_weight(where, gguf_name, tensor.tensor_type.name, name)
      try:
        data = np.asarray(tensor.data)
        digest.update(f"{gguf_name}|{tensor.tensor_type.name}|{list(tensor.shape)}|"
                      f"{content_crc(data)}|".encode())
        values = gguf.quants.dequantize(data, tensor.tensor_type)
      except NotImplementedError:
        raise UsageError(f"{where}: tensor {gguf_name} is {tensor.tensor_type.name}, which the "
                         "gguf package cannot dequantize; convert the model with another "
                         "quantization (F16, Q8_0, Q4_0, Q4_1, ...)") from None
      except (ValueError, IndexError) as e:
        raise UsageError(f"{where}: tensor {gguf_name} cannot be read ({e}); the file may be "
                         "truncated: copy it again") from None
      read.clear()
      read[gguf_name] = values.reshape(tuple(int(d) for d in reversed(tensor.shape)))
      read_names.add(gguf_name)
      return read[gguf_name]

    read_names: set[str] = set()
    for name in hf_names.tensors():
      hf = None
      for gguf_name, rearranged, expert in wanted[name.name]:
        values = rearranged.to_hf(dequantized(gguf_name, name))
        values = values if expert is None else values[expert]
        if rearranged.columns is None:
          hf = values
          continue
        index, count = rearranged.columns  # Its columns of the Hugging Face tensor.
        if hf is None:
          hf = np.empty((*values.shape[:-1], values.shape[-1] * count), values.dtype)
        hf[..., index::count] = values
      placer.put(name, hf)
    params = placer.finish(hf_names.absent())
    warn_unread(where, set(by_name) - read_names)
    return params, f"gguf:{self.path} sha256:{digest.hexdigest()}"


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


def _check_layout(reader: Any, where: str) -> None:
  """Refuses a file whose tensors do not fill its data section as their types and shapes say.

  llama.cpp (and the gguf package) write each tensor's bytes at the offset its info gives,
  padded to the file's alignment, one after the other: the bytes up to the next tensor (or the
  end of the file) are the tensor's size, plus less than one alignment of padding. A type id
  changed to another type of another size (F32 to F16, to a K-quant) breaks that; the reader
  would slice the wrong bytes and dequantize them without complaint.
  """
  tensors = sorted(reader.tensors, key=lambda tensor: tensor.data_offset)
  ends = [tensor.data_offset for tensor in tensors[1:]] + [len(reader.data)]
  for tensor, end in zip(tensors, ends):
    room = end - tensor.data_offset
    if not tensor.n_bytes <= room < tensor.n_bytes + reader.alignment:
      shape = [int(d) for d in reversed(tensor.shape)]
      raise UsageError(f"{where}: tensor {tensor.name} is {tensor.tensor_type.name} of shape "
                       f"{shape}, {tensor.n_bytes} bytes, but the file holds {room} bytes for "
                       f"it: its type or shape was changed, or {_CONVERT}")


def _check_sizes(names: GgufNames, metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                 where: str) -> None:
  """Refuses a file whose metadata sizes (`<arch>.block_count`, `<arch>.vocab_size`, ...) are
  not its tensors' (`names`: the GGUF names of the model the metadata describes), naming the
  key and the tensor: the model would be built to the metadata
  and read tensors of other sizes (refused then, but blaming the command line), or read the
  wrong number of blocks, or split the same rows into other heads. `shapes`: each tensor's, in
  torch's axis order."""
  arch = metadata.get("general.architecture")
  blocks = metadata.get(f"{arch}.block_count")
  if isinstance(blocks, int) and not isinstance(blocks, bool):
    found = {}
    for name in shapes:
      match = _BLOCK.match(name)
      if match:
        found.setdefault(int(match.group(1)), name)
    extra = sorted(set(found) - set(range(blocks)))
    missing = sorted(set(range(blocks)) - set(found))
    if extra:
      raise UsageError(f"{where}: {arch}.block_count={blocks}, but the file holds tensor "
                       f"{found[extra[0]]} of block {extra[0]}; {_CONVERT}")
    if missing:
      raise UsageError(f"{where}: {arch}.block_count={blocks}, but the file holds no tensor of "
                       f"block {missing[0]} (blk.{missing[0]}.*); {_CONVERT}")
  try:
    sizes: list[GgufSize] = names.sizes()
  except (ArithmeticError, TypeError):
    return  # A size that is no positive number: the model's field checks refuse it, by name.
  for size in sizes:
    given = [(key, metadata[f"{arch}.{key}"]) for key in size.keys
             if f"{arch}.{key}" in metadata]
    if not given:
      continue
    layers = range(names.model.num_layers) if "{layer}" in size.tensor else (0,)
    for layer in layers:
      name = size.tensor.format(layer=layer)
      shape = shapes.get(name)
      if shape is None or len(shape) <= size.axis or shape[size.axis] == size.size:
        continue  # A missing tensor is named when the model reads it.
      keys = ", ".join(f"{arch}.{key}={value}" for key, value in given)
      raise UsageError(f"{where}: {keys} make{'s' * (len(given) == 1)} dimension {size.axis} "
                       f"of tensor {name} {size.size}, but its shape is {list(shape)}; "
                       f"{_CONVERT}")
