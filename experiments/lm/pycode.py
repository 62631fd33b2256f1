"""Language models of Python source code: the standard library's own files.

They need nothing but the Python installation. The default experiment, PyCodeSpTiny, tokenizes
with a SentencePiece model trained on the train split at first run; PyCodeTiny reads bytes.
  python -m lingvo_lite --exp=PyCodeSpTiny --job_log_dir=runs/pycode_sp_tiny
"""

import os

import fiddle as fdl

from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.config.registry import register
from lingvo_lite.data.store_data import StoreStream, TokenStoreData, TokenStoreMixture
from lingvo_lite.data.vocabulary import SentencePieceModel, padded_vocab_size
from lingvo_lite.experiment import Experiment, Setup, TrainLoop, setup_config
from lingvo_lite.models.gpt2 import Gpt2
from lingvo_lite.models.gptj import GptJ
from lingvo_lite.models.llama import Llama
from lingvo_lite.training.optimizers import AdamW
from tasks import pycode


def pycode_data(task: fdl.Config, split: str, sequence_length: int, global_batch_size: int,
                num_batches: int | None = None) -> fdl.Config[TokenStoreData]:
  """Packed examples of the split's token store (built at first use). Train data shuffles
  endlessly; eval data is a fixed, spread-out sample of the split."""
  return fdl.Config(TokenStoreData, task=task, split=split, sequence_length=sequence_length,
                    global_batch_size=global_batch_size, shuffle=True,
                    seed=0 if split == "train" else 1, num_batches=num_batches)


@register
class PyCodeTiny(Experiment):
  """GPT-J-style 4-layer byte LM on the Python stdlib; about 3 minutes on 2 CPU cores.

  python -m lingvo_lite --exp=PyCodeTiny --job_log_dir=runs/pycode_tiny
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    task = fdl.Config(pycode.pycode_task)
    sequence_length = 128
    return setup_config(
        # Unit-scale embedding rows (GPT-J's reference init is 0.02): what this experiment
        # was tuned with, and what the default experiment's published losses come from.
        model=fdl.Config(GptJ, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                         num_heads=4, rotary_dim=16, embedding_init_stddev=1.0),
        optimizer=fdl.Config(AdamW, peak_learning_rate=3e-3, warmup_steps=50,
                             weight_decay=0.1, clip_grad_norm=1.0),
        train_data=pycode_data(task, "train", sequence_length, global_batch_size=16),
        eval_data=pycode_data(task, "validation", sequence_length, global_batch_size=16,
                              num_batches=64),
        train=fdl.Config(TrainLoop, steps=800, log_every_steps=50, eval_every_steps=400),
        checkpoint=fdl.Config(CheckpointSettings, every_steps=200, max_to_keep=2),
    )


# The default experiment's vocabulary: trained once per machine on the stdlib's train split.
SP_VOCAB_SIZE = 1024


@register
class PyCodeSpTiny(PyCodeTiny):
  """The default experiment: PyCodeTiny's model on SentencePiece tokens (1,024 unigram pieces,
  trained on the train split at first run); a few minutes on 2 CPU cores.

  python -m lingvo_lite --exp=PyCodeSpTiny --job_log_dir=runs/pycode_sp_tiny
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    task = fdl.Config(pycode.pycode_task, vocabulary=fdl.Config(
        SentencePieceModel, vocab_size=SP_VOCAB_SIZE, model_type="unigram"))
    cfg.train_data.task = task
    cfg.eval_data.task = task
    cfg.model.vocab_size = padded_vocab_size(SP_VOCAB_SIZE)
    return cfg


@register
class PyCodeMixtureTiny(PyCodeTiny):
  """PyCodeTiny trained on a mixture of two tasks: 80% of rows from the stdlib's library code,
  20% from CPython's own test suite (`<stdlib>/test`, which PyCode leaves out); evaluated on
  both validation splits, as the sets `validation` and `test_suite`. Needs CPython's test
  package (Debian: libpython3-testsuite).

  python -m lingvo_lite --exp=PyCodeMixtureTiny --job_log_dir=runs/pycode_mixture
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    train = cfg.train_data
    test_task = fdl.Config(pycode.pycode_task,
                           source_dir=os.path.join(pycode.stdlib_dir(), "test"))
    sources = [fdl.Config(StoreStream, task=train.task, split="train", seed=0),
               fdl.Config(StoreStream, task=test_task, split="train", seed=0)]
    cfg.train_data = fdl.Config(TokenStoreMixture, sources=sources, rates=[0.8, 0.2],
                                sequence_length=train.sequence_length,
                                global_batch_size=train.global_batch_size, seed=0)
    cfg.eval_data = {"validation": cfg.eval_data,
                     "test_suite": pycode_data(test_task, "validation", train.sequence_length,
                                               global_batch_size=16, num_batches=64)}
    return cfg


@register
class PyCodeLlamaTiny(PyCodeTiny):
  """The PyCodeTiny recipe with a Llama block (RMSNorm, SwiGLU, rotate-half RoPE, GQA)."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Llama, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, num_kv_heads=2, mlp_dim=344, embedding_init_stddev=1.0)
    return cfg


@register
class PyCodeGpt2Tiny(PyCodeTiny):
  """The PyCodeTiny recipe with a GPT-2 block (learned positions, tied embeddings)."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    # PaLM-style tied output, as this experiment was tuned (GPT-2's own: 0.02 and "one").
    cfg.model = fdl.Config(Gpt2, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, max_length=cfg.train_data.sequence_length,
                           embedding_init_stddev=1.0, tied_output_scale="rsqrt_dim")
    return cfg
