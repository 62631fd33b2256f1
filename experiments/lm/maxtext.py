"""MaxText's published v5e (and largest v5p) training configurations, as experiments.

  python -m lingvo_lite --exp=MaxText16B --mode=compile --compile_topology=v5e-256
  python -m lingvo_lite --exp=MaxText16B --mode=compile --compile_topology=v5e-256 \\
      --compile_num_slices=2 --fdl.train_data.global_batch_size=3072
  python bench/maxtext_table.py          # every row of MaxText's table: README, "MaxText's table"

MaxText (AI-Hypercomputer/maxtext, MaxText/configs/v5e/{16b,32b,64b,128b}.sh before its move to
src/, commit 1de063ea) runs `base.yml`'s model scaled by `global_parameter_scale`. base.yml:
`decoder_block: llama2` (pre-RMSNorm blocks, eps 1e-5; SwiGLU, `mlp_activations: [silu,
linear]`; rotary positions, `rope_max_timescale` 10,000; no biases; `logits_via_embedding:
False`, an untied output), `base_emb_dim` 2048, `base_num_query_heads` = `base_num_kv_heads` =
16, `head_dim` 128, `base_mlp_dim` 7168, `base_num_decoder_layers` 16, `vocab_size` 32,000,
`weight_dtype` float32 under bfloat16 compute, AdamW (b1 0.9, b2 0.95, weight decay 0.1, clip
1.0), `ici_fsdp_parallelism: -1` and `dcn_data_parallelism: -1` (the slices split the batch),
scanned layers. pyconfig.py's `get_individual_scales` turns a scale of 2^k into doublings,
cycling through (heads and MLP width), (model width), (layers): with k = 3b + r, heads and MLP
double b + (r > 0) times, the width b + (r > 1) times, the layers b times. `maxtext_shape`
below is that arithmetic; the experiments' docstrings cite its results.

Every script trains on synthetic data at `max_target_length=2048` with `attention='flash'`
(lingvo_lite's "auto" attention picks splash on a TPU) and a batch of `per_device_batch_size`
rows per chip; one slice of v5e-256 is the experiments' batch (a K-slice run's batch is K times
it: `--fdl.train_data.global_batch_size`). MaxText's `use_iota_embed` (an embedding lookup
by one-hot matmul) and 128B's `fused_qkv` / `fused_mlp` (one matmul for q, k and v, one for
the MLP's two input projections) have no lingvo_lite field: the same FLOPs, in more kernels.
"""

from __future__ import annotations

import fiddle as fdl

from experiments.lm.llama import Llama1B
from lingvo_lite.config.registry import register
from lingvo_lite.experiment import Setup
from lingvo_lite.models.llama import Llama

# base.yml's model (MaxText's global_parameter_scale 1).
BASE = {"dim": 2048, "num_heads": 16, "mlp_dim": 7168, "num_layers": 16}
VOCAB, HEAD_DIM, SEQUENCE = 32000, 128, 2048
V5E_256 = 256  # Chips of one v5e-256 slice: the scripts' per_device_batch_size is per chip.


def maxtext_shape(scale: int) -> dict[str, int]:
  """base.yml's sizes at a `global_parameter_scale` (a power of 2), by pyconfig.py's rule:
  the doublings of log2(scale) go to the heads and MLP width first, the model width second,
  the layers third, round and round."""
  if scale < 1 or scale & (scale - 1):
    raise ValueError(f"global_parameter_scale={scale}: must be a power of 2")
  rounds, rest = divmod(scale.bit_length() - 1, 3)
  wide = rounds + (rest > 0)  # The heads' and the MLP's doublings.
  return {"dim": BASE["dim"] << (rounds + (rest > 1)),
          "num_heads": BASE["num_heads"] << wide, "mlp_dim": BASE["mlp_dim"] << wide,
          "num_layers": BASE["num_layers"] << rounds}


def _maxtext(cfg: fdl.Config[Setup], scale: int, per_device_batch: int,
             chips: int) -> fdl.Config[Setup]:
  """`cfg` as a MaxText script runs base.yml at `scale`: a Llama of `maxtext_shape(scale)`
  (as many key-value heads as query heads, heads of 128), `per_device_batch` rows of 2048
  per chip on one slice of `chips`, no micro-batches, FSDP over every chip."""
  shape = maxtext_shape(scale)
  cfg.model = fdl.Config(Llama, vocab_size=VOCAB, head_dim=HEAD_DIM,
                         num_kv_heads=shape["num_heads"], rotary_base=10000.0,
                         max_length=SEQUENCE, dtype="bfloat16", param_dtype="float32",
                         scan_layers=True, remat_policy="full", **shape)
  for data in (cfg.train_data, cfg.eval_data):
    data.vocab_size = VOCAB
    data.sequence_length = SEQUENCE
    data.global_batch_size = per_device_batch * chips
  cfg.optimizer.peak_learning_rate = 3e-5  # base.yml's learning_rate.
  cfg.train.grad_accum_steps = 1
  cfg.partitioner.ici_fsdp = -1
  return cfg


@register
class MaxText16B(Llama1B):
  """MaxText's 16b.sh (global_parameter_scale=16): 32 layers, d_model 4096, 64 query and 64
  key-value heads of 128 (8192 wide, twice the model width), SwiGLU 28672, vocabulary 32000:
  15,831,666,688 parameters. per_device_batch_size=6 (1536 x 2048 a step on v5e-256),
  remat_policy=full, FSDP over all 256 chips (ici_fsdp -1). MaxText's table: 120 TFLOP/s/chip,
  61.10% MFU on one v5e-256.

    python -m lingvo_lite --exp=MaxText16B --mode=compile --compile_topology=v5e-256
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _maxtext(super().config(), 16, per_device_batch=6, chips=V5E_256)


@register
class MaxText32B(Llama1B):
  """MaxText's 32b.sh (global_parameter_scale=32): 32 layers, d_model 8192, 64 query and 64
  key-value heads of 128, SwiGLU 28672, vocabulary 32000: 31,663,333,376 parameters.
  per_device_batch_size=4 (1024 x 2048 on v5e-256), remat_policy=full, FSDP over all 256 chips.
  MaxText's table: 132 TFLOP/s/chip, 66.86% MFU on one v5e-256.

    python -m lingvo_lite --exp=MaxText32B --mode=compile --compile_topology=v5e-256
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _maxtext(super().config(), 32, per_device_batch=4, chips=V5E_256)


@register
class MaxText64B(Llama1B):
  """MaxText's 64b.sh (global_parameter_scale=64): 64 layers, d_model 8192, 64 query and 64
  key-value heads of 128, SwiGLU 28672, vocabulary 32000: 62,802,370,560 parameters.
  per_device_batch_size=2 (512 x 2048 on v5e-256), remat_policy=full, FSDP over all 256 chips.
  MaxText's table: 118 TFLOP/s/chip, 59.90% MFU on one v5e-256.

    python -m lingvo_lite --exp=MaxText64B --mode=compile --compile_topology=v5e-256
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _maxtext(super().config(), 64, per_device_batch=2, chips=V5E_256)


@register
class MaxText128B(Llama1B):
  """MaxText's 128b.sh (global_parameter_scale=128): 64 layers, d_model 8192, 128 query and
  128 key-value heads of 128 (16384 wide), SwiGLU 57344, vocabulary 32000: 125,079,396,352
  parameters. per_device_batch_size=1 (256 x 2048 on v5e-256). MaxText's table: 110
  TFLOP/s/chip, 56.06% MFU on one v5e-256.

  The script's remat_policy=qkv_proj_offloaded (the q/k/v projections kept in host memory,
  the rest recomputed) and ici_fsdp_parallelism=16 x ici_tensor_parallelism=16 are
  `ON_TPU["MaxText128B"]`: a CPU target refuses the one and has no 16 x 16 chips for the
  other, and every experiment builds there (tiny runs, `--mode=print`). MaxText's row:

    python -m lingvo_lite --exp=MaxText128B --mode=compile --compile_topology=v5e-256 \\
        --fdl.model.remat_policy="'qkv_proj_offloaded'" --fdl.partitioner.ici_fsdp=16 \\
        --fdl.partitioner.ici_tensor=16
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _maxtext(super().config(), 128, per_device_batch=1, chips=V5E_256)


@register
class MaxText1024B(Llama1B):
  """MaxText's v5p 1024b.sh (global_parameter_scale=1024), the largest of its v5p scripts (the
  README's 1160B row has no script in the repository): 128 layers, d_model 16384, 256 query
  and 256 key-value heads of 128 (32768 wide), SwiGLU 114688, vocabulary 32000:
  997,485,199,360 parameters. per_device_batch_size=2 on a v5p-2048 (1024 chips: 2048 x
  2048 a step), remat_policy=full, ici_fsdp_parallelism=-1 (64) x ici_tensor_parallelism=16
  (`ON_TPU`). MaxText's v5p table (configs/v5p/README.md): 254 TFLOP/s/chip, 55.35% MFU on one
  v5p-2048. No pipeline stages in any of these scripts: FSDP and tensor axes only.

    python -m lingvo_lite --exp=MaxText1024B --mode=compile --compile_topology=v5p-2048 \\
        --fdl.partitioner.ici_tensor=16
  """

  @classmethod
  def config(cls) -> fdl.Config[Setup]:
    return _maxtext(super().config(), 1024, per_device_batch=2, chips=1024)


# The scripts' settings a config built on a CPU cannot carry (an offloading remat policy, mesh
# axes of fixed sizes), as overrides for their TPU target; bench/maxtext_table.py applies them.
ON_TPU: dict[str, tuple[str, ...]] = {
    "MaxText128B": ("model.remat_policy='qkv_proj_offloaded'", "partitioner.ici_fsdp=16",
                    "partitioner.ici_tensor=16"),
    "MaxText1024B": ("partitioner.ici_tensor=16",),
}
