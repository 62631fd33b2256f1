"""Synthetic-token data configs for the full-size shape experiments.

The published models (GPT-J, Llama, GPT-2) were trained on web-scale tokenized corpora
that no machine here has; their experiments reproduce the architectures and recipes on
synthetic tokens. Point `train_data` at a seqio Task to train on real data.
"""

from typing import Any

import fiddle as fdl

from lingvo_lite.data.synthetic import SyntheticData
from lingvo_lite.experiment import Setup


def synthetic_lm_data(vocab_size: int, sequence_length: int, global_batch_size: int,
                      eval_batches: int | None = None) -> fdl.Config[SyntheticData]:
  return fdl.Config(SyntheticData, vocab_size=vocab_size, sequence_length=sequence_length,
                    global_batch_size=global_batch_size, seed=0 if eval_batches is None else 1,
                    num_batches=eval_batches)


def full_size(cfg: fdl.Config[Setup], model: type, sequence_length: int, batch: int, *,
              micro_batches: int | None = None, **fields: Any) -> fdl.Config[Setup]:
  """`cfg` with a `model` of `fields` (vocab_size among them) as the full-size shape experiments
  run it (bfloat16 compute over float32 parameters, the layers scanned and fully
  rematerialized), trained and evaluated on synthetic tokens of its vocabulary: `batch` rows of
  `sequence_length` a step (as `micro_batches` accumulated ones where given; else as `cfg`
  has it), 10 eval batches."""
  cfg.model = fdl.Config(model, **fields, dtype="bfloat16", param_dtype="float32",
                         scan_layers=True, remat_policy="full")
  vocab = fields["vocab_size"]
  cfg.train_data = synthetic_lm_data(vocab, sequence_length, batch)
  cfg.eval_data = synthetic_lm_data(vocab, sequence_length, batch, eval_batches=10)
  if micro_batches is not None:
    cfg.train.grad_accum_steps = micro_batches
  return cfg
