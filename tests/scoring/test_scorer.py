"""Scoring: packed log-probabilities equal a plain JAX computation over the model's logits for
each sequence alone, and equal the same sequences scored unpacked; packing keeps every sequence
whole and apart."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.scoring.row_packing import pack
from lingvo_lite.scoring.scorer import TOP_K, row_lengths
from lingvo_lite.serving import loaded_model
from lingvo_lite.training.train_state import strip_boxes

TEXTS = ("def main():\n    return 1\n", "import os\n", "x = [i for i in range(10)]\nprint(x)\n",
         "a", "class A:\n    pass\n", "for k, v in d.items():\n    print(k, v)\n")


@pytest.fixture(scope="module")
def model(tiny_job):
  return loaded_model.from_job(str(tiny_job / "runs/tiny"), score_tokens=128)


def _reference(model, ids):
  """log_softmax of the model's logits for the sequence alone (no segments, no padding)."""
  logits = jax.jit(lambda p, t: model.setup.model.apply({"params": p}, t))(
      strip_boxes(model.generator.params), jnp.asarray([ids], jnp.int32))
  return np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1))


def test_packed_scores_equal_a_plain_computation_and_unpacked_scores(model):
  sequences = [model.encode(text) for text in TEXTS]
  assert len(sequences[3]) == 1  # Nothing to predict: an empty score.
  packed = model.scorer.score(sequences)
  alone = [model.scorer.score([s])[0] for s in sequences]
  cheap = model.scorer.score(sequences, top=False)  # No alternatives: the greedy check by max.
  for ids, scores, single, plain in zip(sequences, packed, alone, cheap):
    assert plain.top_ids is None and plain.top_logprobs is None
    np.testing.assert_allclose(plain.logprobs, scores.logprobs, atol=2e-5)
    np.testing.assert_array_equal(plain.greedy, scores.greedy)
    assert scores.logprobs.shape == (len(ids) - 1,)
    assert scores.top_ids.shape == (len(ids) - 1, TOP_K)
    if len(ids) == 1:
      continue
    reference = _reference(model, ids)[:-1]
    want = reference[np.arange(len(ids) - 1), ids[1:]]
    np.testing.assert_allclose(scores.logprobs, want, atol=2e-5)
    np.testing.assert_allclose(scores.logprobs, single.logprobs, atol=2e-5)
    np.testing.assert_array_equal(scores.greedy, want >= reference.max(axis=-1) - 1e-6)
    top = np.sort(reference, axis=-1)[:, ::-1][:, :TOP_K]
    np.testing.assert_allclose(scores.top_logprobs, top, atol=2e-5)
    np.testing.assert_allclose(np.take_along_axis(reference, scores.top_ids, axis=-1),
                               scores.top_logprobs, atol=2e-5)


def test_many_sequences_take_several_calls_in_input_order(model):
  sequences = [model.encode(TEXTS[i % len(TEXTS)]) for i in range(23)]
  scores = model.scorer.score(sequences)
  first = model.scorer.score(sequences[:len(TEXTS)])
  for i, s in enumerate(scores):
    np.testing.assert_allclose(s.logprobs, first[i % len(TEXTS)].logprobs, atol=2e-5)


def test_sequences_outside_the_context_are_refused(model):
  with pytest.raises(ValueError, match="model.max_length"):
    model.scorer.score([[5] * (model.max_length + 1)])
  with pytest.raises(ValueError, match="1 to"):
    model.scorer.score([[]])


@pytest.mark.parametrize("seed", range(5))
def test_packing_keeps_sequences_whole_and_apart(seed):
  rng = np.random.default_rng(seed)
  lengths = [int(n) for n in rng.integers(1, 40, size=30)]
  placements, rows = pack(lengths, 40)
  used = np.zeros((rows, 40), int)
  for length, place in zip(lengths, placements):
    assert place.offset + length <= 40
    assert not used[place.row, place.offset:place.offset + length].any()
    used[place.row, place.offset:place.offset + length] = 1
  segments = {}
  for place in placements:
    segments.setdefault(place.row, []).append(place.segment)
  assert all(sorted(s) == list(range(1, len(s) + 1)) for s in segments.values())
  assert rows <= 2 * sum(lengths) / 40 + 1  # First fit decreasing wastes under half a row each.


def test_row_lengths_end_at_the_context(model):
  assert row_lengths(64) == (64,)
  assert row_lengths(300) == (64, 128, 256, 300)
  assert model.scorer.rows_for(64) == 2  # score_tokens=128: two rows of 64 a call.
  assert model.scorer.rows_for(1000) == 1
