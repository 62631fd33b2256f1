"""How far a device's float32 activations are from float64 NumPy: tanh, GELU, SiLU, exp.

  python bench/activation_accuracy.py [--points 1000000] [--json FILE]

On the lent TPU v5e (2026-12-07, bench/results/2026-12-07/tpu6/README.md) Gemma 3's logits
parted from the CPU's at its MLP's output projection, whose inputs agreed to float32 rounding:
between them is GELU with tanh, and the SiLU families (exp) did not part. This measures each
function the models use, over [-12, 12] in float32 on the default device, jitted, against
NumPy's float64 of the same float32 inputs: the largest absolute error and the largest error
in units of float32's spacing at the reference, or at 1e-3 where it is smaller (ulp). Two spellings of GELU with tanh that are
the same function are compared too: jax.nn.gelu(approximate=True) (through tanh) and
x * sigmoid(2 u) (through the logistic), and x / (1 + exp(-2 u)) (through exp), u being
sqrt(2 / pi) (x + 0.044715 x^3).
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp
import numpy as np


def _u(x):
  return math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)


# name -> (the device's float32 function, its float64 NumPy reference).
FUNCTIONS = {
    "tanh": (jnp.tanh, np.tanh),
    "exp": (jnp.exp, np.exp),
    "sigmoid": (jax.nn.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "silu": (jax.nn.silu, lambda x: x / (1 + np.exp(-x))),
    "gelu_tanh": (lambda x: jax.nn.gelu(x, approximate=True),
                  lambda x: 0.5 * x * (1 + np.tanh(_u(x)))),
    "gelu_tanh_by_sigmoid": (lambda x: x * jax.nn.sigmoid(2 * _u(x)),
                             lambda x: 0.5 * x * (1 + np.tanh(_u(x)))),
    "gelu_tanh_by_exp": (lambda x: x / (1 + jnp.exp(-2 * _u(x))),
                         lambda x: 0.5 * x * (1 + np.tanh(_u(x)))),
    "gelu_erf": (lambda x: jax.nn.gelu(x, approximate=False),
                 lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
}


def errors(points: int) -> dict:
  x = np.linspace(-12, 12, points, dtype=np.float32)
  exp_x = np.linspace(-80, 80, points, dtype=np.float32)  # exp's own range, not overflowing.
  found = {}
  for name, (device, reference) in FUNCTIONS.items():
    inputs = exp_x if name == "exp" else x
    got = np.asarray(jax.jit(device)(jnp.asarray(inputs))).astype(np.float64)
    want = reference(inputs.astype(np.float64))
    # In ulp only where the value is not near 0 (GELU's far negative tail underflows).
    spacing = np.spacing(np.maximum(np.abs(want), 1e-3).astype(np.float32)).astype(np.float64)
    ulp = np.abs(got - want) / spacing
    found[name] = {"max_abs": float(np.abs(got - want).max()), "max_ulp": float(ulp.max()),
                   "at": float(inputs[np.argmax(ulp)])}
  return found


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--points", type=int, default=1_000_000)
  parser.add_argument("--json")
  args = parser.parse_args()
  found = errors(args.points)
  device = jax.devices()[0].device_kind
  for name, row in found.items():
    print(f"{device} {name:22s} max abs {row['max_abs']:.2e}, max {row['max_ulp']:10.1f} ulp "
          f"(at {row['at']:+.4f})")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"device": device, "jax": jax.__version__, "functions": found}, f, indent=1)


if __name__ == "__main__":
  main()
