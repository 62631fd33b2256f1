"""Per-row token sampling for a jitted decode loop: temperature, top-k and top-p (nucleus).

Each decode step turns the model's last logits [B, V] into one token per row. Every setting
is a per-row array in `SamplingParams`, never a static jit argument, so a new value, or a
batch whose rows mix greedy and sampled decoding, reuses the one compiled step.

The warpers apply in Hugging Face `generate`'s order: temperature, then top-k, then top-p
(TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper); the token is a draw from the
softmax of what survives. A row with temperature 0 is greedy: the argmax of the raw logits,
its top_k and top_p ignored.

Log-probabilities are not computed here: the decoder reports log_softmax of the raw logits,
so what it reports does not depend on the sampling settings that chose the token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class SamplingParams(NamedTuple):
  """Per-row sampling settings, a pytree whose every field has shape [batch].

  Attributes:
    temperature: float32; 0 means greedy (argmax of the raw logits, top_k and top_p
      ignored).
    top_k: int32; 0 (or >= the vocabulary size) means off; otherwise keep the logits that
      reach the k-th largest, ties with it included (TopKLogitsWarper).
    top_p: float32 in (0, 1]; 1 means off; otherwise keep the smallest set of most probable
      tokens whose probability reaches top_p: a token is kept iff the probability of the
      tokens strictly more probable than it is < top_p (TopPLogitsWarper; the most probable
      token is always kept).
  """
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array


def _per_row(name: str, value: float | int | Sequence[float | int] | np.ndarray | jax.Array,
             batch: int, dtype: type) -> np.ndarray:
  """`value` as a [batch] array of `dtype`: a scalar is broadcast, a sequence kept."""
  array = np.asarray(value)
  if dtype is np.int32 and not np.array_equal(array, np.round(array)):
    raise ValueError(f"sampling_params: {name}={array.tolist()} must be integers.")
  if array.ndim == 0:
    return np.full((batch,), array, dtype)
  if array.shape != (batch,):
    raise ValueError(f"sampling_params: {name} has shape {array.shape}; give a scalar or "
                     f"one value per row, shape ({batch},).")
  return array.astype(dtype)


def sampling_params(batch: int, temperature: float | Sequence[float] = 0.0,
                    top_k: int | Sequence[int] = 0,
                    top_p: float | Sequence[float] = 1.0) -> SamplingParams:
  """Per-row settings from scalars (broadcast to every row) or one value per row.

  Checked here, on the host, because the jitted functions cannot raise on a bad value.

  Args:
    batch: the number of rows.
    temperature: >= 0; 0 means greedy.
    top_k: >= 0; 0 means off.
    top_p: in (0, 1]; 1 means off.

  Returns:
    The settings as [batch] arrays: temperature float32, top_k int32, top_p float32.

  Raises:
    ValueError: a setting has the wrong shape or a value out of its range.
  """
  temperature = _per_row("temperature", temperature, batch, np.float32)
  top_k = _per_row("top_k", top_k, batch, np.int32)
  top_p = _per_row("top_p", top_p, batch, np.float32)
  # Written as `not (valid)` so that NaN, which fails every comparison, is refused too.
  if not np.all(temperature >= 0):
    raise ValueError(f"sampling_params: temperature={temperature.tolist()} must be >= 0 "
                     "(0 means greedy).")
  if not np.all(top_k >= 0):
    raise ValueError(f"sampling_params: top_k={top_k.tolist()} must be >= 0 (0 means off).")
  if not np.all((top_p > 0) & (top_p <= 1)):
    raise ValueError(f"sampling_params: top_p={top_p.tolist()} must be in (0, 1] "
                     "(1 means off).")
  return SamplingParams(jnp.asarray(temperature), jnp.asarray(top_k), jnp.asarray(top_p))


# Logits a filtering step sorts first: the cut of nearly every top-k or top-p setting lies
# among a row's most probable few hundred tokens, and a partial sort of those costs a small
# part of sorting the whole vocabulary (64 x 50257 on 2 CPU cores: 6 ms for 64, 30 ms for
# 1024, 520 ms for all).
CANDIDATES = 256


def _sorted_thresholds(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """The smallest logit each row keeps, float32 [B], from one descending sort.

  A threshold rather than a mask in sorted order: comparing every logit with it keeps all
  the tokens tied with the last kept one (in top-p as in top-k, so the result does not
  depend on how the sort orders equal values) and needs no scatter back to vocabulary order.
  """
  vocab = scaled.shape[-1]
  descending = jax.lax.top_k(scaled, vocab)[0]
  k = jnp.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
  kth = jnp.take_along_axis(descending, (k - 1)[:, None], axis=-1)
  # Top-p sees the top-k survivors only, as TopPLogitsWarper sees TopKLogitsWarper's output.
  probs = jax.nn.softmax(jnp.where(descending >= kth, descending, -jnp.inf), axis=-1)
  # An exclusive cumsum, not cumsum - probs: float32 rounding cannot make it decrease, so
  # the kept positions are exactly a prefix and counting them finds its end. At least one is
  # kept.
  mass_before = jnp.pad(jnp.cumsum(probs, axis=-1)[:, :-1], ((0, 0), (1, 0)))
  num_kept = jnp.maximum(jnp.sum(mass_before < top_p[:, None], axis=-1), 1)
  pth = jnp.take_along_axis(descending, (num_kept - 1)[:, None], axis=-1)
  # top_p == 1 is off outright: in float32 the mass before a token of tiny probability can
  # round up to 1 and would cut it. The max keeps the top-k cut whatever those sums do (the
  # mass before a top-k-removed token can fall short of a top_p near 1).
  return jnp.maximum(kth, jnp.where(top_p[:, None] >= 1, -jnp.inf, pth))[:, 0]


def _thresholds(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """`_sorted_thresholds`' result from the CANDIDATES largest logits of each row, when that
  decides it; else (some row's k is larger, or its top-p mass is not reached among them) from
  the full sort. Exact either way: the top of a full sort is the candidates, so every cut
  inside them is the same cut, and top-p's probabilities are normalized over the whole row
  (a logsumexp over the top-k survivors, no sort)."""
  vocab = scaled.shape[-1]
  if vocab <= CANDIDATES:
    return _sorted_thresholds(scaled, top_k, top_p)
  candidates = jax.lax.top_k(scaled, CANDIDATES)[0]
  k_off = (top_k <= 0) | (top_k >= vocab)
  k_inside = ~k_off & (top_k <= CANDIDATES)
  kth = jnp.where(k_inside[:, None], jnp.take_along_axis(
      candidates, (jnp.clip(top_k, 1, CANDIDATES) - 1)[:, None], axis=-1), -jnp.inf)
  log_z = jax.nn.logsumexp(jnp.where(scaled >= kth, scaled, -jnp.inf), axis=-1, keepdims=True)
  probs = jnp.where(candidates >= kth, jnp.exp(candidates - log_z), 0.0)
  mass_before = jnp.pad(jnp.cumsum(probs, axis=-1)[:, :-1], ((0, 0), (1, 0)))
  num_kept = jnp.maximum(jnp.sum(mass_before < top_p[:, None], axis=-1), 1)
  pth = jnp.take_along_axis(candidates, (num_kept - 1)[:, None], axis=-1)
  threshold = jnp.maximum(kth, jnp.where(top_p[:, None] >= 1, -jnp.inf, pth))[:, 0]
  # Undecided: a k past the candidates, or a top-p cut that may lie past them (every
  # candidate kept).
  undecided = (~k_off & ~k_inside) | ((top_p < 1) & (num_kept >= CANDIDATES))
  return jax.lax.cond(jnp.any(undecided),
                      lambda: _sorted_thresholds(scaled, top_k, top_p), lambda: threshold)


def filtered_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
  """Temperature-scaled, then top-k, then top-p filtered logits; removed entries are -inf.

  When no row filters (every top_k off and every top_p 1, or the row greedy) the [B, V]
  sort, which dominates a step on CPU, is skipped: greedy and plain-temperature decoding do
  not pay for it.

  Args:
    logits: float32 [B, V].
    params: the rows' settings, each field [B].

  Returns:
    float32 [B, V]. Greedy rows (temperature 0) hold their raw logits, unfiltered, so their
    argmax is the raw argmax.
  """
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  greedy = params.temperature <= 0
  # Greedy rows divide by 1, not 0: an inf or nan there could leak into the row sums below.
  temperature = jnp.where(greedy, 1.0, params.temperature)
  # Shifted by the row's max first (the softmax does not change): a tiny temperature then
  # sends the others to -inf, instead of every logit to +-inf (and the draw to token 0).
  scaled = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature[:, None]
  filters = ~greedy & (((params.top_k > 0) & (params.top_k < vocab)) | (params.top_p < 1))

  def filter_rows(scaled: jax.Array) -> jax.Array:
    threshold = _thresholds(scaled, params.top_k, params.top_p)
    # Rows that do not filter keep everything, whatever the float32 sums said.
    threshold = jnp.where(filters, threshold, -jnp.inf)
    return jnp.where(scaled >= threshold[:, None], scaled, -jnp.inf)

  kept = jax.lax.cond(jnp.any(filters), filter_rows, lambda scaled: scaled, scaled)
  return jnp.where(greedy[:, None], logits, kept)


def sample(logits: jax.Array, params: SamplingParams, keys: jax.Array) -> jax.Array:
  """One token per row: the raw argmax for greedy rows, else a draw from the filtered logits.

  Each row draws with its own key only, so a row's token depends on its logits, settings and
  key, never on the other rows in the batch.

  Args:
    logits: float32 [B, V].
    params: the rows' settings, each field [B].
    keys: [B] typed PRNG keys (`jax.random.key`), one per row; the caller derives each from
      a seed and the row's position so the row is reproducible.

  Returns:
    int32 [B] token ids.
  """
  greedy = params.temperature <= 0
  argmax = jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def draw(logits: jax.Array) -> jax.Array:
    filtered = filtered_logits(logits, params)
    return jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)

  # An all-greedy batch skips the Gumbel noise too: [B, V] random bits cost more than argmax.
  drawn = jax.lax.cond(jnp.all(greedy), lambda logits: argmax, draw, logits)
  return jnp.where(greedy, argmax, drawn)
