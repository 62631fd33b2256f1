"""gpt-oss-shaped models: attention with biases and sinks, sliding and full layers alternating,
YaRN, and 32 experts (4 per token) with biases and a clamped SwiGLU.

  python -m lingvo_lite --exp=GptOss20B --mode=compile --compile_topology=v5e-256 \\
      --fdl.partitioner.ici_fsdp=64 --fdl.partitioner.ici_tensor=4 --fdl.train.grad_accum_steps=8
  python -m lingvo_lite --exp=PyCodeGptOssTiny --job_log_dir=runs/gpt_oss_tiny
  python -m lingvo_lite --exp=PyCodeTiny --init_from=hf:PATH --mode=decode ...   # a folder

The full size trains on synthetic tokens (no web corpus here), fully sharded (its experts
over the `expert` mesh axis with --fdl.partitioner.ici_expert=N), scanned and rematerialized.
"""

import fiddle as fdl

from experiments.lm.llama import Llama7B
from experiments.lm.pycode import PyCodeTiny
from experiments.lm.synthetic import full_size
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.gpt_oss import GptOss
from tasks import pycode

VOCAB = 201088


@register
class GptOss20B(Llama7B):
  """gpt-oss-20b shapes: 24 layers, d_model 2880, 64 query / 8 key-value heads of 64 (with
  sinks), windows of 128 on every other layer, 32 experts of 2880 (4 per token), vocabulary
  201,088, YaRN x32 over 4096 positions on a base of 150,000: 20.9B parameters, 3.6B active
  per token. bfloat16 compute, float32 parameters; 512 sequences of 4096 tokens a step as 2
  micro-batches, fully sharded (FSDP over every device). A v5e-256 is 256 ways, which 2880
  does not divide: there it fits as fsdp=64 x tensor=4 in 8 micro-batches (the flags in the
  module's docstring; README's topology table has the layouts tried).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), GptOss, 4096, 512, micro_batches=2, vocab_size=VOCAB,
                     num_layers=24, dim=2880, num_heads=64, num_kv_heads=8, head_dim=64,
                     mlp_dim=2880, num_experts=32, experts_per_token=4, max_length=131072)


@register
class PyCodeGptOssTiny(PyCodeTiny):
  """The PyCodeTiny recipe with a gpt-oss block: 4 layers of width 128, 4 heads of 32 with
  sinks, 2 key-value heads, windows of 32 on every other layer, 8 experts of width 86, 4 per
  token."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(GptOss, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=86, num_experts=8,
                           experts_per_token=4, window=32, max_length=2048,
                           embedding_init_stddev=1.0)
    return cfg
