"""A lingvo_lite model written as a GGUF file (llama.cpp's format) that transformers and llama.cpp
read: `--mode=export --export_format=gguf` writes EXPORT_DIR/model.gguf.

The inverse of gguf_checkpoint.py's reading: the family's Hugging Face config (`hf_config`) becomes
the `<architecture>.*` metadata that its `gguf_hf_config` reads back, each GGUF tensor (the
family's `gguf_tensors`) is its Hugging Face tensor (`hf_tensors`), with the query and key rows
of each head put back in the rotary-pair order GGML's rope expects
(`checkpoint_names.rotary_halves_to_pairs`). Matrices are written as F32 or F16; 1-D tensors
(norms) stay F32, as llama.cpp's converter keeps them. A pretrained byte-level BPE tokenizer
goes into `tokenizer.ggml.*` (data/pretrained_tokenizer.py: `gguf_tokenizer`).

Refused in one line, never written wrong: a family without a GGUF mapping here (GPT-J, GPT-2),
a sliding window shorter than the context (llama.cpp's llama architecture has none), rope
scaling (llama.cpp stores Llama 3.1's as a rope_freqs tensor, which this writer does not make).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.errors import UsageError
from lingvo_lite.models.checkpoint_names import rotary_halves_to_pairs

KIND = "gguf_export"
FILE = "model.gguf"
DTYPES = ("float32", "float16")


def check_expressible(model: Any, hf_config: Mapping[str, Any]) -> str:
  """The GGUF architecture `model` is written as.

  Raises:
    UsageError: naming the field the format cannot express.
  """
  family = type(model)
  if not family.reads_gguf() or family.gguf_architecture is None:
    raise UsageError(f"model: a {family.family_name} model has no GGUF tensor names here "
                     "(llama and mistral have); export --export_format=hf or slim")
  # A family's own settings by their Hugging Face names (no family's field is named here).
  window = hf_config.get("sliding_window")
  if window is not None and window < hf_config["max_position_embeddings"]:
    raise UsageError(f"model: a {family.family_name} model with a sliding window of {window} "
                     f"(Hugging Face's sliding_window): a GGUF {family.gguf_architecture} "
                     "model has none and would attend to every position; export "
                     "--export_format=hf")
  scaling = hf_config.get("rope_scaling") or hf_config.get("rope_parameters")
  if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
    raise UsageError(f"model: rope scaling {scaling.get('rope_type') or scaling.get('type')!r}"
                     ": this GGUF writer does not store it (llama.cpp's rope_freqs tensor); "
                     "export --export_format=hf")
  return family.gguf_architecture


def write(path: str, model: Any, tensors: Mapping[str, np.ndarray], dtype: str,
          hf_config: Mapping[str, Any], tokenizer: Any = None) -> dict[str, Any]:
  """Writes the GGUF file at `path`.

  Args:
    path: The file to write (in an empty folder).
    model: The family instance (unrolled layers).
    tensors: Hugging Face tensor name -> array, as hf_export writes them.
    dtype: float32 or float16, for every matrix.
    hf_config: `hf_export.check_expressible`'s config.json.
    tokenizer: The model's pretrained tokenizer files, or None.

  Returns:
    What the manifest records: the tensor count, the architecture, whether a tokenizer went in.
  """
  import gguf  # pylint: disable=g-import-not-at-top
  arch = check_expressible(model, hf_config)
  writer = gguf.GGUFWriter(path, arch)
  writer.add_name(f"lingvo_lite {type(model).family_name}")
  writer.add_file_type(int(gguf.LlamaFileType.ALL_F32 if dtype == "float32"
                           else gguf.LlamaFileType.MOSTLY_F16))
  head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config[
      "num_attention_heads"]
  writer.add_vocab_size(int(hf_config["vocab_size"]))
  writer.add_context_length(int(hf_config["max_position_embeddings"]))
  writer.add_embedding_length(int(hf_config["hidden_size"]))
  writer.add_block_count(int(hf_config["num_hidden_layers"]))
  writer.add_feed_forward_length(int(hf_config["intermediate_size"]))
  writer.add_head_count(int(hf_config["num_attention_heads"]))
  writer.add_head_count_kv(int(hf_config.get("num_key_value_heads")
                               or hf_config["num_attention_heads"]))
  writer.add_key_length(int(head_dim))
  writer.add_value_length(int(head_dim))
  writer.add_rope_dimension_count(int(head_dim))
  writer.add_layer_norm_rms_eps(float(hf_config["rms_norm_eps"]))
  writer.add_rope_freq_base(float(hf_config.get("rope_theta", 10000.0)))
  has_tokenizer = _add_tokenizer(writer, tokenizer)
  matrix = np.float32 if dtype == "float32" else np.float16
  for gguf_name, (hf_name, heads) in model.gguf_tensors().items():
    values = np.asarray(tensors[hf_name], np.float32)
    if heads is not None:
      values = rotary_halves_to_pairs(values, heads)
    writer.add_tensor(gguf_name, values.astype(matrix if values.ndim > 1 else np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return {"tensors": len(model.gguf_tensors()), "architecture": arch,
          "tokenizer": has_tokenizer, "files": {FILE: os.path.getsize(path)}}


def _add_tokenizer(writer: Any, tokenizer: Any) -> bool:
  """tokenizer.ggml.* for a byte-level BPE tokenizer; False where there is none to write."""
  if tokenizer is None:
    return False
  described = pretrained_tokenizer.gguf_tokenizer(tokenizer)
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
  return True
