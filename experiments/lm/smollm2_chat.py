"""Post-training SmolLM2-135M-Instruct as practitioners do it: chat SFT with LoRA on the standard
library's instruction set, then DPO with LoRA on its preference pairs (tasks/stdlib_chat.py),
both with the model's own tokenizer and chat template.

  python -m lingvo_lite --exp=SmolLM2ChatSft --job_log_dir=runs/smol_sft
  python -m lingvo_lite --mode=export --job_log_dir=runs/smol_sft --export_format=hf \\
      --export_dir=runs/smol_sft_hf                          # the adapters merged
  python -m lingvo_lite --exp=SmolLM2Dpo --init_from=hf:runs/smol_sft_hf \\
      --job_log_dir=runs/smol_dpo                            # the reference: the SFT model

bench/post_training.py runs both with their evaluations (README, "Post-training").
"""

from typing import Any, Callable

import fiddle as fdl

from experiments.lm.smollm2 import SmolLM2_135M, smollm2_gguf
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.config.registry import register
from lingvo_lite.data.preference_data import PreferenceStoreData
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.data.store_data import TokenStoreData
from lingvo_lite.experiment import Setup
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.training.objectives.dpo import Dpo
from lingvo_lite.training.optimizers import AdamW
from tasks import stdlib_chat

# A conversation is ~120-450 tokens with SmolLM2's tokenizer (functions of at most 1,500
# characters of source); rows of 512 pack one to four.
SFT_LENGTH, SFT_BATCH = 512, 8
# A pair is two conversations; rows of 1,024 hold one to four pairs whole.
DPO_LENGTH, DPO_BATCH = 1024, 4
# Each step in two micro-batches: with every activation kept (remat "none") and the 49,152-way
# logits, a step of 8 x 512 tokens holds 12.3 GiB on a CPU host (the compile program's count),
# DPO's 4 x 1,024 with the reference's pass 14.4 GiB; halved, they fit a shared 2-core machine.
MICRO_BATCHES = 2


def _stdlib_chat_data(cfg: fdl.Config[Setup], data: type, task: Callable[..., Any],
                      sequence_length: int, batch: int) -> None:
  """Sets `cfg`'s train and eval data: `task` (a tasks/stdlib_chat.py task) with SmolLM2's
  tokenizer, its train split shuffled and its validation split in order, as `data`."""
  tokenizer = fdl.Config(PretrainedTokenizer, path=smollm2_gguf())
  made = fdl.Config(task, vocabulary=tokenizer)
  cfg.train_data = fdl.Config(data, task=made, split="train", sequence_length=sequence_length,
                              global_batch_size=batch, seed=0)
  cfg.eval_data = fdl.Config(data, task=made, split="validation",
                             sequence_length=sequence_length, global_batch_size=batch,
                             shuffle=False)


@register
class SmolLM2ChatSft(SmolLM2_135M):
  """LoRA (rank 16, alpha 32, every attention projection and MLP matrix: 4.88M trained
  parameters beside the 134.5M frozen) on the stdlib instruction set, the loss on the
  assistant's tokens only: 40 steps of 8 x 512 tokens (163,840 tokens, two thirds of the
  train split's 247,221); eval: the validation split's assistant-token bits per byte (the
  whole split)."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    _stdlib_chat_data(cfg, TokenStoreData, stdlib_chat.instruction_task, SFT_LENGTH, SFT_BATCH)
    cfg.optimizer = fdl.Config(AdamW, peak_learning_rate=5e-4, warmup_steps=5,
                               weight_decay=0.0, clip_grad_norm=1.0)
    cfg.train.lora = fdl.Config(LoraSettings, rank=16, alpha=32.0)
    cfg.train.grad_accum_steps = MICRO_BATCHES
    cfg.train.steps = 40
    cfg.checkpoint = fdl.Config(CheckpointSettings, every_steps=10, max_to_keep=1)
    return cfg


@register
class SmolLM2Dpo(SmolLM2ChatSft):
  """DPO (beta 0.1) with LoRA on the stdlib preference pairs (the real function chosen, the
  same with one bug rejected); the reference is the base with adapters off: give the SFT
  model as the base (`--init_from=hf:` of its merged export). 30 steps of 4 rows of 1,024
  tokens (122,880 tokens; a row holds one to four pairs whole). Eval: the validation pairs'
  DPO loss, reward margin and accuracy, and the policy's own preference accuracy."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    _stdlib_chat_data(cfg, PreferenceStoreData, stdlib_chat.preference_task, DPO_LENGTH,
                      DPO_BATCH)
    cfg.optimizer.peak_learning_rate = 5e-5
    cfg.train.objective = fdl.Config(Dpo, beta=0.1)
    cfg.train.steps = 30
    return cfg
