"""A model loaded to answer requests: its parameters on a mesh once, with the generator that
decodes (decode/generator.py) and the scorer that reads log-probabilities (scoring/scorer.py)
sharing them. What the serve program and the lm-evaluation-harness model stand on.

The parameters are the job's checkpoint, or, for a job dir without one, the weights its config
starts from (`train.init_from`), opened as every program opens them (weights/job_params.py:
`JobParams`); `ModelLoader` checks and shapes the model for decoding before any parameter is
read, then loads them into a `LoadedModel`, which decode, serve and the harness all use.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Any, Sequence

import jax
import numpy as np
from etils import epath

from lingvo_lite import memory_fit, paths, target as targets
from lingvo_lite.config import building, files as config_files, overrides, registry
from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.data.source import text_vocabulary
from lingvo_lite.decode import generator as generation, jitted as decode_jitted
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.scoring.scorer import Scorer
from lingvo_lite.weights import sources
from lingvo_lite.weights.job_params import JobParams


@dataclasses.dataclass
class LoadedModel:
  """A Setup's model with its parameters placed, ready to decode and to score.

  Attributes:
    setup: The validated Setup.
    vocabulary: The seqio vocabulary of its data (None: the model reads ids, not text).
    generator: Decodes requests over the `decode.*` slots.
    scorer: Log-probabilities of token sequences.
    weights: What the parameters are ('checkpoint step 20', 'train.init_from gguf:...').
    checksum: SHA-256 over the parameters' bytes (tree order): results name the weights
      they came from, whatever file held them.
  """

  setup: Setup
  vocabulary: Any
  generator: generation.Generator
  scorer: Scorer
  weights: str

  @functools.cached_property
  def checksum(self) -> str:
    """Computed when first asked (a result or /v1/models names it), not at every load: it
    reads every parameter back to the host."""
    return parameters_checksum(self.generator.params)

  @property
  def max_length(self) -> int:
    return self.setup.model.max_length

  @property
  def eos_id(self) -> int | None:
    return getattr(self.vocabulary, "eos_id", None)

  @property
  def tokenizer_files(self) -> pretrained_tokenizer.TokenizerFiles | None:
    """A pretrained tokenizer's files (its special tokens, BOS rule, chat template), or None
    for a byte or SentencePiece vocabulary. The runtime's TextVocabulary holds them as
    `tokenizer`, seqio's TokenizerVocabulary as `files`."""
    for attribute in ("tokenizer", "files"):
      value = getattr(self.vocabulary, attribute, None)
      if isinstance(value, pretrained_tokenizer.TokenizerFiles):
        return value
    return None

  @property
  def bos_id(self) -> int | None:
    """The pretrained tokenizer's BOS; None elsewhere (byte and SentencePiece vocabularies
    start texts with no BOS here, as seqio's do)."""
    files = self.tokenizer_files
    return files.bos_id if files is not None else None

  def encode(self, text: str) -> list[int]:
    """`text`'s ids with no BOS, a special token's string read as that token (as a Hugging
    Face tokenizer's `encode(text, add_special_tokens=False)` does: a chat template's
    markers are tokens, not text; a harness finds EOS by encoding its string)."""
    files = self.tokenizer_files
    if files is not None:
      return pretrained_tokenizer.encode_with_special_tokens(files, text)
    specials = self._special_strings()
    if not specials:
      return [int(i) for i in self.vocabulary.encode(text)]
    ids = []
    for piece in re.split("(" + "|".join(re.escape(s) for s in specials) + ")", text):
      if piece in specials:
        ids.append(specials[piece])
      elif piece:
        ids += [int(i) for i in self.vocabulary.encode(piece)]
    return ids

  def _special_strings(self) -> dict[str, int]:
    """{string: id} of EOS: the piece a SentencePiece vocabulary names it by, else `</s>` (a
    byte vocabulary's has no text), so a client can name it."""
    processor = getattr(self.vocabulary, "sentencepiece", None)
    token = self.eos_id
    if token is None or token < 0:
      return {}
    return {str(processor.IdToPiece(int(token))) if processor is not None else "</s>":
            int(token)}

  def with_bos(self, ids: list[int]) -> list[int]:
    """`ids` led by BOS where the tokenizer starts a text with it (Hugging Face's
    add_special_tokens=True)."""
    files = self.tokenizer_files
    if files is not None and files.add_bos and files.bos_id is not None and \
        ids[:1] != [files.bos_id]:
      return [int(files.bos_id)] + ids
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    return self.generator.resolver.text(list(ids)) or ""

  def token_text(self, token: int) -> str:
    """One id as text (a special token's own string, which `decode` drops)."""
    files = self.tokenizer_files
    if files is not None:
      return pretrained_tokenizer.tokenizer(files).decode([int(token)],
                                                          skip_special_tokens=False)
    specials = {token_id: text for text, token_id in self._special_strings().items()}
    if int(token) in specials:
      return specials[int(token)]
    return self.vocabulary.decode([int(token)])


class ModelLoader:
  """A job's model checked and shaped for decoding, before any parameter is read: where its
  parameters come from (chosen), its vocabulary, the decode functions on the mesh and the
  decode memory check. `load()` then reads the parameters into a `LoadedModel`.

  Attributes:
    params: The job's parameters, opened.
    vocabulary: The seqio vocabulary of its data (None: the model reads ids, not text).
    steps: The jitted decode functions.
  """

  def __init__(self, params: JobParams):
    """
    Raises:
      UsageError: no usable checkpoint or source, a step that is not there, a decode state
        that does not fit (one line each).
    """
    setup = params.setup
    self.params = params
    params.choose()  # Refused first where there is nothing to load.
    self.vocabulary = text_vocabulary(setup.train_data)
    self.steps = decode_jitted.DecodeSteps(setup, params.mesh,
                                           decode_jitted.end_token(setup, self.vocabulary))
    memory_fit.check_decode_fits(setup)

  def load(self, score_tokens: int | None = None) -> LoadedModel:
    """The model with its parameters placed, in decoding's form (int8 weights quantized
    once, where the model says so)."""
    setup = self.params.setup
    with self.steps.activated():
      params, _ = self.params.load()
    generator = generation.Generator(setup, params, mesh=self.params.mesh,
                                     vocabulary=self.vocabulary, checkpoint_step=self.params.step,
                                     steps=self.steps)
    del params
    return LoadedModel(setup=setup, vocabulary=self.vocabulary, generator=generator,
                       scorer=Scorer(self.steps, generator.params, **(
                           {} if score_tokens is None else {"tokens_per_call": score_tokens})),
                       weights=self.params.describe())


def load(setup: Setup, job_dir: epath.Path, shown_job: Any,
         checkpoint_step: int | None = None, score_tokens: int | None = None) -> LoadedModel:
  """The job's parameters (its checkpoint, else its `train.init_from`) on this host's devices.

  Raises:
    UsageError: no usable checkpoint or source, a step that is not there, a decode state that
      does not fit (one line each, before anything is allocated where it can be).
  """
  return ModelLoader(JobParams(setup, job_dir, shown_job, checkpoint_step)).load(score_tokens)


def parameters_checksum(params: Any) -> str:
  """'sha256:<hex>' over every parameter's dtype, shape and bytes, in tree order."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    array = np.asarray(jax.device_get(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape};".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return f"sha256:{digest.hexdigest()}"


def from_job(job_log_dir: str, exp: str | None = None, init_from: str | None = None,
             checkpoint_step: int | None = None, assignments: Sequence[str] = (),
             score_tokens: int | None = None) -> LoadedModel:
  """A job dir's model for a caller without lingvo_lite's flags (the lm-evaluation-harness
  model): its config.json (or experiment `exp`, for a job dir without one), `init_from`
  (`hf:PATH`, `gguf:PATH`, `JOB[@STEP]`) and `PATH=VALUE` assignments applied as --init_from
  and --fdl.PATH=VALUE would be.

  Raises:
    UsageError: one line naming the argument.
  """
  setup, job_dir = setup_from_job(job_log_dir, exp, init_from, assignments)
  with targets.active(targets.host()):
    return load(setup, job_dir, job_log_dir, checkpoint_step, score_tokens)


def check_job(job_log_dir: str, exp: str | None = None, init_from: str | None = None,
              checkpoint_step: int | None = None, assignments: Sequence[str] = ()) -> None:
  """What `from_job` checks before it reads a parameter (the config, the arguments, the
  checkpoint step or weight source), without reading one: a caller that has more to do
  before the model loads (lm_eval indexes its tasks) refuses a bad argument first.

  Raises:
    UsageError: one line naming the argument.
  """
  setup, job_dir = setup_from_job(job_log_dir, exp, init_from, assignments)
  JobParams(setup, job_dir, job_log_dir, checkpoint_step).choose()


def setup_from_job(job_log_dir: str, exp: str | None = None, init_from: str | None = None,
                   assignments: Sequence[str] = ()) -> tuple[Setup, epath.Path]:
  """The validated Setup of `from_job`'s arguments, and the job dir.

  Raises:
    UsageError: one line naming the argument.
  """
  job_dir = paths.resolve(job_log_dir, "job_log_dir")
  if exp:
    cfg = registry.lookup(exp).config()
  elif (job_dir / config_files.CONFIG_JSON).exists():
    cfg = config_files.load(job_dir / config_files.CONFIG_JSON, "job_log_dir")
  else:
    raise UsageError(f"job_log_dir={job_log_dir}: holds no {config_files.CONFIG_JSON}; give "
                     "the job dir of a training run, or exp=NAME (with init_from=...) for a "
                     "new one")
  cfg = (building.require_setup(cfg, f"exp={exp}") if exp else
         building.require_setup(cfg, f"job_log_dir={job_log_dir}", building.FIX_FILE))
  building.set_parts(cfg, sources.config_parts(init_from, cfg, "init_from"))
  overrides.apply(cfg, [overrides.set_directive(f"--set {a}", a) for a in assignments], None)
  with targets.active(targets.host()):
    return building.build(cfg), job_dir
