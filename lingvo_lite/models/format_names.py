"""A family's names in other weight formats: the mapping classes a family's module defines beside
its model class, and how a weight format finds them.

A weight format that stores a model by its own names (a Hugging Face folder, a GGUF file) asks
the family for them through one interface per format, here: `HfNames` (config.json's keys, the
safetensors' tensor names) and `GgufNames` (llama.cpp's metadata keys and tensor names, as the
Hugging Face folder it was converted from). A family's module answers with a subclass bound to
one model, registered for its model class:

  @format_names.names_for(GptJ)
  class GptJHfNames(TransformerHfNames):
    model_type = "gptj"
    ...

(a transformer family's names implement the interfaces from its tables of rows:
models/transformer_names.py), so the format modules (lingvo_lite/weights/) name no family and
read no family's field: they ask `bound(model, HfNames)` or `families_with(HfNames)`. A subclass of a family that registers
no names of its own answers with its parent's (the nearest registered class of its MRO); a
family that registers none has no such format. A format that reads a model whole (a job's
checkpoint, slim weights) needs no names and has no interface here.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping, TypeVar

from lingvo_lite.errors import UsageError
from lingvo_lite.models import family as families
from lingvo_lite.models.checkpoint_names import GgufTensor, HfConfig, TensorName

# Interface class -> {family class -> its names class}.
_REGISTERED: dict[type, dict[type, type]] = {}
Names = TypeVar("Names", bound="FormatNames")


class FormatNames:
  """Base of a family's names in one format, bound to one model of the family.

  Attributes:
    model: The model (a family instance) whose names these are.
    family: The family class the names were registered for (`names_for` sets it).
  """

  family: ClassVar[type]

  def __init__(self, model: Any):
    self.model = model


class HfNames(FormatNames):
  """A family's names in a Hugging Face folder (what transformers' `save_pretrained` writes).

  Attributes:
    model_type: config.json's `model_type` of the checkpoints it reads and writes.
    architecture: The transformers class that loads its exports (config.json's
      `architectures`).
    optional_prefix: A prefix of `tensors()`' names that some files of the format leave out.
    other_model_types: config.json `model_type`s besides `model_type` that it reads: a
      wrapper whose text model is the family's (Gemma 3's multimodal checkpoints), whose
      config `fields` reads the text model's from and whose tensors `file_names` finds.
  """

  model_type: ClassVar[str]
  architecture: ClassVar[str]
  optional_prefix: ClassVar[str] = ""
  other_model_types: ClassVar[tuple[str, ...]] = ()

  @classmethod
  def reads(cls, model_type: Any) -> bool:
    """Whether a config.json of `model_type` is this family's (its own or a wrapper's)."""
    return model_type == cls.model_type or model_type in cls.other_model_types

  @classmethod
  def file_names(cls, name: str) -> list[str]:
    """The names a file may give the tensor `name` (one of `tensors()`), tried in order:
    itself, and without `optional_prefix`."""
    if cls.optional_prefix and name.startswith(cls.optional_prefix):
      return [name, name[len(cls.optional_prefix):]]
    return [name]

  @classmethod
  def fields(cls, config: HfConfig) -> dict[str, Any]:
    """The fields of the model a config.json describes. Raises UsageError naming a key the
    family cannot honor (`config.refuse`)."""
    raise NotImplementedError

  def tensors(self) -> list[TensorName]:
    """Every tensor of the model's checkpoint, as `TensorName`s naming its parameters in the
    unrolled layer layout (`layer_N/...`)."""
    raise NotImplementedError

  def absent(self) -> tuple[str, ...]:
    """Parameters the format has no tensor for: zero in the model it describes."""
    return ()

  def config(self) -> dict[str, Any]:
    """The model's config.json (the inverse of `fields`)."""
    raise NotImplementedError

  def expressed(self) -> dict[str, Any]:
    """Each field the config.json must describe, by name, as the model computes with it
    (derived sizes resolved): export reads `config()` back through `fields` and compares."""
    raise NotImplementedError

  def unexpressed(self) -> dict[str, Any]:
    """Each field of the model that its config.json cannot say, by name: what the model the
    config (`config()`, read back through `fields`) describes has instead. Empty where the
    format describes this very model."""
    fields = self.fields(HfConfig(self.config(), f"the {self.model_type} config"))
    described = type(self)(type(self.model)(**{k: v for k, v in fields.items()
                                                if v is not None}))
    theirs = described.expressed()
    return {name: theirs[name] for name, ours in self.expressed().items()
            if ours != theirs[name]}

  def export_params(self, params: dict[str, Any]) -> dict[str, Any]:
    """The host parameters as the format's model computes with them: `absent()`'s folded
    into others where the family can (they must then be zero)."""
    return params


class GgufNames(FormatNames):
  """A family's names in a GGUF file (llama.cpp's format), which reads as the Hugging Face
  folder llama.cpp's converter made it from.

  Attributes:
    architecture: llama.cpp's `general.architecture` of the files it reads and writes.
  """

  architecture: ClassVar[str]

  @classmethod
  def reads_file(cls, metadata: Mapping[str, Any]) -> bool:
    """Whether a file of `architecture` with this `metadata` is the family's (several
    families may share an architecture: llama.cpp's `llama` holds Llama and Mixtral)."""
    del metadata
    return True

  @classmethod
  def hf_config(cls, metadata: Mapping[str, Any],
                tensors: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The Hugging Face config.json a file's metadata (and its tensors' names and shapes, in
    torch's axis order) describe."""
    raise NotImplementedError

  def metadata(self) -> dict[str, int | float | str]:
    """The model's `<architecture>.*` metadata, keys without the prefix (the inverse of
    `hf_config`: what llama.cpp's converter writes for the family)."""
    raise NotImplementedError

  def tensors(self) -> dict[str, GgufTensor]:
    """GGUF tensor name -> the Hugging Face tensor it is, and how llama.cpp's converter
    rearranged it."""
    raise NotImplementedError

  def check_writable(self) -> None:
    """Raises UsageError (one line) where a file of `architecture` cannot express the model
    (a setting llama.cpp's architecture has no key for)."""

  @classmethod
  def hf_model_type(cls) -> str:
    """The `model_type` of the folder the file is read as: the family's Hugging Face one."""
    return names_of(cls.family, HfNames).model_type


def _interface(names: type) -> type:
  """The interface (`HfNames`, `GgufNames`) that a names class implements."""
  for cls in names.__mro__:
    if FormatNames in cls.__bases__:
      return cls
  raise TypeError(f"{names.__qualname__}: subclass HfNames or GgufNames")


def names_for(family: type) -> Callable[[type[Names]], type[Names]]:
  """Registers the decorated class as `family`'s names in the format its base names."""

  def register(names: type[Names]) -> type[Names]:
    names.family = family
    _REGISTERED.setdefault(_interface(names), {})[family] = names
    return names

  return register


def names_of(family: type, interface: type[Names]) -> type[Names] | None:
  """`family`'s names class for the format of `interface`: its own, else the nearest parent
  family's; None where none has names in that format."""
  registered = _REGISTERED.get(interface, {})
  for cls in family.__mro__:
    if cls in registered:
      return registered[cls]
  return None


def bound(model: Any, interface: type[Names]) -> Names | None:
  """`model`'s names in the format of `interface`, or None where its family has none."""
  names = names_of(type(model), interface)
  return None if names is None else names(model)


def families_with(interface: type[Names]) -> list[tuple[type, type[Names]]]:
  """(family, its names class) for every family with names in that format, every family
  module imported first (a file's reader asks every family, not only those a config named),
  in `FAMILIES`' order."""
  families.import_every_family()
  found = []
  for family in families.FAMILIES.values():
    names = names_of(family, interface)
    if names is not None:
      found.append((family, names))
  return found


def refuse_unknown(where: str, key: str, value: Any, known: list[str]) -> UsageError:
  """The one line for a file no family reads (`key`=`value`), listing those that do."""
  return UsageError(f"{where}: {key}={value!r}: no lingvo_lite family reads it; supported: "
                    f"{', '.join(sorted(set(known)))}")
