"""The mixture-of-experts transformer's names in other formats: the dense kind's table with the
experts' rows (models/mixtral.py, qwen3_moe.py, gpt_oss.py change it where they differ), and
the base of their Hugging Face names.

Hugging Face's checkpoints store Mixtral's and Qwen3-MoE's experts one tensor per expert and
projection (`block_sparse_moe.experts.3.w1.weight`, `mlp.experts.3.gate_proj.weight`: what
`save_pretrained` writes, whatever transformers fuses in memory), each one row of our stacked
[experts, ...] parameters (`TensorName.expert`); gpt-oss stores them stacked, as we do. llama.cpp's
GGUF stacks them too (`blk.N.ffn_gate_exps.weight`: `GgufTensor.experts`).
"""

from __future__ import annotations

from typing import Any

from lingvo_lite.models import dense_names
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.config_rows import NUMBER, Fixed, Key, Rule
from lingvo_lite.models.tensor_rows import Tensor
from lingvo_lite.models.transformer_names import TransformerHfNames


def _no_jitter(config: HfConfig, found: dict[str, Any]) -> dict[str, Any]:
  """Router jitter (noise on the router's input in training) is refused: lingvo_lite's router
  adds none."""
  del found
  jitter = config.number("router_jitter_noise", 0.0)
  if jitter:
    raise config.refuse("router_jitter_noise", jitter, "lingvo_lite's router adds no noise",
                        "set it to 0.0")
  return {}


def no_jitter(written: bool = False) -> Rule:
  """The refusal of router jitter; `written`: export writes `router_jitter_noise` 0.0."""
  return Rule("router_jitter_noise", _no_jitter,
              (lambda model: {"router_jitter_noise": 0.0}) if written else lambda model: {})


# The dense kind's rows and the experts': how many, how many per token (llama.cpp's
# `expert_count`, `expert_used_count`), the balance loss's weight (its default is
# transformers'), no router jitter.
CONFIG = dense_names.CONFIG.changed(
    Key("num_experts", "num_local_experts", "expert_count"),
    Key("experts_per_token", "num_experts_per_tok", "expert_used_count"),
    Key("load_balance_coefficient", "router_aux_loss_coef", None, 0.001, NUMBER),
    no_jitter(),
    Fixed("output_router_logits", False, checked=False))


def experts(hf: str, gguf: str, projections: tuple[tuple[str, str, str], ...]
            ) -> tuple[Tensor, ...]:
  """Each expert's `nn.Linear` weights, one Hugging Face tensor per expert (`hf` with
  `{expert}`), projection by projection (so a GGUF reader meets each stacked tensor's experts
  in a row): (Hugging Face projection, our stacked parameter, llama.cpp's `ffn_*_exps`)."""
  return tuple(Tensor(f"layer_{{i}}/mlp/{ours}", hf.format(projection=projection, i="{i}",
                                                           expert="{expert}"),
                      f"{gguf}ffn_{theirs}_exps.weight")
               for projection, ours, theirs in projections)


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
