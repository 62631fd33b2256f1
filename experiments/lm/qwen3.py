"""Qwen3-shaped models: Llama's blocks with an RMSNorm of each head's queries and keys.

  python -m lingvo_lite --exp=Qwen3_8B --mode=compile --compile_topology=v5p-8
  python -m lingvo_lite --exp=PyCodeQwen3Tiny --job_log_dir=runs/qwen3_tiny
  python -m lingvo_lite --exp=PyCodeTiny --init_from=hf:PATH --mode=decode ...   # a Qwen3 folder

The full-size shapes train on synthetic tokens (no web corpus here), sharded, scanned and
rematerialized as Llama1B and Llama7B are.
"""

import fiddle as fdl

from experiments.lm.llama import Llama1B, Llama7B
from experiments.lm.pycode import PyCodeTiny
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.qwen3 import Qwen3
from tasks import pycode

VOCAB = 151936


def _shapes(cfg: fdl.Config[Setup], **sizes) -> fdl.Config[Setup]:
  """`cfg` with a Qwen3 of `sizes` (bfloat16 compute, scanned, fully rematerialized) on
  synthetic tokens of its vocabulary."""
  cfg.model = fdl.Config(Qwen3, vocab_size=VOCAB, head_dim=128, rotary_base=1000000.0,
                         max_length=40960, dtype="bfloat16", param_dtype="float32",
                         scan_layers=True, remat_policy="full", **sizes)
  for data in (cfg.train_data, cfg.eval_data):
    data.vocab_size = VOCAB
  return cfg


@register
class Qwen3_0_6B(Llama1B):  # pylint: disable=invalid-name  # The model's own name.
  """Qwen3-0.6B shapes: 28 layers, d_model 1024, 16 query / 8 key-value heads of 128 (2048
  wide, twice the model width), SwiGLU 3072, vocabulary 151,936, RoPE base 1,000,000, tied
  embeddings: 596,049,920 parameters (Hugging Face's count). Llama1B's recipe (256 x 2048 a
  step as 16 micro-batches, FSDP over every chip): `--mode=compile --compile_topology=v5e-8`.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _shapes(super().config(), num_layers=28, dim=1024, num_heads=16, num_kv_heads=8,
                   mlp_dim=3072, tie_embeddings=True)


@register
class Qwen3_8B(Llama7B):  # pylint: disable=invalid-name  # The model's own name.
  """Qwen3-8B shapes: 36 layers, d_model 4096, 32 query / 8 key-value heads of 128, SwiGLU
  12288, vocabulary 151,936, RoPE base 1,000,000, an untied output: 8,190,735,360 parameters.
  Llama7B's recipe: `--mode=compile --compile_topology=v5p-8`."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _shapes(super().config(), num_layers=36, dim=4096, num_heads=32, num_kv_heads=8,
                   mlp_dim=12288, tie_embeddings=False)


@register
class PyCodeQwen3Tiny(PyCodeTiny):
  """The PyCodeTiny recipe with a Qwen3 block: 4 layers of width 128, 4 heads of 64 (256
  wide: a head width of its own), 2 key-value heads, the query and key norms."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(Qwen3, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128,
                           num_heads=4, num_kv_heads=2, head_dim=64, mlp_dim=344,
                           embedding_init_stddev=1.0)
    return cfg
