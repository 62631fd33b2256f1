"""Decoding with the KV cache: equal to teacher forcing and to recomputing without a cache,
for every family and for scanned layers; each request independent of the rest of its batch;
and no recompilation for new settings, prompt lengths or request counts.

Independent references: the model's own full forward pass (`model.apply` over prompt +
completion, no cache) for log-probabilities and logits.
"""

import functools
import inspect
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lingvo_lite import testing
from lingvo_lite.decode import (generator as generation, request_resolver, steps as
                                decoding)
from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError
from lingvo_lite.models import quantization
from lingvo_lite.models.transformer import TransformerLM
from lingvo_lite.target import current_platform
from lingvo_lite.training.train_state import strip_boxes

# Small shapes: prompts up to 20 tokens pad to bucket 16 or 32; 12 new tokens fit in 48.
DECODE_SETS = ("decode.cache_length=48", "decode.slots=4", "decode.max_new_tokens=12",
               "decode.steps_per_call=5")
FAMILIES = {
    "gptj": ("PyCodeTiny", ()),
    "llama_gqa": ("PyCodeLlamaTiny", ()),
    "gpt2_learned": ("PyCodeGpt2Tiny", ()),
    "gptj_scanned": ("PyCodeTiny", ("model.scan_layers=True",)),
    # int8 weights (models/quantization.py), quantized once when the generator takes them:
    # the reference pass multiplies the same int8 weights.
    "llama_int8_weights_scanned": ("PyCodeLlamaTiny", ('model.quantization="int8_weights"',
                                                       "model.scan_layers=True")),
    # Latent attention: slots over a cache of latents and rotary keys, the absorbed decode.
    "deepseek_v3_latent": ("PyCodeDeepSeekV3Tiny", ()),
}


@functools.lru_cache(maxsize=None)
def _generator(family: str) -> generation.Generator:
  experiment, sets = FAMILIES[family]
  setup = testing.synthetic_tiny_setup(experiment, *DECODE_SETS, *sets)
  params = jax.jit(setup.model.init)(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))
  return generation.Generator(setup, strip_boxes(params["params"]))


def _prompt(seed: int, length: int) -> tuple[int, ...]:
  return tuple(int(t) for t in np.random.default_rng(seed).integers(3, 250, size=length))


def _mixed_requests() -> list[Request]:
  """Six requests for four slots (two refill a finished slot), of lengths in both buckets,
  greedy and sampled."""
  settings = [dict(), dict(temperature=1.0, seed=3), dict(temperature=0.7, top_k=20, seed=4),
              dict(temperature=1.3, top_p=0.9, seed=5), dict(max_new_tokens=4),
              dict(temperature=1.0, top_k=5, top_p=0.8, seed=6, max_new_tokens=9)]
  lengths = [5, 20, 1, 11, 17, 8]
  return [Request(source=f"r{i}", prompt_ids=_prompt(i, n), **s)
          for i, (n, s) in enumerate(zip(lengths, settings))]


# The reference passes pad every sequence to this length: one compiled forward pass per
# family, where eager passes over each length would compile every operation once per length.
REFERENCE_LENGTH = 48


@functools.lru_cache(maxsize=None)
def _forward(family: str):
  """The family's jitted forward pass (no cache): logits [batch, REFERENCE_LENGTH, vocab]."""
  generator = _generator(family)
  return jax.jit(lambda tokens: generator.model.apply({"params": generator.params}, tokens))


def _full_logits(family: str, sequences) -> list[np.ndarray]:
  """Each sequence's logits at its own positions, from one pass over them all, padded at the
  end (a causal model's logits at a position see no later token)."""
  tokens = np.zeros((len(sequences), REFERENCE_LENGTH), np.int32)
  for row, ids in enumerate(sequences):
    tokens[row, :len(ids)] = ids
  logits = np.asarray(_forward(family)(jnp.asarray(tokens)))
  return [logits[row, :len(ids)] for row, ids in enumerate(sequences)]


def _full_log_probs(family: str, sequences) -> list[np.ndarray]:
  return [np.asarray(jax.nn.log_softmax(logits, axis=-1))
          for logits in _full_logits(family, sequences)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_reported_log_probs_equal_teacher_forcing(family):
  generator = _generator(family)
  completions = generator.generate(_mixed_requests())
  references = _full_log_probs(family, [c.prompt_ids + c.completion_ids for c in completions])
  for request, completion, full in zip(_mixed_requests(), completions, references):
    assert completion.prompt_ids == request.prompt_ids
    wanted = request.max_new_tokens or 12
    assert len(completion.completion_ids) == wanted, completion.stop_reason
    assert completion.stop_reason == "max_new_tokens"
    start = len(completion.prompt_ids) - 1
    expected = [full[start + i, token] for i, token in enumerate(completion.completion_ids)]
    np.testing.assert_allclose(completion.logprobs, expected, rtol=1e-5, atol=1e-5)
    if request.temperature is None:  # Greedy: each token is the full pass's argmax.
      argmax = [int(np.argmax(full[start + i])) for i in range(len(expected))]
      assert list(completion.completion_ids) == argmax


def test_int8_weights_are_quantized_once_when_the_generator_takes_them():
  generator = _generator("llama_int8_weights_scanned")
  params = generator.params
  # The decode functions' layout: scanned on a CPU ([layers, embed, heads, kv]), unrolled on
  # an accelerator (`for_decoding`: layer 0's [embed, heads, kv]).
  if generator.model.scan_layers:
    kernel = params["layers"]["attention"]["query_kernel"]
    lead = (kernel.qvalue.shape[0],)
  else:
    kernel, lead = params["layer_0"]["attention"]["query_kernel"], ()
  assert quantization.is_quantized(kernel) and kernel.qvalue.dtype == jnp.int8
  assert kernel.scale.shape == (*lead, 1, *kernel.qvalue.shape[len(lead) + 1:])
  assert quantization.is_quantized(params["embedding"])
  assert not quantization.is_quantized(_generator("llama_gqa").params["embedding"])


def test_scanned_layers_decoded_unrolled_as_on_an_accelerator(monkeypatch):
  """On TPUs and GPUs a scanned model decodes through its unrolled form (`for_decoding`): the
  loaded parameters are sliced into layers once and every decode function, the cache and the
  scorer run unrolled. Forced here on the CPU: the same completions and log-probabilities as
  the scanned decode, int8 weights quantized after the slicing."""
  on_cpu = current_platform() == "cpu"
  assert (_generator("gptj_scanned").steps.model is _generator("gptj_scanned").setup.model) \
      == on_cpu
  family = "llama_int8_weights_scanned"
  scanned = _generator(family)
  monkeypatch.setattr(TransformerLM, "for_decoding",
                      lambda self, platform: self.clone(parent=None, scan_layers=False))
  experiment, sets = FAMILIES[family]
  setup = testing.synthetic_tiny_setup(experiment, *DECODE_SETS, *sets)
  params = jax.jit(setup.model.init)(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))
  unrolled = generation.Generator(setup, strip_boxes(params["params"]))
  assert not unrolled.steps.model.scan_layers and "layer_1" in unrolled.params
  assert quantization.is_quantized(unrolled.params["layer_1"]["mlp"]["wi"]["kernel"])
  for ours, theirs in zip(unrolled.generate(_mixed_requests()),
                          scanned.generate(_mixed_requests())):
    assert ours.completion_ids == theirs.completion_ids
    np.testing.assert_allclose(ours.logprobs, theirs.logprobs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["gptj", "llama_gqa", "gptj_scanned",
                                    "llama_int8_weights_scanned"])
def test_cached_logits_equal_recomputing_the_prefix(family):
  """The logits of every generated position, step by step from the cache, against a pass
  over the whole prefix without one (its causal logits at each position)."""
  generator = _generator(family)
  steps, model = generator.steps, generator.model
  lengths = np.array([3, 16, 9, 1], np.int32)
  prompts = np.zeros((4, 16), np.int32)
  for slot, length in enumerate(lengths):
    prompts[slot, :length] = _prompt(10 + slot, length)
  state = steps.empty_state()
  sampled = decoding.sampling.sampling_params(4, temperature=[0.0, 1.0, 0.0, 1.0])
  seeds = np.stack([decoding.key_data(s) for s in range(4)])
  with steps.activated():
    state = steps.prefill(generator.params, state, prompts, lengths, np.ones(4, bool),
                          lengths + 20, sampled, seeds)
    step = jax.jit(functools.partial(decoding.step, model=model))
    all_logits = []
    for _ in range(10):
      state, logits = step(generator.params, state)
      all_logits.append(np.asarray(logits))
  tokens = np.asarray(state.tokens)
  sequences = [tuple(int(t) for t in tokens[slot, :length + 11])
               for slot, length in enumerate(lengths)]
  for slot, (length, recomputed) in enumerate(zip(lengths, _full_logits(family, sequences))):
    for i, logits in enumerate(all_logits):
      # Step i fed the token at position length + i.
      np.testing.assert_allclose(logits[slot], recomputed[length + i], rtol=1e-5, atol=2e-5)


def test_a_request_decodes_the_same_alone_and_in_any_batch():
  generator = _generator("llama_gqa")
  sampled = dict(temperature=0.9, top_k=40, top_p=0.95, seed=11)
  alone = generator.generate([Request(source="alone", prompt_ids=_prompt(1, 7), **sampled)])
  others = [Request(source=f"o{i}", prompt_ids=_prompt(20 + i, n), temperature=t, seed=i)
            for i, (n, t) in enumerate([(19, 1.0), (2, 0.0), (13, 0.5), (30, 2.0)])]
  batches = [others[:1] + [Request(source="in", prompt_ids=_prompt(1, 7), **sampled)]
             + others[1:],  # The fifth waits for a slot: it lands in a refilled one.
             others + [Request(source="in", prompt_ids=_prompt(1, 7), **sampled)]]
  for batch in batches:
    inside = generator.generate(batch)[[r.source for r in batch].index("in")]
    assert inside.completion_ids == alone[0].completion_ids
  # The seed is what decides: another seed, another completion.
  reseeded = generator.generate([Request(source="alone", prompt_ids=_prompt(1, 7),
                                         **dict(sampled, seed=12))])
  assert reseeded[0].completion_ids != alone[0].completion_ids


def test_new_settings_lengths_and_request_counts_never_recompile():
  generator = _generator("gptj")
  compiles = []

  def listen(event, duration, **kwargs):
    del duration, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(event)

  cache_was_enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    # Warm: the generate loop and both prefill buckets.
    generator.generate([Request(source="a", prompt_ids=_prompt(0, 5)),
                        Request(source="b", prompt_ids=_prompt(1, 20))])
    compiles.clear()
    generator.generate(_mixed_requests())  # Mixed settings, six requests for four slots.
    generator.generate([Request(source="c", prompt_ids=_prompt(2, 9), temperature=0.3,
                                top_k=3, top_p=0.5, seed=99, max_new_tokens=2)])
    generator.generate([Request(source=f"d{i}", prompt_ids=_prompt(i, 14 + i), top_p=0.7,
                                temperature=1.1) for i in range(3)])
    assert not compiles
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
    jax.config.update("jax_enable_compilation_cache", cache_was_enabled)


@pytest.fixture(name="sentencepiece", scope="module")
def fixture_sentencepiece(tmp_path_factory):
  """A real SentencePiece vocabulary of 500 pieces (BPE: multi-byte pieces), trained on the
  standard library's source, as the data issue's stores tokenize."""
  # Here, not at the top: seqio brings TensorFlow, which the other tests do not need.
  from lingvo_lite.data.sentencepiece_training import (  # pylint: disable=g-import-not-at-top
      train_sentencepiece)
  from lingvo_lite.runtime.tensorflow_import import (  # pylint: disable=g-import-not-at-top
      import_seqio)
  path = tmp_path_factory.mktemp("sp") / "code.model"
  texts = [inspect.getsource(module).encode() for module in (json, textwrap)]
  train_sentencepiece(texts, str(path), 500, "bpe")
  return import_seqio()[1].SentencePieceVocabulary(str(path))


def test_text_through_a_sentencepiece_vocabulary_and_stop_strings(sentencepiece):
  setup = testing.synthetic_tiny_setup("PyCodeTiny", *DECODE_SETS, "model.vocab_size=512",
                                       "train_data.vocab_size=512",
                                       "decode.max_new_tokens=16")
  params = jax.jit(setup.model.init)(jax.random.key(3), jnp.zeros((1, 8), jnp.int32))
  generator = generation.Generator(setup, strip_boxes(params["params"]),
                                   vocabulary=sentencepiece)
  prompt = "def main(args):\n    return"
  free = generator.generate([Request(source="free", prompt=prompt, temperature=1.0, seed=1)])[0]
  assert free.prompt_ids == tuple(sentencepiece.encode(prompt))
  assert free.prompt_text == prompt
  ids = list(free.completion_ids)
  text = sentencepiece.decode([i for i in ids if i != sentencepiece.eos_id])
  assert free.completion_text == text and len(text) > 8, (ids, text)
  # A stop string from the middle of that text: the same draw (same seed) is cut before it,
  # its ids end with the token that completed it.
  stop = text[4:7]
  cut = generator.generate([Request(source="cut", prompt=prompt, temperature=1.0, seed=1,
                                    stop=(stop, "never seen \x00"))])[0]
  assert cut.stop_reason == "stop" and cut.stop_string == stop
  assert cut.completion_text == text[:text.index(stop)]
  count = len(cut.completion_ids)
  assert list(cut.completion_ids) == ids[:count]
  assert stop in sentencepiece.decode(ids[:count])
  assert stop not in sentencepiece.decode(ids[:count - 1])
  assert len(cut.logprobs) == count
  # The slot the stop string ended is done on the device too: a later call does not run it.
  assert np.asarray(generator.state.done).all()


class _Bytes:
  """A byte vocabulary as seqio's decodes: ids are bytes + 3, EOS is 1, decoding stops at the
  first EOS and drops an incomplete UTF-8 character."""

  eos_id = 1

  def encode(self, text):
    return [b + 3 for b in text.encode()]

  def decode(self, ids):
    ids = list(ids)
    ids = ids[:ids.index(1)] if 1 in ids else ids
    return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="ignore")


def test_completion_text_keeps_what_follows_an_eos_and_characters_across_the_prompt():
  setup = testing.synthetic_tiny_setup("PyCodeTiny", *DECODE_SETS)
  resolver = request_resolver.RequestResolver(setup, _Bytes())
  vocab = _Bytes()
  # decode.stop_at_eos=False lets a completion run past EOS: its text keeps what follows.
  assert resolver.text(vocab.encode("ab") + [1] + vocab.encode("cd")) == "abcd"
  # "é" is two bytes: the prompt ends with the first, the completion starts with the second.
  e_acute = vocab.encode("é")
  prompt = vocab.encode("x") + e_acute[:1]
  assert resolver.completion_text(prompt, e_acute[1:] + vocab.encode("!")) == "é!"


def test_stop_strings_without_a_text_vocabulary_are_one_line():
  setup = testing.synthetic_tiny_setup("PyCodeTiny", *DECODE_SETS)
  resolver = request_resolver.RequestResolver(setup, None)
  with pytest.raises(UsageError, match=r"r: stop=\['x'\]: stop strings are matched in the "
                     r"text, and this experiment's data has no text vocabulary"):
    resolver.resolve(0, Request(source="r", prompt_ids=(5, 6), stop=("x",)))


def test_a_bfloat16_grouped_query_model_decodes_on_cpu():
  """bfloat16 Llama (grouped-query attention): XLA:CPU has no bfloat16 dot of the cached
  attention's shape with float32 results, so the layer reads the cache as float32 there.
  The log-probabilities follow a full bfloat16 forward within bfloat16's precision."""
  setup = testing.synthetic_tiny_setup("PyCodeLlamaTiny", *DECODE_SETS,
                                       "model.dtype='bfloat16'")
  params = jax.jit(setup.model.init)(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))
  generator = generation.Generator(setup, strip_boxes(params["params"]))
  completion = generator.generate([Request(source="b", prompt_ids=_prompt(0, 6),
                                           max_new_tokens=6)])[0]
  ids = jnp.asarray([completion.prompt_ids + completion.completion_ids], jnp.int32)
  logits = jax.jit(generator.model.apply)({"params": generator.params}, ids)[0]
  full = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
  expected = [full[5 + i, t] for i, t in enumerate(completion.completion_ids)]
  np.testing.assert_allclose(completion.logprobs, expected, atol=0.1)
