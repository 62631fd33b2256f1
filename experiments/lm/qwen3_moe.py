"""Qwen3-MoE-shaped models: Qwen3's attention with 128 experts, 8 per token, renormalized.

  python -m lingvo_lite --exp=Qwen3_30B_A3B --mode=compile --compile_topology=v5e-256
  python -m lingvo_lite --exp=PyCodeQwen3MoeTiny --job_log_dir=runs/qwen3_moe_tiny
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
from lingvo_lite.models.qwen3_moe import Qwen3Moe
from tasks import pycode

VOCAB = 151936


@register
class Qwen3_30B_A3B(Llama7B):  # pylint: disable=invalid-name  # The model's own name.
  """Qwen3-30B-A3B shapes: 48 layers, d_model 2048, 32 query / 4 key-value heads of 128, 128
  SwiGLU experts of 768 (8 per token, their weights renormalized), vocabulary 151,936, RoPE
  base 1,000,000, untied: 30.5B parameters, 3.3B active per token. bfloat16 compute, float32
  parameters; 512 sequences of 4096 tokens a step (2M tokens) as 2 micro-batches (a row per
  chip), fully sharded (FSDP): `--mode=compile --compile_topology=v5e-256`; the experts over
  the `expert` mesh axis and the rest FSDP: `--fdl.partitioner.ici_expert=16` (README's
  topology table).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), Qwen3Moe, 4096, 512, micro_batches=2, vocab_size=VOCAB,
                     num_layers=48, dim=2048, num_heads=32, num_kv_heads=4, head_dim=128,
                     mlp_dim=6144, expert_mlp_dim=768, num_experts=128, experts_per_token=8,
                     renormalize_top_k=True, max_length=40960)


@register
class PyCodeQwen3MoeTiny(PyCodeTiny):
  """The PyCodeTiny recipe with a Qwen3-MoE block: 4 layers of width 128, 4 heads of 64, 2
  key-value heads, the query and key norms, 8 experts of width 86, 4 per token."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Qwen3Moe, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, num_kv_heads=2, head_dim=64, mlp_dim=344,
                           expert_mlp_dim=86, num_experts=8, experts_per_token=4,
                           embedding_init_stddev=1.0)
    return cfg
