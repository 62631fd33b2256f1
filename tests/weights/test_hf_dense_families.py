"""Qwen3, Gemma 3 and OLMo 3 against transformers' own: tiny random `Qwen3ForCausalLM`,
`Gemma3ForCausalLM` and `Olmo3ForCausalLM` built from configs (offline), with every norm moved
off its initial value, written by `save_pretrained`:

- our import computes transformers' float32 logits within 1e-4 on rows longer than the
  sliding window, for two batch shapes, with unrolled and scanned layers (groups of the
  pattern and layers left over);
- `--mode=export` writes the same tensors back bit for bit, and `from_pretrained` of the
  export computes the same logits;
- 32 greedy tokens through `--mode=decode` equal transformers' `generate`;
- a GGUF export reads back the same logits: in transformers' GGUF reader (Qwen3, Gemma 3) and
  ours (all three; OLMo 3 is llama.cpp's olmo2, which transformers does not read);
- a Gemma 3 multimodal checkpoint (`Gemma3ForConditionalGeneration`) reads as its text model;
- what a format cannot express is one line.

The models follow tests/weights/hf_reference.py's recipe: weights scaled for O(1) logits,
norms and biases perturbed (ones and zeros hide a swapped scale).
"""

import json
import shutil

import numpy as np
import pytest

from lingvo_lite.errors import UsageError
from lingvo_lite.models import rotary
from lingvo_lite.models.llama import Llama
from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint
from tests.weights import hf_reference
from tests.weights.hf_reference import (TOLERANCE, assert_close as _assert_close,
                                        export as _export, our_logits as _ours,
                                        their_logits as _theirs)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# The reference models are tiny: one thread each. Two threads on a busy 2-core machine ran
# transformers' generate 10x slower (8.9 s against 0.9 s for 32 tokens), waiting on each other.
torch.set_num_threads(1)

VOCAB = 320  # At least PyCodeTiny's 259 (export and decode run it with these folders).
WINDOW = 16
# Rows longer than the window, in two batch shapes.
SHAPES = {"long": (1, 120), "batch": (3, 40)}

# Each family's tiny config. Qwen3's head width (128, transformers' GGUF reader's default) is
# not the width over its heads; Gemma 3's 6 layers are one 5:1 pattern, its head width 256
# its query_pre_attn_scalar (what llama.cpp's gemma3 derives, and transformers' GGUF default);
# OLMo 3's 5 layers are one 3:1 pattern and a layer left over, its full layers scaled by YaRN.
CASES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=128, intermediate_size=96, rope_theta=5000.0, max_position_embeddings=1024,
        tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=64, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
        head_dim=256, intermediate_size=96, sliding_window=WINDOW, query_pre_attn_scalar=256,
        max_position_embeddings=1024)),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(
        hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, sliding_window=WINDOW, max_position_embeddings=1024,
        rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
                               "original_max_position_embeddings": 64},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}})),
    # Two settings the families read that the cases above leave out: Qwen3's sliding upper
    # layers, and Gemma 3's linear scaling of the global layers (4B and up).
    "qwen3_sliding": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=96, use_sliding_window=True, sliding_window=WINDOW,
        max_window_layers=1, max_position_embeddings=1024, tie_word_embeddings=True)),
    "gemma3_scaled": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=96, sliding_window=WINDOW, query_pre_attn_scalar=24,
        max_position_embeddings=1024, rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 100000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})),
}
FAMILIES = ("qwen3", "gemma3", "olmo3")


def _reference_model(case: str):
  return hf_reference.reference_model(CASES[case], VOCAB, bos_token_id=0, eos_token_id=1,
                                      pad_token_id=0)


def _tokens(shape_name: str) -> np.ndarray:
  return np.random.default_rng(0).integers(0, VOCAB, SHAPES[shape_name])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """case -> (its folder, {shape: transformers' float32 logits})."""
  return hf_reference.saved(
      tmp_path_factory.mktemp("hf"), CASES, _reference_model, lambda case, model: {
          shape: _theirs(model, _tokens(shape))
          for shape in (SHAPES if case in FAMILIES else ("long",))})


def _load(path, source=HfCheckpoint, **changes):
  return hf_reference.load(path, source, **changes)[:2]


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers_past_the_window(folders, case):
  folder, expected = folders[case]
  model, params = _load(folder)
  assert model.family_name == case.split("_")[0]
  shapes = SHAPES if case in FAMILIES else ("long",)
  for shape in shapes:
    _assert_close(_ours(model, params, _tokens(shape)), expected[shape], f"{case} {shape}")
  if case == "olmo3":
    # Scanned: a group of the 3:1 pattern and the layer left over, filled from the same
    # tensors (Gemma 3's 6 layers would be one group and nothing left over).
    scanned, scanned_params = _load(folder, scan_layers=True)
    assert scanned.scan_plan() == (4, 1)
    assert sorted(scanned_params["layers"]) == [f"pattern_{j}" for j in range(4)]
    assert "layer_4" in scanned_params and "layer_3" not in scanned_params
    _assert_close(_ours(scanned, scanned_params, _tokens("long")), expected["long"],
                  f"{case} scanned")


def test_the_kinds_and_their_rotary_settings_are_read(folders):
  # What each config says, read into the shared fields; without the window the same
  # weights compute other logits past it.
  gemma, _ = _load(folders["gemma3"][0])
  assert (gemma.layer_kinds, gemma.window, gemma.rotary_base, gemma.sliding_rotary_base,
          gemma.query_pre_attention_scalar) == (("sliding",) * 5 + ("full",), WINDOW,
                                                1000000.0, 10000.0, 256.0)
  scaled, _ = _load(folders["gemma3_scaled"][0])
  assert (scaled.rotary_scaling, scaled.rotary_scaling_factor, scaled.sliding_rotary_scaling,
          scaled.rotary_base, scaled.sliding_rotary_base) == ("linear", 8.0, "none",
                                                              100000.0, 1000.0)
  olmo, _ = _load(folders["olmo3"][0])
  assert (olmo.layer_kinds, olmo.rotary_scaling, olmo.sliding_rotary_scaling,
          olmo.qk_norm) == (("sliding",) * 3 + ("full",), "yarn", "none", "projection")
  qwen, qwen_params = _load(folders["qwen3_sliding"][0])
  assert (qwen.layer_kinds, qwen.window, qwen.head_dim) == (("full", "sliding", "sliding"),
                                                            WINDOW, 32)
  # Its kinds differ in the mask alone: all full, the same weights agree within the window
  # and not past it.
  full, _ = _load(folders["qwen3_sliding"][0], layer_kinds=("full",))
  difference = np.abs(_ours(full, qwen_params, _tokens("long"))
                      - folders["qwen3_sliding"][1]["long"])
  assert difference[:, WINDOW:].max() > 1e-2 and difference[:, :WINDOW].max() < TOLERANCE


# ------------------------------------------------------------------------------ export

@pytest.mark.parametrize("case", FAMILIES)
def test_export_is_bit_for_bit_and_from_pretrained_computes_the_same(folders, case,
                                                                       tmp_path):
  folder, expected = folders[case]
  reloaded = hf_reference.exported_again(folder, tmp_path, CASES[case][1])
  for shape in SHAPES:
    _assert_close(_theirs(reloaded, _tokens(shape)), expected[shape], f"{case} {shape}")


# ------------------------------------------------------------------------------ decode

@pytest.mark.slow
@pytest.mark.parametrize("case", FAMILIES)
def test_32_greedy_tokens_through_decode_equal_transformers_generate(folders, case, tmp_path):
  # The 56 positions go past the window.
  hf_reference.assert_greedy_decode_equals_generate(
      _reference_model(case), folders[case][0], _tokens("long")[0, :24].tolist(), tmp_path)


# ------------------------------------------------------------------------------ GGUF

@pytest.mark.parametrize("case, architecture", [("qwen3", "qwen3"), ("gemma3", "gemma3"),
                                                ("olmo3", "olmo2")])
def test_a_gguf_export_reads_back_the_same_logits(folders, case, architecture, tmp_path):
  folder, expected = folders[case]
  out = tmp_path / "gguf"
  result = _export(tmp_path / "job", out, f"--init_from=hf:{folder}", "--export_format=gguf")
  assert result.code == 0, result.stderr[-3000:]
  assert f"model.gguf ({architecture})" in result.stdout, result.stdout
  model, params = _load(out / "model.gguf", GgufCheckpoint)
  assert model.family_name == case
  _assert_close(_ours(model, params, _tokens("long")), expected["long"], f"{case} ours")
  if architecture == "olmo2":
    return  # transformers has no olmo2 GGUF reader.
  exported = transformers.AutoModelForCausalLM.from_pretrained(
      str(out), gguf_file="model.gguf", dtype=torch.float32, attn_implementation="eager").eval()
  assert type(exported).__name__ == CASES[case][1]
  _assert_close(_theirs(exported, _tokens("long")), expected["long"], f"{case} transformers")


@pytest.mark.parametrize("case, change, words", [
    ("gemma3", "--fdl.model.layer_kinds=('sliding', 'full')", "a pattern of attention kinds"),
    ("gemma3", "--fdl.model.sliding_rotary_base=500.0", "sliding layers' rotary base 500.0"),
    ("olmo3", "--fdl.model.sliding_rotary_scaling='linear'",
     "rotary scaling on the sliding layers"),
    ("qwen3", "--fdl.model.window=8", None),  # No sliding layer: the window is no setting.
])
def test_what_gguf_cannot_express_is_one_line(folders, tmp_path, case, change, words):
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{folders[case][0]}",
                   "--export_format=gguf", change)
  if words is None:
    assert result.code == 0, result.stderr[-2000:]
    return
  hf_reference.assert_refused_in_one_line(result, words, tmp_path / "out")


# ------------------------------------------------------------------------------ multimodal

def test_a_gemma3_multimodal_checkpoint_reads_as_its_text_model(folders, tmp_path):
  """A `Gemma3ForConditionalGeneration` (a tiny vision tower) holding the gemma3 case's text
  weights, written by `save_pretrained` (model_type "gemma3", the text model under
  `language_model.`): our import reads the text model and computes its logits; the vision
  tower is named in one warning, and the export is a text model."""
  text = _reference_model("gemma3")
  config = transformers.Gemma3Config(
      text_config=text.config.to_dict(), mm_tokens_per_image=4, vision_config=dict(
          hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
          image_size=28, patch_size=14))
  multimodal = transformers.Gemma3ForConditionalGeneration(config).eval()
  missing = multimodal.model.language_model.load_state_dict(text.model.state_dict())
  assert not missing.missing_keys and not missing.unexpected_keys
  multimodal.save_pretrained(tmp_path / "mm")
  saved = json.loads((tmp_path / "mm" / "config.json").read_text())
  assert saved["model_type"] == "gemma3" and any(
      name.startswith("language_model.") for name in hf_reference.tensors(tmp_path / "mm"))
  model, params = _load(tmp_path / "mm")
  assert model.family_name == "gemma3" and model.num_layers == 6
  _assert_close(_ours(model, params, _tokens("long")), folders["gemma3"][1]["long"],
                "multimodal")
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{tmp_path / 'mm'}")
  assert result.code == 0, result.stderr[-3000:]
  assert "no part of the model reads" in result.stderr and "vision_tower" in result.stderr
  exported = json.loads((tmp_path / "out" / "config.json").read_text())
  assert exported["model_type"] == "gemma3_text"


# ------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("case, change, words", [
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ("gemma3", {"layer_types": ["sliding_attention"]}, "layer_types=['sliding_attention']"),
    ("olmo3", {"layer_types": ["full_attention"] * 4 + ["local"]}, "layer_types="),
    ("olmo3", {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0},
                                   "sliding_attention": {"rope_type": "default"}}},
     "rope_parameters.full_attention.rope_type='dynamic'"),
    ("olmo3", {"rope_parameters": {"full_attention": {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
        "mscale": 1.0}}}, "rope_parameters.full_attention.mscale=1.0"),
    ("qwen3", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
])
def test_settings_the_families_do_not_compute_are_refused_naming_the_key(folders, tmp_path,
                                                                          case, change, words):
  shutil.copytree(folders[case][0], tmp_path / "changed")
  config = json.loads((tmp_path / "changed" / "config.json").read_text())
  config.update(change)
  (tmp_path / "changed" / "config.json").write_text(json.dumps(config))
  with pytest.raises(UsageError) as error:
    HfCheckpoint(str(tmp_path / "changed")).model_fields()
  message = str(error.value)
  assert "\n" not in message and words in message, message


# ------------------------------------------------------------------ rotary scalings


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 8.0},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 100,
     "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.3},
])
def test_rotary_scalings_give_transformers_frequencies(scaling):
  """The rotary scalings ("linear", "yarn") give transformers' own inverse frequencies and
  attention factor (kept here, beside the file's other transformers references: one torch
  import)."""
  rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
  config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2,
                                    max_position_embeddings=1024,
                                    rope_parameters={"rope_theta": 5000.0, **scaling})
  theirs, factor = rope_utils.ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
  model = Llama(vocab_size=8, num_layers=1, dim=64, num_heads=2, rotary_base=5000.0,
                rotary_scaling=scaling["rope_type"], rotary_scaling_factor=scaling["factor"],
                rotary_original_max_length=scaling.get("original_max_position_embeddings", 8192),
                rotary_beta_fast=scaling.get("beta_fast", 32.0),
                rotary_beta_slow=scaling.get("beta_slow", 1.0),
                rotary_attention_factor=scaling.get("attention_factor"))
  settings = model.rotary_scaling_settings()
  # Within one float32 ulp, not bitwise: torch computes the base's powers with its vectorized
  # pow (SLEEF on AVX-512 hosts, 1-ulp error bound), NumPy with libm; the two round apart on
  # some machines (4 of 16 frequencies 1 ulp off on an AVX-512 EPYC), the same formula both.
  np.testing.assert_array_max_ulp(rotary.inverse_frequencies(32, 5000.0, settings),
                                  theirs.numpy(), maxulp=1)
  assert rotary.attention_factor(settings) == pytest.approx(factor, rel=1e-7)


_SIZES = dict(vocab_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, intermediate_size=96)


def test_a_rope_scaling_without_its_original_context_reads_as_transformers_fills_it():
  """Llama 3.1's and YaRN's `original_max_position_embeddings`, where a config.json leaves
  it out, is what transformers' standardized rope parameters hold (the model's
  `max_position_embeddings`, or the config class's default of it), for flat and by-layer-type
  scalings; one the scaling gives is kept (a top-level one is not read, as transformers does
  not for these families)."""
  from lingvo_lite.models.checkpoint_names import HfConfig  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_checkpoint import family_reading  # pylint: disable=g-import-not-at-top
  yarn = {"rope_type": "yarn", "factor": 4.0}
  configs = [
      {"model_type": "llama", "max_position_embeddings": 1024, "rope_scaling": yarn},
      {"model_type": "llama", "rope_scaling": {"type": "yarn", "factor": 4.0}},
      {"model_type": "llama", "max_position_embeddings": 1024, "rope_scaling": {
          "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
      {"model_type": "llama", "max_position_embeddings": 1024,
       "original_max_position_embeddings": 256,
       "rope_scaling": {**yarn, "original_max_position_embeddings": 512}},
      {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
       "rope_scaling": yarn},
      {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
       "moe_intermediate_size": 32, "max_position_embeddings": 4096, "rope_scaling": yarn},
      {"model_type": "olmo3", "num_hidden_layers": 4, "max_position_embeddings": 1024,
       "sliding_window": 16,
       "rope_parameters": {"full_attention": {**yarn, "rope_theta": 5000.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}},
  ]
  for raw in configs:
    raw = {**_SIZES, **raw}
    parameters = transformers.AutoConfig.for_model(**raw).rope_parameters
    theirs = parameters.get("full_attention", parameters)["original_max_position_embeddings"]
    _, names = family_reading(raw["model_type"], "config.json")
    ours = names.fields(HfConfig(raw, "config.json"))["rotary_original_max_length"]
    assert ours == theirs, (raw, ours, theirs)
