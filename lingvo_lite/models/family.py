"""The model-family interface: what the rest of lingvo_lite may ask of a model, and nothing more.

A family (GPT-J, Llama, GPT-2, ...) is one module in `lingvo_lite/models/` holding one Flax
module class that inherits `LanguageModel` (usually through `transformer.TransformerLM`, whose
blocks it shares) and answers every question below about itself. Programs, the memory check,
MFU, `--fiddler=tiny`, `Setup.validate()`, the partitioner, the config files, decode and the
AOT compiler ask these methods and never name a family, so adding one touches no file outside
its own module, its experiment and its tests.

What a family provides (a `TransformerLM` subclass gets all of it; it overrides what differs):

- Fields, as its dataclass fields: `vocab_size`, `num_layers`, `dim`, `max_length` (the context
  a request may reach when decoding), `dtype`, `param_dtype`, `scan_layers`, `remat_policy`
  (one of `models/remat.py`'s `POLICIES`) and `attention_implementation` ("auto" or a row of
  `models/attention_kernels`). Programs read these by name; every other field is the family's.
- Sizes: `num_parameters()`, `parameter_shapes()` (every parameter's path, logical axes, shape,
  dtype, from shapes alone), `matmul_parameters()` and `size_fields()` (`check_size()` is
  shared).
- FLOPs: `attention_flops_per_token(T)`, the forward attention FLOPs per token of a training
  sequence of T tokens (a causal transformer counts half of the T x T scores; a sliding-window
  family counts only the positions inside its window), and `decode_attention_flops(context)`,
  one new token's; `train_flops_per_token(T)` and `decode_flops_per_token(context)` add them to
  the weight matmuls (`matmul_parameters()`). MFU (mfu.py) and the compile report use these.
- Axes: `logical_axes()`, each logical axis name of its parameters -> the field that sizes it
  (a name the partitioner's default rules do not map needs a rule in `partitioner.rules`).
- Training's forward pass: `logits_and_losses(params, tokens, segment_ids, positions,
  adapters, rngs)`, the
  logits with an auxiliary objective that training adds to the mean token loss and the
  statistics logged beside it (a mixture of experts' load balance and router z-loss, each
  expert's share of the tokens: models/moe_transformer.py); by default none. `after_step`:
  what a train step does to the parameters after the optimizer (DeepSeek's selection bias).
- Checks: `validate(target)` raises `UsageError` with one line naming `model.<field>`, the value
  and the fix; `check_sequence_length(path, length)` refuses data longer than the model takes.
- LoRA (models/lora.py): `with_adapters(settings)`, the model whose weight matmuls add the
  adapters of its `lora` variables.
- Quantization (models/quantization.py): a `quantization` field, the settings it implements in
  `quantizations` (`check_quantization` refuses others, and "int8_weights" in a training
  step), and `int8_weight_contractions()`, its weight matrices by logical axes, from which
  `decode_params(params, specs)` quantizes the weights once for decoding.
- `tiny(fields, sequence_length)`: a classmethod returning the field changes that shrink the
  model to run in seconds on one CPU (models never import Fiddle; `config/fiddlers.py` applies
  them). `resumable_fields`: the fields a resumed run may change (derived from the fields'
  `run_fields.Run` marks).
- Decoding: `for_decoding(platform)`, the model the decode functions run (another layer
  layout where that is faster); `decode_params`, the parameters' form there.
- Memory: `attention_scores_shape(rows, length)` and `holds_attention_scores`; the attention
  that runs, `attention_choice()` (its kernel, "auto" resolved on the active target, and why).
- Checkpoint layout: `layout_metadata()`, `in_saved_layout(metadata)`, `to_own_layout(tree)`.
- Names: `family_name` (registers the class in `FAMILIES` when its module is imported; each
  family sets its own), `same_model_as` (the classes whose configs build this very model: the
  three families name `TransformerLM`, which older jobs' config.json files name; a family with
  computation of its own names none).
- Other weight formats: not here. A family's module registers its names in a format that
  stores models by name (models/format_names.py: `HfNames`, `GgufNames`; for a transformer,
  the rows of its kind's tables it changes, models/transformer_names.py) beside its class;
  the weight formats (lingvo_lite/weights/) ask for them, and a family without them has no such
  format.

`tests/models/test_family.py` imports every module of this package and runs each registered
family through the interface, so a new family's module is covered there without an edit.

The decode cache: decode code (`lingvo_lite/decode/`) holds it as an opaque pytree and changes
it only through the family's `empty_cache`, `cache_logical_specs`, `cache_shapes` /
`cache_bytes`, `prefill` and `extend` (each method's docstring is its contract); docs/DESIGN.md
("The decode cache, and how to give a family another one") says how `TransformerLM` implements
them and how a family with another cache overrides the attention's hooks.

Longer than 300 lines with a reason: it is the whole interface a family implements, with the
contract of each method beside it; the docstrings are most of its length.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from typing import Any, Callable, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from lingvo_lite import run_fields
from lingvo_lite.errors import config_error
from lingvo_lite.models import attention_kernels, lora as lora_lib
from lingvo_lite.models import quantization as quantizing

# No machine holds the training state of more parameters: 1e14 float32 parameters with their
# Adam moments and gradients are 1.6 PB, twice the memory of the largest TPU pods.
MAX_PARAMETERS = 1e14

# Every family that has registered itself (by importing its module), by `family_name`.
FAMILIES: dict[str, type[LanguageModel]] = {}


def import_every_family() -> None:
  """Imports each module of lingvo_lite/models/ (each family registers itself when imported):
  a weight file's reader asks every family, not only those the config imported."""
  for module in pkgutil.iter_modules(importlib.import_module("lingvo_lite.models").__path__):
    importlib.import_module(f"lingvo_lite.models.{module.name}")


# Elements of one device's shard of an array of `shape` with logical `axes`, as memory_fit
# counts them under the partitioner's rules.
Sharder = Callable[[tuple[int, ...], tuple[str | None, ...]], int]


@dataclasses.dataclass(frozen=True)
class ArrayShape:
  """One array of a model (a parameter, or a decode cache's keys), as shapes only.

  Attributes:
    path: Where it lives in its tree, as `jax.tree_util.keystr` writes it.
    axes: Logical axis name of each dimension (None for unnamed).
    shape: Its full shape.
    dtype: Its dtype.
    repeats: How many arrays of this path and shape there are (one per layer for a parameter
      of an unrolled layer).
  """

  path: str
  axes: tuple[str | None, ...]
  shape: tuple[int, ...]
  dtype: jnp.dtype
  repeats: int = 1


class LanguageModel(nn.Module):
  """Base class of every model family: tokens [batch, length] -> float32 logits.

  The methods below raise NotImplementedError where a family must answer; see the module doc
  for what each means and how `TransformerLM` answers it.
  """

  family_name: ClassVar[str | None] = None
  # Import paths of config classes that, field for field, build this very model (the class a
  # family's fields came from): a job written with one resumes and evaluates with the other.
  same_model_as: ClassVar[tuple[str, ...]] = ()
  # Fields a resumed run may change: they leave the parameters and what they compute as they
  # are (how layers are laid out, rematerialized, or attention executed): those marked
  # `run_fields.Run(resumable=True)` on their annotation.
  resumable_fields: ClassVar[tuple[str, ...]] = run_fields.Marked(resumable=True)
  # The settings of its `quantization` field it implements (models/quantization.py): none
  # for a family without the field.
  quantizations: ClassVar[tuple[str, ...]] = ()
  # The collections its layers sow statistics into in a forward pass (a mixture of experts'
  # routing), which `logits_and_losses` keeps for `auxiliary_and_statistics`.
  sown_collections: ClassVar[tuple[str, ...]] = ()

  @classmethod
  def former_defaults(cls, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The fields whose default changed since a config.json was written, with the default
    they had then, for a model config that sets `arguments`: config/files.py gives an older
    file's model each one it does not set, so an older job keeps computing what it trained
    to compute."""
    del arguments
    return {}

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if cls.__dict__.get("family_name"):
      FAMILIES[cls.family_name] = cls

  # ---------------------------------------------------------------------------- sizes

  @nn.nowrap
  def num_parameters(self) -> int:
    """The parameter count, from the sizes alone (nothing traced)."""
    raise NotImplementedError

  @nn.nowrap
  def parameter_shapes(self) -> list[ArrayShape]:
    """Every parameter's path, logical axes, full shape and dtype, without allocating any."""
    raise NotImplementedError

  @nn.nowrap
  def parameter_logical_specs(self) -> Any:
    """The parameter tree's logical axes (a PartitionSpec of axis names per parameter), from
    shapes alone."""
    boxed = jax.eval_shape(lambda: self.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
    return nn.get_partition_spec(boxed["params"])

  @nn.nowrap
  def matmul_parameters(self) -> int:
    """Weights that multiply activations once per token (biases, norms and lookups excluded;
    a tied unembedding included)."""
    raise NotImplementedError

  @nn.nowrap
  def block_matmul_parameters(self) -> int:
    """The share of `matmul_parameters` in the blocks (without the unembedding): the weights
    "int8" training multiplies in int8 (the compile report's int8 step time)."""
    raise NotImplementedError

  @nn.nowrap
  def size_fields(self) -> dict[str, int]:
    """The fields that size the parameters, by name, for naming the one that makes a model
    too large."""
    raise NotImplementedError

  @nn.nowrap
  def check_size(self, path: str = "model") -> None:
    """Refuses a model too large for any machine, counted from its sizes (nothing traced),
    naming its largest size field."""
    count = self.num_parameters()
    if count <= MAX_PARAMETERS:
      return
    sizes = self.size_fields()
    largest = max(sizes, key=sizes.get)
    raise config_error(f"{path}.{largest}", sizes[largest],
                       f"makes {count:.3g} parameters, more than any machine holds "
                       f"({MAX_PARAMETERS:.0e})", "use smaller model sizes")

  # ---------------------------------------------------------------------------- FLOPs

  @nn.nowrap
  def attention_flops_per_token(self, sequence_length: int) -> int | float:
    """Forward FLOPs of attention scores and weighted values per token of a training sequence
    (the matmuls against activations that `matmul_parameters` leaves out)."""
    raise NotImplementedError

  @nn.nowrap
  def decode_attention_flops(self, context_length: int) -> int | float:
    """Forward FLOPs of attention for one new token that sees `context_length` positions
    (itself included)."""
    raise NotImplementedError

  @nn.nowrap
  def train_flops_per_token(self, sequence_length: int) -> float:
    """Model FLOPs per trained token: forward and backward of every weight matmul (6 per
    weight) and of attention (3 times its forward)."""
    return 6.0 * self.matmul_parameters() + 3 * self.attention_flops_per_token(sequence_length)

  @nn.nowrap
  def decode_flops_per_token(self, context_length: int) -> float:
    """Model FLOPs of one decoded token at a context of `context_length` positions: the
    forward of every weight matmul (2 per weight) and of its attention."""
    return 2.0 * self.matmul_parameters() + self.decode_attention_flops(context_length)

  # ---------------------------------------------------------------------------- objective

  @nn.nowrap
  def logits_and_losses(self, params: Any, tokens: jax.Array,
                        segment_ids: jax.Array | None = None,
                        positions: jax.Array | None = None, adapters: Any = None,
                        rngs: dict[str, jax.Array] | None = None, multi_token: bool = False
                        ) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """Training's and evaluation's forward pass: (the logits, the auxiliary objective a
    training step adds to its mean token loss, already weighted by the family's coefficients
    (a float32 scalar), the scalar statistics to log beside the loss by name). By default
    the plain logits, no auxiliary objective and nothing to log. `adapters`: a LoRA model's
    adapters over `params` (models/lora.py); `rngs`: their dropout's keys. A family whose
    layers sow statistics names their collections (`sown_collections`) and reads them
    (`auxiliary_and_statistics`). `multi_token`: the logits are (the logits, the multi-token
    modules' [depths, ...]: models/multi_token.py)."""
    variables = self.variables_of(params, adapters)
    options = {"multi_token": True} if multi_token else {}
    if not self.sown_collections:
      logits = self.apply(variables, tokens, segment_ids, positions, rngs=rngs, **options)
      return logits, *self.auxiliary_and_statistics({})
    logits, sown = self.apply(variables, tokens, segment_ids, positions, rngs=rngs,
                              mutable=list(self.sown_collections), **options)
    return logits, *self.auxiliary_and_statistics(sown)

  @nn.nowrap
  def auxiliary_and_statistics(self, sown: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(the auxiliary objective, the statistics by name) from what the forward pass sowed
    into `sown_collections`: none and nothing by default."""
    del sown
    return jnp.zeros((), jnp.float32), {}

  @nn.nowrap
  def after_step(self, before: Any, params: Any, loads: Any) -> Any:
    """A train step's final parameters from its first (`before`), the optimizer's update
    (`params`) and the step's `loads` (models/expert_balance.py): by default `params`."""
    del before, loads
    return params

  @staticmethod
  def variables_of(params: Any, adapters: Any = None) -> dict[str, Any]:
    """The variables `apply` takes: the parameters, and a LoRA model's adapters beside them."""
    if adapters is None:
      return {"params": params}
    return {"params": params, lora_lib.COLLECTION: adapters}

  # ---------------------------------------------------------------------------- axes, checks

  @classmethod
  def logical_axes(cls) -> dict[str, str]:
    """Each logical axis name the parameters use -> the field that sizes it."""
    raise NotImplementedError

  @nn.nowrap
  def validate(self, target: Any, path: str = "model") -> None:
    """Raises UsageError (one line: `path.field=value: problem; fix`) for the first field or
    combination of fields this family cannot run with on `target` (a `lingvo_lite.target.
    Target`). Each field's own range is checked from its annotation before this."""
    raise NotImplementedError

  @nn.nowrap
  def check_sequence_length(self, path: str, sequence_length: int) -> None:
    """Raises UsageError naming `path` where data of `sequence_length` tokens is longer than
    the model takes (positions it has no parameters for); by default any length goes."""
    del path, sequence_length

  @classmethod
  def tiny(cls, fields: Mapping[str, Any], sequence_length: int) -> dict[str, Any]:
    """The field changes that shrink a model of these `fields` (its config's values, defaults
    included) to run in seconds on one CPU with data of `sequence_length` tokens."""
    raise NotImplementedError

  @nn.nowrap
  def check_quantization(self, path: str = "model", training: bool = False) -> None:
    """Refuses a `quantization` the family does not implement, and, for a training step
    (`training`), one that cannot train ("int8_weights": rounded weights have no gradient)."""
    setting = getattr(self, "quantization", None)
    if setting is None:
      return
    if setting not in self.quantizations:
      implemented = ", ".join(map(repr, self.quantizations)) or "none"
      raise config_error(f"{path}.quantization", setting,
                         f"the {self.family_name or type(self).__name__} family implements "
                         f"{implemented}", "use one of those or None")
    if training and setting not in quantizing.TRAINABLE:
      raise config_error(f"{path}.quantization", setting,
                         "quantizes weights for decoding and serving; a training step cannot "
                         "take it", "train with 'int8' or None")

  # ---------------------------------------------------------------------------- LoRA

  @nn.nowrap
  def with_adapters(self, settings: Any) -> LanguageModel:
    """This model with LoRA adapters (models/lora.py: `settings` is a `LoraSettings`) on the
    weight matrices they target: adapters in the `lora` collection, added at each weight
    matmul; without that collection the model computes as this one."""
    raise config_error("train.lora", settings, f"the {self.family_name or type(self).__name__} "
                       "family has no LoRA adapters", "set train.lora=None")

  # ---------------------------------------------------------------------------- int8 weights

  @classmethod
  def int8_weight_contractions(cls) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Its weight matrices under "int8_weights": each one's logical axes -> the axes its
    matmul contracts (every other axis gets a scale per index)."""
    return {}

  @nn.nowrap
  def for_decoding(self, platform: str) -> LanguageModel:
    """The model the decode functions run on `platform`: this one, or the same function in
    another layer layout (whose parameters `to_own_layout` makes from this one's, once, when
    they are loaded)."""
    del platform
    return self

  @nn.nowrap
  def decode_params(self, params: Any, logical_specs: Any) -> Any:
    """The parameters as decoding multiplies them: under "int8_weights" every weight matrix
    as int8 values and scales (done once, when they are loaded), else as they are.
    `logical_specs`: their logical axes (PartitionSpecs of axis names)."""
    if getattr(self, "quantization", None) != "int8_weights":
      return params
    return quantizing.quantize_weights(params, logical_specs, self.int8_weight_contractions())

  @nn.nowrap
  def decode_param_specs(self, logical_specs: Any) -> Any:
    """The logical axes of `decode_params`' output."""
    if getattr(self, "quantization", None) != "int8_weights":
      return logical_specs
    return quantizing.quantized_specs(logical_specs, self.int8_weight_contractions())

  # ---------------------------------------------------------------------------- memory

  @nn.nowrap
  def attention_choice(self) -> attention_kernels.Choice:
    """The attention kernel the model's training calls run on the active target: the row
    `attention_implementation` names or "auto" picks, and why (models/attention_kernels)."""
    raise NotImplementedError

  @property
  def holds_attention_scores(self) -> bool:
    """Whether training materializes `attention_scores_shape` (its kernel's row says)."""
    return self.attention_choice().runs.holds_scores

  @nn.nowrap
  def resolved_attention_implementation(self) -> str:
    """What `attention_implementation` runs as on the active target ("auto" resolved)."""
    return self.attention_choice().name

  @nn.nowrap
  def attention_scores_shape(self, rows: int, length: int
                             ) -> tuple[tuple[int, ...], tuple[str | None, ...]]:
    """(shape, logical axes) of one layer's float32 attention scores for `rows` sequences of
    `length` tokens, as the written-out attention holds them."""
    raise NotImplementedError

  # ---------------------------------------------------------------------------- layout

  @nn.nowrap
  def layout_metadata(self) -> dict[str, Any]:
    """What a checkpoint records about how its parameter tree is laid out."""
    return {}

  @nn.nowrap
  def in_saved_layout(self, metadata: Mapping[str, Any]) -> LanguageModel | None:
    """This model as a checkpoint with `metadata` was written (its tree's shapes), or None
    where that is this model's own layout (or the metadata does not say)."""
    del metadata
    return None

  @nn.nowrap
  def to_own_layout(self, tree: Any) -> Any:
    """A host tree (parameters, or a whole train state) restored in the layout of
    `in_saved_layout(...)`, converted to this model's."""
    return tree

  # ---------------------------------------------------------------------------- decode cache

  @nn.nowrap
  def empty_cache(self, slots: int, cache_length: int) -> Any:
    raise NotImplementedError

  @nn.nowrap
  def cache_logical_specs(self) -> Any:
    raise NotImplementedError

  @nn.nowrap
  def cache_shapes(self, slots: int, cache_length: int) -> list[ArrayShape]:
    raise NotImplementedError

  @nn.nowrap
  def cache_bytes(self, slots: int, cache_length: int, shard: Sharder | None = None) -> int:
    """Bytes of the decode cache: the whole, or with `shard`, one device's shard of it."""
    shard = shard or (lambda shape, axes: math.prod(shape))
    return sum(array.repeats * shard(array.shape, array.axes) * jnp.dtype(array.dtype).itemsize
               for array in self.cache_shapes(slots, cache_length))

  @nn.nowrap
  def prefill(self, params: Any, tokens: jax.Array, lengths: jax.Array, cache: Any,
              insert: jax.Array) -> tuple[jax.Array, Any]:
    raise NotImplementedError

  @nn.nowrap
  def extend(self, params: Any, tokens: jax.Array, positions: jax.Array, cache: Any
             ) -> tuple[jax.Array, Any]:
    raise NotImplementedError
