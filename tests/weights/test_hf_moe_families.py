"""Mixtral, Qwen3-MoE and gpt-oss against transformers' own: tiny random `MixtralForCausalLM`,
`Qwen3MoeForCausalLM` and `GptOssForCausalLM` built from configs (offline), every weight moved
off its initial value, written by `save_pretrained` (each expert's tensors on their own, as it
writes them, or gpt-oss's stacked and interleaved):

- our import computes transformers' float32 logits within 1e-4 for two batch shapes, with
  unrolled and scanned layers;
- `--mode=export` writes the tensors `save_pretrained` wrote, name for name and bit for bit,
  and `from_pretrained` of the export computes the same logits;
- the families' settings are read from the config (Qwen3-MoE's `norm_topk_prob`, dense
  layers of `mlp_only_layers` and `decoder_sparse_step`) and what they cannot compute is one
  line naming the key.
"""


import numpy as np
import pytest

from lingvo_lite.errors import UsageError
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
from tests.weights import hf_reference
from tests.weights.hf_reference import (assert_close as _assert_close, export as _export,
                                        our_logits as _ours, their_logits as _theirs)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 320  # At least PyCodeTiny's 259 (export runs it with these folders).
SHAPES = {"long": (1, 48), "batch": (3, 20)}
WINDOW = 16

# Each family's tiny config: 4 experts (2 per token), experts of their own width.
CASES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=1024)),
    # 3 layers: the middle one dense (mlp_only_layers), experts 48 wide, renormalized top-k.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=96, moe_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
        max_position_embeddings=1024)),
    # As transformers' default: the chosen weights as they are (norm_topk_prob false).
    # Every layer sparse, renormalized: what llama.cpp's qwen3moe holds (GGUF). Experts 768
    # wide: transformers' GGUF reader takes no expert width from the file but its default.
    "qwen3_moe_gguf": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, moe_intermediate_size=768, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=1024)),
    "qwen3_moe_unnormalized": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, moe_intermediate_size=48, num_experts=4,
        num_experts_per_tok=2, max_position_embeddings=1024)),
    # 3 layers: sliding, full, sliding (a window of 16 in rows of 48), YaRN unrounded.
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=WINDOW, max_position_embeddings=256, rope_parameters={
            "rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
            "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False})),
}


def _reference_model(case: str):
  return hf_reference.reference_model(CASES[case], VOCAB, _stored_in_out, bos_token_id=0,
                                      eos_token_id=1, pad_token_id=0)


def _stored_in_out(model, parameter) -> bool:
  """gpt-oss's stacked experts are [experts, in, out]; every other matrix is [out, in]."""
  experts = getattr(model.model.layers[0].mlp, "experts", None)
  return experts is not None and type(experts).__name__ == "GptOssExperts" and any(
      parameter is p for p in (experts.gate_up_proj, experts.down_proj))


def _tokens(shape_name: str) -> np.ndarray:
  return np.random.default_rng(0).integers(0, VOCAB, SHAPES[shape_name])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """case -> (its folder, {shape: transformers' float32 logits})."""
  return hf_reference.saved(
      tmp_path_factory.mktemp("hf"), CASES, _reference_model,
      lambda case, model: {shape: _theirs(model, _tokens(shape)) for shape in SHAPES})


def _load(path, source=HfCheckpoint, **changes):
  return hf_reference.load(path, source, **changes)[:2]


# The cases a family's numbers are tested on (the GGUF case is Qwen3-MoE's again).
FAMILY_CASES = ("mixtral", "qwen3_moe", "qwen3_moe_unnormalized", "gpt_oss")


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_logits_equal_transformers(folders, case):
  folder, expected = folders[case]
  model, params = _load(folder)
  assert case.startswith(model.family_name)
  for shape in SHAPES:
    _assert_close(_ours(model, params, _tokens(shape)), expected[shape], f"{case} {shape}")
  if case == "qwen3_moe_unnormalized":
    return  # Its layers scan as qwen3_moe's do.
  # Scanned: one block a step (Mixtral), a group of the pattern (sparse, dense, sparse;
  # sliding, full, sliding).
  scanned, scanned_params = _load(folder, scan_layers=True)
  assert "layers" in scanned_params
  _assert_close(_ours(scanned, scanned_params, _tokens("batch")), expected["batch"],
                f"{case} scanned")


# ------------------------------------------------------------------------------ export

@pytest.mark.parametrize("case", ("mixtral", "qwen3_moe", "gpt_oss"))
def test_export_writes_save_pretrained_s_tensors_and_from_pretrained_computes_the_same(
    folders, case, tmp_path):
  folder, expected = folders[case]
  reloaded = hf_reference.exported_again(folder, tmp_path, CASES[case][1])
  for shape in SHAPES:
    _assert_close(_theirs(reloaded, _tokens(shape)), expected[shape], f"{case} {shape}")


def test_qwen3_moe_reads_its_renormalization_and_dense_layers_from_the_config(folders):
  model, _ = _load(folders["qwen3_moe"][0])
  assert (model.renormalize_top_k, model.mlp_kinds_by_layer(), model.mlp_dim,
          model.expert_mlp_dim, model.qk_norm) == (True, ("moe", "dense", "moe"), 96, 48,
                                                   "head")
  folder, expected = folders["qwen3_moe_unnormalized"]
  unnormalized, params = _load(folder)
  assert not unnormalized.renormalize_top_k
  # The same weights renormalized compute other logits: the setting is the config's.
  renormalized = unnormalized.clone(renormalize_top_k=True)
  assert np.abs(_ours(renormalized, params, _tokens("long")) - expected["long"]).max() > 1e-2


@pytest.mark.parametrize("case, change, words", [
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise=0.1: lingvo_lite's router "
                                              "adds no noise; set it to 0.0"),
    ("mixtral", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step=0: must be a positive "
                                              "integer"),
    ("qwen3_moe", {"num_experts": 0, "num_local_experts": 0},
     "num_experts=0: a Qwen3-MoE without experts is a dense Qwen3"),
    ("qwen3_moe", {"mlp_only_layers": "1"}, "mlp_only_layers='1': must be a list"),
])
def test_what_a_family_cannot_compute_is_one_line_naming_the_key(folders, tmp_path, case,
                                                                  change, words):
  import json  # pylint: disable=g-import-not-at-top
  config = json.loads((folders[case][0] / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
  with pytest.raises(UsageError) as refused:
    HfCheckpoint(str(tmp_path)).model_fields()
  assert words in str(refused.value) and "\n" not in str(refused.value)


def _mxfp4_as_released(values, gguf):
  """(blocks, scales) of a [..., in, out] float32 tensor in the released checkpoints' MXFP4
  layout, and the values they decode to: quantized by the gguf package's MXFP4 code (groups
  of 32 along `in`), its bytes rearranged into OpenAI's layout (each byte two neighbours, the
  low nibble first; transformers' `convert_moe_packed_tensors` reads them)."""
  rows = np.ascontiguousarray(np.swapaxes(values, -1, -2))  # [..., out, in]
  packed = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.MXFP4)
  decoded = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.MXFP4)
  packed = packed.reshape(*rows.shape[:-1], rows.shape[-1] // 32, 17)
  scales, nibbles = packed[..., 0], packed[..., 1:]
  # GGML's block: values 0..15 in the low nibbles, 16..31 in the high ones.
  codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
  blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
  return (np.ascontiguousarray(blocks), np.ascontiguousarray(scales),
          np.swapaxes(decoded.reshape(rows.shape), -1, -2))


def test_mxfp4_experts_as_the_released_checkpoints_store_them_read_dequantized(folders,
                                                                               tmp_path):
  gguf = pytest.importorskip("gguf")
  import json  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  folder = folders["gpt_oss"][0]
  tensors, decoded = hf_reference.tensors(folder), {}
  for name in [n for n in list(tensors) if n.endswith(("gate_up_proj", "down_proj"))]:
    blocks, scales, decoded[name] = _mxfp4_as_released(tensors.pop(name), gguf)
    tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
  save_file(tensors, str(tmp_path / "model.safetensors"))
  config = json.loads((folder / "config.json").read_text())
  config["quantization_config"] = {"quant_method": "mxfp4"}
  (tmp_path / "config.json").write_text(json.dumps(config))
  model, params = _load(tmp_path)
  experts = params["layer_1"]["mlp"]
  gate_up = decoded["model.layers.1.mlp.experts.gate_up_proj"]
  assert np.array_equal(np.asarray(experts["wi"]), gate_up[..., 0::2])
  assert np.array_equal(np.asarray(experts["wi_gate"]), gate_up[..., 1::2])
  assert np.array_equal(np.asarray(experts["wo"]),
                        decoded["model.layers.1.mlp.experts.down_proj"])
  assert model.family_name == "gpt_oss"


# ------------------------------------------------------------------------------ GGUF

@pytest.mark.parametrize("case, architecture, transformers_reads", [
    # llama.cpp converts Mixtral to `llama` with experts, which transformers reads as a Llama
    # without them: ours alone reads it back.
    ("mixtral", "llama", False),
    ("qwen3_moe_gguf", "qwen3moe", True),
    # transformers' gpt-oss GGUF reader fails on llama.cpp's rope.scaling.* keys (it reads
    # each key's length as its value: a TypeError), so ours alone.
    ("gpt_oss", "gpt-oss", False)])
def test_a_gguf_export_with_stacked_experts_reads_back_the_same_logits(
    folders, case, architecture, transformers_reads, tmp_path):
  from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint  # pylint: disable=g-import-not-at-top
  folder, expected = folders[case]
  out = tmp_path / "gguf"
  result = _export(tmp_path / "job", out, f"--init_from=hf:{folder}", "--export_format=gguf")
  assert result.code == 0, result.stderr[-3000:]
  assert f"model.gguf ({architecture})" in result.stdout, result.stdout
  import gguf  # pylint: disable=g-import-not-at-top
  names = {tensor.name for tensor in gguf.GGUFReader(str(out / "model.gguf")).tensors}
  assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
          "blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_inp.weight"} <= names
  model, params = _load(out / "model.gguf", GgufCheckpoint)
  assert model.family_name == case.split("_gguf")[0]
  _assert_close(_ours(model, params, _tokens("long")), expected["long"], f"{case} ours")
  if transformers_reads:
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), gguf_file="model.gguf", dtype=torch.float32,
        attn_implementation="eager").eval()
    assert type(exported).__name__ == CASES[case][1]
    _assert_close(_theirs(exported, _tokens("long")), expected["long"], f"{case} theirs")


@pytest.mark.parametrize("case, change, words", [
    ("qwen3_moe", (), "a qwen3_moe model with dense layers (Hugging Face's mlp_only_layers)"),
    ("qwen3_moe_unnormalized", (), "model.renormalize_top_k=False (Hugging Face's "
                                   "norm_topk_prob): llama.cpp's qwen3moe always renormalizes"),
    ("gpt_oss", ("--fdl.model.layer_kinds=('full', 'sliding')",),
     "llama.cpp's gpt-oss slides the first layer's window and every other layer's after it"),
])
def test_what_a_gguf_architecture_cannot_hold_is_one_line(folders, tmp_path, case, change,
                                                          words):
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{folders[case][0]}",
                   "--export_format=gguf", *change)
  hf_reference.assert_refused_in_one_line(result, words, tmp_path / "out")


def test_a_gpt_oss_gguf_file_with_mxfp4_experts_reads_through_the_gguf_package(folders,
                                                                               tmp_path):
  """llama.cpp's gpt-oss files store the experts as MXFP4: the same file with its three
  expert matrices quantized so (by the gguf package) reads, each dequantized by the gguf
  package's code, into the experts exactly, and the model still computes (quantized weights:
  near, not equal, logits)."""
  gguf = pytest.importorskip("gguf")
  from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint  # pylint: disable=g-import-not-at-top
  folder, expected = folders["gpt_oss"]
  result = _export(tmp_path / "job", tmp_path / "f32", f"--init_from=hf:{folder}",
                   "--export_format=gguf")
  assert result.code == 0, result.stderr[-3000:]
  reader = gguf.GGUFReader(str(tmp_path / "f32" / "model.gguf"))
  writer = gguf.GGUFWriter(str(tmp_path / "mxfp4.gguf"), "gpt-oss")
  for name, field in reader.fields.items():
    if name.startswith("gpt-oss.") or name == "general.name":
      value = field.contents()
      kind = field.types[0]
      writer.add_key_value(name, value, kind,
                           field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
  decoded = {}
  mxfp4 = gguf.GGMLQuantizationType.MXFP4
  for tensor in reader.tensors:
    values = np.asarray(tensor.data).reshape([int(d) for d in reversed(tensor.shape)])
    if tensor.name.endswith("_exps.weight"):
      packed = gguf.quants.quantize(values, mxfp4)
      decoded[tensor.name] = gguf.quants.dequantize(packed, mxfp4)
      writer.add_tensor(tensor.name, packed, raw_dtype=mxfp4)  # Its bytes.
    else:
      writer.add_tensor(tensor.name, values)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  model, params = _load(tmp_path / "mxfp4.gguf", GgufCheckpoint)
  experts = params["layer_0"]["mlp"]
  # GGUF's [experts, out, in] back to our [experts, in, out].
  assert np.array_equal(np.asarray(experts["wi"]),
                        np.swapaxes(decoded["blk.0.ffn_gate_exps.weight"], -1, -2))
  assert np.array_equal(np.asarray(experts["wi_gate"]),
                        np.swapaxes(decoded["blk.0.ffn_up_exps.weight"], -1, -2))
  assert np.array_equal(np.asarray(experts["wo"]),
                        np.swapaxes(decoded["blk.0.ffn_down_exps.weight"], -1, -2))
  logits = _ours(model, params, _tokens("long"))
  assert np.isfinite(logits).all() and np.corrcoef(logits.ravel(),
                                                   expected["long"].ravel())[0, 1] > 0.9
