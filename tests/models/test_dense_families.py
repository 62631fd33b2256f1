"""The Qwen3, Gemma 3 and OLMo 3 families at their registered shapes: transformers' own models of
those shapes have as many parameters (built on torch's meta device: nothing allocated), `tiny`
keeps what makes each family itself, the FLOPs of Gemma 3 1B's 22 sliding and 4 global layers
are the hand count, and the decode memory check counts each layer's cache (a sliding layer's
window, a global layer's whole length).

The families' numbers against transformers' are tests/weights/test_hf_dense_families.py's;
the shared mechanisms' against a written-out forward pass, tests/models/test_layer_kinds.py's.
"""

import fiddle as fdl
import pytest

from lingvo_lite import memory_fit, target, testing
from lingvo_lite.config import building, overrides, registry
from lingvo_lite.models import family

# Each registered shape: the transformers class and config of the same model.
SHAPES = {
    "Qwen3_0_6B": "qwen3", "Qwen3_8B": "qwen3", "Gemma3_1B": "gemma3",
    "Gemma3_12B": "gemma3", "Olmo3_7B": "olmo3",
}


def _transformers_config(transformers, model):
  """The Hugging Face config our export would write for `model`, as transformers builds it."""
  from lingvo_lite.models.format_names import HfNames, bound  # pylint: disable=g-import-not-at-top
  config = dict(bound(model, HfNames).config())
  architecture = config.pop("architectures")[0]
  config.pop("model_type")
  config_class = {"Qwen3ForCausalLM": "Qwen3Config", "Gemma3ForCausalLM": "Gemma3TextConfig",
                  "Olmo3ForCausalLM": "Olmo3Config"}[architecture]
  return architecture, getattr(transformers, config_class)(**config)


@pytest.mark.parametrize("experiment", sorted(SHAPES))
def test_registered_shapes_have_transformers_parameter_count(experiment):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model = fdl.build(registry.lookup(experiment).config().model)
  assert model.family_name == SHAPES[experiment]
  architecture, config = _transformers_config(transformers, model)
  with torch.device("meta"):
    reference = getattr(transformers, architecture)(config)
  # Tied output weights are one parameter there too.
  assert model.num_parameters() == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("experiment, expected", [
    # Qwen3's heads of 128 are not its width over its heads (1024 / 16): tiny keeps that so.
    ("Qwen3_0_6B", {"num_layers": 2, "head_dim": 32, "qk_norm": "head",
                    "layer_kinds": ("full",), "tie_embeddings": True}),
    # A mixed pattern becomes each kind once over three layers; the window a quarter of 64.
    ("Gemma3_1B", {"num_layers": 3, "layer_kinds": ("sliding", "full"), "window": 16,
                   "head_dim": 32, "block": "sandwich", "norm": "rmsnorm_plus_one",
                   "embedding_scale": "sqrt_dim", "sliding_rotary_base": 10000.0}),
    ("Gemma3_12B", {"num_layers": 3, "rotary_scaling": "linear",
                    "sliding_rotary_scaling": "none"}),
    ("Olmo3_7B", {"num_layers": 3, "layer_kinds": ("sliding", "full"), "window": 16,
                  "head_dim": None, "block": "post_norm", "qk_norm": "projection",
                  "rotary_scaling": "yarn"}),
])
def test_tiny_keeps_each_familys_parts(experiment, expected):
  cfg = testing.tiny_config(experiment)
  assert {name: getattr(cfg.model, name) for name in expected} == expected
  fdl.build(cfg.model).validate(target.host())


def test_gemma3_1b_flops_count_each_sliding_layer_over_its_window():
  """Counted by hand: 4 query heads of 256; of 26 layers, 22 slide (window 512) and 4 are
  global. Training at T = 2048: a global layer's token sees T / 2 = 1024 positions on average,
  a sliding one's W - W^2 / 2T = 512 - 64 = 448; 4 x 4 x 256 FLOPs a position. Decoding at a
  context of 8192: the global layers read all of it, the sliding ones their 512."""
  model = fdl.build(registry.lookup("Gemma3_1B").config().model)
  assert model.kinds_by_layer().count("sliding") == 22
  assert model.attention_flops_per_token(2048) == 4096 * (22 * 448 + 4 * 1024) == 57_147_392
  assert model.decode_attention_flops(8192) == 4096 * (22 * 512 + 4 * 8192) == 180_355_072
  assert model.train_flops_per_token(2048) == 6 * model.matmul_parameters() + 3 * 57_147_392


def test_the_decode_memory_check_counts_each_layers_cache():
  """Gemma3_1B decoding 8 slots of 8192 positions on one device: keys and values of one
  key-value head of 256 in bfloat16, 512 entries in each of 22 sliding layers and 8192 in
  each of 4 global ones (a cache of every layer at full length would be 3.7 x larger)."""
  cfg = registry.lookup("Gemma3_1B").config()
  overrides.apply(cfg, [overrides.set_directive(f"--fdl.{s}", s)
                        for s in ("decode.slots=8", "decode.cache_length=8192")], None)
  setup = building.build(cfg)
  need = memory_fit.decode_need(setup, 1)
  per_entry = 2 * 8 * 1 * 256 * 2  # keys and values, slots, heads, head_dim, bfloat16 bytes
  assert need["KV cache"] == per_entry * (22 * 512 + 4 * 8192)
  assert family.FAMILIES["gemma3"] is type(setup.model)
