"""The checks of a `TransformerLM`'s fields that its field annotations cannot make (sizes that
must divide, the attention kernel the target runs: its row's refusal, models/attention_kernels;
the sequence its positions cover), the attention kernel its calls run (from the facts of its
calls that the kernels' rows read), and the changes that make it tiny. A mixin of
`TransformerLM` (models/transformer.py): the family interface's answers about checks and the
attention kernel (models/family.py), reading the transformer's fields.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn

from lingvo_lite import target as targets
from lingvo_lite.errors import config_error
from lingvo_lite.models import attention_kernels, remat

# The most layers a model traces one by one (`scan_layers=False`): each is traced, lowered and
# compiled as code of its own, and the time grows faster than the count (`--mode=compile` of
# PyCodeTiny for cpu:1 on this project's 2-core host: 64 layers 46 s, 256 layers 333 s), so a
# million never finished. The deepest published models have under 200 layers; a scanned stack
# traces one body whatever its depth.
MAX_UNROLLED_LAYERS = 1024


class TransformerChecks:
  """`validate`, `check_sequence_length`, the attention kernel (`attention_choice`) and `tiny`
  of a `TransformerLM` (its fields are read; none is declared here)."""

  @nn.nowrap
  def validate(self, target: targets.Target, path: str = "model") -> None:
    self.check_size(path)
    if not self.scan_layers and self.num_layers > MAX_UNROLLED_LAYERS:
      raise config_error(f"{path}.num_layers", self.num_layers,
                         f"unrolled ({path}.scan_layers=False): more than "
                         f"{MAX_UNROLLED_LAYERS} layers traced one by one take hours to "
                         "compile", f"set {path}.scan_layers=True or use fewer layers")
    if self.head_dim is None and self.dim % self.num_heads:
      raise config_error(f"{path}.num_heads", self.num_heads,
                         f"does not divide {path}.dim={self.dim}",
                         f"choose a divisor of dim or set {path}.head_dim")
    if self.num_heads % self.resolved_num_kv_heads:
      raise config_error(f"{path}.num_kv_heads", self.num_kv_heads,
                         f"does not divide {path}.num_heads={self.num_heads}",
                         "grouped-query attention needs num_heads % num_kv_heads == 0")
    refused = attention_kernels.refusal(self.attention_implementation,
                                        self.attention_call(target, path))
    if refused:
      raise config_error(f"{path}.attention_implementation", self.attention_implementation,
                         *refused)
    if remat.offloads(self.remat_policy) and target.platform == "cpu":
      raise config_error(f"{path}.remat_policy", self.remat_policy,
                         "moves activations to host memory, which a CPU target does not have "
                         "apart from its own", "use a policy without '_offloaded' on a CPU")
    self.check_quantization(path)
    rotary_dim = self.resolved_rotary_dim
    if rotary_dim % 2 or rotary_dim > self.resolved_head_dim:
      raise config_error(f"{path}.rotary_dim", self.rotary_dim,
                         f"must be even and at most head_dim={self.resolved_head_dim}")
    self._check_layer_kinds(path)

  @nn.nowrap
  def attention_call(self, target: targets.Target | None = None, path: str = "model"
                     ) -> attention_kernels.Call:
    """The facts of this model's attention calls on `target` (the active one by default) that
    the kernels' rules read: the device (read on a GPU, or for a target's check), the dtype,
    the head width, and the masks every call holds (a window, the sinks); `path` names the
    model in a refusal."""
    platform = target.platform if target is not None else targets.current_platform()
    device = None
    if target is not None or platform == "gpu":
      devices = (target or targets.current()).devices
      device = devices[0] if devices else None
    attention_type, _ = self.attention_module()
    windowed = any(self.kind_fields(kind)["window"] is not None
                   for kind in self.kinds_used())
    masks = {"window"} if windowed else set()
    if attention_type.has_sinks():
      masks.add("sinks")
    return attention_kernels.Call(
        platform=platform, device_kind=getattr(device, "device_kind", ""),
        compute_capability=str(getattr(device, "compute_capability", "0")), dtype=self.dtype,
        head_dim=self.resolved_head_dim, masks=frozenset(masks), path=path)

  @nn.nowrap
  def attention_choice(self) -> attention_kernels.Choice:
    return attention_kernels.choose(self.attention_implementation, self.attention_call())

  @nn.nowrap
  def _check_layer_kinds(self, path: str) -> None:
    """A pattern of kinds, and a window where a layer slides (configs are range-checked
    before; a model built by hand is not)."""
    if not self.layer_kinds:
      raise config_error(f"{path}.layer_kinds", self.layer_kinds, "names no attention kind",
                         "give at least one of 'full', 'sliding', 'no_rotary'")
    if self.window is not None and self.window < 1:
      raise config_error(f"{path}.window", self.window, "must be at least 1",
                         "a token must see itself")
    if "sliding" in self.layer_kinds[:self.num_layers] and self.window is None:
      raise config_error(f"{path}.window", None, "a layer of layer_kinds slides but the "
                         "window is not set", f"set {path}.window or drop 'sliding'")

  @nn.nowrap
  def check_sequence_length(self, path: str, sequence_length: int) -> None:
    if self.position == "learned" and sequence_length > self.max_length:
      raise config_error(path, sequence_length,
                         f"exceeds model.max_length={self.max_length} of learned positions")

  @classmethod
  def tiny(cls, fields: Mapping[str, Any], sequence_length: int) -> dict[str, Any]:
    """2 layers, width 64, 4 heads of derived width (of 32 where the model's head width is
    not its width over its heads, which stays so), at most 2 key/value heads, the rotated
    fraction of each head kept, float32, and a context of at least 64 positions. A sliding
    window shrinks to a quarter of the sequence (shorter than it, so that the band still cuts
    off what a full causal mask would see); a pattern of several attention kinds becomes each
    kind once, over one layer more than that (a scanned stack then has a group and a layer
    left over)."""
    old_head_dim = fields.get("head_dim") or fields["dim"] // fields["num_heads"]
    independent = old_head_dim != fields["dim"] // fields["num_heads"]
    changes = {"num_layers": 2, "dim": 64, "num_heads": 4,
               "head_dim": 32 if independent else None, "mlp_dim": None,
               "dtype": "float32", "param_dtype": "float32",
               "max_length": max(sequence_length, 64)}
    if fields.get("window") is not None:
      changes["window"] = max(1, min(fields["window"], sequence_length // 4))
    kinds = tuple(dict.fromkeys(fields.get("layer_kinds") or ("full",)))
    if len(kinds) > 1:
      changes.update(layer_kinds=kinds, num_layers=len(kinds) + 1)
    if fields.get("num_kv_heads") is not None:
      changes["num_kv_heads"] = min(fields["num_kv_heads"], 2)
    if fields.get("rotary_dim") is not None:
      # Keep the rotated fraction of each head (GPT-J rotates 64 of 256 dims).
      changes["rotary_dim"] = min(16, max(2, 16 * fields["rotary_dim"] // old_head_dim // 2 * 2))
    return changes
