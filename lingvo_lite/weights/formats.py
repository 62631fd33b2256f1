"""The weight formats, one row each: what `--init_from` (its scheme, its help), `train.init_from`'s
type and `--mode=export` (its `--export_format` choices, their dtypes) look formats up in.

  format  --init_from     source (train.init_from)    --export_format writer
  job     JOB[@STEP]      job_checkpoint.JobCheckpoint
  hf      hf:PATH         hf_checkpoint.HfCheckpoint  hf_export.HfExport
  gguf    gguf:PATH       gguf_checkpoint.GgufCheckpoint  gguf_export.GgufExport
  slim    slim:PATH       slim_weights.SlimCheckpoint  slim_weights.SlimExport
  peft    peft:PATH[,base=SOURCE]  peft.PeftCheckpoint  peft.PeftExport

A format is its module(s) and its row in `FORMATS`; nothing else names it. Its source is a config
part that subclasses weight_source.py's `Source`: whole weights (`describe()`,
`load_params(mesh_params)`), and what more it brings declared there with defaults (a description
of its model: `describes_model()`, `model_fields()`, `origin()`, and `--init_from` then sets
`model` too, weights/sources.py; LoRA adapters over a base: `brings_adapters`).
Its writer is made from an `ExportRequest` before anything is read, and answers the `Export`
protocol (weights/exports.py). A format that stores a model by its own names asks each family
for them (models/format_names.py), so no module here names a family.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import re
from typing import Any, Callable

import fiddle as fdl

from lingvo_lite.errors import UsageError
from lingvo_lite.weights.exports import Export, ExportRequest
from lingvo_lite.weights import gguf_checkpoint, gguf_export, hf_checkpoint, hf_export
from lingvo_lite.weights import job_checkpoint, peft, slim_weights


@dataclasses.dataclass(frozen=True)
class WeightFormat:
  """One weight format.

  Attributes:
    name: Its name (`--export_format=NAME`).
    source: The config part that reads it as `train.init_from`; None: never read.
    scheme: `--init_from=SCHEME:PATH` names it; None for the format of a value with no
      scheme of the table (another job's `JOB[@STEP]`).
    flag_value: How `--init_from` writes it, for its help ("hf:PATH").
    flag_help: What it is, for `--init_from`'s help.
    path_noun: What PATH names ("folder", "file"), for the refusal of an empty one.
    arguments: (value without its scheme, flag) -> the source's arguments; None: {"path":
      value}.
    nested_sources: The arguments whose values `arguments` gives as `--init_from` values of
      other sources (peft:'s `base=`): each becomes that source's config part here.
    writer: Makes its writer from an `ExportRequest` (an `Export`); None: not written.
    export_help: What `--export_format=NAME` writes, for its help.
  """

  name: str
  source: type | None = None
  scheme: str | None = None
  flag_value: str = ""
  flag_help: str = ""
  path_noun: str = "path"
  arguments: Callable[[str, str], dict[str, Any]] | None = None
  nested_sources: tuple[str, ...] = ()
  writer: Callable[[ExportRequest], Export] | None = None
  export_help: str = ""

  def source_arguments(self, value: str, flag: str) -> dict[str, Any]:
    """The source's arguments for `--init_from`'s `value` (its scheme taken off).

    Raises:
      UsageError: an empty path after the scheme (the format's own checks for the rest).
    """
    if self.arguments is not None:
      found = self.arguments(value, flag)
      return {name: source_config(argument, flag) if name in self.nested_sources else argument
              for name, argument in found.items()}
    if not value.strip():
      raise UsageError(f"{flag}={self.scheme}:{value}: give the {self.path_noun} after "
                       f"{self.scheme}: ({self.scheme}:PATH)")
    return {"path": value}


FORMATS: tuple[WeightFormat, ...] = (
    WeightFormat(
        "job", source=job_checkpoint.JobCheckpoint, flag_value="JOB, JOB@STEP",
        flag_help="another job's newest usable step, or STEP",
        arguments=job_checkpoint.flag_arguments),
    WeightFormat(
        "hf", source=hf_checkpoint.HfCheckpoint, scheme="hf", flag_value="hf:PATH",
        flag_help="a Hugging Face folder, whose config.json then sets the model",
        path_noun="folder", writer=hf_export.HfExport,
        export_help="a Hugging Face folder that transformers' from_pretrained loads"),
    WeightFormat(
        "gguf", source=gguf_checkpoint.GgufCheckpoint, scheme="gguf", flag_value="gguf:PATH",
        flag_help="a GGUF file, whose metadata then sets the model", path_noun="file",
        writer=gguf_export.GgufExport,
        export_help="a GGUF file, model.gguf, for llama.cpp and transformers"),
    WeightFormat(
        "slim", source=slim_weights.SlimCheckpoint, scheme="slim", flag_value="slim:PATH",
        flag_help="slim weights an export wrote", path_noun="folder",
        writer=slim_weights.SlimExport,
        export_help="slim weights: the parameters alone, orbax, which --init_from=slim:PATH "
        "reads"),
    WeightFormat(
        "peft", source=peft.PeftCheckpoint, scheme="peft", flag_value="peft:PATH[,base=SOURCE]",
        flag_help="a Hugging Face PEFT folder's LoRA adapters, over the base its "
        "adapter_config.json names (a local folder or file) or SOURCE (any other value here); "
        "sets train.lora", path_noun="folder", arguments=peft.flag_arguments,
        nested_sources=("base",),
        writer=peft.PeftExport,
        export_help="a LoRA job's adapters as a Hugging Face PEFT folder (adapter_config.json, "
        "adapter_model.safetensors) that peft.PeftModel.from_pretrained reads; the other "
        "formats write a LoRA job with its adapters merged"),
)

# What `train.init_from` may hold: any format's source.
WeightSource = functools.reduce(operator.or_, [f.source for f in FORMATS if f.source])


# A URL's scheme (RFC 3986) and its colon, but not a URL's `://`: what reads as a scheme.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:(?!//)")


def for_flag(value: str, flag: str = "--init_from") -> tuple[WeightFormat, str]:
  """(the format `--init_from=value` names, the value without its scheme): `SCHEME:PATH` for
  a scheme of the table, else the format without a scheme, with the whole value.

  A value that starts like a scheme (`NAME:`, a letter then letters, digits, `+`, `-` or `.`,
  as a URL's) that no format has is refused, listing the schemes: `ggml:model.bin` is no job
  folder. A job folder may still have a `:` in its name: a URL (`gs://bucket/job`, which
  epath reads), a folder that exists, or one written `./NAME:...` is read as a job.

  Raises:
    UsageError: an unknown scheme (one line listing the valid values).
  """
  scheme, colon, rest = value.partition(":")
  for weight_format in FORMATS:
    if colon and weight_format.scheme is not None and weight_format.scheme == scheme:
      return weight_format, rest
  default, = [f for f in FORMATS if f.scheme is None and f.source is not None]
  if _SCHEME.match(value) and not any(os.path.exists(os.path.expanduser(path))
                                      for path in (value, value.rpartition("@")[0]) if path):
    values = [f.flag_value for f in FORMATS if f.source is not None]
    raise UsageError(f"{flag}={value}: {scheme}: is no weight format's scheme; give "
                     f"{', '.join(values[:-1])} or {values[-1]} (a job folder whose name has "
                     f"a ':' must exist, or be written ./{value})")
  return default, value


def source_config(value: str, flag: str = "--init_from") -> fdl.Config:
  """The weight source `value` names, as a config part of its format's source class.

  Raises:
    UsageError: an unknown scheme, an empty path after a scheme, or an empty value.
  """
  weight_format, rest = for_flag(value, flag)
  return fdl.Config(weight_format.source, **weight_format.source_arguments(rest, flag))


def init_from_help() -> str:
  """What `--init_from` takes, from the table: `JOB, JOB@STEP, hf:PATH ... or slim:PATH: the
  parameters ... (JOB ...: ...; hf:PATH: ...)`."""
  readable = [f for f in FORMATS if f.source is not None]
  values = [f.flag_value for f in readable]
  listed = ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else values[0]
  described = "; ".join(f"{f.flag_value}: {f.flag_help}" for f in readable)
  return (f"{listed}: the parameters a job that has no checkpoint of its own starts from "
          f"({described})")


def writable() -> dict[str, WeightFormat]:
  """The formats `--mode=export` writes, by name, in table order."""
  return {f.name: f for f in FORMATS if f.writer is not None}
