"""Sampling against a plain float64 NumPy reference: exact supports, probabilities, draw
frequencies (chi-square), greedy rows, batch independence and one compile for any settings."""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite.decode import sampling

# Jitted once for the file; the cases share VOCAB (and mostly batch sizes) so few shapes
# compile.
VOCAB = 16
FILTERED = jax.jit(sampling.filtered_logits)
SAMPLE = jax.jit(sampling.sample)
# Many draws of the same rows in one call: the keys batch, the logits and settings do not.
DRAWS = jax.jit(jax.vmap(sampling.sample, in_axes=(None, None, 0)))


def reference_probs(logits, temperature, top_k, top_p):
  """The distribution a row samples from, in float64, written from the definitions.

  Returns:
    (probabilities [V], margin): margin is how far the nearest token's top-p test
    (probability strictly above it vs top_p) is from flipping, so a case at a float32
    knife edge is caught rather than flaky.
  """
  logits = np.asarray(logits, np.float64)
  if temperature == 0:
    probs = np.zeros_like(logits)
    probs[np.argmax(logits)] = 1.0
    return probs, np.inf
  z = logits / temperature
  if 0 < top_k < len(z):
    kth = np.sort(z)[::-1][top_k - 1]
    z = np.where(z >= kth, z, -np.inf)
  probs = np.exp(z - np.max(z))
  probs /= probs.sum()
  margin = np.inf
  if top_p < 1:
    # Token i stays iff the tokens strictly more probable than it hold < top_p.
    above = np.array([probs[probs > p].sum() for p in probs])
    margin = np.min(np.abs(above - top_p)[probs > 0])
    probs = np.where(above < top_p, probs, 0.0)
    probs /= probs.sum()
  return probs, margin


def _logits_of(probs):
  """Logits whose softmax is `probs` (a zero probability becomes -inf)."""
  with np.errstate(divide="ignore"):
    return np.log(np.asarray(probs, np.float64))


def _pad(probs):
  """`probs` followed by zeros up to VOCAB, so every hand-made row shares one shape."""
  return list(probs) + [0.0] * (VOCAB - len(probs))


def _cases():
  """(logits, temperature, top_k, top_p) rows: hand-made edge cases, then random ones."""
  base = np.linspace(2.0, -2.0, VOCAB)
  ties = np.array([3.0, 1.0, 1.0, 1.0] + [0.0] * (VOCAB - 4))
  cases = [
      (base, 1.0, 0, 1.0),                 # Nothing filters.
      (base, 0.7, VOCAB, 1.0),             # top_k == V is off.
      (base, 0.7, VOCAB + 5, 1.0),         # top_k > V is off.
      (base, 1.3, 1, 1.0),                 # Top-1 sampling.
      (ties, 1.0, 2, 1.0),                 # The k-th value is tied: all three ties kept.
      (ties, 1.0, 4, 1.0),                 # k reaches the end of the tie exactly.
      (ties, 1.0, 5, 1.0),                 # One past the ties: the zeros' tie comes in.
      # Three ties of 0.2 after 0.4: mass above each is 0.4, so top_p 0.5 keeps all three
      # (a per-position cut would keep one), and top_p 0.3 keeps the 0.4 alone.
      (_logits_of(_pad([0.4, 0.2, 0.2, 0.2])), 1.0, 0, 0.5),
      (_logits_of(_pad([0.4, 0.2, 0.2, 0.2])), 1.0, 0, 0.3),
      # Mass above the 0.2 is exactly 0.8: both sides of that boundary.
      (_logits_of(_pad([0.5, 0.3, 0.2])), 1.0, 0, 0.8 - 1e-4),
      (_logits_of(_pad([0.5, 0.3, 0.2])), 1.0, 0, 0.8 + 1e-4),
      # Top-k then top-p: after top-3 the probabilities renormalize to 0.4, 0.33, 0.27, so
      # top_p 0.6 keeps two; top-p on the raw 0.3, 0.25, 0.2 would keep three.
      (_logits_of(_pad([0.3, 0.25, 0.2, 0.15, 0.1])), 1.0, 3, 0.6),
      # Temperature then top-p: at temperature 1 top_p 0.75 keeps two of 0.5, 0.3, 0.2; at
      # temperature 3 (0.39, 0.33, 0.28) it keeps all three.
      (_logits_of(_pad([0.5, 0.3, 0.2])), 3.0, 0, 0.75),
      (base, 1.0, 0, 1e-3),                # Tiny top_p keeps the most probable token.
      (ties, 2.0, 3, 0.9),
      (base, 0.0, 3, 0.5),                 # Greedy: top_k and top_p ignored.
      # Token 1's probability, 1e-13, vanishes from float32 sums: the mass before it rounds
      # to 1, which top_p 1 must not read as reached.
      (np.array([0.0, -30.0] + [-40.0] * (VOCAB - 2)), 1.0, 2, 1.0),
  ]
  rng = np.random.default_rng(0)
  for i in range(24):
    logits = rng.normal(size=VOCAB) * 2.0
    if i % 2:
      logits = np.round(logits)  # Many ties, at the k-th value and at top-p boundaries.
    cases.append((logits, float(rng.choice([0.5, 1.0, 1.7])), int(rng.choice([0, 1, 3, 6])),
                  float(rng.choice([1.0, 0.95, 0.7, 0.35]))))
  return cases


def _params(cases):
  return sampling.sampling_params(len(cases), [c[1] for c in cases], [c[2] for c in cases],
                                  [c[3] for c in cases])


def test_filtered_support_and_probabilities_match_reference():
  cases = _cases()
  logits = jnp.asarray(np.stack([c[0] for c in cases]), jnp.float32)
  filtered = np.asarray(FILTERED(logits, _params(cases)))
  for row, (row_logits, temperature, top_k, top_p) in enumerate(cases):
    expected, margin = reference_probs(row_logits, temperature, top_k, top_p)
    assert margin > 1e-5, f"case {row} sits on a top-p knife edge; move its top_p"
    if temperature == 0:
      np.testing.assert_array_equal(filtered[row], np.float32(row_logits), err_msg=f"{row}")
      continue
    support = np.isfinite(filtered[row])
    np.testing.assert_array_equal(support, expected > 0, err_msg=f"case {row}")
    probs = np.asarray(jax.nn.softmax(filtered[row]))
    np.testing.assert_allclose(probs, expected, atol=1e-6, err_msg=f"case {row}")


def test_hand_made_supports():
  """The reference itself, on the cases whose answer is known by hand."""
  cases = {i: c for i, c in enumerate(_cases())}
  kept = {i: np.flatnonzero(reference_probs(*c)[0]).tolist() for i, c in cases.items()}
  assert kept[4] == kept[5] == [0, 1, 2, 3]
  assert kept[6] == list(range(VOCAB))
  assert kept[7] == [0, 1, 2, 3] and kept[8] == [0]
  assert kept[9] == [0, 1] and kept[10] == [0, 1, 2]
  assert kept[11] == [0, 1] and kept[12] == [0, 1, 2] and kept[13] == [0]


def test_top_p_boundary_reached_exactly_removes_the_token():
  # Probabilities 1/4, 1/4, 1/4, 1/8, 1/8 are exact in float32 (XLA's exp(float32(ln 1/2))
  # is exactly 1/2), and so are their sums: the mass above each 1/8 is exactly 0.75.
  logits = _logits_of(_pad([0.25, 0.25, 0.25, 0.125, 0.125]))
  top_p = [0.75, np.nextafter(np.float32(0.75), np.float32(1)),
           np.nextafter(np.float32(0.75), np.float32(0)), 0.25]
  assert np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)))[:5].tolist() == \
      [0.25, 0.25, 0.25, 0.125, 0.125], "float32 softmax is no longer exact here: re-pick"
  params = sampling.sampling_params(4, 1.0, 0, top_p)
  filtered = np.asarray(FILTERED(jnp.asarray(np.stack([logits] * 4), jnp.float32), params))
  kept = [np.flatnonzero(np.isfinite(row)).tolist() for row in filtered]
  # Reached is not below: 0.75 removes the 1/8s, the next float32 up keeps them; and 0.25,
  # reached after the first 1/4, still keeps the other two 1/4s it is tied with.
  assert kept == [[0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2], [0, 1, 2]]
  for row, p in enumerate(top_p):
    expected, _ = reference_probs(logits, 1.0, 0, float(np.float32(p)))
    assert np.flatnonzero(expected).tolist() == kept[row]


def _chi2_threshold(df, false_failure_rate):
  """The chi-square value exceeded with probability `false_failure_rate` under the null."""
  try:
    from scipy import stats  # pylint: disable=import-outside-toplevel
    return float(stats.chi2.isf(false_failure_rate, df))
  except ImportError:  # Not a declared dependency: Wilson-Hilferty, a few % off at df >= 2.
    z = statistics.NormalDist().inv_cdf(1 - false_failure_rate)
    h = 2 / (9 * df)
    return df * (1 - h + z * np.sqrt(h)) ** 3


def test_draw_frequencies_match_reference():
  num_draws = 30_000
  probs = np.array([0.22, 0.16, 0.13, 0.11, 0.09, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.01])
  probs = _pad(probs / probs.sum())
  logits = _logits_of(probs)
  rows = [(logits, 1.0, 0, 1.0), (logits, 0.6, 0, 1.0), (logits, 1.5, 5, 1.0),
          (logits, 1.0, 0, 0.7), (logits, 2.0, 6, 0.8), (logits, 0.8, 3, 0.9),
          (logits, 0.0, 2, 0.5)]
  row_logits = jnp.asarray(np.stack([r[0] for r in rows]), jnp.float32)
  keys = jax.random.split(jax.random.key(1234), (num_draws, len(rows)))
  draws = np.asarray(DRAWS(row_logits, _params(rows), keys))
  for row, case in enumerate(rows):
    expected, _ = reference_probs(*case)
    support = expected > 0
    counts = np.bincount(draws[:, row], minlength=VOCAB)
    assert counts[~support].sum() == 0, f"row {row} drew outside its support: {counts}"
    if support.sum() == 1:
      continue
    expected_counts = num_draws * expected[support]
    assert expected_counts.min() >= 5, "too few draws for the chi-square approximation"
    chi2 = np.sum((counts[support] - expected_counts) ** 2 / expected_counts)
    # 1e-6 false failures per row (7 rows: < 1e-5 per run), were the seed not fixed.
    threshold = _chi2_threshold(support.sum() - 1, 1e-6)
    assert chi2 < threshold, f"row {row}: chi2 {chi2:.1f} >= {threshold:.1f}, {counts}"


def test_greedy_rows_take_the_raw_argmax():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, VOCAB)), jnp.float32)
  logits = logits.at[3, 5].set(logits[3].max())  # A tied maximum: the first index wins.
  # Row 1 keeps only token 0 were its top_k honored; greedy must ignore it.
  logits = logits.at[1, 0].set(logits[1].max() - 1e-3)
  params = sampling.sampling_params(4, 0.0, [0, 1, 0, 2], [1.0, 1.0, 0.01, 0.5])
  argmax = np.argmax(np.asarray(logits), axis=-1)
  for seed in range(3):
    keys = jax.random.split(jax.random.key(seed), 4)
    np.testing.assert_array_equal(SAMPLE(logits, params, keys), argmax)
  np.testing.assert_array_equal(FILTERED(logits, params), logits)


def test_a_row_draws_the_same_whatever_else_is_in_the_batch():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, VOCAB)).astype(np.float32)
  other = logits.copy()
  other[[0, 3]] = rng.normal(size=(2, VOCAB))
  keys = jax.random.split(jax.random.key(7), (64, 4))
  # Row 2 samples at plain temperature: in `plain` no row filters and the sort is skipped,
  # in the others it rides the filtering branch. Row 1 filters, beside different neighbors
  # in `mixed` and `changed`. Rows 1 and 2, not 0, so that a key taken from the wrong row
  # shows.
  plain = sampling.sampling_params(4, [0.0, 0.8, 0.9, 0.5])
  mixed = sampling.sampling_params(4, [0.0, 0.8, 0.9, 0.5], [0, 3, 0, 2], [1.0, 0.8, 1.0, 1.0])
  changed = sampling.sampling_params(4, [1.3, 0.8, 0.9, 0.0], [5, 3, 0, 0], [0.5, 0.8, 1.0, 1.0])
  draws = [np.asarray(DRAWS(l, p, keys)) for l, p in
           [(logits, plain), (logits, mixed), (other, changed)]]
  np.testing.assert_array_equal(draws[0][:, 2], draws[1][:, 2])
  np.testing.assert_array_equal(draws[0][:, 2], draws[2][:, 2])
  np.testing.assert_array_equal(draws[1][:, 1], draws[2][:, 1])
  assert len(set(draws[0][:, 2].tolist())) > 1, "row 2 should draw more than one token"
  assert len(set(draws[1][:, 1].tolist())) > 1, "row 1 should draw more than one token"
  # The same key gives the same token in a batch of one.
  for row in (1, 2):
    alone = np.asarray(DRAWS(logits[row:row + 1], jax.tree.map(lambda x: x[row:row + 1], mixed),
                             keys[:, row:row + 1]))
    np.testing.assert_array_equal(alone[:, 0], draws[1][:, row])


def test_one_compile_for_any_settings():
  # A shape no other test uses, so the first call below must compile, and only it.
  batch, vocab = 5, 11
  logits = jnp.asarray(np.random.default_rng(3).normal(size=(batch, vocab)), jnp.float32)
  keys = jax.random.split(jax.random.key(0), batch)
  settings = [
      sampling.sampling_params(batch),  # All greedy.
      sampling.sampling_params(batch, 1.0),  # Plain temperature: no sort.
      sampling.sampling_params(batch, 0.7, 3, 0.9),
      sampling.sampling_params(batch, [0.0, 1.0, 0.5, 2.0, 0.0], [0, 2, 0, 20, 1],
                               [1.0, 0.5, 0.8, 1.0, 0.1]),
      sampling.sampling_params(batch, [1.5, 0.0, 0.0, 0.3, 1.0], [4, 0, 0, 1, 11]),
  ]
  jax.block_until_ready((logits, keys, settings))
  compiled = []

  def listener(event, duration, **kwargs):
    del duration
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(kwargs.get("fun_name"))

  cache_was = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    sample = jax.jit(sampling.sample)
    for params in settings:
      jax.block_until_ready(sample(logits, params, keys))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
    jax.config.update("jax_enable_compilation_cache", cache_was)
  assert len(compiled) == 1, compiled


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": [0, -1, 0]}, "top_k"),
    ({"top_k": 1.5}, "integers"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
    ({"temperature": [1.0, 1.0]}, "shape"),
])
def test_sampling_params_refuses_bad_values(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.sampling_params(3, **kwargs)


def test_sampling_params_dtypes_and_broadcast():
  params = sampling.sampling_params(3, 0.5, [1, 2, 3])
  assert [x.dtype for x in params] == [jnp.float32, jnp.int32, jnp.float32]
  assert [x.shape for x in params] == [(3,)] * 3
  np.testing.assert_array_equal(params.top_p, [1.0, 1.0, 1.0])


def test_a_large_vocabulary_filters_from_its_candidates_as_from_the_full_sort():
  """Past sampling.CANDIDATES tokens, each row's cut is found among its largest logits (or
  the full sort when it may lie past them): the same support as the reference, for cuts
  inside the candidates, past them (a large k; a flat row whose top-p mass needs more), and
  with ties at the k-th value."""
  vocab = 4 * sampling.CANDIDATES
  rng = np.random.default_rng(7)
  peaked = rng.normal(size=vocab) * 3.0
  flat = rng.normal(size=vocab) * 0.01
  tied = np.round(rng.normal(size=vocab), 1)
  rows = [(peaked, 1.0, 40, 1.0), (peaked, 0.8, 0, 0.9), (peaked, 1.0, 100, 0.95),
          (flat, 1.0, 0, 0.9), (flat, 1.0, 3 * sampling.CANDIDATES, 1.0),
          (tied, 1.0, 37, 1.0), (tied, 1.2, 0, 0.5), (peaked, 0.0, 5, 0.5)]
  for batch in (rows[:3] + rows[5:], rows):  # Without and with a row past the candidates.
    logits = jnp.asarray(np.stack([row[0] for row in batch]), jnp.float32)
    params = sampling.sampling_params(len(batch), [r[1] for r in batch],
                                      [r[2] for r in batch], [r[3] for r in batch])
    filtered = np.asarray(jax.jit(sampling.filtered_logits)(logits, params))
    for row, (values, temperature, top_k, top_p) in zip(filtered, batch):
      expected, margin = reference_probs(values.astype(np.float32), temperature, top_k, top_p)
      assert margin > 1e-5
      kept = np.isfinite(row) if temperature else row == np.max(row)
      np.testing.assert_array_equal(kept, expected > 0)


def test_a_tiny_temperature_samples_the_argmax():
  """2e-38 is a valid temperature: the logits are shifted by their max before dividing, so
  the others go to -inf rather than every logit to +-inf (which drew token 0)."""
  logits = jnp.asarray([[25.0, 30.0, -10.0, 5.0]], jnp.float32)  # / 2e-38: past float32.
  params = sampling.sampling_params(1, temperature=2e-38)  # Normal: 1e-38 would flush to 0.
  assert int(SAMPLE(logits, params, jax.random.split(jax.random.key(0), 1))[0]) == 1
