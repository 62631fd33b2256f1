"""The stack of a `TransformerLM`'s layers: which attention kind each layer has, how a stack of
mixed kinds is scanned, and the decode cache over them. A mixin of `TransformerLM`
(models/transformer.py), reading its fields.

Attention kinds (`layer_kinds`, a pattern repeated over the layers, as Hugging Face's
`layer_types` lists them):

- "full": every earlier position, rotary positions of `rotary_base` and `rotary_scaling`;
- "sliding": the last `window` positions, rotary positions of `sliding_rotary_base` and
  `sliding_rotary_scaling` (each the full layers' where unset);
- "no_rotary": every earlier position and no rotary positions (SmolLM3's "NoPE" layers).

Every kind has the same parameters, so kinds change what a layer computes, not its tree.

Scanned layers (`scan_layers`): the per-layer kinds repeat with a shortest period P (1 for
one kind; Gemma 3: 6, OLMo 3: 4). With P = 1 the blocks are one `nn.scan` as always, their
parameters under `layers` with a leading axis of num_layers. With P > 1 the scan steps over
groups of P consecutive layers (`block.BlockGroup`), each group's member j a layer of the
pattern's kind j: parameters `layers/pattern_j/...` with a leading axis of groups = num_layers
// P; the num_layers % P layers left over run unrolled after it as `layer_N` (Gemma 3 1B's
26 layers: 4 groups of 6 and 2 sliding layers). So every layer keeps its own kind's static
mask and kernel (no per-layer switch inside the scan), and the compiled body is one group.

A family whose first layers break the period (DeepSeek's dense first layers before the MoE
ones: `scan_prefix`, models/moe_transformer.py) has them unrolled before the scan, each its
own `layer_N`, and the period is the rest's: DeepSeek-V3's 61 layers are `layer_0..layer_2`
(dense) and a scan of 58 MoE layers, where the whole stack's period (61) would leave nothing
scanned. The stack is thus [prefix, each its own kind] + [groups of the period] + [leftover];
`scanned_span` says which layers the scan holds, and the scanned rows count from its start.

The decode cache (models/kv_cache.py) follows the same layout: unrolled, one array per layer;
scanned, one array per prefix layer, one stacked array per position of the pattern, and one
per layer left over. A sliding layer's array holds min(window, cache_length) entries per slot
(a ring), a full layer's cache_length; the shapes are fixed when the cache is made, so
decoding and serving never recompile.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite.models import attention_kernels, kv_cache, layer_layout, pipeline, remat
from lingvo_lite.models.block import Block, BlockGroup
from lingvo_lite.models.family import ArrayShape
from lingvo_lite.models.lora import COLLECTION as LORA_COLLECTION
from lingvo_lite.models.moe import STATISTICS

LayerKind = Literal["full", "sliding", "no_rotary"]


def per_layer(pattern: Sequence[str], num_layers: int, start: int = 0) -> tuple[str, ...]:
  """The kind of each of `num_layers` layers from layer `start` on: `pattern` repeated (and
  cut)."""
  return tuple(pattern[index % len(pattern)] for index in range(start, start + num_layers))


def count_per_layer(pattern: Sequence[str], num_layers: int, kind: str) -> int:
  """How many of `per_layer(pattern, num_layers)` are `kind`, without listing the layers (an
  absurd depth is refused by the memory verdict, not by a list of a billion kinds)."""
  whole, rest = divmod(num_layers, len(pattern))
  return whole * list(pattern).count(kind) + list(pattern[:rest]).count(kind)


def shortest_period(kinds: Sequence[Any]) -> int:
  """The shortest P with kinds[i] == kinds[i % P] for every layer i: the length less the
  longest border (a proper prefix that is also a suffix: KMP's failure function), in time
  linear in the layers (trying each P would be quadratic: minutes at 10^5 layers)."""
  border = [0] * len(kinds)
  for index in range(1, len(kinds)):
    length = border[index - 1]
    while length and kinds[index] != kinds[length]:
      length = border[length - 1]
    border[index] = length + (kinds[index] == kinds[length])
  return len(kinds) - border[-1]


def pattern_of(kinds: Sequence[str]) -> tuple[str, ...]:
  """The shortest pattern whose repetition gives `kinds` (a per-layer list)."""
  return tuple(kinds[:shortest_period(kinds)])


class TransformerLayers:
  """The layer stack of a `TransformerLM` (its fields are read; none is declared here)."""

  # ---------------------------------------------------------------------------- kinds

  @nn.nowrap
  def kinds_by_layer(self) -> tuple[str, ...]:
    return per_layer(self.layer_kinds, self.num_layers)

  @nn.nowrap
  def kinds_used(self) -> frozenset[str]:
    """The attention kinds some layer has, without listing the layers (the checks run before
    the memory verdict refuses an absurd depth: a billion-entry list took minutes)."""
    return frozenset(self.layer_kinds[:max(self.num_layers, 0)])

  @nn.nowrap
  def mlp_kind_pattern(self) -> tuple[str, ...]:
    """The feed-forward kinds' pattern, repeated over the layers: "dense" (`layers.Mlp`) here;
    a family with other feed-forward layers (a mixture of experts) names its kinds and builds
    them (`mlp_module`)."""
    return ("dense",)

  @nn.nowrap
  def mlp_kinds_by_layer(self) -> tuple[str, ...]:
    """Each layer's feed-forward kind (`mlp_kind_pattern` repeated)."""
    return per_layer(self.mlp_kind_pattern(), self.num_layers)

  @nn.nowrap
  def scan_prefix(self) -> int:
    """The first layers, before the repeating part: each unrolled as its own `layer_N` ahead
    of the scanned groups, since they break the stack's period (DeepSeek's dense first
    layers: models/moe_transformer.py). Always fewer than num_layers; none here."""
    return 0

  @nn.nowrap
  def variant_period(self) -> int:
    """`shortest_period(layer_variants()[scan_prefix():])`, from the two patterns alone:
    past the prefix the variants repeat with M, the least common multiple of the patterns'
    lengths, so its first 2M layers have its shortest period (by Fine and Wilf's theorem a
    shorter one would be a period of the patterns); an absurd depth is never listed."""
    start = self.scan_prefix()
    patterns = (tuple(self.layer_kinds), self.mlp_kind_pattern())
    listed = min(self.num_layers - start, 2 * math.lcm(*(len(p) for p in patterns)))
    return shortest_period(tuple(zip(*(per_layer(p, listed, start) for p in patterns))))

  @nn.nowrap
  def layer_variants(self) -> tuple[tuple[str, str], ...]:
    """Each layer's (attention kind, feed-forward kind): layers of one variant have the same
    parameters and computation, so a scan steps over a period of them."""
    return tuple(zip(self.kinds_by_layer(), self.mlp_kinds_by_layer()))

  @nn.nowrap
  def variant_fields(self, count: int) -> dict[str, Any]:
    """The field changes that make a model of `count` layers with this one's first `count`
    variants (what `parameter_shapes` traces: the prefix and one period)."""
    return {"num_layers": count,
            "layer_kinds": per_layer(self.layer_kinds, min(count, self.num_layers))}

  @nn.nowrap
  def sample_layers(self) -> tuple[int, list[range]]:
    """A short stack that has every layer's parameters: (its depth, the real layers each of
    its layers stands for). It is the prefix and one period: sample layer j < prefix is
    layer j; the next ones are layers j, j + P, j + 2P, ... (tracing the whole stack takes
    time in proportion to depth: forever, for an absurd one)."""
    start, period = self.scan_prefix(), self.variant_period()
    count = start + min(period, self.num_layers - start)
    return count, [range(j, j + 1) if j < start else range(j, self.num_layers, period)
                   for j in range(count)]

  @nn.nowrap
  def sample_layer(self, layer: int) -> int:
    """The layer of `sample_layers`' short stack that stands for `layer`."""
    start = self.scan_prefix()
    return layer if layer < start else start + (layer - start) % self.variant_period()

  @nn.nowrap
  def scan_plan(self) -> tuple[int, int]:
    """(P, groups): the scanned layers run as `groups` groups of P layers (P = 1: one block
    per step), the prefix before them and the rest after unrolled; (0, 0) unrolled."""
    if not self.scan_layers:
      return 0, 0
    period = self.variant_period()
    return period, (self.num_layers - self.scan_prefix()) // period

  @nn.nowrap
  def scanned_span(self) -> tuple[int, int]:
    """The layers [start, stop) the scan holds (empty where none is scanned): every layer
    before `start` and from `stop` on is unrolled."""
    period, groups = self.scan_plan()
    start = self.scan_prefix() if period * groups else 0
    return start, start + period * groups

  @nn.nowrap
  def rotary_scaling_settings(self, kind: str = "full") -> tuple[Any, ...]:
    """`rotary.inverse_frequencies`' `scaling` of a layer of `kind`: () for none."""
    scaling = self.rotary_scaling
    if kind == "sliding" and self.sliding_rotary_scaling is not None:
      scaling = self.sliding_rotary_scaling
    if scaling == "none":
      return ()
    if scaling == "linear":
      return ("linear", self.rotary_scaling_factor)
    if scaling == "yarn":
      factor = self.rotary_scaling_factor
      attention = self.rotary_attention_factor
      if attention is None:  # YaRN's default: 0.1 ln(factor) + 1 for a factor above 1.
        attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
      return ("yarn", factor, self.rotary_original_max_length, self.rotary_beta_fast,
              self.rotary_beta_slow, attention, self.rotary_truncate)
    return (scaling, self.rotary_scaling_factor, self.rotary_low_freq_factor,
            self.rotary_high_freq_factor, self.rotary_original_max_length)

  @nn.nowrap
  def kind_fields(self, kind: str) -> dict[str, Any]:
    """A layer's attention fields (`block.Block`'s) for its `kind`."""
    sliding = kind == "sliding"
    base = self.rotary_base
    if sliding and self.sliding_rotary_base is not None:
      base = self.sliding_rotary_base
    return {"window": self.window if sliding else None,
            "rotary_dim": 0 if kind == "no_rotary" else self.resolved_rotary_dim,
            "rotary_base": base, "rotary_scaling": self.rotary_scaling_settings(kind)}

  # ---------------------------------------------------------------------------- the stack

  @nn.nowrap
  def _block_class(self, in_scan: bool) -> Any:
    if self.remat_policy == "none":
      return Block
    return nn.remat(Block, policy=remat.policy_function(self.remat_policy),
                    prevent_cse=not in_scan)

  def _layers(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
              cache: Any = None, return_kv: bool = False) -> tuple[jax.Array, Any]:
    """The stack of blocks (the module doc says how it is laid out).

    Returns the output and: with a decode `cache` (keys, values: tuples of the arrays of
    `cache_arrays`), the cache with the new tokens written; with `return_kv`, every layer's
    new (keys, values) stacked on a leading layer axis, in layer order; else None.
    """
    wants_kv = return_kv and cache is None
    caches = None if cache is None else list(zip(*cache))  # (keys, values) per array.
    start, stop = self.scanned_span()
    x, first = self._unrolled_layers(x, positions, segment_ids, range(start), caches,
                                     wants_kv)
    x, scanned = self._scanned_layers(x, positions, segment_ids,
                                      None if caches is None else caches[start:], wants_kv)
    left = None if caches is None else caches[start + len(scanned):]
    x, rest = self._unrolled_layers(x, positions, segment_ids, range(stop, self.num_layers),
                                    left, wants_kv)
    parts = first + scanned + rest
    if caches is not None:
      return x, tuple(tuple(part) for part in zip(*parts))
    if wants_kv:
      return x, jax.tree.map(lambda *arrays: jnp.concatenate(arrays), *parts)
    return x, None

  def _scanned_layers(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                      caches: list[Any] | None, wants_kv: bool) -> tuple[jax.Array, list[Any]]:
    """The scanned groups of layers (none where the layers are unrolled): their output, and
    their arrays of the decode cache with the new tokens written (`caches`, the cache's
    (keys, values) per array), or their new (keys, values) on a layer axis (`wants_kv`)."""
    period, groups = self.scan_plan()
    if not period * groups:
      return x, []
    if (self.pipeline is not None and caches is None and not wants_kv
        and not self.is_initializing()):
      return self._pipelined(period, x, positions, segment_ids), []
    index = jnp.arange(groups, dtype=jnp.int32)
    stack = self._scan(period, groups, wants_kv)
    if caches is not None:
      carried = caches[0] if period == 1 else tuple(caches[:period])
      (x, carried), _ = stack((x, carried), positions, segment_ids, index)
      return x, [carried] if period == 1 else list(carried)
    x, kv = stack(x, positions, segment_ids, index)
    if not wants_kv:
      return x, []
    if period == 1:
      return x, [kv]
    # Each member's [groups, ...]: interleaved back into layer order.
    return x, [jax.tree.map(
        lambda *members: jnp.stack(members, 1).reshape(-1, *members[0].shape[1:]), *kv)]

  def _pipelined(self, period: int, x: jax.Array, positions: jax.Array,
                 segment_ids: jax.Array | None) -> jax.Array:
    """The scanned groups run as `self.pipeline`'s schedule (models/pipeline.py) on the
    variables the `layers` scan holds (initializing, the scan itself makes them, so the
    parameters are the same whatever the stages)."""
    body, fields = self._scan_body(period, False)
    group_module = body(**fields, parent=None)
    stack = {name: self.variables[name]["layers"] for name in ("params", LORA_COLLECTION)
             if "layers" in self.variables.get(name, {})}
    collect = self.is_mutable_collection(STATISTICS)

    def group(variables, h, group_positions, group_segments, key):
      rngs = None if key is None else {"dropout": key}
      if not collect:
        h, _ = group_module.apply(variables, h, group_positions, group_segments, rngs=rngs)
        return h, {}
      (h, _), sown = group_module.apply(variables, h, group_positions, group_segments,
                                        rngs=rngs, mutable=[STATISTICS])
      return h, sown.get(STATISTICS, {})

    key = self.make_rng("dropout") if self.has_rng("dropout") else None
    x, statistics = pipeline.run(group, stack, x, positions, segment_ids, self.pipeline, key)
    if collect and statistics:
      self.put_variable(STATISTICS, "layers", statistics)
    return x

  @nn.nowrap
  def _scan_body(self, period: int, wants_kv: bool) -> tuple[Any, dict[str, Any]]:
    """The module a scan step runs, and its fields: a block (`period` 1), else a group of
    `period` blocks, the pattern's (from the first scanned layer on)."""
    start = self.scan_prefix()
    kinds = self.kinds_by_layer()[start:start + period]
    mlp_kinds = self.mlp_kinds_by_layer()[start:start + period]
    if period == 1:
      body = self._block_class(True)
      fields = dict(self._block_fields(kinds[0], mlp_kinds[0]), return_kv=wants_kv,
                    scan_carry=True)
    else:
      body = BlockGroup
      fields = {"members": tuple(tuple(sorted(self._block_fields(kind, mlp_kind).items()))
                                 for kind, mlp_kind in zip(kinds, mlp_kinds)),
                "block_class": self._block_class(True), "return_kv": wants_kv}
    return body, fields

  def _scan(self, period: int, groups: int, wants_kv: bool) -> Any:
    """The `layers` scan over `groups` steps of `_scan_body`'s module."""
    body, fields = self._scan_body(period, wants_kv)
    # The adapters (models/lora.py) are stacked like the parameters, and so are a layer's
    # statistics (a mixture of experts' routing); each layer draws its own LoRA dropout.
    return nn.scan(body, variable_axes={"params": 0, LORA_COLLECTION: 0, STATISTICS: 0},
                   split_rngs={"params": True, "dropout": True},
                   in_axes=(nn.broadcast, nn.broadcast, 0), length=groups,
                   metadata_params={nn.PARTITION_NAME: "layers"})(**fields, name="layers")

  def _unrolled_layers(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                       layers: range, caches: list[Any] | None,
                       wants_kv: bool) -> tuple[jax.Array, list[Any]]:
    """The unrolled `layers` (the prefix before the scanned groups, the layers left over after
    them; every layer, unscanned), each its own `layer_N`: their output, and as
    `_scanned_layers` their cache arrays (one a layer, `caches` from the first) or (keys,
    values)."""
    kinds, mlp_kinds = self.kinds_by_layer(), self.mlp_kinds_by_layer()
    leftover = self._block_class(False)
    added = []
    for layer in layers:
      block = leftover(**self._block_fields(kinds[layer], mlp_kinds[layer]),
                       return_kv=wants_kv, name=f"layer_{layer}")
      if caches is not None:
        x, layer_cache = block((x, caches[len(added)]), positions, segment_ids)
        added.append(layer_cache)
      elif wants_kv:
        x, kv = block(x, positions, segment_ids)
        added.append(jax.tree.map(lambda a: a[None], kv))
      else:
        x = block(x, positions, segment_ids)
    return x, added

  # ---------------------------------------------------------------------------- layout

  @nn.nowrap
  def scanned_position(self, layer: int) -> tuple[tuple[str, ...], int] | None:
    """Where scanned layers keep layer `layer`'s parameters: (the keys of its stacked
    subtree, its row there), or None where it is unrolled (the prefix, a layer left over)."""
    start, stop = self.scanned_span()
    if not start <= layer < stop:
      return None
    period, _ = self.scan_plan()
    if period == 1:
      return ("layers",), layer - start
    return ("layers", f"pattern_{(layer - start) % period}"), (layer - start) // period

  @nn.nowrap
  def to_own_layout(self, tree: Any) -> Any:
    """Stacks unrolled layers (`layer_0`, ...) or slices scanned ones, on host."""
    if not self.scan_layers:
      return layer_layout.unstack_layers(tree)
    period, _ = self.scan_plan()
    start, stop = self.scanned_span()
    return layer_layout.stack_layers(tree, period, stop - start, start)

  # ---------------------------------------------------------------------------- decode cache

  @nn.nowrap
  def cache_arrays(self, cache_length: int) -> list[kv_cache.CacheArray]:
    """The decode cache's arrays, in the order the layers read them (the module doc)."""
    kinds = self.kinds_by_layer()

    def array(layers: Sequence[int], stacked: bool) -> kv_cache.CacheArray:
      kind = kinds[layers[0]]
      sliding = kind == "sliding"
      entries = min(self.window, cache_length) if sliding else cache_length
      return kv_cache.CacheArray(tuple(layers), entries, sliding, stacked, kind)

    period, _ = self.scan_plan()
    start, stop = self.scanned_span()
    first = [array((layer,), False) for layer in range(start)]
    scanned = [array(range(start + member, stop, period), True)
               for member in range(period if stop > start else 0)]
    return first + scanned + [array((layer,), False) for layer in range(stop, self.num_layers)]

  @nn.nowrap
  def cache_widths(self) -> tuple[int, int, int]:
    """What a cache entry holds (models/kv_cache.py): (heads, key width, value width)."""
    return self.resolved_num_kv_heads, self.resolved_head_dim, self.resolved_head_dim

  @nn.nowrap
  def cache_layout(self) -> str:
    """How each layer's keys and values are laid out (models/kv_cache.py): decided by the
    decode forms of its kernel on the active target (`attention_kernels.cache_layout`): by
    head where the TPU's paged kernel decodes them, by position elsewhere."""
    return attention_kernels.cache_layout(self.resolved_attention_implementation(),
                                          self.attention_call())

  @nn.nowrap
  def cache_axes(self) -> tuple[str | None, ...]:
    """The logical axes of each layer's keys and values."""
    return kv_cache.axes(self.cache_layout())

  @nn.nowrap
  def empty_cache(self, slots: int, cache_length: int) -> kv_cache.KVCache:
    return kv_cache.empty(self, self.cache_arrays(cache_length), slots)

  @nn.nowrap
  def cache_logical_specs(self) -> kv_cache.KVCache:
    return kv_cache.logical_specs(self, self.cache_arrays(1))

  @nn.nowrap
  def cache_shapes(self, slots: int, cache_length: int) -> list[ArrayShape]:
    return kv_cache.array_shapes(self, self.cache_arrays(cache_length), slots)

  @nn.nowrap
  def prefill(self, params: Any, tokens: jax.Array, lengths: jax.Array,
              cache: kv_cache.KVCache, insert: jax.Array) -> tuple[jax.Array, kv_cache.KVCache]:
    """The prompts' pass (no cache read: a prompt attends to itself, within a sliding layer's
    window), then their keys and values written into the inserted slots: a full layer's at
    entries [0, bucket), a sliding layer's last positions at their ring entries."""
    logits, new_kv = self.apply({"params": params}, tokens, output_index=lengths - 1,
                                return_kv=True)
    # Which layers each array holds and whether it is a ring: the same at any length.
    arrays = self.cache_arrays(1)
    return logits, kv_cache.write_prefix(cache, new_kv, arrays, lengths, insert,
                                         self.cache_layout())

  @nn.nowrap
  def extend(self, params: Any, tokens: jax.Array, positions: jax.Array,
             cache: kv_cache.KVCache) -> tuple[jax.Array, kv_cache.KVCache]:
    logits, cache = self.apply({"params": params}, tokens, positions=positions,
                               cache=tuple(cache))
    return logits, kv_cache.KVCache(*cache)

