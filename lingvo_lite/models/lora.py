"""LoRA adapters (low-rank adaptation, Hu et al. 2021), placed at the weight matmul.

A weight matrix W [in..., out...] that `train.lora.targets` names gets two adapter matrices,
A [in..., rank] and B [rank, out...], and its matmul computes

  y = x W + (alpha / rank) * dropout(x) A B

where x W is the layer's own matmul, whatever it is (float, or "int8_weights"' int8 weight:
QLoRA), A starts random (Kaiming-uniform, as PEFT's `nn.Linear` default) and B at zero, so an
adapted model starts as its base. This is the arithmetic Qwix's `LoraProvider` adds; it is
placed here explicitly, at each weight matmul (`adapted`, called by `layers.Dense` and the
attention's projections right after `weight_matmul`), as models/quantization.py places int8
and for the same reason: the provider intercepts a module's calls and finds the weight among
its parameters, by shape where identity fails (q, k and v can share a shape), where each call
here knows its weight. Each adapted matrix therefore gets exactly one adapter, named after it:
the kernel `layer_0/attention/query_kernel` has `query_kernel_lora_a` and `_lora_b` beside it,
in a collection of their own, `lora`, so that the base parameters (`params`) and the adapters
are two trees: the train step differentiates the adapters alone (the base gets no gradient
and no optimizer state), a checkpoint holds only them, and applying the model without the
`lora` collection is the base (DPO's reference: the same model with adapters off, no copy).

`targets` is a regular expression searched (`re.search`) in each weight matrix's path, the
path of its parameter as a checkpoint names it (`layer_3/mlp/wi/kernel`; with
`model.scan_layers`, `layers/mlp/wi/kernel`, every layer alike). The matrices a model can adapt
are those whose matmul calls `adapted`: every family's attention projections and MLP matrices
(and an untied output projection, `output/kernel`); `adaptable_paths` lists them from shapes.
A regex that matches none of them is refused in one line naming them; so is one that matches
only parameters that are not weight matrices of this kind (the embedding, norms). A family
with mixture-of-experts weights would have to call `adapted` from its expert matmul for them
to be targets; none does (models/moe.py's experts and router have no adapters: the families'
attention and dense MLP layers do), and a regex naming only such weights is refused the same
way.

Dropout applies to the adapter's input only when the step gives a `dropout` random key (the
train step does; eval and decode do not).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Annotated, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lingvo_lite.errors import UsageError, config_error
from lingvo_lite import fields
from lingvo_lite.fields import NonEmpty, PositiveFloat, PositiveInt, Range
from lingvo_lite.models.layer_layout import flatten, unflatten
from lingvo_lite.models.weight_matmul import weight_matmul

COLLECTION = "lora"
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"
# Every attention projection and MLP matrix of the blocks (PEFT's "all-linear" for these
# families, less the output projection): what QLoRA's paper found best. Latent attention's
# (models/latent_attention.py) are its query (or query down and up), latent down
# (`kv_a`) and latent up (`kv_b`) projections and its output.
DEFAULT_TARGETS = (r"attention/(query|key|value|out|query_b|kv_b)_kernel"
                   r"|attention/(query_a|kv_a)/kernel|mlp/wi(_gate)?/kernel|mlp/wo/kernel")


@dataclasses.dataclass(frozen=True)
class LoraSettings:
  """LoRA's settings (`train.lora`): which weight matrices get adapters, and of what size.

  Attributes:
    rank: The adapters' inner width r.
    alpha: The update is scaled by alpha / rank (PEFT's `lora_alpha`).
    dropout: Dropout on the adapter's input during training (PEFT's `lora_dropout`).
    targets: A regular expression searched in each weight matrix's parameter path
      (`layer_0/attention/query_kernel`, `layer_0/mlp/wi/kernel`); every matrix it matches
      gets an adapter. The default: every attention projection and MLP matrix.
  """

  rank: PositiveInt = 8
  alpha: PositiveFloat = 16.0
  dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.0
  targets: Annotated[str, NonEmpty(
      "give a regular expression of the weight matrices to adapt, e.g. "
      "'attention/(query|value)_kernel', or leave it out for every attention projection and "
      "MLP matrix")] = DEFAULT_TARGETS

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def pattern(self, path: str = "train.lora") -> re.Pattern[str]:
    """`targets` compiled; UsageError naming the field when it is not a string, is empty or
    is no regular expression."""
    fields.check(f"{path}.targets", self.targets, fields.type_hints(LoraSettings)["targets"])
    try:
      return re.compile(self.targets)
    except re.error as e:
      raise config_error(f"{path}.targets", self.targets, f"is not a regular expression ({e})",
                         "escape special characters, e.g. 'mlp/wi\\\\b'") from None

  def targets_path(self, path: str) -> bool:
    return _compiled(self.targets).search(path) is not None


@functools.lru_cache(maxsize=64)
def _compiled(targets: str) -> re.Pattern[str]:
  return re.compile(targets)


def _kaiming_uniform(fan_in: int) -> nn.initializers.Initializer:
  """PEFT's lora_A init (torch's `kaiming_uniform_(a=sqrt(5))`): uniform in +-1/sqrt(fan_in)."""
  bound = 1.0 / math.sqrt(fan_in)
  return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


def _module_path(module: nn.Module) -> str:
  return "/".join(str(part) for part in module.path)


def adapted(module: nn.Module, kernel_name: str, x: jax.Array, y: jax.Array,
            kernel_shape: tuple[int, ...], kernel_axes: tuple[str | None, ...],
            contracting: int, settings: LoraSettings | None) -> jax.Array:
  """`y` = x W (the layer's matmul of x [..., in...] with its kernel `kernel_name` of
  `kernel_shape` and logical `kernel_axes`, contracting x's last `contracting` axes), plus the
  kernel's LoRA update where `settings` target it.

  The adapters live in the `lora` collection beside the kernel; the model applied without that
  collection (a base model, a reference) computes `y` alone.
  """
  if settings is None:
    return y
  path = f"{_module_path(module)}/{kernel_name}"
  if not settings.targets_path(path):
    return y
  if not module.is_initializing() and not module.has_variable(COLLECTION,
                                                              kernel_name + A_SUFFIX):
    return y  # Applied without adapters: the base model.
  inputs, outputs = kernel_shape[:contracting], kernel_shape[contracting:]
  in_axes, out_axes = kernel_axes[:contracting], kernel_axes[contracting:]
  param_dtype = jnp.float32
  a_init = nn.with_logical_partitioning(_kaiming_uniform(math.prod(inputs)),
                                        (*in_axes, None))
  b_init = nn.with_logical_partitioning(nn.initializers.zeros, (None, *out_axes))
  a = module.variable(COLLECTION, kernel_name + A_SUFFIX,
                      lambda: a_init(module.make_rng("params"), (*inputs, settings.rank),
                                     param_dtype)).value
  b = module.variable(COLLECTION, kernel_name + B_SUFFIX,
                      lambda: b_init(module.make_rng("params"), (settings.rank, *outputs),
                                     param_dtype)).value
  if settings.dropout and module.has_rng("dropout"):
    keep = jax.random.bernoulli(module.make_rng("dropout"), 1.0 - settings.dropout, x.shape)
    x = jnp.where(keep, x / jnp.asarray(1.0 - settings.dropout, x.dtype), jnp.zeros_like(x))
  low = weight_matmul(x, a.astype(x.dtype), contracting)
  update = weight_matmul(low, b.astype(x.dtype), 1)
  return y + (update * jnp.asarray(settings.scale, x.dtype)).astype(y.dtype)


# ------------------------------------------------------------------------------ trees


def kernel_paths(adapters: Any) -> list[str]:
  """The paths of the kernels `adapters` (a `lora` tree) adapt, sorted."""
  return sorted(path[:-len(A_SUFFIX)] for path in flatten(adapters) if path.endswith(A_SUFFIX))


def pairs(adapters: Any) -> dict[str, tuple[Any, Any]]:
  """kernel path -> (A, B) of a `lora` tree."""
  flat = flatten(adapters)
  return {path: (flat[path + A_SUFFIX], flat[path + B_SUFFIX]) for path in kernel_paths(adapters)}


def delta(a: Any, b: Any, scale: float, layers: bool = False) -> Any:
  """The kernel update scale * A B, [in..., out...] (A [in..., r], B [r, out...]); with
  `layers`, of scanned layers' stacked adapters (a leading layer axis on both)."""
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  product = jax.vmap(lambda x, y: jnp.tensordot(x, y, 1)) if layers else (
      lambda x, y: jnp.tensordot(x, y, 1))
  return scale * product(a, b)


def merge(params: Any, adapters: Any, scale: float) -> Any:
  """`params` with each adapted kernel replaced by W + scale * A B, in W's dtype: the model that
  computes what the adapted one does, with no adapter (an export, decoding)."""
  flat = flatten(params)
  for path, (a, b) in pairs(adapters).items():
    kernel = flat[path]
    layers = kernel.ndim == a.ndim + b.ndim - 3  # Both stacked on a leading layer axis.
    flat[path] = (jnp.asarray(kernel, jnp.float32) + delta(a, b, scale, layers)
                  ).astype(kernel.dtype)
  return unflatten(flat)


# ------------------------------------------------------------------------------ checks


@functools.lru_cache(maxsize=16)  # Every program validates; a 30-layer trace takes seconds.
def adaptable_paths(model: nn.Module, sequence_length: int) -> list[str]:
  """The weight matrices of `model` (a family instance without adapters) that LoRA can adapt:
  every kernel whose matmul calls `adapted`, found by initializing (shapes only) with a
  regex that matches everything."""
  probe = model.clone(lora=LoraSettings(rank=1, targets=""))
  shapes = jax.eval_shape(
      lambda key: probe.init(key, jnp.zeros((1, sequence_length), jnp.int32)),
      jax.random.key(0))
  return kernel_paths(shapes.get(COLLECTION, {}))


def adaptable_kernels(model: nn.Module) -> set[str]:
  """`adaptable_paths` of `model` with its layers unrolled (`layer_N/...`), traced over its
  `sample_layers` (the unrolled prefix and one period of its layers: layers of one variant
  have the same kernels), so that a deep model is not traced whole."""
  unrolled = model.clone(parent=None, scan_layers=False, lora=None)
  if not hasattr(unrolled, "sample_layers"):
    return set(adaptable_paths(unrolled, 1))
  count, stands_for = unrolled.sample_layers()
  sample = unrolled.clone(**unrolled.variant_fields(count))
  found = set()
  for path in adaptable_paths(sample, 1):
    match = re.fullmatch(r"layer_(\d+)/(.+)", path)
    if match is None:
      found.add(path)
      continue
    found.update(f"layer_{layer}/{match.group(2)}"
                 for layer in stands_for[int(match.group(1))])
  return found


def check_targets(settings: LoraSettings, model: nn.Module, sequence_length: int,
                  path: str = "train.lora") -> list[str]:
  """The kernel paths `settings.targets` adapts in `model`; UsageError (naming
  `path.targets`) when the regex is bad or adapts nothing."""
  pattern = settings.pattern(path)
  adaptable = list(adaptable_paths(model, sequence_length))
  chosen = [p for p in adaptable if pattern.search(p)]
  if chosen:
    return chosen
  if getattr(model, "scan_layers", False):
    # Adapters of some layers only (a PEFT folder's layers_to_transform) name unrolled layers.
    unrolled = [p for p in adaptable_paths(model.clone(scan_layers=False), sequence_length)
                if pattern.search(p)]
    if unrolled:
      raise config_error(f"{path}.targets", settings.targets,
                         f"names matrices of single layers ({', '.join(unrolled[:3])}), and "
                         "model.scan_layers=True adapts every layer alike",
                         "set --fdl.model.scan_layers=False")
  names = ["/".join(re.findall(r"\['([^']*)'\]", shape.path)) or shape.path
           for shape in model.parameter_shapes()]
  others = [name for name in names if pattern.search(name)]
  examples = sorted({re.sub(r"layer_\d+/", "layer_N/", p) for p in adaptable})
  why = (f"matches only parameters LoRA does not adapt ({', '.join(others[:3])}: it adapts "
         "the blocks' weight matrices, not embeddings, norms, biases or a mixture of "
         "experts' router and experts)" if others else
         "matches none of the model's weight matrices")
  raise config_error(f"{path}.targets", settings.targets, why,
                     f"name some of {', '.join(examples[:8])}"
                     + (" (and more)" if len(examples) > 8 else ""))


def adapter_count(adapters: Any) -> int:
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(adapters))


def refuse_direct_setting(model: Any) -> None:
  """A config that sets `model.lora` itself (the train program sets it from `train.lora`)."""
  if getattr(model, "lora", None) is not None:
    raise UsageError("model.lora: is set by the train program from train.lora; leave it None "
                     "and set train.lora (e.g. --fdl.train.lora=...) instead")


def adapter_shapes(model: nn.Module, settings: LoraSettings, sequence_length: int
                   ) -> list[tuple[str, tuple[str | None, ...], tuple[int, ...]]]:
  """(path, logical axes, shape) of every float32 adapter of `model` (a family instance
  without adapters) under `settings`, from shapes alone: what the memory verdict counts."""
  adapted = model.clone(lora=settings)
  boxed = jax.eval_shape(
      lambda key: adapted.init(key, jnp.zeros((1, sequence_length), jnp.int32)),
      jax.random.key(0)).get(COLLECTION, {})
  found = []
  for path, leaf in flatten(boxed).items():
    names = tuple(leaf.names) if isinstance(leaf, nn.LogicallyPartitioned) else (
        (None,) * len(leaf.shape))
    value = leaf.value if isinstance(leaf, nn.meta.AxisMetadata) else leaf
    found.append((path, names, tuple(value.shape)))
  return found
