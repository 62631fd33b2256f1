"""Each token's log-probability given the tokens before it, for many sequences at once.

Sequences are packed into rows (scoring/row_packing.py), each its own segment: the model's
attention mask keeps a segment to itself and its positions restart at 0, so a packed
sequence's log-probabilities are those it has alone (tests/scoring check it). Rows come in a
few lengths (powers of two from 64 up to the model's context): the shortest that holds the
longest sequence, since attention costs the square of a row's length, so many short requests
go in many short rows. A call holds at most about `tokens_per_call` tokens (its rows times their
length, at least the data-parallel size of rows), which bounds the [tokens, vocabulary]
logits in memory; its rows are the data-parallel size times a power of two, the smallest
that holds what is to score: a few compiled shapes per row length (twice that where the top
alternatives are asked for too).
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
from lingvo_lite.scoring.row_packing import pack

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
      most probable first (None where they were not asked for).
  """

  logprobs: np.ndarray
  greedy: np.ndarray
  top_ids: np.ndarray | None
  top_logprobs: np.ndarray | None


def score_rows(params: Any, tokens: jax.Array, segment_ids: jax.Array, *, model: Any,
               top: bool) -> tuple[jax.Array, ...]:
  """Per position p of each row, for the token at p + 1: (its log-probability, whether it is
  the argmax) and, with `top`, (the top TOP_K ids, their log-probabilities). Shapes
  [rows, length - 1] and [rows, length - 1, TOP_K]; entries that cross a segment boundary are
  meaningless."""
  logits = model.apply({"params": params}, tokens, segment_ids)[:, :-1].astype(jnp.float32)
  # log p = logit - logsumexp: no second [rows, length, vocabulary] array of log-probabilities.
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
  target = target_logit - log_z
  if not top:  # A top-k over the vocabulary costs more than the max a greedy check needs.
    return target, target_logit >= jnp.max(logits, axis=-1)
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

  def __init__(self, steps: DecodeSteps, params: Any, tokens_per_call: int = 4096):
    """
    Args:
      steps: The decode functions of the same Setup and mesh (their parameter shardings, mesh
        and axis rules are used; `params` must already be placed in them).
      params: The model's parameters, placed (as the generator places them).
      tokens_per_call: About how many tokens one call scores (rows x row length; at least
        the data-parallel size of rows).
    """
    setup = steps.setup
    self.model = steps.model  # The decode functions' model: `params` are in its layout.
    self.max_length = self.model.max_length
    self._steps = steps
    self.params = params
    self._ways = setup.partitioner.data_parallel_size(dict(steps.mesh.shape))
    if tokens_per_call < 1:
      raise ValueError(f"tokens_per_call={tokens_per_call}: give a positive number")
    self.tokens_per_call = tokens_per_call
    self._row_sharding = setup.partitioner.logical_to_sharding(
        PartitionSpec("batch", None), steps.mesh)
    self._score = {top: jax.jit(functools.partial(score_rows, model=self.model, top=top),
                                in_shardings=(steps.param_shardings, self._row_sharding,
                                              self._row_sharding))
                   for top in (False, True)}
    self.compiled_lengths: set[int] = set()

  def rows_for(self, row_length: int) -> int:
    """The most rows a call takes at `row_length`: `tokens_per_call` worth, a multiple of
    the data-parallel size, at least one row per data-parallel way."""
    rows = max(1, self.tokens_per_call // row_length)
    return max(self._ways, rows // self._ways * self._ways)

  def _rows(self, row_length: int, used: int) -> int:
    """Rows for a call that has `used` rows to score: the data-parallel size times the
    smallest power of two that holds them, at most `rows_for` (a few compiled shapes, and a
    call of a few short requests does not pay for the budget's worth of padding rows)."""
    most = self.rows_for(row_length)
    rows = self._ways
    while rows < min(used, most):
      rows *= 2
    return min(rows, most)

  @property
  def mesh(self) -> Mesh:
    return self._steps.mesh

  def score(self, sequences: Sequence[Sequence[int]], top: bool = True) -> list[Scores]:
    """The scores of each sequence (1 to model.max_length ids), in input order; without
    `top`, no alternatives (`top_ids` and `top_logprobs` are None): cheaper."""
    sequences = [np.asarray(s, np.int32) for s in sequences]
    if not sequences:
      return []
    for s in sequences:
      if not 1 <= len(s) <= self.max_length:
        raise ValueError(f"a sequence of {len(s)} tokens: scoring takes 1 to "
                         f"model.max_length={self.max_length}")
    lengths = [len(s) for s in sequences]
    row_length = next(n for n in row_lengths(self.max_length) if n >= max(lengths))
    placements, used_rows = pack(lengths, row_length)
    rows = self._rows(row_length, used_rows)
    calls = math.ceil(used_rows / rows)
    tokens = np.zeros((calls * rows, row_length), np.int32)
    segments = np.zeros_like(tokens)  # Padding is segment 0, apart from every sequence.
    for sequence, place in zip(sequences, placements):
      tokens[place.row, place.offset:place.offset + len(sequence)] = sequence
      segments[place.row, place.offset:place.offset + len(sequence)] = place.segment
    outputs = []
    with self._steps.activated():
      for call in range(calls):
        chosen = slice(call * rows, (call + 1) * rows)
        outputs.append(jax.device_get(
            self._score[top](self.params, tokens[chosen], segments[chosen])))
    self.compiled_lengths.add(row_length)
    arrays = [np.concatenate(parts) for parts in zip(*outputs)]
    target, greedy = arrays[:2]
    top_ids, top_logprobs = arrays[2:] if top else (None, None)
    results = []
    for sequence, place in zip(sequences, placements):
      # Position p predicts token p + 1: a sequence at [offset, offset + n) is scored by
      # positions offset .. offset + n - 2.
      span = slice(place.offset, place.offset + len(sequence) - 1)
      results.append(Scores(
          logprobs=target[place.row, span], greedy=greedy[place.row, span],
          top_ids=None if top_ids is None else top_ids[place.row, span],
          top_logprobs=None if top_logprobs is None else top_logprobs[place.row, span]))
    return results
