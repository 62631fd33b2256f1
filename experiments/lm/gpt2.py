"""GPT-2-shaped models on synthetic tokens.

  python -m lingvo_lite --exp=Gpt2Small --fiddler=tiny --job_log_dir=runs/gpt2_tiny
"""

import fiddle as fdl

from experiments.lm.synthetic import synthetic_lm_data
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Experiment, Setup, TrainLoop, setup_config
from lingvo_lite.models.gpt2 import Gpt2
from lingvo_lite.training.optimizers import AdamW

GPT2_BPE_TOKENS = 50257


@register
class Gpt2Small(Experiment):
  """GPT-2 small (124M): 12 layers, d_model 768, 12 heads, context 1024, tied embeddings;
  vocabulary padded from 50257 to 50304 (a multiple of 128)."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    sequence_length, batch = 1024, 512
    return setup_config(
        model=fdl.Config(Gpt2, vocab_size=50304, num_layers=12, dim=768, num_heads=12,
                         max_length=sequence_length),
        optimizer=fdl.Config(AdamW, peak_learning_rate=6e-4, warmup_steps=700,
                             weight_decay=0.1, clip_grad_norm=1.0),
        train_data=synthetic_lm_data(GPT2_BPE_TOKENS, sequence_length, batch),
        eval_data=synthetic_lm_data(GPT2_BPE_TOKENS, sequence_length, batch, eval_batches=10),
        train=fdl.Config(TrainLoop, steps=600000, log_every_steps=10, eval_every_steps=1000),
    )


@register
class Gpt2Medium(Gpt2Small):
  """GPT-2 medium (350M): 24 layers, d_model 1024, 16 heads."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model.num_layers = 24
    cfg.model.dim = 1024
    cfg.model.num_heads = 16
    return cfg
