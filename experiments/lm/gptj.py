"""GPT-J-6B as trained by mesh-transformer-jax, on synthetic tokens.

  python -m lingvo_lite --exp=GptJ6B --fiddler=tiny --job_log_dir=runs/gptj_tiny
  python -m lingvo_lite --exp=GptJ6B --mode=compile --compile_topology=v5e-256
"""

import fiddle as fdl

from experiments.lm.synthetic import synthetic_lm_data
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Experiment, Setup, TrainLoop, setup_config
from lingvo_lite.models.gptj import GptJ
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.partitioning import Partitioner

GPT2_BPE_TOKENS = 50257


@register
class GptJ6B(Experiment):
  """GPT-J-6B: 28 layers, d_model 4096, 16 heads x 256, rotary on 64 dims, 6.05B parameters.

  Vocabulary 50400 (50257 GPT-2 BPE tokens padded so 8 shards divide it); context 2048;
  batch 512 x 2048 tokens; AdamW 1.2e-4 with warmup and cosine decay to 10%, clipping 1.0,
  weight decay 0.1 on matrices; z-loss 1e-4; float32 master weights, bfloat16 compute.
  Fully sharded (FSDP) over every device, the layers scanned and rematerialized (as in
  mesh-transformer-jax): the train step fits a v5e-256 with 13.2 GiB per chip to spare
  (XLA:TPU's peak 2.76 of 16 GiB; `--mode=compile --compile_topology=v5e-256`).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    sequence_length = 2048
    return setup_config(
        model=fdl.Config(GptJ, vocab_size=50400, num_layers=28, dim=4096, num_heads=16,
                         head_dim=256, rotary_dim=64, mlp_dim=16384, dtype="bfloat16",
                         param_dtype="float32", scan_layers=True, remat_policy="full"),
        optimizer=fdl.Config(AdamW, peak_learning_rate=1.2e-4, warmup_steps=3000,
                             final_learning_rate_ratio=0.1, b1=0.9, b2=0.95,
                             weight_decay=0.1, clip_grad_norm=1.0),
        train_data=synthetic_lm_data(GPT2_BPE_TOKENS, sequence_length, 512),
        eval_data=synthetic_lm_data(GPT2_BPE_TOKENS, sequence_length, 512, eval_batches=10),
        train=fdl.Config(TrainLoop, steps=383500, z_loss=1e-4, log_every_steps=10,
                         eval_every_steps=1000),
        partitioner=fdl.Config(Partitioner, ici_data=1, ici_fsdp=-1),
    )


@register
class GptJ6BFinetune(GptJ6B):
  """mesh-transformer-jax's fine-tuning recipe for GPT-J-6B (its howto_finetune config): batch 32
  x 2048 tokens, AdamW 5e-5 after 520 warmup steps, annealed to 1e-5 by step 5205, weight
  decay 0.1, clipping 1.0; starting from the pretrained weights and reading the user's files.
  mesh-transformer-jax takes the 32 sequences one at a time (32 accumulation steps) on one
  8-core model-parallel replica; sharded fully over every chip here, a micro-batch needs a row
  per chip, so the 32 are 2 micro-batches of 16 (a row per chip of a v5e-16):

    python -m lingvo_lite --exp=GptJ6BFinetune --init_from=hf:models/gpt-j-6b \
        --job_log_dir=runs/gptj_ft --fdl.train_data=... (a task of tasks/formats/)
    python -m lingvo_lite --exp=GptJ6BFinetune --mode=compile --compile_topology=v5e-16

  The experiment's own data are synthetic tokens of the same shapes, so it compiles (and its
  memory verdict holds) without the files. Fully sharded as GptJ6B, the step fits a v5e-16 (8.6
  of 16 GiB per chip, XLA:TPU's peak). It does not fit a v4-8: float32 weights and Adam
  moments are 16.9 GiB of each chip's 30.75, and with gradients and their sum the step needs
  31.4 GiB even a row per chip at a time (`--fdl.train.grad_accum_steps=8`; 33.9 GiB with 2 micro-batches).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.optimizer = fdl.Config(AdamW, peak_learning_rate=5e-5, warmup_steps=520,
                               final_learning_rate_ratio=0.2, b1=0.9, b2=0.95,
                               weight_decay=0.1, clip_grad_norm=1.0)
    for data in (cfg.train_data, cfg.eval_data):
      data.global_batch_size = 32
    cfg.train.steps = 5205
    cfg.train.grad_accum_steps = 2
    cfg.train.eval_every_steps = 500
    return cfg
