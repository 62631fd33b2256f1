"""The checks every weight source's tensors get, written once: a Hugging Face folder and a GGUF
file (through placing.py's `Placer`), a PEFT folder's adapters (peft.py) and slim weights
(slim_weights.py) call these, so a rule cannot hold for one format and not another.

  - Names: every tensor the model needs is in the source, else one line naming the source and
    the tensor (`missing`); a tensor that no part of the model reads is not an error: all of
    them are named in one warning line (`warn_unread`), as transformers does, and the rest
    loads.
  - Dtypes: float widths convert (float64, float32, float16, bfloat16 into the parameter's
    dtype, as transformers' `from_pretrained` casts them); an integer or boolean tensor where
    a float weight belongs is refused, one line naming the source and the tensor (cast, its
    values would be garbage weights that load and run), and so is a float where integers
    belong (an int8 export's values) or one integer type for another (`check_dtype`).
  - Shapes: each tensor has the shape the parameters it holds need, else one line naming the
    tensor, both shapes and the fix (`check_shape`).

What a format's own header says about its tensors is checked against them by the format
(gguf_header.py: a GGUF file's metadata sizes; safetensors' reader: a header whose offsets do
not fit).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

import jax.numpy as jnp
import numpy as np

from lingvo_lite.errors import UsageError, one_line

# Unread tensors a warning names before it counts the rest.
_NAMED_UNREAD = 5


def is_float(dtype: Any) -> bool:
  """A floating-point dtype: NumPy's, and ml_dtypes' (bfloat16)."""
  return bool(jnp.issubdtype(dtype, jnp.floating))


def check_dtype(where: str, tensor: str, stored: Any, reads: Sequence[str],
                wanted: Sequence[Any], shown: str | None = None) -> None:
  """Refuses tensor `tensor` of the source `where`, stored as `stored` (a dtype; `shown`: its
  name in the format, where that is not NumPy's), where the model reads the parameters
  `reads` of dtypes `wanted`: floats convert to floats; anything else must be what the model
  holds.

  Raises:
    UsageError: one line naming the source, the tensor and the fix.
  """
  stored = np.dtype(stored)
  shown = shown or str(stored)
  wanted = [np.dtype(dtype) for dtype in wanted]
  if all(is_float(dtype) for dtype in wanted):
    if is_float(stored):
      return
    raise UsageError(f"{where}: tensor {tensor} is {shown}, not floating point, where the model "
                     f"reads the float weight {', '.join(reads)}; weights convert between "
                     "float widths (float64, float32, float16, bfloat16), never from integers: "
                     "give the model's float weights")
  if all(dtype == stored for dtype in wanted):
    return
  raise UsageError(f"{where}: tensor {tensor} is {shown}, where the model reads "
                   f"{', '.join(reads)} as {', '.join(sorted({str(d) for d in wanted}))}; only "
                   "float widths convert: give the weights as they were written")


def check_shape(where: str, tensor: str, shape: Sequence[int], expected: Sequence[int],
                reads: Sequence[str], fix: str) -> None:
  """Refuses tensor `tensor` of the source `where`, of `shape`, where the model's parameters
  `reads` (each with its shape: "layer_0/mlp/wi/kernel [64, 96]") need `expected`.

  Raises:
    UsageError: one line naming the source, the tensor, both shapes and `fix`.
  """
  if tuple(shape) != tuple(expected):
    raise UsageError(f"{where}: tensor {tensor} has shape {list(shape)}, but this model's "
                     f"{', '.join(reads)} need{'s' * (len(reads) == 1)} {list(expected)}; "
                     f"{fix}")


def missing(where: str, tensor: str, fix: str) -> UsageError:
  """The one line for a tensor the model needs that the source `where` does not hold."""
  return UsageError(f"{where}: no tensor {tensor}, which this model needs; {fix}")


def warn_unread(where: str, names: Iterable[str]) -> None:
  """One warning line on stderr naming the tensors of `where` that no part of the model read
  (nothing when there are none)."""
  unread = sorted(names)
  if not unread:
    return
  shown = ", ".join(unread[:_NAMED_UNREAD])
  more = f" and {len(unread) - _NAMED_UNREAD} more" if len(unread) > _NAMED_UNREAD else ""
  count = f"{len(unread)} tensor{'s' * (len(unread) != 1)}"
  print(one_line(f"lingvo_lite: warning: {where}: {count} that no part of the model reads, "
                 f"left unread: {shown}{more}"), file=sys.stderr, flush=True)
