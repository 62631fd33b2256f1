"""DeepSeek-shaped models: multi-head latent attention and DeepSeek's mixture of experts.

  python -m lingvo_lite --exp=DeepSeekV3_671B --mode=compile --compile_topology=v5p-256
  python -m lingvo_lite --exp=DeepSeekV2Lite_16B --mode=compile --compile_topology=v5e-16
  python -m lingvo_lite --exp=PyCodeDeepSeekV3Tiny --job_log_dir=runs/deepseek_tiny
  python -m lingvo_lite --exp=PyCodeTiny --init_from=hf:PATH --mode=decode ...   # a folder

Kimi K2 is DeepSeek-V3's architecture with other numbers (64 heads, 384 experts in one group,
one dense layer, a larger vocabulary and rotary base): an experiment of the DeepSeekV3
family, not a family of its own. The full sizes train on synthetic tokens (no web corpus
here), fully sharded, scanned and rematerialized.
"""

import fiddle as fdl

from experiments.lm.llama import Llama7B
from experiments.lm.pycode import PyCodeTiny
from experiments.lm.synthetic import full_size
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.deepseek_v2 import DeepSeekV2
from lingvo_lite.models.deepseek_v3 import DeepSeekV3
from tasks import pycode


@register
class DeepSeekV3_671B(Llama7B):  # pylint: disable=invalid-name  # The model's own name.
  """DeepSeek-V3 (and R1) shapes, the family's defaults: 61 layers of 7168, 128 heads with
  latent attention (query bottleneck 1536, latent 512, heads of 128 + 64 rotary, values of
  128), 3 dense layers of 18,432, then 256 experts of 2048 (8 per token from 4 of 8 groups)
  and a shared one, vocabulary 129,280: 671B parameters, 37B active per token. bfloat16
  compute, float32 parameters; 1024 sequences of 4096 tokens a step as 4 micro-batches,
  fully sharded with the experts over `--fdl.partitioner.ici_expert=N`.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), DeepSeekV3, 4096, 1024, micro_batches=4, vocab_size=129280)


@register
class KimiK2_1T(DeepSeekV3_671B):  # pylint: disable=invalid-name  # The model's own name.
  """Kimi K2 (moonshotai/Kimi-K2-Instruct's config): DeepSeek-V3's architecture with 64 heads,
  one dense layer, 384 experts (8 per token, one group) scaled by 2.827, a vocabulary of
  163,840 and a rotary base of 50,000 (YaRN factor 32): 1.04T parameters, 32B active.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), DeepSeekV3, 4096, 1024, micro_batches=4, vocab_size=163840,
                     num_heads=64, first_dense_layers=1, num_experts=384, expert_groups=1,
                     expert_groups_per_token=1, routed_scaling_factor=2.827,
                     rotary_base=50000.0, rotary_scaling_factor=32.0, max_length=131072)


@register
class DeepSeekV2Lite_16B(Llama7B):  # pylint: disable=invalid-name  # The model's own name.
  """DeepSeek-V2-Lite shapes, the DeepSeekV2 family's defaults: 27 layers of 2048, 16 heads
  with latent attention (no query bottleneck, latent 512), one dense layer of 10,944, then 64
  experts of 1408 (6 per token, softmax) and two shared, vocabulary 102,400: 15.7B
  parameters, 2.4B active. bfloat16 compute, float32 parameters; 256 sequences of 4096 a
  step as 2 micro-batches, fully sharded.
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return full_size(super().config(), DeepSeekV2, 4096, 256, micro_batches=2, vocab_size=102400)


@register
class PyCodeDeepSeekV3Tiny(PyCodeTiny):
  """The PyCodeTiny recipe with DeepSeek-V3's blocks: 4 layers of width 128, 4 heads with
  latent attention (query bottleneck 64, latent 64, heads of 32 + 16 rotary, values of 32),
  one dense layer, then 8 experts of 86 (2 per token from 2 of 4 groups, sigmoid scores
  with the selection bias) and a shared one."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(
        DeepSeekV3, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128, num_heads=4,
        q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
        v_head_dim=32, mlp_dim=344, expert_mlp_dim=86, shared_expert_mlp_dim=86,
        num_experts=8, experts_per_token=2, expert_groups=4, expert_groups_per_token=2,
        first_dense_layers=1, rotary_scaling="none", max_length=2048,
        embedding_init_stddev=1.0)
    return cfg


@register
class PyCodeDeepSeekV2LiteTiny(PyCodeDeepSeekV3Tiny):
  """PyCodeDeepSeekV3Tiny's sizes with DeepSeek-V2-Lite's choices: a full query projection,
  softmax routing over every expert, weights not renormalized, two shared experts."""

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    cfg = super().config()
    cfg.model = fdl.Config(
        DeepSeekV2, vocab_size=pycode.BYTE_VOCAB_SIZE, num_layers=4, dim=128, num_heads=4,
        kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        mlp_dim=344, expert_mlp_dim=86, shared_expert_mlp_dim=172, num_experts=8,
        experts_per_token=2, rotary_scaling="none", max_length=2048,
        embedding_init_stddev=1.0)
    return cfg
