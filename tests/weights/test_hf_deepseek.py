"""DeepSeek-V3 and DeepSeek-V2 against transformers' own: tiny random `DeepseekV3ForCausalLM`
(a query bottleneck, YaRN with DeepSeek's mscale and mscale_all_dim, values narrower than the
keys, a dense layer then experts in groups with a selection bias) and `DeepseekV2ForCausalLM`
(V2-Lite's full query projection, values wider than the keys, softmax routing over groups;
once more, every layer dense, with attention and MLP biases) built from configs (offline),
every norm and bias moved off its initial value, written by `save_pretrained`:

- our import computes transformers' float32 logits within 1e-4 on two batch shapes, with
  unrolled and scanned layers;
- the export writes the same tensors back bit for bit and `from_pretrained` of it computes the
  same logits;
- a GGUF export (llama.cpp's deepseek2) reads back as the same family with the same
  parameters;
- 32 greedy tokens through `--mode=decode` (the absorbed decode over the latent cache) equal
  transformers' `generate`;
- the routing of each is read (V3's sigmoid over groups with its selection bias, moved off
  zero here; V2's softmax over groups), and one it does not compute is one line.
"""

import json

import jax
import numpy as np
import pytest
from etils import epath

from lingvo_lite.errors import UsageError
from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.models.checkpoint_names import HfConfig
from lingvo_lite.models.deepseek_v3 import DeepSeekV3, DeepSeekV3HfNames
from lingvo_lite.models.format_names import GgufNames, bound as names_of_gguf
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.weights import gguf_export, hf_export
from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint, names_of
from tests.weights import hf_reference
from tests.weights.hf_reference import (assert_close as _assert_close, our_logits as _ours,
                                        their_logits as _theirs)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)  # As test_hf_dense_families.py: tiny models, one thread each.

VOCAB = 320  # At least PyCodeTiny's 259 (decode runs it with these folders).
SHAPES = {"long": (1, 120), "batch": (3, 40)}
_LATENT = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
               intermediate_size=96, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
               max_position_embeddings=1024)
# One dense layer, then two of 8 experts in 4 groups (2 per token from 2 groups), 2 shared.
_EXPERTS = dict(num_hidden_layers=3, first_k_dense_replace=1, moe_intermediate_size=24,
                n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, n_group=4,
                topk_group=2)
CASES = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        _LATENT, **_EXPERTS, q_lora_rank=24, v_head_dim=12, routed_scaling_factor=2.5,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
            "original_max_position_embeddings": 256, "mscale": 0.8, "mscale_all_dim": 0.8})),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        _LATENT, **_EXPERTS, q_lora_rank=None, v_head_dim=40, routed_scaling_factor=1.5,
        topk_method="group_limited_greedy",
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0})),
    # Every layer dense, with biases on the latent's and the query's down projections, the
    # output and the MLP.
    "deepseek_v2_biased": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        _LATENT, num_hidden_layers=2, first_k_dense_replace=2, q_lora_rank=24, v_head_dim=12,
        attention_bias=True, mlp_bias=True)),
}
FAMILIES = ("deepseek_v2", "deepseek_v3")


def _reference_model(case: str):
  model = hf_reference.reference_model(CASES[case], VOCAB, bos_token_id=0, eos_token_id=1,
                                       pad_token_id=0)
  # V3's selection bias is a buffer, not a parameter: moved off zero here (it chooses the
  # experts and groups, and never weighs them).
  generator = torch.Generator().manual_seed(2)
  with torch.no_grad():
    for name, buffer in model.named_buffers():
      if name.endswith("e_score_correction_bias"):
        buffer.add_(0.3 * torch.randn(buffer.shape, generator=generator))
  return model


def _tokens(shape_name: str) -> np.ndarray:
  return np.random.default_rng(0).integers(0, VOCAB, SHAPES[shape_name])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """case -> (its folder, {shape: transformers' float32 logits})."""
  return hf_reference.saved(tmp_path_factory.mktemp("hf"), CASES, _reference_model,
                            lambda case, model: {shape: _theirs(model, _tokens(shape))
                                                 for shape in SHAPES})


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers(folders, case):
  folder, expected = folders[case]
  model, params, _ = hf_reference.load(folder)
  assert model.family_name == case[:len("deepseek_vN")]
  for shape in SHAPES:
    _assert_close(_ours(model, params, _tokens(shape)), expected[shape], f"{case} {shape}")
  if case == "deepseek_v3":  # Scanned: one group of the dense layer and the MoE layers.
    scanned, scanned_params, _ = hf_reference.load(folder, scan_layers=True)
    _assert_close(_ours(scanned, scanned_params, _tokens("batch")), expected["batch"],
                  f"{case} scanned")


def test_the_latent_sizes_and_yarn_magnitudes_are_read(folders):
  v3, _, _ = hf_reference.load(folders["deepseek_v3"][0])
  assert (v3.q_lora_rank, v3.kv_lora_rank, v3.qk_nope_head_dim, v3.qk_rope_head_dim,
          v3.v_head_dim, v3.rotary_style, v3.rotary_scaling,
          v3.rotary_mscale_all_dim) == (24, 32, 16, 8, 12, "interleaved", "yarn", 0.8)
  # transformers' attention factor: mscale(4, mscale) / mscale(4, mscale_all_dim).
  assert v3.rotary_attention_factor == 1.0
  config = json.loads((folders["deepseek_v3"][0] / "config.json").read_text())
  config["rope_parameters"]["mscale"] = 0.9
  fields = DeepSeekV3HfNames.fields(HfConfig(config, "config.json"))
  expected = (0.09 * np.log(4) + 1) / (0.08 * np.log(4) + 1)
  assert fields["rotary_attention_factor"] == pytest.approx(expected, rel=1e-12)
  v2, _, _ = hf_reference.load(folders["deepseek_v2"][0])
  assert (v2.q_lora_rank, v2.v_head_dim, v2.rotary_scaling, v2.mlp_bias) == (
      None, 40, "none", False)
  biased, _, _ = hf_reference.load(folders["deepseek_v2_biased"][0])
  assert (biased.q_lora_rank, biased.attention_bias, biased.mlp_bias) == (24, True, True)


def _host(model, params):
  return names_of(model).export_params(jax.tree.map(np.asarray, params))


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_is_bit_for_bit_and_from_pretrained_computes_the_same(folders, case,
                                                                       tmp_path):
  folder, expected = folders[case]
  model, params, _ = hf_reference.load(folder)
  config = hf_export.check_expressible(model)
  shapes = {"/".join(str(k.key) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  plan = hf_export.plan_shards(names_of(model).tensors(), shapes, "float32")
  hf_export.write(epath.Path(tmp_path), model, _host(model, params), "float32", plan, config)
  hf_reference.assert_same_tensors(folder, tmp_path)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
  assert type(reloaded).__name__ == CASES[case][1]
  for shape in SHAPES:
    _assert_close(_theirs(reloaded, _tokens(shape)), expected[shape], f"{case} {shape}")


def test_a_gguf_export_reads_back_the_same_model(folders, tmp_path):
  for case in FAMILIES:
    model, params, _ = hf_reference.load(folders[case][0])
    tensors = hf_export.NamedTensors(model, _host(model, params))
    path = str(tmp_path / case / gguf_export.FILE)
    epath.Path(path).parent.mkdir()
    written = gguf_export.write(path, model, tensors, "float32")
    assert written["architecture"] == "deepseek2", written
    source = GgufCheckpoint(path)
    family, fields = source.model_fields()
    assert family.family_name == case
    again = family(**fields)
    sizes = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "rotary_scaling", "rotary_style", "rotary_attention_factor")
    assert {f: getattr(again, f) for f in sizes} == {f: getattr(model, f) for f in sizes}
    abstract = MeshParams(again, 16, Partitioner(), Partitioner().make_mesh()).abstract
    read, _ = source.read_params(again, abstract)
    for ours, original in zip(jax.tree.leaves(read), jax.tree.leaves(params)):
      np.testing.assert_array_equal(np.asarray(ours), np.asarray(original))
    # The norms' epsilon went through float32 (GGUF's): the logits, not the config, agree.
    _assert_close(_ours(again, read, _tokens("batch")), folders[case][1]["batch"], case)
  # Newer llama.cpp converters' split of attn_kv_b: one line.
  shapes = {"blk.0.attn_k_b.weight": (4, 32, 16)}
  with pytest.raises(UsageError, match="attn_k_b and attn_v_b") as refused:
    names_of_gguf(DeepSeekV3(), GgufNames).hf_config(
        {"general.architecture": "deepseek2"}, shapes)
  assert "\n" not in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("case", FAMILIES)
def test_32_greedy_tokens_through_decode_equal_transformers_generate(folders, case, tmp_path):
  hf_reference.assert_greedy_decode_equals_generate(
      _reference_model(case), folders[case][0], _tokens("long")[0, :24].tolist(), tmp_path)


@pytest.mark.parametrize("case, changes, words", [
    ("deepseek_v2_biased", {}, "attention biases"),
    ("deepseek_v3", {"rotary_attention_factor": 1.01}, "YaRN other than llama.cpp's"),
    ("deepseek_v3", {"rotary_style": "half"}, "rotary features in halves"),
])
def test_what_gguf_cannot_express_is_one_line(folders, case, changes, words):
  model, _, _ = hf_reference.load(folders[case][0], **changes)
  with pytest.raises(UsageError, match=words) as refused:
    gguf_export.check_expressible(model)
  assert "\n" not in str(refused.value)


def test_the_routing_is_read(folders):
  v3, _, _ = hf_reference.load(folders["deepseek_v3"][0])
  assert (v3.mlp_kinds_by_layer(), v3.num_experts, v3.experts_per_token, v3.expert_mlp_dim,
          v3.shared_expert_mlp_dim, v3.router_score, v3.renormalize_top_k, v3.expert_groups,
          v3.expert_groups_per_token, v3.group_score, v3.routed_scaling_factor,
          v3.selection_bias) == (("dense", "moe", "moe"), 8, 2, 24, 48, "sigmoid", True, 4, 2,
                                 "top2_sum", 2.5, True)
  v2, _, _ = hf_reference.load(folders["deepseek_v2"][0])
  assert (v2.router_score, v2.renormalize_top_k, v2.expert_groups, v2.group_score,
          v2.routed_scaling_factor, v2.selection_bias) == ("softmax", False, 4, "max", 1.5,
                                                           False)


def test_a_routing_not_computed_is_refused_in_one_line(folders, tmp_path):
  folder = tmp_path / "noaux"
  folder.mkdir()
  config = json.loads((folders["deepseek_v2"][0] / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps(dict(config, topk_method="noaux_tc")))
  with pytest.raises(UsageError, match="topk_method='noaux_tc'") as refused:
    HfCheckpoint(str(folder)).model_fields()
  assert "\n" not in str(refused.value)
