"""TPU flash attention: the splash attention kernel that ships with JAX, placed per shard.

Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, the kernel MaxText
uses) computes softmax(q k^T) v block by block in the TPU's vector memory: the [t, t] scores
never reach HBM, blocks the mask rules out entirely are skipped (half the work of a causal
mask, most of a sliding window's), and its backward pass recomputes the scores from the saved
log-sum-exp. This module is the whole bridge between the model's attention and the kernel:

- Masks: causal, or causal within a window of the last `window` positions (Mistral's band);
  packed documents through segment ids (a query sees keys of its own segment only).
- Grouped-query attention natively: the kernel takes `heads` query heads over `kv_heads`
  key/value heads.
- Meshes: the kernel sees one shard. Under a mesh, `jax.shard_map` hands each device its
  rows (the logical `batch` axis's mesh axes) and heads (`heads`'), so data, FSDP and tensor
  parallelism all work; the sequence is never split (context parallelism is a non-goal).
- Lengths: the kernel's blocks must divide the sequence. `block_size` takes the largest of
  512, 256 and 128 that divides it (1024 first for heads of 64: `NARROW_HEAD_BLOCK_SIZES`);
  a length no block divides (a short decode prefill bucket) has no splash form, and
  `supports_length` says so, so the caller takes the written-out path for it. A decode
  step's single query token always takes the cached (written-out) path.
- Platforms: on a TPU the kernel is compiled by Mosaic; anywhere else it runs in Pallas's
  interpret mode (slow, exact), which is what the CPU tests compare against the einsum path.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lingvo_lite.target import current_platform

# Block edges tried from the largest: 512 is MaxText's default on v5e/v5p, and a sequence
# of 2048 splits into 4 x 4 blocks of it.
BLOCK_SIZES = (512, 256, 128)

# Heads of 64 (Llama 3.2's, SmolLM2's): blocks of 1024 where they divide the length, and keys
# and values laid out with the sequence minor. Measured on a v5e (README, "Measured on a TPU
# v5e"; bench/results/2026-12-07/tpu3/): Llama1BOneChip's best row 266.4 ms a step with 512,
# 263.9 ms with keys so laid out, 261.9 ms with values too. Wider heads keep the kernel's
# defaults, as measured: blocks of 1024 over heads of 256 ran out of the kernel's scoped
# vector memory at 8192 positions in a v5e compile from a CPU host, and the layouts were not
# timed there.
NARROW_HEAD = 64
NARROW_HEAD_BLOCK_SIZES = (1024, *BLOCK_SIZES)
TUNED_FOR_NARROW_HEADS = dict(k_layout="SEQ_MINOR", v_layout="SEQ_MINOR")  # QKVLayout names.

# Fields of the kernel's `BlockSizes` set over the edge `block_size` picks (block_q=1024,
# block_kv_compute=512, use_fused_bwd_kernel=False, k_layout=QKVLayout.SEQ_MINOR, ...): what
# bench/accelerator_mfu.py tunes the kernel on the chip with; empty in every run.
BLOCK_OVERRIDES: dict = {}

# The name the kernel's saved residuals (its output and log-sum-exp) carry, so a remat policy
# can keep them (models/remat.py's "attention_out" covers both paths).
RESIDUAL_NAME = "attention_out"


def _splash() -> Any:
  """Pallas's splash attention module, imported where a kernel is made: its TPU modules take
  0.1 s to import, which every process that never makes one (most runs on a CPU, every child
  process of the tests) would pay."""
  from jax.experimental.pallas.ops.tpu import splash_attention  # pylint: disable=g-import-not-at-top
  return splash_attention


def block_size(length: int, head_dim: int | None = None) -> int | None:
  """The kernel's block edge for a sequence of `length` (over heads of `head_dim`), or None
  if no block divides it."""
  narrow = head_dim is not None and head_dim <= NARROW_HEAD
  sizes = NARROW_HEAD_BLOCK_SIZES if narrow else BLOCK_SIZES
  return next((block for block in sizes if length % block == 0), None)


def supports_length(length: int) -> bool:
  return block_size(length) is not None


def _kernel(length: int, heads: int, head_dim: int, window: int | None, interpret: bool
            ) -> Any:
  """A kernel (splash's SplashAttentionKernel) for one shard's `heads` query heads: the same
  mask for every head. Made anew in each trace (its mask tables become constants of that
  trace: a kernel kept across traces would carry one trace's values into another)."""
  splash = _splash()
  shape = (length, length)
  if window is None:
    mask = splash.CausalMask(shape)
  else:  # Keys from i - (window - 1) to i: the band, causal on its own.
    mask = splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
  block = block_size(length, head_dim)
  sizes = dict(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
               block_kv_dkv=block, block_kv_dkv_compute=block, use_fused_bwd_kernel=True)
  if head_dim <= NARROW_HEAD:
    sizes.update({field: splash.QKVLayout[layout]
                  for field, layout in TUNED_FOR_NARROW_HEADS.items()})
  sizes.update(BLOCK_OVERRIDES)
  if not sizes["use_fused_bwd_kernel"]:  # The separate dq kernel's blocks, as the dkv one's.
    sizes = {"block_q_dq": sizes["block_q_dkv"], "block_kv_dq": sizes["block_kv_dkv"], **sizes}
  sizes = splash.BlockSizes(**sizes)
  return splash.make_splash_mha(splash.MultiHeadMask([mask] * heads), block_sizes=sizes,
                                head_shards=1, q_seq_shards=1,
                                residual_checkpoint_name=RESIDUAL_NAME, interpret=interpret)


def shard_specs(batch: int, kv_heads: int) -> tuple[PartitionSpec, PartitionSpec] | None:
  """(spec of [batch, heads, length, head_dim], spec of [batch, length]) under the mesh and
  logical rules in scope, or None without a mesh of more than one device. A dimension that
  its mesh axes do not divide (one row, as the parameters' shapes are traced with) is not
  split."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return None

  def split(axes, size):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    ways = 1
    for name in names:
      ways *= mesh.shape[name]
    return axes if names and size % ways == 0 else None

  batch_axes, heads_axes = nn.logical_to_mesh_axes(("batch", "heads"))
  batch_axes, heads_axes = split(batch_axes, batch), split(heads_axes, kv_heads)
  return (PartitionSpec(batch_axes, heads_axes, None, None),
          PartitionSpec(batch_axes, None))


def _at_default_precision(function):
  """`function`, its forward and its backward traced at the default matmul precision.

  A precision set for float32 work ("highest", say) would ask Mosaic for float32 passes over
  the kernel's bfloat16 operands, which it refuses; the backward pass is traced when the
  gradient is taken, outside any scope around the call, hence the custom VJP.
  """
  @jax.custom_vjp
  def wrapped(*args):
    with jax.default_matmul_precision("default"):
      return function(*args)

  def forward(*args):
    with jax.default_matmul_precision("default"):
      return jax.vjp(function, *args)

  def backward(pullback, cotangent):
    with jax.default_matmul_precision("default"):
      return pullback(cotangent)

  wrapped.defvjp(forward, backward)
  return wrapped


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None,
                     window: int | None = None, interpret: bool | None = None,
                     sinks: jax.Array | None = None) -> jax.Array:
  """Causal attention of q [b, t, heads, d] over k, v [b, t, kv_heads, d]: [b, t, heads, d].

  `q` comes already scaled (the kernel multiplies by nothing). `segment_ids` [b, t] (None:
  one document per row) keeps each query within its document; `window` restricts it to the
  last `window` positions, itself included. `sinks` [heads]: a logit per query head each
  softmax also sums over (gpt-oss's), which the kernel takes. `interpret` defaults to "not on
  a TPU".
  """
  length = q.shape[1]
  if not supports_length(length):
    raise ValueError(f"splash attention needs a length divisible by {BLOCK_SIZES[-1]}, "
                     f"got {length}")
  if interpret is None:
    # The active target's platform: an AOT compile for a TPU topology from a CPU host traces
    # the kernel itself, not its interpretation.
    interpret = current_platform() != "tpu"
  q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [b, heads, t, d]: the kernel's.

  def attend(q, k, v, segment_ids, sinks):
    kernel = _kernel(length, q.shape[1], q.shape[-1], window, interpret)
    if sinks is not None:  # One per query head, the same for every row.
      kernel = functools.partial(kernel, sinks=sinks.astype(jnp.float32))
    if segment_ids is None:
      return jax.vmap(kernel)(q, k, v)
    segments = _splash().SegmentIds(q=segment_ids, kv=segment_ids)
    return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s))(q, k, v, segments)

  specs = shard_specs(q.shape[0], k.shape[1])
  if specs is not None:
    heads_spec, rows_spec = specs
    attend = jax.shard_map(
        attend, in_specs=(heads_spec, heads_spec, heads_spec,
                          None if segment_ids is None else rows_spec,
                          None if sinks is None else PartitionSpec(heads_spec[1])),
        out_specs=heads_spec, check_vma=False)
  if q.dtype != jnp.float32 and jax.config.jax_default_matmul_precision is not None:
    attend = _at_default_precision(attend)
  out = attend(q, k, v, segment_ids, sinks)
  return jnp.swapaxes(out, 1, 2)

