"""One attention kernel as a row of the table (`attention_kernels.KERNELS`): what it runs on,
what it takes, what it holds, and how it attends in training and in a decode step.

A row's rules read the facts of a call (`Call`: the target, the dtype, the head width, the
masks, the length) and never another row's name; what a row cannot take goes to the row it
names as its fallback, so the layer that asks never branches on a kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax

# What a query's mask may hold beyond causal, which a row applies itself or leaves to its
# fallback: packed documents (segment ids), a sliding window, gpt-oss's sink logits.
MASKS = frozenset({"segments", "window", "sinks"})
PLATFORMS = ("cpu", "gpu", "tpu")
# The decode cache's layouts of keys and values by head that a form may read
# (models/kv_cache.py stores them): "heads" [slots, kv_heads, entries, head_dim], each head's
# entries together (the TPU's paged kernel reads pages of one head); "positions" [slots,
# entries, kv_heads * head_dim], every head of an entry together (no padding of a few narrow
# heads in the TPU's tiles). A family's own layout (latent attention's) is another name.
HEADS = "heads"
POSITIONS = "positions"


@dataclasses.dataclass(frozen=True)
class Call:
  """The facts of an attention call that the rows' rules read.

  Attributes:
    platform: The target's: "cpu", "gpu" or "tpu".
    device_kind: Its devices' kind ("NVIDIA H100", "TPU v5 lite"); "" where not read.
    compute_capability: An NVIDIA GPU's ("9.0"); "0" where unknown.
    dtype: The compute dtype's name.
    head_dim: Each head's width.
    masks: What the mask holds beyond causal (of `MASKS`).
    length: The queries' length (a training or prefill call's); None for any (a model's
      check, before there is a call).
    path: The model's config path, for the words of a refusal.
  """

  platform: str
  device_kind: str = ""
  compute_capability: str = "0"
  dtype: str = "float32"
  head_dim: int = 0
  masks: frozenset[str] = frozenset()
  length: int | None = None
  path: str = "model"


class DecodeStep(NamedTuple):
  """One decode step's attention, after the layer wrote the new tokens into its cache.

  Attributes:
    layer: The attention layer (`layers.Attention` or a family's subclass): its hooks say which
      entries a query sees (`_cache_mask`, `_cache_prefix`).
    q: The queries as the cache layout's forms take them; "heads" and "positions": scaled,
      [batch, length, kv_heads, group, head_dim].
    cache: This layer's cache arrays in `layout`; "heads": (keys, values), each [batch,
      kv_heads, entries, head_dim]; "positions": each [batch, entries, kv_heads * head_dim]
      (models/kv_cache.py). Entries are the second last axis in every layout.
    positions: int32 [batch, length], each query's position.
    sinks: The layer's `sinks()`, or None.
    layout: The cache's layout (the layer's `cache_layout`).
  """

  layer: Any
  q: jax.Array
  cache: tuple[jax.Array, ...]
  positions: jax.Array
  sinks: jax.Array | None
  layout: str = HEADS


@dataclasses.dataclass(frozen=True)
class DecodeForm:
  """How a kernel attends in a decode step.

  Attributes:
    layouts: The cache layouts it reads (`HEADS`, `POSITIONS`, or a family's own). A layer
      declares its cache's (`Attention.cache_layout`), and a decode step takes the first
      form, along its kernel's decode fallbacks, that reads it.
    attend: The step's output, [batch, length, heads, head_dim] in the layer's dtype.
    fits: Whether this step has the form's shape (a query length, a cache dtype, entries a
      page divides); a step it does not fit goes to the kernel's `decode_fallback`.
    keeps: The layout a model's cache is made in where this form decodes the model's steps on
      a target (`Call`: its platform, dtype, head width; before any step), or None where it
      does not (the next form along the kernel's decode fallbacks says); None: the first of
      `layouts`, for every model. `attention_kernels.cache_layout` asks it.
  """

  layouts: tuple[str, ...]
  attend: Callable[[DecodeStep], jax.Array]
  fits: Callable[[DecodeStep], bool] = lambda step: True
  keeps: Callable[[Call], str | None] | None = None

  def cache_layout(self, call: Call) -> str | None:
    """The layout a model decoded by this form on `call`'s target keeps, or None."""
    return self.layouts[0] if self.keeps is None else self.keeps(call)


def _takes_every_length(length: int) -> bool:
  del length
  return True


def _refuses_nothing(call: Call) -> str | None:
  del call
  return None


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One attention kernel: a row of `attention_kernels.KERNELS`.

  Attributes:
    name: What `model.attention_implementation` names it by.
    description: What it is, in a line (the README's and the help's words).
    platforms: Where it is compiled natively.
    interpreted_on: Where it also runs, interpreted (slow: what tests compare on a CPU).
    auto_on: Where "auto" may pick it; "auto" takes the first row of the table that may and
      that takes the model's calls.
    masks: What it applies beyond causal (of `row.MASKS`); a call needing more goes to
      `fallback`, and "auto" passes it over for a model that always does (sinks).
    holds_scores: Whether a training call holds the float32 [rows, heads, length, length]
      scores (`memory_fit.py` counts them).
    attend: Training's and prefill's attention, (layer, q, k, v, segment_ids, sinks) ->
      [batch, length, heads, head_dim]: q [batch, length, heads, head_dim] unscaled (the layer's
      `scale()`), k and v [batch, length, kv_heads, head_dim], segment_ids [batch, length] or
      None, sinks [heads] float32 or None. None: it has no training form (`fallback`'s).
    takes_length: Whether it takes queries of a length (a kernel's blocks must divide it); a
      call of another length goes to `fallback`.
    fallback: The row that attends the training calls this one cannot.
    decode: Its decode step; None: it has none (`decode_fallback`'s).
    decode_fallback: The row whose decode form a step takes where this one has none or does
      not fit it; None: the end of the chain (the written-out form, which takes every step).
    refusal: Why the model's calls (their platform, dtype, head width, device) are beyond it,
      or None: a named kernel that refuses is a one-line config error, and "auto" passes it by.
    auto_refusal: Why "auto" passes it by though it takes the calls (a limit it is not
      measured beyond), or None.
    value_width: Whether its training form takes values of another width than the queries'
      and keys' (latent attention's: DeepSeek-V3's keys are 192 wide, its values 128); a
      layer with such values pads them to the keys' width for a row that does not.
  """

  name: str
  description: str
  platforms: tuple[str, ...]
  interpreted_on: tuple[str, ...] = ()
  auto_on: tuple[str, ...] = ()
  masks: frozenset[str] = MASKS
  holds_scores: bool = True
  attend: Callable[..., jax.Array] | None = None
  takes_length: Callable[[int], bool] = _takes_every_length
  fallback: str = "einsum"
  decode: DecodeForm | None = None
  decode_fallback: str | None = "einsum"
  refusal: Callable[[Call], str | None] = _refuses_nothing
  auto_refusal: Callable[[Call], str | None] = _refuses_nothing
  value_width: bool = False

  def runs_on(self, platform: str) -> bool:
    return platform in self.platforms or platform in self.interpreted_on

  def problem(self, call: Call) -> str | None:
    """Why this kernel cannot attend the model's calls on `call`'s target: its own refusal,
    or a platform it does not run on."""
    refusal = self.refusal(call)
    if refusal or self.runs_on(call.platform):
      return refusal
    where = " or ".join(self.platforms)
    if self.interpreted_on:
      where += f" (interpreted on {' or '.join(self.interpreted_on)})"
    return f"runs on {where}, not on {call.platform}"

  def takes(self, call: Call) -> bool:
    """Whether a call's masks and length are within this kernel's training form."""
    return (self.attend is not None and call.masks <= self.masks
            and (call.length is None or self.takes_length(call.length)))


@dataclasses.dataclass(frozen=True)
class Choice:
  """The kernel a model's training calls run on a target, and why (what the train program logs
  and the memory check reads).

  Attributes:
    name: The row the layers are built with (`attention_implementation`, "auto" resolved).
    runs: The row that attends the model's calls: `name`'s, or its fallback's where the model's
      masks are beyond it (a call's length may still go further: a short prefill bucket).
    why: "auto on tpu", what "auto" passed by, or why a named row falls back; "" for none.
    scoreless: The kernels for this target that take the model's calls and hold no scores
      (the memory check's advice); () for none.
  """

  name: str
  runs: Kernel
  why: str = ""
  scoreless: tuple[str, ...] = ()

  def __str__(self) -> str:
    return f"{self.runs.name} ({self.why})" if self.why else self.runs.name
