"""The attention kernels: `KERNELS`, name -> its row (row.py), one module per kernel.

| row    | runs on               | takes                                    | scores | decode    |
|--------|-----------------------|------------------------------------------|--------|-----------|
| splash | TPU (CPU interpreted) | every mask; lengths its blocks divide    | no     | einsum's  |
| cudnn  | NVIDIA GPUs           | bf16/f16, heads of 8k up to 128 (256 on  | no     | einsum's  |
|        |                       | Hopper); segments, window; no sinks      |        |           |
| xla    | any                   | segments, window; no sinks               | no     | einsum's  |
| einsum | any                   | everything                               | yes    | its own   |
| paged  | TPU (CPU interpreted) | decoding only: a token per slot over a   | -      | its own   |
|        |                       | bf16 cache, heads of 128k, a prefix      |        |           |
| latent | any                   | decoding only: latent attention's cache  | -      | its own   |
|        |                       | of latents and rotary keys               |        |           |

Values of another width than the keys' (latent attention's) go as they are to the rows that
take them (einsum, splash: `Kernel.value_width`), padded to the keys' width to the others.

`model.attention_implementation` names a row or "auto": its accepted values are this table's
names (`AttentionImplementation`, rebuilt when a row is registered), so a name no row
implements is never accepted. "auto" is the first row, in the table's order, that may be
picked on the target (`auto_on`) and takes the model's calls (`choose`). A named row the
target or the model is beyond is refused by `Setup.validate()` in one line (`refusal`). A
call a row has no form for (a mask, a length; a decode step it does not fit) goes to the row
it names (`for_training`, `for_decoding`), so the attention layer never asks for a name.

A model's decode cache is made in the layout its kernel's decode forms keep (`cache_layout`,
asked once by the model's `cache_layout()`): "heads" where the paged kernel decodes it (it
reads pages of one head) and on CPUs, "positions" where the written-out form does elsewhere
(models/kv_cache.py says why); the written-out form reads both, so a step the paged kernel
does not fit still decodes.

Adding a kernel: a module with its row, and its name in `_ROWS` (or `register(row)` from
one's own module, as the tests do).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Literal

from lingvo_lite.models.attention_kernels import einsum, fused, latent, paged, splash
from lingvo_lite.models.attention_kernels.row import (HEADS, MASKS, POSITIONS, Call, Choice,
                                                      DecodeForm, DecodeStep, Kernel)

__all__ = ["HEADS", "KERNELS", "MASKS", "POSITIONS", "AttentionImplementation", "Call",
           "Choice", "DecodeForm", "DecodeStep", "Kernel", "cache_layout", "choose",
           "for_decoding", "for_training", "refusal", "register", "registered",
           "resolve_implementation"]

# In "auto"'s order of preference: a target's kernel before the written-out one.
_ROWS = (splash.ROW, fused.CUDNN, fused.XLA, einsum.ROW, paged.ROW, latent.ROW)
KERNELS: dict[str, Kernel] = {row.name: row for row in _ROWS}


def _field_type():
  return Literal[("auto", *KERNELS)]  # type: ignore[valid-type]


# The field's type: "auto" and exactly the table's names (rebuilt by `register`).
AttentionImplementation = _field_type()


def register(row: Kernel) -> None:
  """Adds a kernel to the table (after the others: "auto" prefers those), and its name to
  the field's accepted values.

  Raises:
    ValueError: The name is taken, or a fallback names no row.
  """
  global AttentionImplementation  # pylint: disable=global-statement
  if row.name in KERNELS or row.name == "auto":
    raise ValueError(f"an attention kernel named {row.name!r} exists already")
  for fallback in (row.fallback, row.decode_fallback):
    if fallback is not None and fallback not in KERNELS:
      raise ValueError(f"attention kernel {row.name!r} falls back to {fallback!r}, which is no "
                       f"row of {sorted(KERNELS)}")
  if not row.masks <= MASKS:
    raise ValueError(f"attention kernel {row.name!r} names masks {sorted(row.masks - MASKS)}; "
                     f"the masks are {sorted(MASKS)}")
  KERNELS[row.name] = row
  AttentionImplementation = _field_type()


def unregister(name: str) -> None:
  """Removes a kernel `register` added (one of the table's own stays)."""
  global AttentionImplementation  # pylint: disable=global-statement
  if any(row.name == name for row in _ROWS):
    raise ValueError(f"{name!r} is one of the table's own attention kernels")
  KERNELS.pop(name, None)
  AttentionImplementation = _field_type()


@contextlib.contextmanager
def registered(row: Kernel) -> Iterator[Kernel]:
  """`register(row)` for the duration of a block."""
  register(row)
  try:
    yield row
  finally:
    unregister(row.name)


def _follow(row: Kernel, next_of, done) -> Kernel:
  """Follows `next_of` from `row` until `done(row)`; a fallback loop is an error of the
  table, never met by a call."""
  seen = []
  while not done(row):
    seen.append(row.name)
    following = next_of(row)
    if following is None or following in seen:
      raise ValueError(f"attention kernels {' -> '.join(seen)} end in no kernel that takes "
                       "the call")
    row = KERNELS[following]
  return row


def for_training(name: str, call: Call) -> Kernel:
  """The row that attends a training or prefill call: `name`'s, or along its fallbacks the
  first that takes the call's masks and length."""
  return _follow(KERNELS[name], lambda row: row.fallback, lambda row: row.takes(call))


def for_decoding(name: str, layout: str, step: DecodeStep) -> DecodeForm:
  """The decode form a step takes: along `name`'s decode fallbacks, the first that reads the
  layer's cache `layout` and fits the step; where none of them reads that layout, the first
  row of the table whose form does (a family's own layout, as latent attention's)."""
  fits = lambda row: (row.decode is not None and layout in row.decode.layouts
                      and row.decode.fits(step))
  try:
    return _follow(KERNELS[name], lambda row: row.decode_fallback, fits).decode
  except ValueError:
    for row in KERNELS.values():
      if fits(row):
        return row.decode
    raise


def cache_layout(name: str, call: Call) -> str:
  """The layout a model's decode cache is made in (models/kv_cache.py): the layout of the first
  decode form, along `name`'s decode fallbacks, that runs on `call`'s target and keeps one for
  the model there (`DecodeForm.cache_layout`): by head where the TPU's paged kernel (which
  reads pages of one head) decodes it, else the written-out form's choice. Where no form
  along the chain keeps one (a registered row's chain without a decode form), by head: every
  model asks when its layers are built, training too, and such a decode step is refused
  where it is taken (`for_decoding`)."""
  keeps = lambda row: (None if row.decode is None or not row.runs_on(call.platform)
                       else row.decode.cache_layout(call))
  try:
    return keeps(_follow(KERNELS[name], lambda row: row.decode_fallback,
                         lambda row: keeps(row) is not None))
  except ValueError:
    return HEADS


def _alternatives(call: Call, refused: str) -> list[str]:
  """The kernels this target runs natively with a training form that take the model."""
  return sorted(row.name for row in KERNELS.values()
                if row.name != refused and row.attend is not None
                and call.platform in row.platforms and row.problem(call) is None)


def _either(names: list[str] | tuple[str, ...]) -> str:
  quoted = [repr(name) for name in names]
  return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def refusal(name: str, call: Call) -> tuple[str, str] | None:
  """(why, fix) where the kernel `name` cannot attend the model's calls on `call`'s target;
  None where it can, or for "auto"."""
  if name == "auto":
    return None
  problem = KERNELS[name].problem(call)
  if problem is None:
    return None
  others = _alternatives(call, name)
  return problem, f"or use {_either(others)}" if others else "or use 'auto'"


def _auto(call: Call) -> tuple[Kernel, str]:
  """The first row "auto" may pick on the target that takes the model's calls, and why."""
  passed = []
  for row in KERNELS.values():
    if call.platform not in row.auto_on:
      continue
    missing = call.masks - row.masks
    problem = (row.problem(call) or row.auto_refusal(call)
               or (f"takes no {', '.join(sorted(missing))}" if missing else None))
    if row.attend is not None and problem is None:
      why = f"auto on {call.platform}"
      return row, why + (f": {'; '.join(passed)}" if passed else "")
    if problem:
      passed.append(f"{row.name} {problem}")
  raise ValueError(f"no attention kernel may be picked on {call.platform}")


def choose(requested: str, call: Call) -> Choice:
  """The kernel the model's layers are built with and the one its training calls run (the
  masks of `call` its own, or its fallback's), with why; for the log and the memory check."""
  if requested == "auto":
    row, why = _auto(call)
    chosen = runs = row
  else:
    chosen = KERNELS[requested]
    runs = for_training(requested, call)
    missing = ", ".join(sorted(call.masks - chosen.masks))
    why = ("" if runs is chosen else f"{chosen.name} takes no {missing}" if missing
           else f"{chosen.name} has no training form")
  scoreless = tuple(row.name for row in KERNELS.values()
                    if call.platform in row.auto_on and not row.holds_scores
                    and row.takes(call) and row.problem(call) is None)
  return Choice(chosen.name, runs, why, scoreless)


def resolve_implementation(requested: str, platform: str, device_kind: str = "",
                           dtype: str = "float32", head_dim: int = 0) -> str:
  """The kernel `requested` stands for on `platform` ("auto" resolved; any other name is
  returned as it is): the target's fastest that takes the dtype and head width."""
  call = Call(platform=platform, device_kind=device_kind, dtype=dtype, head_dim=head_dim)
  return choose(requested, call).name
