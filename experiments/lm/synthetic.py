"""Synthetic-token data configs for the full-size shape experiments.

The published models (GPT-J, Llama, GPT-2) were trained on web-scale tokenized corpora
that no machine here has; their experiments reproduce the architectures and recipes on
synthetic tokens. Point `train_data` at a seqio Task to train on real data.
"""

import fiddle as fdl

from lingvo_lite.data.synthetic import SyntheticData


def synthetic_lm_data(vocab_size: int, sequence_length: int, global_batch_size: int,
                      eval_batches: int | None = None) -> fdl.Config[SyntheticData]:
  return fdl.Config(SyntheticData, vocab_size=vocab_size, sequence_length=sequence_length,
                    global_batch_size=global_batch_size, seed=0 if eval_batches is None else 1,
                    num_batches=eval_batches)
