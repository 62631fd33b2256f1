"""Tiny weight files for tests, made with NumPy alone (no torch): a two-block Llama (PyCodeTiny's
byte vocabulary) as a Hugging Face folder and as a GGUF file, and the edits that make a file
contradict itself (a tensor's stored type changed in place, a metadata size, an extra tensor).
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Any, Mapping

import jax
import numpy as np

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.models.llama import Llama
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.weights import hf_export
from lingvo_lite.weights.gguf_checkpoint import names_of

# PyCodeTiny's vocabulary (bytes and 3 specials); every size small, heads grouped.
FIELDS = dict(vocab_size=259, num_layers=2, dim=64, num_heads=4, num_kv_heads=2, mlp_dim=96,
              max_length=128)


def model(**changes: Any) -> Llama:
  return Llama(**dict(FIELDS, **changes))


def tensors(llama: Llama) -> dict[str, np.ndarray]:
  """The Hugging Face tensors of random float32 parameters of `llama`, by name (the same for
  the same model)."""
  return dict(_tensors(tuple(sorted(
      (field, getattr(llama, field)) for field in (*FIELDS, "tie_embeddings")))))


@functools.lru_cache(maxsize=4)
def _tensors(fields: tuple[tuple[str, Any], ...]) -> dict[str, np.ndarray]:
  llama = Llama(**dict(fields))
  abstract = MeshParams(llama, 16, Partitioner(), Partitioner().make_mesh()).abstract
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda leaf: (rng.standard_normal(leaf.shape) * 0.1).astype(np.float32),
                        abstract)
  named = hf_export.NamedTensors(llama, params)
  return {name: named[name] for name in named}


def hf_folder(folder: str | os.PathLike, llama: Llama | None = None,
              replaced: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """Writes config.json and model.safetensors of `llama` (random weights) into `folder`, with
  the tensors of `replaced` put in (added, or instead of the model's own). Returns what the
  file holds."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  llama = llama or model()
  held = {**tensors(llama), **(replaced or {})}
  os.makedirs(folder, exist_ok=True)
  save_file(held, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf_export.check_expressible(llama), f)
  return held


def gguf_file(path: str | os.PathLike, llama: Llama | None = None,
              metadata: Mapping[str, Any] | None = None,
              extra: Mapping[str, np.ndarray] | None = None,
              quantized: Any = None) -> None:
  """Writes `llama` (random weights) as llama.cpp's GGUF file at `path`: its metadata, with
  `metadata`'s keys (without the `llama.` prefix) set instead, its tensors (the matrices
  quantized to the `gguf.GGMLQuantizationType` `quantized` where given), then `extra`'s."""
  import gguf  # pylint: disable=g-import-not-at-top
  llama = llama or model()
  named = tensors(llama)
  writer = gguf.GGUFWriter(os.fspath(path), "llama")
  for key, value in {**names_of(llama).metadata(), **(metadata or {})}.items():
    if isinstance(value, float):
      writer.add_float32(f"llama.{key}", value)
    else:
      writer.add_uint32(f"llama.{key}", value)
  for name, tensor in names_of(llama).tensors().items():
    values = np.ascontiguousarray(tensor.from_hf(named[tensor.hf]))
    if quantized is not None and values.ndim == 2:
      writer.add_tensor(name, gguf.quants.quantize(values, quantized), raw_dtype=quantized)
    else:
      writer.add_tensor(name, values)
  for name, values in (extra or {}).items():
    writer.add_tensor(name, values)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def retype_gguf(path: str | os.PathLike, tensor: str, shape: tuple[int, ...],
                type_id: int) -> None:
  """Changes the stored type id of GGUF `tensor` (GGUF's dimension order: `shape`) in place,
  as a byte edit does: its info is its name, its dimension count and sizes, then the type."""
  with open(path, "rb") as f:
    data = bytearray(f.read())
  name = tensor.encode()
  record = (struct.pack("<Q", len(name)) + name + struct.pack("<I", len(shape))
            + b"".join(struct.pack("<Q", d) for d in shape))
  at = data.index(record) + len(record)
  data[at:at + 4] = struct.pack("<I", type_id)
  with open(path, "wb") as f:
    f.write(bytes(data))


def retype_safetensors(path: str | os.PathLike, tensor: str, dtype: str) -> None:
  """Changes the stored dtype of `tensor` in a safetensors file's header (its bytes stay), as
  an edit of the header does."""
  with open(path, "rb") as f:
    data = f.read()
  length = struct.unpack("<Q", data[:8])[0]
  header = json.loads(data[8:8 + length])
  header[tensor]["dtype"] = dtype
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # Where the data starts stays 8-aligned.
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data[8 + length:])
