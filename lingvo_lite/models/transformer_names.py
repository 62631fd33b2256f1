"""What every family built on `TransformerLM` shares in other weight formats: the bases of the
names classes of models/gptj.py, llama.py, gpt2.py and mistral.py (models/format_names.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lingvo_lite.models.checkpoint_names import GgufSize
from lingvo_lite.models.format_names import GgufNames, HfNames

# How a model is run, not what it computes: no Hugging Face key for them, none needed.
_RUN_FIELDS = ("dtype", "param_dtype", "scan_layers", "remat_policy",
               "attention_implementation", "embedding_init_stddev", "parent", "name")
# Sizes a config may leave to their derivation (None) or give: compared as derived.
_DERIVED = {"num_kv_heads": "resolved_num_kv_heads", "head_dim": "resolved_head_dim",
            "mlp_dim": "resolved_mlp_dim", "rotary_dim": "resolved_rotary_dim"}


class TransformerHfNames(HfNames):
  """A transformer family's Hugging Face names: every field but how the model is run must
  read back from its config.json."""

  def expressed(self) -> dict[str, Any]:
    return {field.name: getattr(self.model, _DERIVED.get(field.name, field.name))
            for field in dataclasses.fields(self.model) if field.name not in _RUN_FIELDS}


class TransformerGgufNames(GgufNames):
  """A transformer family's GGUF names: the sizes every architecture's metadata holds."""

  def metadata(self) -> dict[str, int | float | str]:
    """The sizes llama.cpp's converters write for every transformer architecture (keys without
    the architecture's prefix); each family adds its own settings."""
    model = self.model
    return {"vocab_size": model.vocab_size, "context_length": model.max_length,
            "embedding_length": model.dim, "block_count": model.num_layers,
            "feed_forward_length": model.resolved_mlp_dim,
            "attention.head_count": model.num_heads}

  def sizes(self) -> list[GgufSize]:
    """The sizes every llama.cpp architecture's tensors show: the token table [vocabulary,
    width] (and an untied output matrix's rows), the MLP's input matrix [mlp, width]."""
    model = self.model
    sizes = [GgufSize(("vocab_size",), "token_embd.weight", 0, model.vocab_size),
             GgufSize(("embedding_length",), "token_embd.weight", 1, model.dim),
             GgufSize(("feed_forward_length",), "blk.{layer}.ffn_up.weight", 0,
                      model.resolved_mlp_dim),
             GgufSize(("embedding_length",), "blk.{layer}.ffn_up.weight", 1, model.dim)]
    if not model.tie_embeddings:
      sizes.append(GgufSize(("vocab_size",), "output.weight", 0, model.vocab_size))
    return sizes
