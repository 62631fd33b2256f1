"""The policy's own completions of prompt records, sampled in-process through the decode engine
and scored by the registered rewards: the rows of an objective whose batch comes from the
policy (training/objectives/grpo.py).

The completions come from the train state's current parameters, with no second copy of the
model: a full fine-tune's parameters are handed to the decode functions as they lie (placed in
the decode shardings, which on the train mesh are theirs, so nothing moves), and a LoRA job's
adapters are merged into the frozen base once per rollout, as `--mode=decode` applies a LoRA
job's adapters (weights/job_params.py). Decoding is the generator's (decode/generator.py):
its slots, its continuous batching (a finished completion's slot takes the next request), its
per-row sampling, compiled once per job on the train mesh; `decode.*` gives its shapes (slots,
cache length, prefill buckets, stop strings), the objective its sampling.

A completion's draws depend only on its seed (decode/steps.py: one key per row and position),
so a rollout is reproduced exactly from the same parameters: the seeds are a function of the
objective's seed, the rollout's index and the completion's global row, which is what makes a
resumed run draw what the uninterrupted one drew.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from absl import logging

from lingvo_lite.data.source import text_vocabulary
from lingvo_lite.decode.generator import Generator
from lingvo_lite.decode.records import Completion
from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError
from lingvo_lite.models import lora, quantization
from lingvo_lite.rewards import registry
from lingvo_lite.training.objectives.objective import Forward, token_losses

# Seeds lie in [0, 2**63) (decode/requests.py's bound).
_SEED_RANGE = 2**63


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How a rollout samples: completions per prompt, their length and the sampling settings."""

  samples_per_prompt: int
  max_new_tokens: int
  temperature: float
  top_p: float
  seed: int


def rollout_seeds(seed: int, rollout: int, first_row: int, rows: int) -> list[int]:
  """The sampling seed of each of `rows` completions from global row `first_row` of rollout
  `rollout` (the same whatever the number of processes)."""
  return [int(np.random.default_rng([seed, rollout, first_row + row]).integers(_SEED_RANGE))
          for row in range(rows)]


def prompt_records(batch: Any) -> list[dict[str, Any]]:
  """The records of a prompt source's batch: its `records` entry, or the batch itself where it
  is a sequence of records."""
  records = batch.get("records") if isinstance(batch, Mapping) else batch
  if records is None or not all(isinstance(r, Mapping) for r in records):
    raise UsageError("train_data: the batch holds no prompt records (a 'records' list of "
                     "dicts); give a PromptSource (data/prompt_source.py)")
  return [dict(r) for r in records]


def score_all(specs: Sequence[tuple[str, float]], records: Sequence[Mapping[str, Any]],
              completions: Sequence[str]) -> list[Any]:
  """The rewards `specs` ((name, weight) pairs) give each completion of its record
  (rewards/registry.py's ScoredCompletion: a reward that fails scores 0 and is counted); the
  step's failures are one warning (how many, and the first)."""
  # A reward whose work runs in a subprocess (code_tests) scores several completions at once.
  scored = registry.score_many(list(specs), [dict(r) for r in records], list(completions),
                               workers=os.cpu_count() or 1)
  warning = registry.failure_warning(scored)
  if warning is not None:
    logging.warning("%s", warning)
  return scored


def _merged(base: Any, adapters: Any, scale: float) -> Any:
  """A LoRA job's base with its adapters merged in, as float weights: a QLoRA base's int8
  weights dequantized first (the decode functions quantize the merged weights again, as
  `--mode=decode` quantizes a QLoRA job's merged parameters)."""
  base = jax.tree.map(lambda w: quantization.dequantize(w) if quantization.is_quantized(w)
                      else w, base, is_leaf=quantization.is_quantized)
  return lora.merge(base, adapters, scale)


class Rollouts:
  """Samples and scores completions of prompt records for one job's JittedSteps (their model,
  mesh and train data); made once per job, its decode functions compiled at the first rollout.

  Attributes:
    memo: (key, value) of the last rollout kept for reuse (an objective's several updates on
      one batch of rollouts), or None.
  """

  records = staticmethod(prompt_records)
  sampling = Sampling
  score_all = staticmethod(score_all)

  def __init__(self, jitted: Any):
    self._jitted = jitted
    self._setup = jitted.setup
    self._vocabulary = text_vocabulary(self._setup.train_data)
    self._generator: Generator | None = None
    self.memo: tuple[Any, Any] | None = None
    self._log_probs: Any = None  # The jitted teacher-forced forward, made at first use.
    lora_settings = self._setup.train.lora
    self._merge = None if lora_settings is None else jax.jit(functools.partial(
        _merged, scale=lora_settings.scale))

  def policy_params(self, state: Any) -> Any:
    """The parameters the policy decodes with: the trained ones, or a LoRA job's base with its
    adapters merged in (as decode applies them)."""
    if self._merge is None:
      return state.params
    return self._merge(state.frozen, state.params)

  def _decoder(self, params: Any) -> Generator:
    """The generator, its parameters set to `params` (made, on the train mesh, at first)."""
    if self._generator is None:
      self._generator = Generator(self._setup, params, mesh=self._jitted.mesh,
                                  vocabulary=self._vocabulary)
    else:
      self._generator.params = self._generator.steps.decode_form(params)
    return self._generator

  def prompt(self, record: Mapping[str, Any]) -> dict[str, Any]:
    """The request fields of `record`'s prompt: its ids (a prompt source's, rendered and
    tokenized), else its text."""
    if record.get("prompt_ids") is not None:
      return {"prompt_ids": tuple(int(i) for i in record["prompt_ids"])}
    if isinstance(record.get("prompt"), str):
      return {"prompt": record["prompt"]}
    raise UsageError(f"train_data: record {record.get('id')!r} has no prompt text or ids "
                     "(a prompt source, data/prompt_source.py, renders chat messages); give "
                     "one")

  def complete(self, state: Any, records: Sequence[Mapping[str, Any]], sampling: Sampling,
               rollout: int) -> list[Completion]:
    """`sampling.samples_per_prompt` completions of each record, prompt by prompt (the
    completions of record i are rows i*G .. i*G + G - 1), from `state`'s parameters."""
    group = sampling.samples_per_prompt
    rows = len(records) * group
    seeds = rollout_seeds(sampling.seed, rollout, jax.process_index() * rows, rows)
    requests = []
    for index, record in enumerate(records):
      prompt = self.prompt(record)
      for member in range(group):
        requests.append(Request(
            source=f"train_data record {record.get('id')!r}", **prompt,
            max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
            top_k=0, top_p=sampling.top_p, seed=seeds[index * group + member]))
    generator = self._decoder(self.policy_params(state))
    completions = generator.generate(requests)
    return [c for c in completions if c is not None]

  def log_probs(self, state: Any, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each target's log-probability under `state`'s policy by the train step's own forward
    (teacher-forced, whole rows), this process's rows [rows, length]: the denominators of an
    objective's ratio over several updates, free of what decoding computes otherwise (a
    QLoRA job decodes its merged weights quantized again)."""
    if self._log_probs is None:
      jitted = self._jitted

      def log_probs(params, frozen, inputs, targets):
        logits = Forward(jitted.model, frozen, jitted.adapters).logits(params,
                                                                       {"inputs": inputs})
        return -token_losses(logits, targets)[0]

      self._log_probs = jax.jit(log_probs)
    batch = self._jitted.global_batch({key: rows[key] for key in ("inputs", "targets")})
    found = self._log_probs(state.params, state.frozen, batch["inputs"], batch["targets"])
    shards = {shard.index[0].start or 0: np.asarray(shard.data)
              for shard in found.addressable_shards}
    return np.concatenate([shards[start] for start in sorted(shards)], axis=0)

  def text(self, completion: Completion) -> str:
    """The completion as the rewards read it: its text (its ids in a list, where the data has
    no text vocabulary)."""
    if completion.completion_text is not None:
      return completion.completion_text
    return " ".join(str(i) for i in completion.completion_ids)
