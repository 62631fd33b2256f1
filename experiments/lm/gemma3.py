"""Gemma 3-shaped text models: five sliding-window layers to one global, Gemma's norms.

  python -m lingvo_lite --exp=Gemma3_1B --mode=compile --compile_topology=v5e-8
  python -m lingvo_lite --exp=PyCodeGemma3Tiny --job_log_dir=runs/gemma3_tiny

The full-size shapes train on synthetic tokens (no web corpus here), sharded, scanned (in
groups of the 6-layer pattern, models/transformer_layers.py) and rematerialized as Llama1B
and Llama7B are.
"""

import fiddle as fdl

from experiments.lm.llama import Llama1B, Llama7B
from experiments.lm.pycode import PyCodeTiny
from experiments.lm.synthetic import full_size
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.gemma3 import Gemma3
from tasks import pycode


def _shapes(cfg: fdl.Config[Setup], vocab: int, sequence_length: int, **sizes
            ) -> fdl.Config[Setup]:
  """`cfg` with a Gemma 3 of `sizes` (bfloat16 compute, scanned, fully rematerialized) on
  synthetic tokens of its vocabulary, `sequence_length` long (past the window)."""
  return full_size(cfg, Gemma3, sequence_length, cfg.train_data.global_batch_size,
                   vocab_size=vocab, head_dim=256, **sizes)


@register
class Gemma3_1B(Llama1B):  # pylint: disable=invalid-name  # The model's own name.
  """Gemma 3 1B shapes: 26 layers (four patterns of five sliding to one global, and two
  sliding), a window of 512, d_model 1152, 4 query heads and 1 key-value head of 256, GeGLU
  6912, vocabulary 262,144, RoPE bases 10,000 (sliding) and 1,000,000 (global), tied
  embeddings: 999,885,952 parameters. Llama1B's recipe (256 x 2048 a step, four windows, as
  16 micro-batches, FSDP over every chip): `--mode=compile --compile_topology=v5e-8`."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _shapes(super().config(), 262144, 2048, num_layers=26, dim=1152, num_heads=4,
                   num_kv_heads=1, mlp_dim=6912, window=512, max_length=32768)


@register
class Gemma3_12B(Llama7B):  # pylint: disable=invalid-name  # The model's own name.
  """Gemma 3 12B's text model: 48 layers (eight patterns), a window of 1024, d_model 3840,
  16 query / 8 key-value heads of 256, GeGLU 15360, vocabulary 262,208, the global layers'
  positions scaled linearly by 8: 11,766,034,176 parameters. Llama7B's recipe (256 x 2048 a
  step as 16 micro-batches, FSDP): `--mode=compile --compile_topology=v5p-16`."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _shapes(super().config(), 262208, 2048, num_layers=48, dim=3840, num_heads=16,
                   num_kv_heads=8, mlp_dim=15360, window=1024, max_length=131072,
                   rotary_scaling="linear", rotary_scaling_factor=8.0)


@register
class PyCodeGemma3Tiny(PyCodeTiny):
  """The PyCodeTiny recipe with Gemma 3 blocks: 6 layers of width 128 (five sliding, a window
  of 32 of the 128-token rows, then one global), 4 heads of 64 and 2 key-value heads."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Gemma3, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=6, dim=128,
                           num_heads=4, num_kv_heads=2, head_dim=64, mlp_dim=344, window=32,
                           query_pre_attention_scalar=64.0)
    return cfg
