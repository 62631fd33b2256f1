"""Pure decode steps: prefill a prompt into a slot, then generate tokens in a jitted loop.

Like lingvo_lite/steps.py: no I/O, no flags, no config; the decode program and the AOT
compiler jit these functions with the same shardings. The state is a fixed number of slots
(the decode batch), each holding one request from position 0, and the model's decode cache,
which only the model's family creates, writes and reads (`empty_cache`, `prefill`, `extend`:
models/family.py), so a family with another cache needs no change here:

  prefill(params, state, prompts, ...)    writes the prompts of the slots `insert` names and
                                          samples each one's first token; other slots go on
                                          untouched, so a finished slot refills while the rest
                                          keep generating
  generate(params, state, limit, ...)     up to `limit` steps of every unfinished slot (a
                                          `lax.while_loop` that ends early once all are done)

Every per-request setting (sampling, seed, length) is an array of the state, never a static
argument: a new value, a mixed batch, a new prompt length within a prefill bucket, or fewer
requests than slots reuse the compiled functions.

Each slot keeps its tokens by position (`tokens[slot, p]`, prompt then completion) with the
log-probability of every generated one (`logprobs[slot, p]`): the model's own log-softmax
of the logits, before temperature and filtering. Row r's draw at position p uses the key
fold_in(key(seed_r), p), so a request's tokens depend on its seed and nothing else in the
batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from lingvo_lite.decode import sampling
from lingvo_lite.models.family import LanguageModel

# No token id is negative: "no end-of-sequence token" never matches.
NO_EOS = -1


class DecodeState(NamedTuple):
  """The slots of a decode batch (a pytree; every array leads with the slot axis but the
  cache's, whose layout is the model family's).

  Attributes:
    cache: The family's decode cache (for the transformer families, every layer's keys and
      values by position: models/kv_cache.py).
    tokens: int32 [slots, cache_length]: prompt and generated tokens by position.
    logprobs: float32 [slots, cache_length]: log-probability of each generated token.
    lengths: int32 [slots]: positions in the cache; the token at `lengths` is the last one
      sampled (fed at the next step).
    end: int32 [slots]: prompt length + max_new_tokens; a slot is done once it has sampled
      the token at end - 1.
    done: bool [slots]: finished (or empty).
    sampling: Each slot's temperature, top-k and top-p.
    seeds: uint32 [slots, 2]: each slot's PRNG key data (see `key_data`).
  """

  cache: Any
  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  end: jax.Array
  done: jax.Array
  sampling: sampling.SamplingParams
  seeds: jax.Array


def key_data(seed: int) -> np.ndarray:
  """Threefry key data of a seed of up to 64 bits, computed on the host (a request's seed
  becomes state data without a device call): its high and low 32 bits, as
  `jax.random.key(seed)` with 64-bit ints enabled makes it (without them, jax.random.key
  keeps only the low 32 bits, so seeds 0 and 2**32 would draw alike)."""
  seed = int(seed)
  return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], np.uint32)


def empty_state(model: LanguageModel, slots: int, cache_length: int) -> DecodeState:
  """Every slot empty (done, length 0). Every leaf is its own array, so the state can be
  donated (one buffer given for two donated arguments is refused)."""
  return DecodeState(
      cache=model.empty_cache(slots, cache_length),
      tokens=jnp.zeros((slots, cache_length), jnp.int32),
      logprobs=jnp.zeros((slots, cache_length), jnp.float32),
      lengths=jnp.zeros((slots,), jnp.int32), end=jnp.zeros((slots,), jnp.int32),
      done=jnp.ones((slots,), jnp.bool_),
      sampling=sampling.sampling_params(slots),
      seeds=jnp.zeros((slots, 2), jnp.uint32))


def logical_specs(model: LanguageModel) -> DecodeState:
  """Logical axes of the state: slots over `batch` (so over the data-parallel mesh axes),
  the cache's as its family names them (key/value heads over `heads`)."""
  per_slot = PartitionSpec("batch")
  by_position = PartitionSpec("batch", None)
  return DecodeState(
      cache=model.cache_logical_specs(), tokens=by_position, logprobs=by_position,
      lengths=per_slot, end=per_slot, done=per_slot,
      sampling=sampling.SamplingParams(per_slot, per_slot, per_slot),
      seeds=PartitionSpec("batch", None))


def _keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
  return jax.vmap(lambda seed, position: jax.random.fold_in(
      jax.random.wrap_key_data(seed), position))(seeds, positions)


def _pick(logits: jax.Array, state_sampling: sampling.SamplingParams, seeds: jax.Array,
          positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Each slot's token at `positions` from logits [slots, vocab], and its log-probability
  under the model (before temperature and filtering)."""
  tokens = sampling.sample(logits, state_sampling, _keys(seeds, positions))
  logprobs = jax.nn.log_softmax(logits, axis=-1)
  return tokens, jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]


def _set_at(rows: jax.Array, positions: jax.Array, values: jax.Array) -> jax.Array:
  """rows[slot, positions[slot]] = values[slot]."""
  return rows.at[jnp.arange(rows.shape[0]), positions].set(values.astype(rows.dtype))


def _where(mask: jax.Array, new: Any, old: Any) -> Any:
  """Slot-wise select over matching trees whose leaves lead with the slot axis."""
  def select(n, o):
    return jnp.where(mask.reshape(mask.shape + (1,) * (o.ndim - 1)), n, o)
  return jax.tree.map(select, new, old)


def prefill(params: Any, state: DecodeState, prompts: jax.Array, prompt_lengths: jax.Array,
            insert: jax.Array, end: jax.Array, slot_sampling: sampling.SamplingParams,
            seeds: jax.Array, *, model: LanguageModel, eos_id: int = NO_EOS) -> DecodeState:
  """Writes the prompts of the slots `insert` names and samples their first tokens.

  Args:
    params: The model's parameters.
    state: The slots; those not in `insert` are returned unchanged.
    prompts: int32 [slots, bucket]: each inserted slot's prompt from index 0, padded at the
      end (padding is never attended to: a token sees only earlier positions, and a slot's
      generated tokens overwrite the padding's cache entries before they are read).
    prompt_lengths: int32 [slots], at least 1 where inserted.
    insert: bool [slots].
    end: int32 [slots]: prompt length + max_new_tokens (at most the cache length).
    slot_sampling: Each inserted slot's sampling settings.
    seeds: uint32 [slots, 2]: each inserted slot's `key_data(seed)`.
    model: The model (its family writes the prompts into the cache).
    eos_id: The vocabulary's end-of-sequence id, or NO_EOS.
  """
  lengths = jnp.where(insert, prompt_lengths, 1).astype(jnp.int32)
  logits, cache = model.prefill(params, prompts, lengths, state.cache, insert)
  first, first_logprob = _pick(logits[:, 0], slot_sampling, seeds, lengths)
  width = prompts.shape[1]
  tokens = _set_at(state.tokens.at[:, :width].set(prompts), lengths, first)
  logprobs = _set_at(state.logprobs, lengths, first_logprob)
  inserted = DecodeState(
      cache=state.cache, tokens=tokens, logprobs=logprobs, lengths=lengths, end=end,
      done=(first == eos_id) | (lengths + 1 >= end), sampling=slot_sampling, seeds=seeds)
  merged = _where(insert, inserted._replace(cache=None), state._replace(cache=None))
  return merged._replace(cache=cache)


def step(params: Any, state: DecodeState, *, model: LanguageModel, eos_id: int = NO_EOS
         ) -> tuple[DecodeState, jax.Array]:
  """One token of every unfinished slot: feeds each slot's last sampled token (its keys and
  values go into the cache at the slot's length), and samples the next. Returns the new state and
  the logits [slots, vocab] (the tests compare them with a recompute of the prefix)."""
  active = ~state.done
  fed = jnp.take_along_axis(state.tokens, state.lengths[:, None], axis=1)
  # A finished slot is fed too (its last token again, at its frozen length, past its valid
  # entries): harmless, and cheaper than a masked step.
  logits, cache = model.extend(params, fed, state.lengths[:, None], state.cache)
  logits = logits[:, 0]
  lengths = state.lengths + active.astype(jnp.int32)
  token, logprob = _pick(logits, state.sampling, state.seeds, lengths)
  # The new token goes at index `lengths`; a finished slot keeps what is there (its last).
  kept_token = jnp.take_along_axis(state.tokens, lengths[:, None], axis=1)[:, 0]
  kept_logprob = jnp.take_along_axis(state.logprobs, lengths[:, None], axis=1)[:, 0]
  new_tokens = _set_at(state.tokens, lengths, jnp.where(active, token, kept_token))
  new_logprobs = _set_at(state.logprobs, lengths, jnp.where(active, logprob, kept_logprob))
  done = state.done | (active & ((token == eos_id) | (lengths + 1 >= state.end)))
  return state._replace(cache=cache, tokens=new_tokens, logprobs=new_logprobs,
                        lengths=lengths, done=done), logits


def generate(params: Any, state: DecodeState, limit: jax.Array, finished: jax.Array, *,
             model: LanguageModel, eos_id: int = NO_EOS) -> DecodeState:
  """Up to `limit` (an int32 scalar, not static) steps; ends early when every slot is done.

  Args:
    finished: bool [slots]: slots the host has ended (a stop string matched) before this
      call; they stop generating.
  """
  state = state._replace(done=state.done | finished)

  def unfinished(carry):
    count, looped = carry
    return (count < limit) & ~jnp.all(looped.done)

  def body(carry):
    count, looped = carry
    return count + 1, step(params, looped, model=model, eos_id=eos_id)[0]

  return jax.lax.while_loop(unfinished, body, (jnp.zeros((), jnp.int32), state))[1]
