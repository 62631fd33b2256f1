"""The weight source a command line names, as config parts: `--init_from=VALUE` ->
`train.init_from` (and, for a source that describes its model, the `model` part).

The value's scheme names the format (weights/formats.py's table: `hf:PATH`, `gguf:PATH`,
`slim:PATH`; a value with no scheme of the table is another job's `JOB[@STEP]`), whose source
class the part builds. A Hugging Face folder's config.json and a GGUF file's metadata describe
their model; slim weights and a job's checkpoint do not (the model stays the experiment's).

A source that describes its model replaces the experiment's `model` with its family and the
fields its header sets (weights/weight_source.py: `describes_model()`); the experiment's
choices of how to run that model (the family's fields marked `run_fields.Run(carried=True)`:
dtypes, layer layout, rematerialization, attention implementation, quantization, the experts'
dispatch) carry over where the experiment sets them. A source that brings LoRA adapters sets
`train.lora` as they were made. The executor sets these parts before the fiddlers and `--fdl.*`
overrides, so an override still changes any field (one that contradicts the weights' shapes is
refused when they load).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import fiddle as fdl
from fiddle import history

from lingvo_lite import run_fields
from lingvo_lite.errors import UsageError
from lingvo_lite.weights import formats
from lingvo_lite.weights.job_checkpoint import FIELD


def model_part(source: fdl.Config, model: Any) -> fdl.Config | None:
  """The `model` part of a source that describes its model (its family, its header's fields,
  and the experiment `model`'s carried fields); None for one that does not."""
  checkpoint = fdl.build(source)
  if not checkpoint.describes_model():
    return None
  family, fields = checkpoint.model_fields()
  # config.txt names the file each field came from (config/files.py: a line number of 0).
  origin = history.Location(checkpoint.origin(), 0, None)
  with history.custom_location(lambda: origin):
    part = fdl.Config(family, **fields)
  arguments = model.__arguments__ if isinstance(model, fdl.Buildable) else {}
  for name in run_fields.names(family, carried=True):  # How to run it: the experiment's.
    if name in arguments:
      setattr(part, name, arguments[name])
  return part


def config_parts(value: str | None, cfg: fdl.Config, flag: str = "--init_from"
                 ) -> dict[str, fdl.Buildable]:
  """The parts `--init_from=value` sets in `cfg`, a Setup's config: `train.init_from`, and
  `model` where the source describes its model (carrying fields of `cfg`'s model, where it
  sets one). Empty when the flag is not given."""
  if value is None:
    return {}
  source = formats.source_config(value, flag)
  parts: dict[str, fdl.Buildable] = {FIELD: source}
  model_config = model_part(source, cfg.__arguments__.get("model"))
  if model_config is not None:
    parts["model"] = model_config
  built = fdl.build(source)
  if built.brings_adapters:  # Adapters (peft:): train.lora as their config says.
    model = model_config if model_config is not None else cfg.__arguments__.get("model")
    if model is None:
      raise UsageError(f"{flag}={value}: the base does not describe its model and the "
                       "experiment names none; give a base folder or file (base=hf:...)")
    settings = built.lora_settings(fdl.build(model))
    parts["train.lora"] = fdl.Config(type(settings), **dataclasses.asdict(settings))
  return parts
