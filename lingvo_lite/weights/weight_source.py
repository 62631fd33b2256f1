"""What a weight source (`train.init_from`) brings, declared on one base class with defaults.

Every source brings a model's whole weights (`load_params(mesh_params)`, and `load(jitted)` for
training) and says what it is (`describe()`). A source that brings more says so by overriding
the answers below, whose defaults say "nothing more"; programs ask them, never whether a
method exists:

  - a description of its model (a Hugging Face config.json, GGUF metadata): `describes_model()`
    is True, `model_fields()` gives its family and fields, `origin()` the file they come from;
    `--init_from` then sets `model` (weights/sources.py);
  - LoRA adapters over a base model (a PEFT folder): `brings_adapters`, `lora_settings(model)`
    (train.lora as the adapters were made), `load_adapters(adapter_params)`, and
    `load_base(mesh_params)`: the base's weights alone, a LoRA job's frozen weights (by default
    the whole weights: `load_params`);
  - `base_model_path()`: the folder or file a PEFT export names as its base model.

`PathSource` is the base of the sources read from one local folder or file (`SCHEME:PATH`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from etils import epath

from lingvo_lite import paths
from lingvo_lite.errors import UsageError


class Source:
  """Base of every weight source: whole weights, and nothing more unless a subclass says so.

  Attributes:
    brings_adapters: The source brings LoRA adapters (`lora_settings`, `load_adapters`).
  """

  brings_adapters: ClassVar[bool] = False

  def describe(self) -> str:
    """What it is, as `--init_from` writes it (`hf:PATH`)."""
    raise NotImplementedError

  def load_params(self, mesh_params: Any) -> tuple[Any, str]:
    """(the model's parameters in `mesh_params`' shapes and shardings (a
    `checkpoints.params.MeshParams`), what was loaded: `describe()` and a `sha256:`)."""
    raise NotImplementedError

  def load(self, jitted: Any) -> tuple[Any, str]:
    """`load_params` into a training's jitted steps' shapes."""
    return self.load_params(jitted.mesh_params())

  def describes_model(self) -> bool:
    """Whether its files describe their model (then `model_fields` and `origin` answer)."""
    return False

  def model_fields(self) -> tuple[type, dict[str, Any]]:
    """(the family its files describe, the fields they set)."""
    raise NotImplementedError(f"{self.describe()} does not describe its model")

  def origin(self) -> str:
    """The file the model's fields come from, for config.txt."""
    return self.describe()

  def lora_settings(self, model: Any) -> Any:
    """train.lora (models/lora.py's `LoraSettings`) as the adapters were made for `model`."""
    raise NotImplementedError(f"{self.describe()} brings no LoRA adapters")

  def load_adapters(self, adapter_params: Any) -> tuple[Any, str]:
    """(the adapters in `adapter_params`' shapes and shardings (a `MeshParams` of the adapted
    model's `lora` collection), what was loaded)."""
    raise NotImplementedError(f"{self.describe()} brings no LoRA adapters")

  def load_base(self, mesh_params: Any) -> tuple[Any, str]:
    """The weights adapters go over (a LoRA job's frozen weights): the whole weights unless
    the source brings adapters over a base of its own."""
    return self.load_params(mesh_params)

  def base_model_path(self) -> str | None:
    """The local folder or file a PEFT export names as the base these weights are
    (`base_model_name_or_path`); None where there is none (a job's checkpoint)."""
    return None


@dataclasses.dataclass(frozen=True)
class PathSource(Source):
  """A source read from one local folder or file, `SCHEME:PATH` on the command line.

  Attributes:
    path: The folder or file (relative to the working directory).
    scheme: Its `--init_from` scheme, which `describe()` writes.
    holds: What `path` names, for the refusal of an empty one.
    folder_fix: What to give instead of a folder that is not there (`folder()`).
  """

  path: str
  scheme: ClassVar[str]
  holds: ClassVar[str]
  folder_fix: ClassVar[str] = "give the folder the source's writer made"

  def __post_init__(self):
    if not isinstance(self.path, str) or not self.path.strip():
      raise UsageError(f"path={self.path!r}: must name {self.holds}")

  def describe(self) -> str:
    return f"{self.scheme}:{self.path}"

  def base_model_path(self) -> str | None:
    return self.path

  def folder(self) -> epath.Path:
    """`path` as the folder it names (resolved against the working directory).

    Raises:
      UsageError: there is no such folder.
    """
    folder = paths.resolve(self.path, "train.init_from.path")
    if not folder.is_dir():
      raise UsageError(f"{self.scheme}:{self.path}: no such folder; {self.folder_fix}")
    return folder
