"""The dense transformer's names in other formats, as Llama's Hugging Face checkpoints and
llama.cpp's converter name them: the table every family of the kind starts from and changes
where it differs (models/llama.py takes it as it is; gemma3.py, olmo3.py, ... change rows).

`CONFIG`: each field's config.json key and GGUF key (models/config_rows.py). The tensors are
groups of rows (models/tensor_rows.py) under `model.layers.{i}.` and llama.cpp's `blk.{i}.`:
`EMBEDDING`, a layer's `ATTENTION`, `QK_NORMS` and `SWIGLU` (`attention()`, `swiglu()` for a
family without their biases), `norm(...)` for each of its norms,
and the model's `FINAL_NORM` and `OUTPUT`; `tensors(*layer)` puts a layer's rows between the
embedding and the final norm.
"""

from __future__ import annotations

from lingvo_lite.models import tensor_rows
from lingvo_lite.models.config_rows import FLAG, NUMBER, Fixed, Key, Rows
from lingvo_lite.models.rope_names import ROPE_SCALING, ROTARY_BASE
from lingvo_lite.models.tensor_rows import Tensor, has


def _untied(metadata, arch, tensors, config) -> bool:  # pylint: disable=unused-argument
  return "output.weight" not in tensors


def tied(default: bool) -> Key:
  """`tie_word_embeddings` (`default` where a config.json has none); llama.cpp stores an untied
  output as `output.weight`, a tied one not at all."""
  return Key("tie_embeddings", "tie_word_embeddings", _untied, default, FLAG)


# How a config.json names each field, what one without the key means (transformers' default),
# and the key llama.cpp's converter writes.
CONFIG = Rows((
    Fixed("hidden_act", "silu"),
    Key("vocab_size", "vocab_size", "vocab_size"),
    Key("num_layers", "num_hidden_layers", "block_count"),
    Key("dim", "hidden_size", "embedding_length"),
    Key("num_heads", "num_attention_heads", "attention.head_count"),
    Key("num_kv_heads", "num_key_value_heads", "attention.head_count_kv", None,
        source="resolved_num_kv_heads"),
    Key("head_dim", "head_dim", "attention.key_length", None, source="resolved_head_dim"),
    Key("head_dim", None, "attention.value_length", source="resolved_head_dim"),
    Key("head_dim", None, "rope.dimension_count", source="resolved_head_dim"),
    Key("mlp_dim", "intermediate_size", "feed_forward_length", source="resolved_mlp_dim"),
    Key("norm_eps", "rms_norm_eps", "attention.layer_norm_rms_epsilon", 1e-6, NUMBER),
    ROTARY_BASE,
    Key("max_length", "max_position_embeddings", "context_length", 2048),
    tied(False),
    Key("attention_bias", "attention_bias", None, False, FLAG),
    Key("mlp_bias", "mlp_bias", None, False, FLAG),
    ROPE_SCALING,
))

LAYER, BLOCK = "model.layers.{i}.", "blk.{i}."
EMBEDDING = Tensor("embedding", "model.embed_tokens.weight", "token_embd.weight", table=True)


def attention(bias: bool = True, gguf_bias: bool = False) -> tuple[Tensor, ...]:
  """Query, key, value and output; their biases where the model has them, if `bias` (a family
  whose config.json has no `attention_bias` has no tensor for them), with GGUF names where
  `gguf_bias` (llama.cpp's gpt-oss; its other architectures are read and written without)."""
  return tensor_rows.attention(f"{LAYER}self_attn.", ("q_proj", "k_proj", "v_proj", "o_proj"),
                               BLOCK, bias=has("attention_bias") if bias else False,
                               gguf_bias=gguf_bias)


def swiglu(bias: bool = True) -> tuple[Tensor, ...]:
  """The gate (our `wi`, activated), up (`wi_gate`) and down (`wo`) projections; their biases
  where the model has them, if `bias` (a family whose config.json has no `mlp_bias` has no
  tensor for them)."""
  return sum((tensor_rows.dense(f"layer_{{i}}/mlp/{ours}", f"{LAYER}mlp.{theirs}_proj",
                                f"{BLOCK}ffn_{theirs}", bias=has("mlp_bias") if bias else False)
              for ours, theirs in (("wi", "gate"), ("wi_gate", "up"), ("wo", "down"))), ())


ATTENTION = attention()
# An RMSNorm of each head's queries and keys (Qwen3's, Gemma 3's).
QK_NORMS = (tensor_rows.norm("layer_{i}/attention/query_norm", f"{LAYER}self_attn.q_norm",
                             f"{BLOCK}attn_q_norm")
            + tensor_rows.norm("layer_{i}/attention/key_norm", f"{LAYER}self_attn.k_norm",
                               f"{BLOCK}attn_k_norm"))
SWIGLU = swiglu()
FINAL_NORM = tensor_rows.norm("final_norm", "model.norm", "output_norm")
OUTPUT = (Tensor("output/kernel", "lm_head.weight", "output.weight",
                 when=has("tie_embeddings", False)),)


def norm(ours: str, hf: str, gguf: str) -> tuple[Tensor, ...]:
  """A layer's RMSNorm: our `layer_{i}/ours`, Hugging Face's `model.layers.{i}.hf`, llama.cpp's
  `blk.{i}.gguf`."""
  return tensor_rows.norm(f"layer_{{i}}/{ours}", f"{LAYER}{hf}", f"{BLOCK}{gguf}")


def tensors(*layer: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
  """The model's tensors: the embedding, each layer's `layer` rows, the final norm and the
  untied output."""
  return (EMBEDDING, *sum(layer, ()), *FINAL_NORM, *OUTPUT)


# Llama's layer: pre-norms before attention and the SwiGLU MLP.
LLAMA_LAYER = (norm("attention_norm", "input_layernorm", "attn_norm"), ATTENTION,
               norm("mlp_norm", "post_attention_layernorm", "ffn_norm"), SWIGLU)
