"""Every value an enumerated field accepts runs or is refused in one line: the Literal and enum
fields of every part a Setup holds are found by walking the dataclasses (not listed here), and
each value, set alone on a tiny setup, lowers the program it belongs to or is refused by
`Setup.validate()` (on a CPU: what needs an accelerator). Lowering (tracing the project's own
jitted train step, or decoding's generate loop, and emitting its program) is where a value
nothing implements fails; compiling and running each would take minutes, not seconds."""

import dataclasses
import enum
import functools
import typing
from typing import Iterator, Mapping

from lingvo_lite import fields
from lingvo_lite.errors import UsageError
from lingvo_lite.experiment import Setup
from lingvo_lite.testing import synthetic_tiny_setup


# The values a CPU refuses in validate() (one line naming the field), and why; every other
# value a field offers must trace and lower on a CPU.
_REFUSED_ON_CPU = {
    ("attention_implementation", "cudnn"): "needs an NVIDIA GPU",
    ("remat_policy", "qkv_proj_offloaded"): "moves activations to host memory",
    ("remat_policy", "minimal_offloaded"): "moves activations to host memory",
    # Not the CPU's doing: the one field alone cannot make these.
    ("layer_kinds", ("sliding",)): "a layer of layer_kinds slides but the window is not set",
}


def _choices(annotation) -> list:
  """Every value an enumerated annotation accepts: a Literal's, an enum's members, one of
  either (or None) in a union, a tuple of them as each choice alone (a pattern of one)."""
  bare = fields._strip(annotation)[0]  # pylint: disable=protected-access
  if typing.get_origin(bare) is typing.Literal:
    return list(typing.get_args(bare))
  if isinstance(bare, type) and issubclass(bare, enum.Enum):
    return list(bare)
  union = fields._union_args(bare)  # pylint: disable=protected-access
  if union is not None:
    return [choice for member in union for choice in _choices(member)]
  args = typing.get_args(bare)
  if (typing.get_origin(bare) is tuple and len(args) == 2 and args[1] is Ellipsis) or (
      typing.get_origin(bare) is list and len(args) == 1):
    return [(choice,) for choice in _choices(args[0])]
  return []


def _enumerated(path: str, part) -> Iterator[tuple[str, object]]:
  """(field path, a value it accepts) for every enumerated field of `part` and the parts in
  it, walked from the dataclasses' own fields."""
  if isinstance(part, (list, tuple, dict)):
    for key, entry in fields.entries(part):
      yield from _enumerated(fields.path_join(path, key), entry)
    return
  if not dataclasses.is_dataclass(part) or isinstance(part, type):
    return
  hints = fields.type_hints(type(part))
  for field in dataclasses.fields(part):
    if field.name in hints and not fields._is_framework_field(part, field.name):  # pylint: disable=protected-access
      field_path = fields.path_join(path, field.name)
      yield from ((field_path, choice) for choice in _choices(hints[field.name]))
      yield from _enumerated(field_path, getattr(part, field.name))


def _replaced(part, path: list[str], value):
  """`part` with the field at `path` (names and dict keys) set to `value`."""
  if not path:
    return value
  head, rest = path[0], path[1:]
  if isinstance(part, Mapping):
    return {**part, head: _replaced(part[head], rest, value)}
  inner = _replaced(getattr(part, head), rest, value)
  return part.clone(**{head: inner}) if hasattr(part, "clone") else dataclasses.replace(
      part, **{head: inner})


def _lowered_or_refused(setup, path: str) -> str | None:
  """None once the program the field belongs to lowers (the train step, or decoding's
  generate loop for decode.*); the one line validate() refused it with."""
  from lingvo_lite.decode.jitted import DecodeSteps  # pylint: disable=g-import-not-at-top
  from lingvo_lite.on_mesh.jitted import JittedSteps  # pylint: disable=g-import-not-at-top
  try:
    setup.validate()
  except UsageError as e:
    assert "\n" not in str(e), str(e)
    return str(e)
  if path.startswith("decode."):
    DecodeSteps(setup).lower_generate()
  else:
    JittedSteps(setup).lower_train_step()
  return None


def _family_setups(base: Setup) -> Iterator[Setup]:
  """`base`, then `base` with each other registered family's tiny model (as --fiddler=tiny
  shrinks it, each attention and feed-forward kind in one layer), the shallowest first, so
  that the fields only some families have are walked too, on the cheapest of them."""
  from lingvo_lite.models import family  # pylint: disable=g-import-not-at-top
  family.import_every_family()
  yield base
  setups = []
  for cls in set(family.FAMILIES.values()) - {type(base.model)}:
    model = cls(vocab_size=base.model.vocab_size, num_layers=2, dim=64, num_heads=4)
    arguments = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)
                 if not fields._is_framework_field(model, f.name)}  # pylint: disable=protected-access
    tiny = cls.tiny(arguments, base.train_data.sequence_length)
    layers = max(len(tiny.get(kinds, getattr(model, kinds, ()))) for kinds in (
        "layer_kinds", "mlp_kinds"))
    setups.append(dataclasses.replace(base, model=model.clone(**{**tiny,
                                                                 "num_layers": layers})))
  yield from sorted(setups, key=lambda s: (s.model.num_layers, s.model.family_name))


def test_every_value_an_enumerated_field_accepts_runs_or_is_refused_in_one_line():
  """Every Literal or enum field of every part a Setup holds (each family's model, the loop,
  the optimizer, the data, the partitioner, decoding), walked from the dataclasses, not listed
  here: each value it accepts, set alone on a tiny setup, lowers the program it belongs to
  (the project's own jitted train step, or decode's generate loop), or validate() refuses it
  in one line naming it (on a CPU: what needs an accelerator). A value the field accepts and
  nothing implements fails here as the traceback it would be."""
  base = synthetic_tiny_setup("PyCodeTiny", "model.num_layers=1", "train.log_grad_norm=False",
                              "train_data.sequence_length=16", "train_data.global_batch_size=2")
  seen, refused, problems = set(), {}, []
  for setup in _family_setups(base):
    assert _lowered_or_refused(setup, "model") is None  # Each family as it comes.
    for name in [f.name for f in dataclasses.fields(setup)]:
      for path, value in _enumerated(name, getattr(setup, name)):
        field = path.rsplit(".", 1)[-1]
        current = functools.reduce(getattr, path.split("."), setup)
        if (field, value) in seen or value == current:
          seen.add((field, value))
          continue
        seen.add((field, value))
        try:
          message = _lowered_or_refused(_replaced(setup, path.split("."), value), path)
        except Exception as e:  # pylint: disable=broad-except
          problems.append(f"{path}={value!r}: {type(e).__name__}: {e}".splitlines()[0])
          continue
        if message is not None:
          refused[(field, value)] = message
  assert not problems, problems
  assert refused.keys() == _REFUSED_ON_CPU.keys(), refused
  for key, message in refused.items():
    assert key[0] in message and _REFUSED_ON_CPU[key] in message, message
  assert ("remat_policy", "save_dot_except_mlp_in") in seen and ("dispatch", "dense") in seen
