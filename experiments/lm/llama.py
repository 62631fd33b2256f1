"""Llama-shaped models on synthetic tokens.

  python -m lingvo_lite --exp=Llama1B --fiddler=tiny --job_log_dir=runs/llama_tiny
"""

import fiddle as fdl

from experiments.lm.synthetic import synthetic_lm_data
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Experiment, Setup, TrainLoop, setup_config
from lingvo_lite.models.llama import Llama
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.partitioning import Partitioner


@register
class Llama1B(Experiment):
  """Llama-3.2-1B shapes: 16 layers, d_model 2048, 32 query / 8 key-value heads, SwiGLU 8192,
  vocabulary 128256, RoPE base 500000, tied embeddings; bfloat16 compute.

  Fully sharded (FSDP), layers scanned and rematerialized, the 256-row batch taken as 16
  micro-batches: the train step fits a v5e-8 (`--mode=compile --compile_topology=v5e-8`).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    vocab, sequence_length, batch = 128256, 2048, 256
    return setup_config(
        model=fdl.Config(Llama, vocab_size=vocab, num_layers=16, dim=2048, num_heads=32,
                         num_kv_heads=8, head_dim=64, mlp_dim=8192, rotary_base=500000.0,
                         tie_embeddings=True, dtype="bfloat16", param_dtype="float32",
                         scan_layers=True, remat_policy="full"),
        optimizer=fdl.Config(AdamW, peak_learning_rate=3e-4, warmup_steps=2000,
                             weight_decay=0.1, clip_grad_norm=1.0),
        train_data=synthetic_lm_data(vocab, sequence_length, batch),
        eval_data=synthetic_lm_data(vocab, sequence_length, batch, eval_batches=10),
        train=fdl.Config(TrainLoop, steps=100000, log_every_steps=10, eval_every_steps=1000,
                         grad_accum_steps=16),
        partitioner=fdl.Config(Partitioner, ici_data=1, ici_fsdp=-1),
    )


@register
class Llama7B(Llama1B):
  """Llama-2-7B shapes: 32 layers, d_model 4096, 32 heads, SwiGLU 11008, vocabulary 32000.

  Sharded and micro-batched as Llama1B: fits a v5p-8 (4 chips x 95 GiB); its float32
  parameters and Adam moments alone (81 GB) exceed a v5e-4's 4 x 16 GiB.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Llama, vocab_size=32000, num_layers=32, dim=4096, num_heads=32,
                           mlp_dim=11008, dtype="bfloat16", param_dtype="float32",
                           scan_layers=True, remat_policy="full")
    for data in (cfg.train_data, cfg.eval_data):
      data.vocab_size = 32000
    return cfg


@register
class Llama1BOneChip(Llama1B):
  """Llama1B's widths with 8 layers and a 32k vocabulary (552M parameters) at sequence 2048:
  the largest of its shape whose AdamW training state fits one 16 GiB TPU v5e chip. The
  speed benchmark of the TPU issue (`bench/tpu_check.sh`), at its baseline's batch of 4 and
  Llama1B's full remat; the best row measured there (56.3% MFU on a v5e) sets
  `model.remat_policy='minimal_with_context'`, `optimizer.moment_dtype='bfloat16'` and
  `train_data.global_batch_size=5` (README, "Measured on a TPU v5e").

    python -m lingvo_lite --exp=Llama1BOneChip --mode=compile --compile_topology=v5e-1
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model.num_layers = 8
    cfg.model.vocab_size = 32000
    for data in (cfg.train_data, cfg.eval_data):
      data.vocab_size = 32000
      data.global_batch_size = 4
    cfg.train.grad_accum_steps = 1
    cfg.partitioner.ici_fsdp = 1
    return cfg
