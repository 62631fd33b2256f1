"""A family's settings in other formats as rows: our field, its Hugging Face config.json key, its
GGUF metadata key, what a file without the key means, and how the value reads and is written.

One row is read both ways by every format (models/transformer_names.py):

  Key("num_layers", "num_hidden_layers", "block_count")
  Key("norm_eps", "rms_norm_eps", "attention.layer_norm_rms_epsilon", 1e-6, NUMBER)

reads config.json's `rms_norm_eps` (a number; 1e-6 where the file has none) into the field
`norm_eps`, writes `model.norm_eps` back under that key on export, writes it as the GGUF key
`<architecture>.attention.layer_norm_rms_epsilon` (a float), and reads a GGUF file's key as the
config.json entry it stands for. A `Fixed` row is a key whose one value the family computes
(refused otherwise); a `Rule` says in code what a few keys say together (a pattern of layer
kinds, a rope scaling). A model kind's rows are one `Rows` (models/dense_names.py,
moe_names.py); a family's are its kind's `changed` where the family differs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from lingvo_lite.models.checkpoint_names import HfConfig

# How a config.json value reads: as it is, a number (a float; "1e-5" as text is refused), true
# or false, the rotary base (`rope_parameters.rope_theta` or `rope_theta`).
VALUE, NUMBER, FLAG, ROPE_THETA = "value", "number", "flag", "rope_theta"


class _Required:
  def __repr__(self) -> str:
    return "REQUIRED"


REQUIRED = _Required()  # A file without the key is refused (it names it).
# A GGUF reading: (metadata, its architecture, each tensor's shape, the config.json so far) ->
# the value (a setting llama.cpp keeps in the tensors, or fixes).
GgufReading = Callable[[Mapping[str, Any], str, Mapping[str, tuple[int, ...]], dict], Any]


@dataclasses.dataclass(frozen=True)
class Key:
  """One field as one key of each format.

  Attributes:
    field: Our field.
    hf: Its config.json key; None: a GGUF key alone (written for llama.cpp, never read).
    gguf: Its GGUF metadata key without the `<architecture>.` prefix; or how a GGUF file says
      it otherwise (a `GgufReading`: read, never written); None: no GGUF key.
    default: What a config.json without the key means; REQUIRED: refused.
    read: How the value reads: VALUE, NUMBER, FLAG or ROPE_THETA (NUMBER and ROPE_THETA are
      written to GGUF as floats); or a function (config, key, default) -> value.
    source: The model's attribute export writes (a derived size resolved:
      "resolved_head_dim"); None: the field.
    written: Export writes the key (False: read, never written).
    gguf_reads: A GGUF file's key is read (False: written alone; the value is read from
      elsewhere: the vocabulary from the token table).
  """

  field: str
  hf: str | None
  gguf: str | GgufReading | None = None
  default: Any = REQUIRED
  read: str | Callable[[HfConfig, str, Any], Any] = VALUE
  source: str | None = None
  written: bool = True
  gguf_reads: bool = True

  @property
  def name(self) -> str:
    return self.hf or self.gguf

  def fields(self, config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
    """{field: value} from a config.json (`found`: the fields the rows before it read)."""
    del found
    if self.hf is None:
      return {}
    if callable(self.read):
      return {self.field: self.read(config, self.hf, self.default)}
    if self.default is REQUIRED:
      return {self.field: config.require(self.hf)}
    readers = {VALUE: config.get, NUMBER: config.number, FLAG: config.flag,
               ROPE_THETA: lambda key, default: config.rope_theta(default)}
    return {self.field: readers[self.read](self.hf, self.default)}

  def value(self, model: Any) -> Any:
    return getattr(model, self.source or self.field)

  def config(self, model: Any) -> dict[str, Any]:
    """Its config.json entry for `model`."""
    return {self.hf: self.value(model)} if self.hf and self.written else {}

  def from_metadata(self, metadata: Mapping[str, Any], arch: str,
                    tensors: Mapping[str, tuple[int, ...]], config: dict) -> dict[str, Any]:
    """The config.json entry a GGUF file's metadata (and tensors) hold, where they do."""
    if self.hf is None or self.gguf is None or not self.gguf_reads:
      return {}
    value = (self.gguf(metadata, arch, tensors, config) if callable(self.gguf)
             else metadata.get(f"{arch}.{self.gguf}"))
    return {} if value is None else {self.hf: value}

  def metadata(self, model: Any) -> dict[str, Any]:
    """Its GGUF metadata entry for `model` (key without the prefix)."""
    if not isinstance(self.gguf, str):
      return {}
    value = self.value(model)
    if value is None:  # A setting left unset (no query bottleneck): GGUF has no null.
      return {}
    return {self.gguf: float(value) if self.read in (NUMBER, ROPE_THETA) else value}


@dataclasses.dataclass(frozen=True)
class Fixed:
  """A config.json key whose one value the family computes: another is refused naming the key
  (unless not `checked`: a key of how transformers reports, not of what it computes), and
  export writes it.

  Attributes:
    hf: The key.
    value: The value (also what a file without the key means).
    checked: Whether a config.json's value is checked.
  """

  hf: str
  value: Any
  checked: bool = True

  @property
  def name(self) -> str:
    return self.hf

  def fields(self, config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
    del found
    if self.checked:
      config.expect(self.hf, (self.value,), self.value)
    return {}

  def config(self, model: Any) -> dict[str, Any]:
    del model
    return {self.hf: self.value}

  def from_metadata(self, *args: Any) -> dict[str, Any]:
    del args
    return {}

  def metadata(self, model: Any) -> dict[str, Any]:
    del model
    return {}


def _none(*args: Any) -> dict[str, Any]:
  del args
  return {}


@dataclasses.dataclass(frozen=True)
class Rule:
  """What several keys say together, in code: each direction a function (none: nothing).

  Attributes:
    name: What the rule is named by in `Rows.changed` (its main config.json key).
    fields: (config.json, the fields read so far) -> the fields it sets.
    config: model -> its config.json entries.
    from_metadata: (GGUF metadata, architecture, tensor shapes, config.json so far) -> the
      config.json entries they stand for.
    metadata: model -> its GGUF metadata entries (keys without the prefix).
  """

  name: str
  fields: Callable[[HfConfig, dict[str, Any]], dict[str, Any]] = _none
  config: Callable[[Any], dict[str, Any]] = _none
  from_metadata: Callable[..., dict[str, Any]] = _none
  metadata: Callable[[Any], dict[str, Any]] = _none


class Rows(tuple):
  """A model kind's or a family's rows, in the order they read (a rule may use the fields
  of the rows before it) and write."""

  def changed(self, *rows: Any, drop: tuple[str, ...] = (), **defaults: Any) -> Rows:
    """These rows with `rows` in place of those of the same name (others added at the end),
    the rows named in `drop` left out, and each field of `defaults` read with that default."""
    found = list(self)
    for row in rows:
      names = [old.name for old in found]
      if row.name in names:
        found[names.index(row.name)] = row
      else:
        found.append(row)
    found = [row for row in found if row.name not in drop]
    for field, default in defaults.items():
      keys = [i for i, row in enumerate(found)
              if isinstance(row, Key) and row.field == field and row.hf]
      if len(keys) != 1:
        raise ValueError(f"{field}: no config.json key of its own to default")
      found[keys[0]] = dataclasses.replace(found[keys[0]], default=default)
    return Rows(found)

  def _collected(self, found: dict[str, Any], say: Callable[[Any, dict], dict[str, Any]]
                 ) -> dict[str, Any]:
    """`found` updated with what each row says, in order (`say(row, found so far)`)."""
    for row in self:
      found.update(say(row, found))
    return found

  def fields(self, config: HfConfig) -> dict[str, Any]:
    """The fields a config.json sets."""
    return self._collected({}, lambda row, found: row.fields(config, found))

  def config(self, model: Any) -> dict[str, Any]:
    """The config.json entries of `model`."""
    return self._collected({}, lambda row, found: row.config(model))

  def from_metadata(self, metadata: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                    config: dict[str, Any]) -> dict[str, Any]:
    """`config` (the entries a file without any key has) updated with what a GGUF file's
    metadata and tensors say."""
    arch = metadata.get("general.architecture")
    return self._collected(config, lambda row, found: row.from_metadata(
        metadata, arch, tensors, found))

  def metadata(self, model: Any) -> dict[str, Any]:
    """The GGUF metadata of `model` (keys without the prefix)."""
    return self._collected({}, lambda row, found: row.metadata(model))
