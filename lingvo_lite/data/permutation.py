"""A keyed permutation of [0, n) in O(1) memory: the shuffle of a token store's examples.

`np.random.permutation(n)` holds n int64s (1.6 GB for 200M examples) and takes O(n) time
before the first batch. A Feistel network over the smallest even number of bits that covers
n is a bijection of [0, 2^bits) for any round function; "cycle walking" (applying it again
to an output >= n until it lands below n) restricts it to a bijection of [0, n). Each index
is mapped independently, so any batch of any epoch is computed directly (exact resume), in
time proportional to the batch alone. Expected walks per index are below 2 (2^bits < 4n).
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 4  # Four rounds make a Feistel network a strong pseudorandom permutation.
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
  """splitmix64's finalizer: a cheap, well-distributed 64-bit hash, vectorized."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def round_keys(*key: int) -> np.ndarray:
  """Per-round 64-bit keys from a tuple of non-negative ints (seed, epoch, ...)."""
  state = np.uint64(0x9E3779B97F4A7C15)
  with np.errstate(over="ignore"):
    for part in key:
      state = _mix(np.asarray(state ^ np.uint64(int(part) & 0xFFFFFFFFFFFFFFFF)))
    return np.array([_mix(np.asarray(state + np.uint64(r + 1))) for r in range(_ROUNDS)],
                    dtype=np.uint64)


class KeyedPermutation:
  """A bijection of [0, size), fixed by `key` (for a shuffle: (seed, epoch))."""

  def __init__(self, size: int, *key: int):
    if size < 1:
      raise ValueError(f"size={size}: a permutation needs at least one element")
    self.size = size
    bits = max(2, (size - 1).bit_length())
    bits += bits % 2
    self._half = np.uint64(bits // 2)
    self._half_mask = np.uint64((1 << (bits // 2)) - 1)
    self._keys = round_keys(*key)

  def _feistel(self, x: np.ndarray) -> np.ndarray:
    left, right = x >> self._half, x & self._half_mask
    with np.errstate(over="ignore"):
      for key in self._keys:
        left, right = right, left ^ (_mix(right ^ key) & self._half_mask)
    return (left << self._half) | right

  def __call__(self, indices: np.ndarray) -> np.ndarray:
    """The images of `indices` (int array, each in [0, size)); same shape, int64."""
    x = np.asarray(indices, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= self.size):
      raise IndexError(f"indices outside [0, {self.size})")
    out = self._feistel(x.astype(np.uint64))
    outside = out >= np.uint64(self.size)
    while outside.any():  # Cycle walking: at most a few passes over a shrinking subset.
      out[outside] = self._feistel(out[outside])
      outside = out >= np.uint64(self.size)
    return out.astype(np.int64)
