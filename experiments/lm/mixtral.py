"""Mixtral-shaped models: Llama's blocks with a mixture of 8 experts, 2 per token, in every layer.

  python -m lingvo_lite --exp=Mixtral8x7B --mode=compile --compile_topology=v5p-128
  python -m lingvo_lite --exp=PyCodeMixtralTiny --job_log_dir=runs/mixtral_tiny
  python -m lingvo_lite --exp=PyCodeTiny --init_from=hf:PATH --mode=decode ...   # a Mixtral folder

The full size trains on synthetic tokens (no web corpus here), fully sharded (its experts
over the `expert` mesh axis with --fdl.partitioner.ici_expert=N), scanned and rematerialized.
"""

import fiddle as fdl

from experiments.lm.llama import Llama7B
from experiments.lm.pycode import PyCodeTiny
from experiments.lm.synthetic import full_size
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.mixtral import Mixtral
from tasks import pycode


@register
class Mixtral8x7B(Llama7B):
  """Mixtral-8x7B shapes: 32 layers, d_model 4096, 32 query / 8 key-value heads of 128, 8
  SwiGLU experts of 14336 (2 per token), vocabulary 32000, RoPE base 1,000,000: 46.7B
  parameters, 12.9B active per token. bfloat16 compute, float32 parameters; 256 sequences of
  4096 tokens a step (1M tokens) as 4 micro-batches (a row per chip), fully sharded (FSDP):
  `--mode=compile --compile_topology=v5p-128`; the experts over the `expert` mesh axis and the
  rest FSDP: `--fdl.partitioner.ici_expert=8` (the README's topology table has both).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), Mixtral, 4096, 256, micro_batches=4, vocab_size=32000,
                     num_layers=32, dim=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                     mlp_dim=14336, num_experts=8, experts_per_token=2, max_length=32768)


@register
class PyCodeMixtralTiny(PyCodeTiny):
  """The PyCodeTiny recipe with a Mixtral block: 4 layers of width 128, 4 heads, 2 key-value
  heads, 8 experts of width 172, 2 per token (344 active: PyCodeLlamaTiny's MLP width,
  the dense model of the same active parameters that bench/moe_bench.py trains beside it)."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Mixtral, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, num_kv_heads=2, mlp_dim=172, num_experts=8,
                           experts_per_token=2, rotary_base=10000.0, embedding_init_stddev=1.0)
    return cfg
