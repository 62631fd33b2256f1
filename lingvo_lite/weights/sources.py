"""The weight source a command line names, as config parts: `--init_from=VALUE` ->
`train.init_from` (and, for a source that describes its model, the `model` part).

  hf:PATH      a Hugging Face folder (HfCheckpoint): its config.json is the model's config
  gguf:PATH    a GGUF file (GgufCheckpoint): its metadata is the model's config
  slim:PATH    slim weights (SlimCheckpoint, --export_format=slim): the model stays the
               experiment's (the folder's config.json is the job's, for --fdl_config_file)
  JOB[@STEP]   another lingvo_lite job's checkpoint step (JobCheckpoint; its newest usable
               step without @STEP): the model stays the experiment's

A source that describes its model replaces the experiment's `model` with its family and the
fields its header sets; the experiment's choices of how to run that model (dtypes, layer layout,
rematerialization, attention implementation) carry over where the family has them. The
executor sets these parts before the fiddlers and `--fdl.*` overrides, so an override still
changes any field (one that contradicts the weights' shapes is refused when they load).
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl
from fiddle import history

from lingvo_lite.errors import UsageError
from lingvo_lite.weights import job_checkpoint
from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
from lingvo_lite.weights.slim_weights import SlimCheckpoint
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
from lingvo_lite.weights.job_checkpoint import FIELD, JobCheckpoint

# How to run a model, not what it computes: kept from the experiment's model.
CARRIED_MODEL_FIELDS = ("dtype", "param_dtype", "scan_layers", "remat_policy",
                        "attention_implementation")


def from_flag(value: str, flag: str = "--init_from") -> fdl.Config:
  """The weight source `value` names, as a config part: `hf:PATH`, `gguf:PATH`, `slim:PATH`,
  or anything
  else a job dir (`JOB` or `JOB@STEP`, whose checks name the flag when it is built).

  Raises:
    UsageError: an empty path after hf: or gguf:, or a malformed JOB@STEP.
  """
  scheme, colon, path = value.partition(":")
  if colon and scheme == "hf":
    if not path.strip():
      raise UsageError(f"{flag}={value}: give the folder after hf: (hf:PATH)")
    return fdl.Config(HfCheckpoint, path=path)
  if colon and scheme == "slim":
    if not path.strip():
      raise UsageError(f"{flag}={value}: give the folder after slim: (slim:PATH)")
    return fdl.Config(SlimCheckpoint, path=path)
  if colon and scheme == "gguf":
    if not path.strip():
      raise UsageError(f"{flag}={value}: give the file after gguf: (gguf:PATH)")
    return fdl.Config(GgufCheckpoint, path=path)
  return fdl.Config(JobCheckpoint, **job_checkpoint.flag_arguments(value, flag))


def model_part(source: fdl.Config, model: Any) -> fdl.Config | None:
  """The `model` part of a source that describes its model (its family, its header's fields,
  and the experiment `model`'s carried fields); None for a job's checkpoint."""
  if fdl.get_callable(source) not in (HfCheckpoint, GgufCheckpoint):
    return None
  checkpoint = fdl.build(source)
  family, fields = checkpoint.model_fields()
  # config.txt names the file each field came from (config/files.py: a line number of 0).
  origin = history.Location(checkpoint.origin(), 0, None)
  with history.custom_location(lambda: origin):
    part = fdl.Config(family, **fields)
  arguments = model.__arguments__ if isinstance(model, fdl.Buildable) else {}
  for name in CARRIED_MODEL_FIELDS:
    if name in arguments and name in family.__dataclass_fields__:
      setattr(part, name, arguments[name])
  return part


def config_parts(value: str | None, cfg: fdl.Config, flag: str = "--init_from"
                 ) -> dict[str, fdl.Buildable]:
  """The parts `--init_from=value` sets in `cfg`, a Setup's config: `train.init_from`, and
  `model` where the source describes its model (carrying fields of `cfg`'s model, where it
  sets one). Empty when the flag is not given."""
  if value is None:
    return {}
  source = from_flag(value, flag)
  parts: dict[str, fdl.Buildable] = {FIELD: source}
  model_config = model_part(source, cfg.__arguments__.get("model"))
  if model_config is not None:
    parts["model"] = model_config
  return parts
