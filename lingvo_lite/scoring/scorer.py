"""Each token's log-probability given the tokens before it, for many sequences at once.

Sequences are packed into rows (scoring/packing.py), each its own segment: the model's
attention mask keeps a segment to itself and its positions restart at 0, so a packed
sequence's log-probabilities are those it has alone (tests/scoring check it). Rows come in a
few lengths (powers of two from 64 up to the model's context), so a caller's many lengths
share a few compiled functions; the number of rows per call is fixed (the data-parallel size
unless asked), so logits of [rows, length, vocabulary] stay within memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from lingvo_lite.decode.jitted import DecodeSteps
from lingvo_lite.scoring.packing import pack

# OpenAI's completions API returns at most 5 alternatives per token; a fixed k keeps shapes.
TOP_K = 5
_SHORTEST_ROW = 64


@dataclasses.dataclass(frozen=True)
class Scores:
  """One sequence's scores, one entry per token after the first.

  Attributes:
    logprobs: float32 [n - 1]: log p(token i | tokens before i), for i = 1 .. n - 1.
    greedy: bool [n - 1]: token i is the most probable one there (a tie counts).
    top_ids, top_logprobs: int32 / float32 [n - 1, TOP_K]: the most probable tokens there,
      most probable first.
  """

  logprobs: np.ndarray
  greedy: np.ndarray
  top_ids: np.ndarray
  top_logprobs: np.ndarray


def score_rows(params: Any, tokens: jax.Array, segment_ids: jax.Array, *, model: Any
               ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per position p of each row, for the token at p + 1: (its log-probability, whether it is
  the argmax, the top TOP_K ids, their log-probabilities). Shapes [rows, length - 1] and
  [rows, length - 1, TOP_K]; entries that cross a segment boundary are meaningless."""
  logits = model.apply({"params": params}, tokens, segment_ids)[:, :-1].astype(jnp.float32)
  # log p = logit - logsumexp: no second [rows, length, vocabulary] array of log-probabilities.
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0] - log_z
  top_logits, top_ids = jax.lax.top_k(logits, TOP_K)
  top_logprobs = top_logits - log_z[..., None]
  return target, target >= top_logprobs[..., 0], top_ids.astype(jnp.int32), top_logprobs


def row_lengths(max_length: int) -> tuple[int, ...]:
  """The row lengths scoring is compiled for: powers of two from 64, then the context."""
  ladder, size = [], _SHORTEST_ROW
  while size < max_length:
    ladder.append(size)
    size *= 2
  return tuple(ladder) + (max_length,)


class Scorer:
  """Scores sequences with one model's parameters on a mesh (see the module doc)."""

  def __init__(self, steps: DecodeSteps, params: Any, rows: int | None = None):
    """
    Args:
      steps: The decode functions of the same Setup and mesh (their parameter shardings, mesh
        and axis rules are used; `params` must already be placed in them).
      params: The model's parameters, placed (as the generator places them).
      rows: Rows per call; a multiple of the data-parallel size (None: that size).
    """
    setup = steps.setup
    self.model = setup.model
    self.max_length = self.model.max_length
    self._steps = steps
    self.params = params
    ways = setup.partitioner.data_parallel_size(dict(steps.mesh.shape))
    self.rows = rows or ways
    if self.rows % ways:
      raise ValueError(f"rows={self.rows} must be a multiple of the data-parallel size {ways}")
    self._row_sharding = setup.partitioner.logical_to_sharding(
        PartitionSpec("batch", None), steps.mesh)
    self._score = jax.jit(functools.partial(score_rows, model=self.model),
                          in_shardings=(steps.param_shardings, self._row_sharding,
                                        self._row_sharding))
    self.compiled_lengths: set[int] = set()

  @property
  def mesh(self) -> Mesh:
    return self._steps.mesh

  def _row_length(self, lengths: Sequence[int]) -> int:
    """The shortest compiled row length that holds the longest sequence and, if it can, all
    the tokens in one call."""
    need = max(max(lengths), math.ceil(sum(lengths) / self.rows))
    return next(n for n in row_lengths(self.max_length) if n >= min(need, self.max_length))

  def score(self, sequences: Sequence[Sequence[int]]) -> list[Scores]:
    """The scores of each sequence (1 to model.max_length ids), in input order."""
    sequences = [np.asarray(s, np.int32) for s in sequences]
    if not sequences:
      return []
    for s in sequences:
      if not 1 <= len(s) <= self.max_length:
        raise ValueError(f"a sequence of {len(s)} tokens: scoring takes 1 to "
                         f"model.max_length={self.max_length}")
    lengths = [len(s) for s in sequences]
    row_length = self._row_length(lengths)
    placements, used_rows = pack(lengths, row_length)
    calls = math.ceil(used_rows / self.rows)
    tokens = np.zeros((calls * self.rows, row_length), np.int32)
    segments = np.zeros_like(tokens)  # Padding is segment 0, apart from every sequence.
    for sequence, place in zip(sequences, placements):
      tokens[place.row, place.offset:place.offset + len(sequence)] = sequence
      segments[place.row, place.offset:place.offset + len(sequence)] = place.segment
    outputs = []
    with self._steps.activated():
      for call in range(calls):
        rows = slice(call * self.rows, (call + 1) * self.rows)
        outputs.append(jax.device_get(self._score(self.params, tokens[rows], segments[rows])))
    self.compiled_lengths.add(row_length)
    target, greedy, top_ids, top_logprobs = (np.concatenate(parts) for parts in zip(*outputs))
    results = []
    for sequence, place in zip(sequences, placements):
      # Position p predicts token p + 1: a sequence at [offset, offset + n) is scored by
      # positions offset .. offset + n - 2.
      span = slice(place.offset, place.offset + len(sequence) - 1)
      results.append(Scores(logprobs=target[place.row, span], greedy=greedy[place.row, span],
                            top_ids=top_ids[place.row, span],
                            top_logprobs=top_logprobs[place.row, span]))
    return results
