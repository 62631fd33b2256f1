"""lm_eval's request kinds: loglikelihood equal to a plain JAX computation over the model's
logits; rolling windows as lm_eval's own `get_rolling_token_windows` makes them; generate_until
equal to the decode program's generator; and the `lingvo_lite` lm_eval model through
lm_eval's own evaluator on the repository's offline tasks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_eval import utils as lm_eval_utils

from lingvo_lite.decode.requests import Request
from lingvo_lite.harness import request_kinds as harness
from lingvo_lite.serving import loaded_model
from lingvo_lite.training.train_state import strip_boxes
from tests.harness.mesh_requests import PAIRS



@pytest.fixture(scope="module")
def model(tiny_job):
  return loaded_model.from_job(str(tiny_job / "runs/tiny"))


def _logprobs(model, ids):
  logits = jax.jit(lambda p, t: model.setup.model.apply({"params": p}, t))(
      strip_boxes(model.generator.params), jnp.asarray([ids], jnp.int32))
  return np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1))


def test_loglikelihood_equals_a_plain_computation(model):
  results = harness.loglikelihood(model, PAIRS)
  for (context, continuation), (value, greedy) in zip(PAIRS, results):
    context_ids, continuation_ids = harness.split_pair(model, context, continuation)
    ids = context_ids + continuation_ids
    assert len(ids) <= model.max_length
    logprobs = _logprobs(model, ids)
    positions = np.arange(len(context_ids) - 1, len(ids) - 1)
    want = logprobs[positions, ids[len(context_ids):]]
    assert value == pytest.approx(float(want.sum()), abs=1e-4)
    assert greedy == bool((logprobs[positions].argmax(-1) == ids[len(context_ids):]).all())


def test_a_continuation_that_adds_no_token_scores_zero(model, monkeypatch):
  # A tokenizer that merges across the boundary leaves the continuation no ids of its own.
  monkeypatch.setattr(harness, "split_pair", lambda m, c, t: (m.encode(c + t), []))
  results = harness.loglikelihood(model, [("def main(", "):"), PAIRS[0]])
  assert results[0] == (0.0, True)
  assert results[1] == harness.loglikelihood(model, [PAIRS[0]])[0]


def test_pairs_split_as_lm_eval_splits_them(model):
  # Trailing spaces move to the continuation; an empty context is the prefix token.
  context, continuation = harness.split_pair(model, "x = 1 ", " + 2")
  assert model.decode(context) == "x = 1"
  assert model.decode(continuation) == "  + 2"
  context, continuation = harness.split_pair(model, "", "print(1)")
  assert context == [harness.prefix_token(model)]
  assert model.decode(continuation) == "print(1)"


@pytest.mark.parametrize("length,window", [(1, 10), (10, 10), (11, 10), (57, 10), (200, 63)])
def test_rolling_windows_are_lm_eval_s(length, window):
  tokens = list(range(100, 100 + length))
  ours = harness.rolling_windows(tokens, 7, window)
  theirs = [lm_eval_utils.make_disjoint_window(w) for w in
            lm_eval_utils.get_rolling_token_windows(tokens, 7, window, 1)]
  assert len(ours) == len(theirs)
  for scored, (context, predicted) in zip(ours, theirs):
    assert scored.ids == context + predicted
    assert scored.ids[scored.first:] == predicted


def test_rolling_loglikelihood_sums_every_token_once(model):
  text = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n" * 2
  ids = model.encode(text)
  assert len(ids) > model.max_length  # Scored in several windows.
  total = harness.loglikelihood_rolling(model, [text, "x = 1\n"])
  want = 0.0
  for scored in harness.rolling_windows(ids, harness.prefix_token(model), model.max_length - 1):
    logprobs = _logprobs(model, scored.ids)
    positions = np.arange(scored.first - 1, len(scored.ids) - 1)
    want += float(logprobs[positions, scored.ids[scored.first:]].sum())
  assert total[0] == pytest.approx(want, abs=1e-3)


def test_generate_until_equals_the_generator(model):
  requests = [("def main(", {"until": ["\n"], "max_gen_toks": 20}),
              ("import ", {"max_gen_toks": 12, "until": []}),
              ("x = ", {"until": [")"], "max_gen_toks": 30, "do_sample": True,
                        "temperature": 0.9, "seed": 5})]
  texts = harness.generate_until(model, requests)
  completions = model.generator.generate([
      Request(source="a", prompt_ids=tuple(model.encode("def main(")), max_new_tokens=20,
              temperature=0.0, stop=("\n",)),
      Request(source="b", prompt_ids=tuple(model.encode("import ")), max_new_tokens=12,
              temperature=0.0, stop=()),
      Request(source="c", prompt_ids=tuple(model.encode("x = ")), max_new_tokens=30,
              temperature=0.9, seed=5, stop=(")",))])
  assert texts == [c.completion_text for c in completions]
  assert all("\n" not in texts[0] and ")" not in texts[2] for _ in [0])


def test_repeats_of_a_sampled_request_are_different_samples(model):
  """lm_eval draws a task's `repeats` as the same request n times: each sampled one without a
  seed of its own is seeded by its place in the call, so they differ, and a run repeats."""
  request = ("x = ", {"until": [], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0})
  texts = harness.generate_until(model, [request] * 4)
  assert len(set(texts)) > 1, texts
  assert harness.generate_until(model, [request] * 4) == texts


def test_unknown_generation_settings_are_named(model):
  with pytest.raises(Exception, match="'num_beams'"):
    harness.generate_until(model, [("x", {"num_beams": 4})])
