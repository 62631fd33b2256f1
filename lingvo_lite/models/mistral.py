"""Mistral: Llama's blocks with sliding-window attention, and a decode cache of only the window.

Each token attends to itself and the `window - 1` tokens before it (the band 0 <= i - j <
window of the causal triangle), in every layer; information from further back reaches it only
through the layers below. Everything else is Llama's (pre-RMSNorm blocks, SwiGLU, rotate-half
RoPE, grouped-query key/value heads, no biases), so the parameters are Llama's tree.

This module is the whole family: the attention with the band (`SlidingWindowAttention`: the
window is the shared attention's `sliding_window` hook, which every training path takes), the
FLOPs that count only the window, `tiny`'s smaller window, its names in other weight formats,
and a decode cache that is a ring of min(window, cache_length) entries per slot (position p at
entry p % entries: the shared attention's `_cache_entry` and `_cache_mask` hooks): decoding
past the window writes over the positions that fell out of it, so the cache's memory stays
the window's however long a request runs. Nothing outside `lingvo_lite/models/` names it.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite import target as targets
from lingvo_lite.errors import UsageError, config_error
from lingvo_lite.fields import PositiveInt
from lingvo_lite.models import format_names, kv_cache, layers
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.family import ArrayShape
from lingvo_lite.models.llama import Llama, LlamaGgufNames, LlamaHfNames


def ring_positions(last: jax.Array, entries: int) -> jax.Array:
  """The position each of a ring's `entries` holds once positions up to `last` (int32
  [...]) are written in order, position p at entry p % entries: [..., entries]. Negative
  where nothing of this request is there yet (a stale entry)."""
  last = last[..., None]
  return last - (last - jnp.arange(entries, dtype=jnp.int32)) % entries


class SlidingWindowAttention(layers.Attention):
  """Grouped-query attention restricted to the last `window` positions (itself included).

  Attributes:
    window: Positions each query sees, its own included.
  """

  window: int = 4096

  def sliding_window(self) -> int:
    return self.window

  def _cache_entry(self, positions: jax.Array, entries: int) -> jax.Array:
    """Position p at entry p % entries: the ring writes over the position that left the
    window. One token per slot and call (what decoding feeds): several would overwrite
    entries that their earlier tokens still see."""
    return positions % entries

  def _cache_mask(self, positions: jax.Array, entries: int) -> jax.Array:
    """The entries whose position is this request's and within the window of the query."""
    held = ring_positions(positions, entries)  # [batch, length, entries]
    return (held >= 0) & (positions[..., None] - held < self.window)

  def _cache_prefix(self, positions: jax.Array, entries: int) -> jax.Array:
    """Entries 0..p until the ring is full, then all of them: every position a full ring
    holds is within the window (it holds at most `window`), and where in the ring each sits
    does not change a softmax over them."""
    return jnp.minimum(positions + 1, entries)


def _write_ring(cache: kv_cache.KVCache, new: tuple[jax.Array, jax.Array],
                lengths: jax.Array, insert: jax.Array) -> kv_cache.KVCache:
  """Writes each inserted slot's last min(entries, length) prompt positions of a prefill's
  keys and values ([layers, slots, bucket, kv_heads, head_dim]) at their ring entries; the
  other slots keep theirs."""
  def write(cached: jax.Array, update: jax.Array) -> jax.Array:
    """[(layers,) slots, heads, entries, d] <- update [(layers,) slots, bucket, heads, d]."""
    entries, bucket = cached.shape[-2], update.shape[-3]
    held = ring_positions(lengths.astype(jnp.int32) - 1, entries)  # [slots, entries]
    lead = (1,) * (cached.ndim - 4)
    index = jnp.clip(held, 0, bucket - 1).reshape(lead + held.shape + (1, 1))
    gathered = jnp.take_along_axis(update, index, axis=-3)
    gathered = jnp.swapaxes(gathered, -3, -2).astype(cached.dtype)
    keep_new = ((held >= 0) & insert[:, None]).reshape(lead + (held.shape[0], 1, entries, 1))
    return jnp.where(keep_new, gathered, cached)

  def write_all(cached: Any, update: jax.Array) -> Any:
    if isinstance(cached, tuple):  # Unrolled layers: layer i's array takes update[i].
      return tuple(write(c, update[i]) for i, c in enumerate(cached))
    return write(cached, update)

  return kv_cache.KVCache(*(write_all(c, u) for c, u in zip(cache, new)))


class Mistral(Llama):
  """Mistral: Llama's fields (their docs are `TransformerLM`'s) and a sliding window.

  Attributes:
    window: Positions each token attends to in every layer, its own included (Mistral-7B:
      4096); the decode cache holds this many positions per slot at most.
  """

  window: PositiveInt = 4096

  family_name = "mistral"
  same_model_as = ()

  @nn.nowrap
  def attention_module(self) -> tuple[type[layers.Attention], dict[str, Any]]:
    return SlidingWindowAttention, {"window": self.window}

  # ---------------------------------------------------------------------------- FLOPs

  @nn.nowrap
  def attention_flops_per_token(self, sequence_length: int) -> int | float:
    """Llama's count (causal: T^2 / 2 score pairs of 4 H d FLOPs per layer) less the pairs
    outside the band, (T - W)^2 / 2 in the same count: W T - W^2 / 2 pairs, W - W^2 / 2T per
    token. A window at least the sequence is Llama's count exactly."""
    length, window = sequence_length, self.window
    if length <= window:
      return super().attention_flops_per_token(length)
    per_layer = 4 * self.num_heads * self.resolved_head_dim
    return self.num_layers * per_layer * (window - window * window / (2 * length))

  @nn.nowrap
  def decode_attention_flops(self, context_length: int) -> int:
    """A new token reads the window at most, however long the context."""
    return super().decode_attention_flops(min(context_length, self.window))

  # ---------------------------------------------------------------------------- checks

  @nn.nowrap
  def validate(self, target: targets.Target, path: str = "model") -> None:
    super().validate(target, path)
    if self.window < 1:  # Configs are range-checked before; a model built by hand is not.
      raise config_error(f"{path}.window", self.window, "must be at least 1",
                         "a token must see itself")

  @classmethod
  def tiny(cls, fields: Mapping[str, Any], sequence_length: int) -> dict[str, Any]:
    """Llama's tiny sizes, and a window of a quarter of the tiny sequence (shorter than it,
    so that the band still cuts off what a full causal mask would see)."""
    changes = super().tiny(fields, sequence_length)
    changes["window"] = max(1, min(fields["window"], sequence_length // 4))
    return changes

  # ---------------------------------------------------------------------------- decode cache

  @nn.nowrap
  def cache_entries(self, cache_length: int) -> int:
    """Ring entries per slot: the window, or fewer where no request reaches it."""
    return min(self.window, cache_length)

  @nn.nowrap
  def empty_cache(self, slots: int, cache_length: int) -> kv_cache.KVCache:
    return kv_cache.empty(self, slots, self.cache_entries(cache_length))

  @nn.nowrap
  def cache_shapes(self, slots: int, cache_length: int) -> list[ArrayShape]:
    return kv_cache.array_shapes(self, slots, self.cache_entries(cache_length))

  @nn.nowrap
  def prefill(self, params: Any, tokens: jax.Array, lengths: jax.Array,
              cache: kv_cache.KVCache, insert: jax.Array) -> tuple[jax.Array, kv_cache.KVCache]:
    """The prompts' banded pass, then each inserted prompt's last positions into its ring."""
    logits, new_kv = self.apply({"params": params}, tokens, output_index=lengths - 1,
                                return_kv=True)
    return logits, _write_ring(cache, new_kv, lengths, insert)


@format_names.names_for(Mistral)
class MistralHfNames(LlamaHfNames):
  """Mistral's Hugging Face names: Llama's, and the window as `sliding_window`."""

  model_type = "mistral"
  architecture = "MistralForCausalLM"

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    """Llama's fields and the window: Hugging Face's `sliding_window` (query i sees key j
    where i - j < sliding_window, this band); none means the whole context."""
    window = config.get("sliding_window")
    fields = super().fields(HfConfig({k: v for k, v in config.values.items()
                                      if k != "sliding_window"}, config.where))
    return dict(fields, window=window if window is not None else fields["max_length"])

  def config(self) -> dict[str, Any]:
    return dict(super().config(), sliding_window=self.model.window)


@format_names.names_for(Mistral)
class MistralGgufNames(LlamaGgufNames):
  """llama.cpp converts Mistral-7B to its `llama` architecture, whose files have no window: a
  reader takes a `llama` file as Llama's (models/format_names.py), and only a model whose
  window covers its whole context is written as one."""

  def check_writable(self) -> None:
    model = self.model
    if model.window < model.max_length:
      raise UsageError(f"model: a {model.family_name} model with a sliding window of "
                       f"{model.window} (Hugging Face's sliding_window): a GGUF "
                       f"{self.architecture} model has none and would attend to every "
                       "position; export --export_format=hf")
    super().check_writable()
