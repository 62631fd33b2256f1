"""Reinforcement learning from verifiable rewards on SmolLM2-135M-Instruct: GRPO with LoRA on
easy arithmetic word problems (tasks/arithmetic_problems.py: 1-2 steps of adding and taking
away, numbers up to 20), the answer in a tag, the format shown by a one-shot system string.

  python bin/make_prompts.py --task=arithmetic --split=train --count=2000 --min_steps=1 \\
      --max_steps=2 --operations=add,take --one_shot --out=prompts/arithmetic_easy/train.jsonl
  python -m lingvo_lite --exp=SmolLM2Grpo --job_log_dir=runs/smol_grpo
  python bench/grpo_demo.py --out OUT --work WORK   # the above, and accuracy before/after

The rollouts are sampled in-process by the decode engine from the adapted policy, scored by
`exact_answer` (the tagged answer equals the record's) and `answer_format` (a tagged number is
there at all) and trained on with GRPO's loss (training/objectives/grpo.py).
"""

import fiddle as fdl

from experiments.lm.smollm2 import SmolLM2_135M, smollm2_gguf
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.config.registry import register
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.data.prompt_data import PromptData
from lingvo_lite.data.prompt_source import PromptSource
from lingvo_lite.experiment import Setup
from lingvo_lite.models.lora import LoraSettings
from lingvo_lite.training.objectives.grpo import Grpo
from lingvo_lite.training.optimizers import AdamW

# Where the README's `bin/make_prompts.py` commands (and bench/grpo_demo.py) write the
# problems: JSON lines of data/prompt_data.py's format, train and held-out splits disjoint.
PROBLEMS_DIR = "prompts/arithmetic_easy"
# The problems' difficulty, and the one-shot system string (tasks/arithmetic_problems.py's
# `generate` arguments; `PROBLEM_FLAGS` the same for bin/make_prompts.py). At the default
# 2-3 steps of five kinds with the instruction alone the untrained model never answers in the
# tags, and GRPO has nothing to compare (README, "GRPO").
PROBLEMS = {"min_steps": 1, "max_steps": 2, "max_number": 20, "operations": ("add", "take"),
            "one_shot": True}
PROBLEM_FLAGS = (*(f"--{key}={PROBLEMS[key]}" for key in ("min_steps", "max_steps", "max_number")),
                 "--operations=" + ",".join(PROBLEMS["operations"]),
                 *(("--one_shot",) if PROBLEMS["one_shot"] else ()))
# A problem with the system string renders to 166-181 tokens with the chat template (the
# 2,000 train problems); a worked answer of two steps is ~30 tokens, and 64 leave room to
# reason. Rows of 256 hold both; the decode cache the same.
SEQUENCE_LENGTH, MAX_NEW_TOKENS = 256, 64
# 2 prompts x 8 completions a step: 16 rows of 256 tokens, in two micro-batches of 8 rows:
# with the 49,152-way logits (and the entropy's log-softmax beside them) a micro-batch holds
# about what SmolLM2ChatSft's of 4 x 512 does. Measured at 32 rows of 288 (README, "GRPO"), a
# step took 229-270 s at a load of ~5.5: half the rows, and 20 steps, for 30 idle minutes.
PROMPTS_PER_STEP, GROUP_SIZE, MICRO_BATCHES = 2, 8, 2
STEPS = 20


@register
class SmolLM2Grpo(SmolLM2_135M):
  """GRPO (group of 8, token-level DAPO aggregation with clip-higher 0.2/0.28, no reference)
  with LoRA (rank 16, alpha 32, learning rate 5e-4) on the easy arithmetic problems' train
  split: 20 steps of 2 prompts x 8 sampled completions (at most 64 new tokens each,
  temperature 1), rewarded 1.0 for the right tagged answer and 0.1 for a well-formed one; no
  eval set (bench/grpo_demo.py measures accuracy on the held-out split by greedy decoding)."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    tokenizer = fdl.Config(PretrainedTokenizer, path=smollm2_gguf())
    prompts = fdl.Config(PromptData, files=f"{PROBLEMS_DIR}/train.jsonl",
                         prompts_per_step=PROMPTS_PER_STEP, seed=0,
                         required_fields=("answer",))
    cfg.train_data = fdl.Config(PromptSource, prompts=prompts, tokenizer=tokenizer,
                                sequence_length=SEQUENCE_LENGTH)
    cfg.eval_data = None
    cfg.train.objective = fdl.Config(
        Grpo, rewards=(("exact_answer", 1.0), ("answer_format", 0.1)),
        group_size=GROUP_SIZE, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0,
        epsilon_low=0.2, epsilon_high=0.28, aggregation="token")
    cfg.train.lora = fdl.Config(LoraSettings, rank=16, alpha=32.0)
    cfg.train.steps = STEPS
    cfg.train.grad_accum_steps = MICRO_BATCHES
    cfg.train.log_every_steps = 1
    cfg.optimizer = fdl.Config(AdamW, peak_learning_rate=5e-4, warmup_steps=2,
                               weight_decay=0.0, clip_grad_norm=1.0)
    cfg.checkpoint = fdl.Config(CheckpointSettings, every_steps=10, max_to_keep=1)
    cfg.decode.cache_length = SEQUENCE_LENGTH + 32  # A long prompt still fits its answer.
    cfg.decode.slots = PROMPTS_PER_STEP * GROUP_SIZE  # One rollout in one round of slots.
    return cfg
