"""Activations times weights, with a weight gradient that XLA:CPU runs on its fast kernel.

For y = x w the weight gradient is x^T g. XLA:CPU's fast matmul (YNNPACK) does not read a
transposed left operand, so XLA transposes the other operand, g, instead; g is the larger
one in an MLP, and XLA fuses g's elementwise producer (GELU's derivative, for instance) into
that strided transpose. Measured in a BenchSmall train step on CPU: 22-44 ms per MLP layer of
a 0.45 s step, more than the layer's matmuls. Here the backward pass transposes x explicitly
(an optimization barrier keeps XLA from folding the transpose back into the matmul), which is
a plain copy of the smaller operand, and every matmul runs on the fast kernel. GPUs and TPUs
read transposed operands natively, so on them this is a plain `jnp.tensordot`. The variant
follows the platform of the active target (`lingvo_lite.target`), not this host's backend: a
TPU step compiled on a CPU host gets the TPU form. The backward
assumes meshes with Auto axes, as the partitioner builds them (under Explicit axes JAX asks
for the output sharding of the contraction over the batch).

Under a `quantization` (or with an int8 weight), the matmul is models/quantization.py's
instead, on every platform: Qwix's quantized dot has its own backward pass.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from lingvo_lite import target
from lingvo_lite.models import quantization as quantizing


def weight_matmul(x: jax.Array, w: Any, contracting: int = 1,
                  quantization: quantizing.Quantization | None = None) -> jax.Array:
  """x [..., K...] times w [K..., N...] -> [..., N...], over x's last `contracting` dims.

  `w` is a float array in x's dtype, or an int8 weight (`quantization.quantize_weights`)."""
  if quantization is not None or quantizing.is_quantized(w):
    numbers = ((tuple(range(x.ndim - contracting, x.ndim)), tuple(range(contracting))),
               ((), ()))
    return quantizing.dot_general(x, w, numbers, quantization)
  if target.current_platform() == "cpu":
    return _cpu_weight_matmul(x, w, contracting)
  return jnp.tensordot(x, w, contracting)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cpu_weight_matmul(x: jax.Array, w: jax.Array, contracting: int) -> jax.Array:
  return jnp.tensordot(x, w, contracting)


def _forward(x, w, contracting):
  return jnp.tensordot(x, w, contracting), (x, w)


def _backward(contracting, residuals, g):
  x, w = residuals
  output_dims = w.ndim - contracting
  x_grad = jnp.tensordot(g, w, axes=(tuple(range(g.ndim - output_dims, g.ndim)),
                                     tuple(range(contracting, w.ndim))))
  x_rows = x.reshape(-1, math.prod(w.shape[:contracting]))
  g_rows = g.reshape(-1, math.prod(w.shape[contracting:]))
  w_grad = jax.lax.optimization_barrier(x_rows.T) @ g_rows
  return x_grad.astype(x.dtype), w_grad.reshape(w.shape).astype(w.dtype)


_cpu_weight_matmul.defvjp(_forward, _backward)
