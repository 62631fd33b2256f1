"""Rotary position embedding: the inverse frequencies of a base and a scaling, and the rotation
of each head's features by them.

A scaling is a tuple whose first item names it (the `scaling` argument below; `()` for none).
Every scaling is computed on the host in float32, as transformers computes it (its
`modeling_rope_utils`), so that a pretrained model's positions are the ones it was trained
with to the last ulp:

- ("llama3", factor, low_freq_factor, high_freq_factor, original_max_length): Llama 3.1's.
  Wavelengths shorter than original / high_freq_factor keep their frequency, those longer
  than original / low_freq_factor are divided by `factor`, and the band between moves
  smoothly from one to the other.
- ("linear", factor): every frequency divided by `factor` (positions interpolated): Gemma 3
  4B and larger on their global layers.
- ("yarn", factor, original_max_length, beta_fast, beta_slow, attention_factor[, truncate]):
  YaRN (OLMo 3's global layers, Qwen3's long context, gpt-oss): frequencies between the two
  correction dimensions blended from interpolated to original, and sin and cos multiplied by
  `attention_factor` (which scales the attention logits by its square); the correction
  dimensions rounded to whole ones unless `truncate` is False (gpt-oss's config).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

RotaryStyle = Literal["interleaved", "half"]


def _yarn(rotary_dim: int, base: float, factor: float, original: int, beta_fast: float,
          beta_slow: float, truncate: bool = True) -> np.ndarray:
  """YaRN's blend of interpolated (inv_freq / factor) and original frequencies: dimensions
  that turn fewer than `beta_slow` times over the original context are interpolated, those
  that turn more than `beta_fast` times keep theirs, linearly in between (transformers'
  `_compute_yarn_parameters`, with its truncation of the correction range to whole
  dimensions where `truncate`)."""
  def correction_dim(rotations: float) -> float:
    return (rotary_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, rotary_dim - 1)
  if low == high:
    high += 0.001  # As transformers does: no division by zero.
  ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float32) - np.float32(low))
                 / np.float32(high - low), 0, 1).astype(np.float32)
  extrapolation = np.float32(1) - ramp
  periods = np.float32(base) ** (np.arange(0, rotary_dim, 2, dtype=np.float32)
                                 / np.float32(rotary_dim))
  original_freq = np.float32(1) / periods
  interpolated = np.float32(1) / (np.float32(factor) * periods)
  return (interpolated * (np.float32(1) - extrapolation)
          + original_freq * extrapolation).astype(np.float32)


def inverse_frequencies(rotary_dim: int, base: float, scaling: tuple[Any, ...] = ()
                        ) -> np.ndarray:
  """float32 [rotary_dim // 2]: base^(-2i / rotary_dim), rescaled by `scaling` (the module
  doc lists the kinds)."""
  exponents = np.arange(0, rotary_dim, 2, dtype=np.float32) / np.float32(rotary_dim)
  inv_freq = np.float32(1) / (np.float32(base) ** exponents)
  if not scaling:
    return inv_freq
  kind = scaling[0]
  if kind == "linear":
    return (inv_freq / np.float32(scaling[1])).astype(np.float32)
  if kind == "yarn":
    _, factor, original, beta_fast, beta_slow, _, *truncate = scaling
    return _yarn(rotary_dim, base, factor, original, beta_fast, beta_slow, *truncate)
  _, factor, low, high, original = scaling
  factor, low, high, original = (np.float32(v) for v in (factor, low, high, original))
  wavelength = np.float32(2 * math.pi) / inv_freq
  scaled = np.where(wavelength > original / low, inv_freq / factor, inv_freq)
  smooth = (original / wavelength - low) / (high - low)
  smoothed = (np.float32(1) - smooth) * scaled / factor + smooth * scaled
  between = (wavelength >= original / high) & (wavelength <= original / low)
  return np.where(between, smoothed, scaled).astype(np.float32)


def attention_factor(scaling: tuple[Any, ...]) -> float:
  """What sin and cos are multiplied by: YaRN's attention factor, else 1."""
  return float(scaling[5]) if scaling and scaling[0] == "yarn" else 1.0


def sin_cos(positions: jax.Array, rotary_dim: int, base: float,
            scaling: tuple[Any, ...] = ()) -> tuple[jax.Array, jax.Array]:
  """Returns sin and cos of shape [batch, length, rotary_dim // 2] in float32.

  The inverse frequencies are a constant computed on the host in float32 arithmetic, as the
  reference implementations compute them (transformers: float32 `base ** (2i / d)`): XLA's
  in-program power differs from it by an ulp here and there, which at position 600 moves a
  pretrained model's logits by ~1e-4.
  """
  inv_freq = inverse_frequencies(rotary_dim, base, scaling)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  factor = attention_factor(scaling)
  if factor != 1.0:
    sin, cos = sin * np.float32(factor), cos * np.float32(factor)
  return sin, cos


def apply(x: jax.Array, sin: jax.Array, cos: jax.Array, style: RotaryStyle) -> jax.Array:
  """Rotates the first `2 * sin.shape[-1]` features of each head; the rest pass through.

  Args:
    x: [batch, length, heads, head_dim].
    sin, cos: [batch, length, rotary_dim // 2].
    style: "interleaved" rotates pairs (x0, x1), (x2, x3), ... as GPT-J does;
      "half" pairs feature i with i + rotary_dim / 2 as Llama and GPT-NeoX do.
  """
  rotary_dim = 2 * sin.shape[-1]
  rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
  sin = sin[:, :, None, :].astype(x.dtype)
  cos = cos[:, :, None, :].astype(x.dtype)
  if style == "interleaved":
    pairs = rot.reshape(*rot.shape[:-1], rotary_dim // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1)
    rotated = rotated.reshape(rot.shape)
  else:
    first, second = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2:]
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  if rest.shape[-1] == 0:
    return rotated
  return jnp.concatenate([rotated, rest], axis=-1)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
  """Position of each token within its segment (restarts at 0 where the segment changes): the
  positions a packed row's rotation (or learned embedding) reads."""
  length = segment_ids.shape[-1]
  index = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), segment_ids.shape)
  starts = jnp.concatenate(
      [jnp.ones_like(segment_ids[:, :1], dtype=jnp.bool_),
       segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  segment_start = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  return index - segment_start
