"""What the mixture-of-experts families (models/mixtral.py, qwen3_moe.py, gpt_oss.py) share in
other weight formats: the bases of their names classes and the experts' tensor names.

Hugging Face's checkpoints store Mixtral's and Qwen3-MoE's experts one tensor per expert and
projection (`block_sparse_moe.experts.3.w1.weight`, `mlp.experts.3.gate_proj.weight`: what
`save_pretrained` writes, whatever transformers fuses in memory), each one row of our stacked
[experts, ...] parameters (`TensorName.expert`); gpt-oss stores them stacked, as we do. llama.cpp's
GGUF stacks them too (`blk.N.ffn_gate_exps.weight`: `GgufTensor.experts`).
"""

from __future__ import annotations

from typing import Any, Sequence

from lingvo_lite.models.checkpoint_names import HfConfig, TensorName
from lingvo_lite.models.transformer_names import TransformerHfNames


class MoeHfNames(TransformerHfNames):
  """A mixture-of-experts family's Hugging Face names: the transformer's, with the
  feed-forward kinds compared layer by layer."""

  def expressed(self) -> dict[str, Any]:
    model = self.model
    found = super().expressed()
    found.update(mlp_kinds=model.mlp_kinds_by_layer(),
                 expert_mlp_dim=model.resolved_expert_mlp_dim)
    if "moe" not in model.mlp_kinds_by_layer():  # Then no expert's setting is in the model.
      found = {k: v for k, v in found.items() if k in ("mlp_kinds", "mlp_dim") or k not in
               {"num_experts", "experts_per_token", "expert_mlp_dim"}}
    if "dense" not in model.mlp_kinds_by_layer():
      found.pop("mlp_dim", None)  # No dense layer: no width of one to compare.
    return found


def router_aux_loss(config: HfConfig) -> dict[str, Any]:
  """The balance loss's coefficient (`router_aux_loss_coef`), and a refusal of router jitter
  (noise on the router's input in training), which lingvo_lite does not add."""
  jitter = config.number("router_jitter_noise", 0.0)
  if jitter:
    raise config.refuse("router_jitter_noise", jitter, "lingvo_lite's router adds no noise",
                        "set it to 0.0")
  return {"load_balance_coefficient": config.number("router_aux_loss_coef", 0.001)}


def per_expert(hf: str, ours: str, experts: int, projections: Sequence[tuple[str, str]]
               ) -> list[TensorName]:
  """Each expert's `nn.Linear` weights, stored one tensor per expert: `hf`{e}.{name}.weight
  for each (Hugging Face name, our stacked parameter) of `projections`, projection by
  projection (so a GGUF reader meets each stacked tensor's experts in a row)."""
  names = []
  for projection, parameter in projections:
    input_axes = 1
    names += [TensorName(f"{hf}{expert}.{projection}.weight", (f"{ours}{parameter}",),
                         input_axes, expert=expert) for expert in range(experts)]
  return names
