"""OLMo 3-shaped models: three sliding-window layers to one full, norms after attention and MLP.

  python -m lingvo_lite --exp=Olmo3_7B --mode=compile --compile_topology=v5p-8
  python -m lingvo_lite --exp=PyCodeOlmo3Tiny --job_log_dir=runs/olmo3_tiny

The full-size shape trains on synthetic tokens (no web corpus here), sharded, scanned (in
groups of the 4-layer pattern) and rematerialized as Llama7B is.
"""

import fiddle as fdl

from experiments.lm.llama import Llama7B
from experiments.lm.pycode import PyCodeTiny
from experiments.lm.synthetic import full_size
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.olmo3 import Olmo3
from tasks import pycode


@register
class Olmo3_7B(Llama7B):  # pylint: disable=invalid-name  # The model's own name.
  """OLMo 3 7B shapes: 32 layers (eight patterns of three sliding to one full), a window of
  4096, d_model 4096, 32 heads of 128, SwiGLU 11008, vocabulary 100,278, RoPE base 500,000
  with YaRN (factor 8 over 8192 positions) on the full layers, an untied output:
  7,298,011,136 parameters. Trained on 8192-token rows (twice the window), 64 a step: Llama7B's
  524,288 tokens a step in 16 micro-batches of 4 rows (one per chip of a v5p-8), sharded as
  Llama7B: `--mode=compile --compile_topology=v5p-8`."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), Olmo3, 8192, 64, vocab_size=100278, num_layers=32,
                     dim=4096, num_heads=32, num_kv_heads=32, mlp_dim=11008, window=4096,
                     max_length=65536, rotary_scaling="yarn", rotary_scaling_factor=8.0,
                     rotary_original_max_length=8192)


@register
class PyCodeOlmo3Tiny(PyCodeTiny):
  """The PyCodeTiny recipe with OLMo 3 blocks: 4 layers of width 128 (three sliding, a window
  of 32 of the 128-token rows, then one full), 4 heads, 2 key-value heads."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Olmo3, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, num_kv_heads=2, mlp_dim=344, window=32,
                           embedding_init_stddev=1.0)
    return cfg
