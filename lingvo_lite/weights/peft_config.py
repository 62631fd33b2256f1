"""What a PEFT folder's adapter_config.json says, read as `peft` reads it: which modules of the
base model have LoRA adapters, of what rank and scale (weights/peft.py reads the folder).

Which modules: peft's own rule (`peft.tuners.tuners_utils.check_target_module_exists`, peft
0.21), over the modules the family's Hugging Face names hold as matrices: `target_modules` as a
list (a module named in it, or whose name ends with `.` and one of its entries) or as a regular
expression (matched whole), "all-linear" (every matrix but the output layer); then
`exclude_modules`, and `layers_to_transform` (an index or a list) with `layers_pattern` (the
name of the list of layers; by default the first `NAME.N.` of the module's name), which apply
to modules matched by a suffix only, as in peft. Where `target_modules` is missing, the modules
the file holds adapters for.

Rank and scale: `r` and `lora_alpha`, or the entry of `rank_pattern` / `alpha_pattern` whose
key matches the module's name (`(.*\\.)?KEY$`, the first that does, as peft's
`get_pattern_key`); rsLoRA (`use_rslora`) scales by alpha / sqrt(r), read as alpha * sqrt(r) /
r. `train.lora` holds one rank and one alpha for every adapted matrix (models/lora.py), so
patterns are read where every adapted module gets the same rank and alpha, and refused naming
the key where they differ.

Refused in one line naming the key and the fix: DoRA (`use_dora`), `modules_to_save`, trained
biases, and the other LoRA variants peft writes (`_REFUSED`); a module these adapters cannot
hold (an embedding, a router, a fused tensor) that the config targets.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Collection, Mapping, Sequence

from lingvo_lite.errors import UsageError
from lingvo_lite.models import lora

# Merging into the base is what every variant these adapters lack can still become.
_MERGE = ("merge the adapters into the base with peft's merge_and_unload(), save it, and give "
          "that folder: --init_from=hf:FOLDER")
# Keys of a PEFT LoraConfig that, when set, ask for something these adapters do not do.
_REFUSED = (("use_dora", "DoRA (a magnitude per output channel)"),
            ("modules_to_save", "modules trained whole beside the adapters"),
            ("lora_bias", "trained biases"), ("layer_replication", "replicated layers"),
            ("target_parameters", "adapters of parameters (not modules)"),
            ("trainable_token_indices", "trained token embeddings"),
            ("alora_invocation_tokens", "activated LoRA"), ("use_qalora", "QA-LoRA"),
            ("use_bdlora", "block-diagonal LoRA"))


def check(values: Any, where: str) -> dict[str, Any]:
  """`values` (an adapter_config.json's), once it asks for LoRA and nothing these adapters do
  not do, its rank and alpha positive numbers.

  Raises:
    UsageError: one line naming the file (`where`), the key and the fix.
  """
  if not isinstance(values, dict) or values.get("peft_type") != "LORA":
    kind = values.get("peft_type") if isinstance(values, dict) else None
    raise UsageError(f"{where}: peft_type={kind!r}; lingvo_lite reads LoRA adapters "
                     "(peft_type 'LORA')")
  for key, what in _REFUSED:
    if values.get(key):
      raise UsageError(f"{where}: {key}={values[key]!r} asks for {what}, which lingvo_lite's "
                       f"LoRA does not implement; {_MERGE}")
  if values.get("bias", "none") != "none":
    raise UsageError(f"{where}: bias={values['bias']!r}: trained biases are not implemented "
                     f"here; {_MERGE}")
  for key in ("r", "lora_alpha"):
    if isinstance(values.get(key), bool) or not isinstance(values.get(key), (int, float)) or (
        values[key] <= 0):
      raise UsageError(f"{where}: {key}={values.get(key)!r}: must be a positive number")
  _check_types(values, where)
  return values


def _check_types(values: Mapping[str, Any], where: str) -> None:
  """Refuses a targeting key of a type peft does not write (so that matching cannot fail)."""
  expected = {"target_modules": (str, list), "exclude_modules": (str, list),
              "layers_to_transform": (int, list), "layers_pattern": (str, list),
              "rank_pattern": (dict,), "alpha_pattern": (dict,)}
  for key, types in expected.items():
    value = values.get(key)
    if value is None:
      continue
    entries = value if isinstance(value, list) else [value]
    entry = int if key == "layers_to_transform" else str
    if not isinstance(value, types) or (not isinstance(value, dict) and any(
        isinstance(item, bool) or not isinstance(item, entry) for item in entries)):
      raise UsageError(f"{where}: {key}={value!r}: peft writes "
                       f"{' or '.join(t.__name__ for t in types)} here; fix the file")
    try:
      for pattern in (value if isinstance(value, (list, dict)) else [value]):
        if key != "layers_to_transform":
          re.compile(pattern)
    except re.error as e:
      raise UsageError(f"{where}: {key}={value!r}: not a regular expression ({e}); fix the "
                       "file") from None


def targeted(values: Mapping[str, Any], module: str, linear: Sequence[str]) -> bool:
  """Whether peft adapts `module` (a module's name in the base model:
  `model.layers.0.self_attn.q_proj`) under `values`; `linear`: every matrix module of the base
  but its output layer (what "all-linear" names)."""
  exclude = values.get("exclude_modules")
  if exclude:
    if isinstance(exclude, str):
      if re.fullmatch(exclude, module):
        return False
    elif module in exclude or any(module.endswith(f".{key}") for key in exclude):
      return False
  target = values.get("target_modules")
  if isinstance(target, str) and target.lower() == "all-linear":
    target = list(linear)
  if isinstance(target, str):
    return re.fullmatch(target, module) is not None
  if module in target:  # Named whole: every layer's, whatever layers_to_transform says.
    return True
  if not any(module.endswith(f".{key}") for key in target):
    return False
  layers = values.get("layers_to_transform")
  if layers is None or layers == []:
    return True
  patterns = values.get("layers_pattern")
  patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
  match = None
  if not patterns:
    match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
  for pattern in patterns:
    match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module)
    if match is not None:
      break
  if match is None:
    return False
  index = int(match.group("idx"))
  return index == layers if isinstance(layers, int) else index in layers


def pattern_value(pattern: Mapping[str, Any], module: str, default: Any) -> Any:
  """The value `rank_pattern` or `alpha_pattern` gives `module` (peft's `get_pattern_key`:
  the first key matching the end of its name), else `default`."""
  for key, value in pattern.items():
    if re.match(rf"(.*\.)?({key})$", module):
      return value
  return default


@dataclasses.dataclass(frozen=True)
class AdapterPlan:
  """The adapters a PEFT folder gives one model.

  Attributes:
    kernels: PEFT module name -> our kernel it adapts (unrolled layout), in the model's order.
    rank: The adapters' rank (every module's).
    alpha: The scale's numerator, alpha / rank (rsLoRA's made plain).
    dropout: `lora_dropout`.
  """

  kernels: dict[str, str]
  rank: int
  alpha: float
  dropout: float

  def settings(self, num_layers: int) -> lora.LoraSettings:
    """train.lora for these adapters: their rank, alpha and dropout, and a `targets` regex
    naming exactly their kernels."""
    return lora.LoraSettings(rank=self.rank, alpha=self.alpha, dropout=self.dropout,
                             targets=_regex_of(self.kernels.values(), num_layers))


def plan(values: Mapping[str, Any], where: str, ours: Mapping[str, str | None],
         adaptable: Collection[str], held: Sequence[str], family: str) -> AdapterPlan:
  """The adapters `values` (a checked adapter_config.json) gives a model whose matrix modules
  are `ours` (PEFT module name -> our kernel, None for a tensor that fuses several: GPT-2's
  `c_attn`; the output layer `lm_head` last) and whose LoRA can adapt the kernels `adaptable`;
  `held`: the modules the folder's file holds adapters for.

  Raises:
    UsageError: a targeted module these adapters cannot hold, a config that targets nothing,
      or rank or alpha patterns that differ between the targeted modules (naming the key).
  """
  linear = [module for module, path in ours.items()
            if module != "lm_head" and path not in ("embedding", "position_embedding")]
  if values.get("target_modules") is None:
    chosen = [module for module in ours if module in held]
  else:
    chosen = [module for module in ours if targeted(values, module, linear)]
  if not chosen:
    raise UsageError(f"{where}: target_modules={values.get('target_modules')!r} adapts no "
                     f"module of this {family} model; give the base the adapters were made for "
                     "(base=...)")
  for module in chosen:
    if ours[module] is None or ours[module] not in adaptable:
      raise UsageError(f"{where}: the config adapts {module}, which lingvo_lite's LoRA does not "
                       f"adapt in a {family} model (it adapts the attention and MLP matrices and "
                       f"an untied output layer, each a tensor of its own); {_MERGE}")
  rank, alpha = values["r"], values["lora_alpha"]
  ranks = {module: pattern_value(values.get("rank_pattern") or {}, module, rank)
           for module in chosen}
  alphas = {module: pattern_value(values.get("alpha_pattern") or {}, module, alpha)
            for module in chosen}
  for key, found in (("rank_pattern", ranks), ("alpha_pattern", alphas)):
    if len(set(found.values())) > 1:
      first, other = chosen[0], next(m for m in chosen if found[m] != found[chosen[0]])
      raise UsageError(f"{where}: {key}={values[key]!r} gives {first} {found[first]} and "
                       f"{other} {found[other]}: train.lora holds one rank and one alpha for "
                       f"every adapted matrix; {_MERGE}")
  rank, alpha = next(iter(ranks.values())), next(iter(alphas.values()))
  key = "rank_pattern" if values.get("rank_pattern") else "r"
  if isinstance(rank, float) and rank.is_integer():
    rank = int(rank)
  if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
    raise UsageError(f"{where}: {key} gives rank {rank!r}: must be a positive integer")
  dropout = values.get("lora_dropout") or 0.0
  for key, value, low in (("alpha_pattern" if values.get("alpha_pattern") else "lora_alpha",
                           alpha, 0.0), ("lora_dropout", dropout, None)):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        value > 0 if low is not None else 0 <= value < 1):
      raise UsageError(f"{where}: {key} gives {value!r}: must be "
                       f"{'a positive number' if low is not None else 'in [0, 1)'}")
  alpha = float(alpha)
  if values.get("use_rslora"):
    alpha *= math.sqrt(rank)  # Its scale alpha / sqrt(r) is ours, alpha' / r.
  return AdapterPlan(kernels={module: ours[module] for module in chosen}, rank=rank,
                     alpha=alpha, dropout=float(dropout))


def _regex_of(paths: Any, num_layers: int) -> str:
  """A regex matching exactly these kernel paths: `(/attention/query_kernel|...)$` where
  every one of the `num_layers` layers has the same kernels (the regex then holds for any
  layer layout), else each path whole (`^(layer_0/attention/query_kernel|...)$`)."""
  paths = sorted(set(paths))
  by_layer: dict[str, set[str]] = {}
  rest = []
  for path in paths:
    match = re.fullmatch(r"layer_(\d+)/(.+)", path)
    if match:
      by_layer.setdefault(match.group(1), set()).add(match.group(2))
    else:
      rest.append(path)
  kinds = {frozenset(kernels) for kernels in by_layer.values()}
  if not rest and len(kinds) == 1 and len(by_layer) == num_layers:
    return "(" + "|".join(re.escape(f"/{kernel}") for kernel in sorted(next(iter(kinds)))) + ")$"
  return "^(" + "|".join(re.escape(path) for path in paths) + ")$"
