"""Mistral-shaped models on synthetic tokens: Llama's blocks with sliding-window attention.

  python -m lingvo_lite --exp=Mistral7B --fiddler=tiny --job_log_dir=runs/mistral_tiny
"""

import fiddle as fdl

from experiments.lm.llama import Llama7B
from experiments.lm.synthetic import full_size
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.mistral import Mistral


@register
class Mistral7B(Llama7B):
  """Mistral-7B-v0.1 shapes: 32 layers, d_model 4096, 32 query / 8 key-value heads of 128,
  SwiGLU 14336, vocabulary 32000, RoPE base 10000, a window of 4096 positions; bfloat16
  compute, float32 parameters.

  Trained on sequences of 8192 tokens, twice the window, so the band cuts the attention of
  the second half of each sequence. Sharded, scanned and rematerialized as Llama7B, 64
  sequences a step (Llama7B's tokens) as 16 micro-batches: fits a v5p-8
  (`--mode=compile --compile_topology=v5p-8`).
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    length = 8192
    return full_size(super().config(), Mistral, length, 64, vocab_size=32000, num_layers=32,
                     dim=4096, num_heads=32, num_kv_heads=8, head_dim=128, mlp_dim=14336,
                     window=4096, rotary_base=10000.0, max_length=length)
