"""The model-family interface: every registered family answers it, and each answer is checked
against an independent count (the initialized parameter tree, the FLOPs formula written out
by hand, literal sizes), so that programs may trust what they ask instead of naming families.
"""

import importlib
import math
import pkgutil

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

import lingvo_lite.models
from lingvo_lite import mfu, target, testing
from lingvo_lite.config import files as config_files, help as config_help
from lingvo_lite.errors import UsageError
from lingvo_lite.models import family, quantization
from lingvo_lite.models.format_names import GgufNames, HfNames, names_of
from lingvo_lite.models.transformer import TransformerLM

# Every module of the package imported, so every family there has registered itself.
for _module in pkgutil.iter_modules(lingvo_lite.models.__path__):
  importlib.import_module(f"lingvo_lite.models.{_module.name}")

# Small sizes every family takes; GPT-2's learned positions need max_length.
SIZES = {"vocab_size": 60, "num_layers": 3, "dim": 32, "num_heads": 4, "max_length": 16}
# Each family's structural choices as `TransformerLM` fields, written out here as the
# published models make them (the independent statement of what each family is).
CHOICES = {
    "gptj": {"block": "parallel", "norm": "layernorm", "mlp_activation": "gelu_tanh",
             "position": "rotary", "rotary_style": "interleaved", "attention_bias": False,
             "mlp_bias": True, "embedding_bias": True, "tie_embeddings": False,
             "output_bias": True},
    "llama": {"block": "sequential", "norm": "rmsnorm", "mlp_activation": "swiglu",
              "position": "rotary", "rotary_style": "half", "attention_bias": False,
              "mlp_bias": False, "embedding_bias": False, "tie_embeddings": False,
              "output_bias": False},
    "gpt2": {"block": "sequential", "norm": "layernorm", "mlp_activation": "gelu_tanh",
             "position": "learned", "attention_bias": True, "mlp_bias": True,
             "embedding_bias": False, "tie_embeddings": True, "output_bias": False},
}


def _model(name: str, **fields) -> family.LanguageModel:
  return family.FAMILIES[name](**{**SIZES, **fields})


def _params(model: nn.Module, length: int = 8):
  return nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0),
                                      jnp.zeros((1, length), jnp.int32)))["params"]


def test_the_three_families_are_registered_with_their_names():
  assert set(family.FAMILIES) >= {"gptj", "llama", "gpt2"}
  for name in ("gptj", "llama", "gpt2"):
    cls = family.FAMILIES[name]
    assert (cls.family_name, names_of(cls, HfNames).model_type,
            names_of(cls, GgufNames).architecture) == (name, name, name)


@pytest.mark.parametrize("name", sorted(family.FAMILIES))
@pytest.mark.parametrize("fields", [{}, {"tie_embeddings": True, "attention_bias": True,
                                         "mlp_bias": True}], ids=["defaults", "tied_biased"])
def test_every_hf_family_names_a_tensor_for_each_parameter_once(name, fields):
  """Each parameter is held by exactly one Hugging Face tensor (or is one the format lacks),
  in the format's shape: a family's table that misses or repeats one fails here, whatever
  its weights."""
  cls = family.FAMILIES[name]
  if names_of(cls, HfNames) is None:
    pytest.skip(f"{name} reads no Hugging Face checkpoint")
  if name == "gptj" and fields:
    fields = {"mlp_bias": True}  # GPT-J's Hugging Face model has no tied or biased attention.
  if name in ("gemma3", "olmo3", "qwen3_moe", "deepseek_v3") and fields:
    fields = {"tie_embeddings": True, "attention_bias": True}  # Theirs have no MLP biases.
  if name in ("mixtral", "gpt_oss") and fields:
    fields = {"tie_embeddings": True}  # Their biases are fixed: none, or every one.
  model = _model(name, **fields)
  shapes = {"/".join(k.key for k in path): leaf.shape for path, leaf in
            jax.tree_util.tree_flatten_with_path(_params(model))[0]}
  names = names_of(cls, HfNames)(model)
  # A tensor of one expert holds that expert's row of a stacked parameter: each row once.
  held = [path for tensor in names.tensors() for path in tensor.paths
          if tensor.expert in (None, 0)]
  assert sorted(held + list(names.absent())) == sorted(shapes)
  rows: dict = {}
  for tensor in names.tensors():
    for path in tensor.paths if tensor.expert is not None else ():
      rows.setdefault(path, []).append(tensor.expert)
  assert all(sorted(found) == list(range(shapes[path][0])) for path, found in rows.items())
  for tensor in names.tensors():
    parts = [np.zeros(shapes[path]) for path in tensor.paths]
    assert tensor.from_ours(parts).shape == tensor.format_shape([shapes[p] for p in
                                                                 tensor.paths])
  assert len({tensor.name for tensor in names.tensors()}) == len(names.tensors())


@pytest.mark.parametrize("name", sorted(family.FAMILIES))
def test_every_registered_family_implements_the_interface(name):
  """No method is left to the base class's NotImplementedError, and each answer is
  consistent with the model itself."""
  cls = family.FAMILIES[name]
  assert issubclass(cls, family.LanguageModel)
  model = _model(name)
  params = _params(model)
  leaves = jax.tree.leaves(params)
  assert model.num_parameters() == sum(math.prod(x.shape) for x in leaves)
  shapes = model.parameter_shapes()
  assert sum(p.repeats * math.prod(p.shape) for p in shapes) == model.num_parameters()
  # Every axis the parameters use is sized by a field the model has.
  axes = cls.logical_axes()
  used = {a for p in shapes for a in p.axes if a}
  assert used <= set(axes), used - set(axes)
  assert all(hasattr(model, field) for field in axes.values())
  assert set(model.size_fields()) <= {f for f in SIZES} | {
      "mlp_dim", "num_kv_heads", "head_dim", "num_experts", "expert_mlp_dim",
      "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"}  # Latent attention's.
  assert all(hasattr(model, field) for field in cls.resumable_fields)
  assert model.train_flops_per_token(8) > model.decode_flops_per_token(1) > 0
  model.validate(target.host())
  model.check_sequence_length("train_data.sequence_length", 8)
  changes = cls.tiny(fdl.ordered_arguments(fdl.Config(cls, **SIZES), include_defaults=True), 8)
  assert set(changes) <= set(fdl.ordered_arguments(fdl.Config(cls, **SIZES),
                                                    include_defaults=True))
  assert isinstance(model.holds_attention_scores, bool)
  shape, score_axes = model.attention_scores_shape(2, 8)
  assert len(shape) == len(score_axes)
  assert model.in_saved_layout(model.layout_metadata()) is None
  cache = model.empty_cache(2, 10)
  specs = model.cache_logical_specs()
  assert jax.tree.structure(cache) == jax.tree.structure(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert model.cache_bytes(2, 10) == sum(x.nbytes for x in jax.tree.leaves(cache))
  # Every quantization it lists runs: "int8" forward and backward, "int8_weights" on its
  # weights quantized once, every weight matrix among them.
  # The init and the gradient jitted: one program each to find in the compilation cache, not
  # one per operation (a mixture of experts' are hundreds); the rest stays eager, where its
  # operations are mostly the ones earlier cases already compiled in this process.
  tokens = jnp.zeros((2, 8), jnp.int32)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), tokens))["params"]
  assert "int8" in cls.quantizations and "int8_weights" in cls.quantizations
  int8 = model.clone(quantization="int8")
  grads = jax.jit(jax.grad(lambda p: jnp.sum(int8.apply({"params": p}, tokens))))(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  weights = model.clone(quantization="int8_weights")
  quantized = weights.decode_params(params, model.parameter_logical_specs())
  # A norm's scale over several axes (a query norm of every head's features) is no matrix;
  # a mixture of experts' router stays in float (a rounded router moves tokens).
  matrices = [p for p in shapes if len(p.shape) - (p.axes[:1] == ("layers",)) >= 2
              and "bias" not in p.path and "position" not in p.path and "norm" not in p.path
              and "router" not in p.path]
  assert sum(quantization.is_quantized(leaf) for leaf in jax.tree.leaves(
      quantized, is_leaf=quantization.is_quantized)) == sum(p.repeats for p in matrices)
  np.testing.assert_array_equal(weights.apply({"params": quantized}, tokens),
                                weights.apply({"params": params}, tokens))


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_a_family_is_the_transformer_with_its_choices(name):
  """The family class and an older config's TransformerLM with the family's fields written
  out build one model: the same parameters give the same logits."""
  model = _model(name, rotary_dim=4 if name == "gptj" else None)
  spelled_out = TransformerLM(**SIZES, **CHOICES[name], rotary_dim=model.rotary_dim)
  assert {f: getattr(model, f) for f in CHOICES[name]} == CHOICES[name]
  tokens = jax.random.randint(jax.random.key(3), (2, 12), 1, SIZES["vocab_size"])
  params = nn.meta.unbox(model.init(jax.random.key(1), tokens))["params"]
  np.testing.assert_array_equal(model.apply({"params": params}, tokens),
                                spelled_out.apply({"params": params}, tokens))


def _matmul_weights(model) -> int:
  """Kernels of the real parameter tree (lookups and biases are no matmuls), plus a tied
  unembedding, which reuses the embedding."""
  count = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(_params(model))[0]:
    name = jax.tree_util.keystr(path)
    if len(leaf.shape) >= 2 and "embedding" not in name and "bias" not in name:
      count += math.prod(leaf.shape)
  return count + (model.dim * model.vocab_size if model.tie_embeddings else 0)


def _old_flops_per_step(model, batch: int, length: int) -> float:
  """mfu's formula before the families answered it: 6 x matmul weights x tokens
  + 6 x layers x length x heads x head_dim x tokens (causal attention halved)."""
  head_dim = model.head_dim or model.dim // model.num_heads
  tokens = batch * length
  return 6.0 * _matmul_weights(model) * tokens + 6 * model.num_layers * length * \
      model.num_heads * head_dim * tokens


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_flops_of_each_family_equal_the_old_formula(name):
  model = _model(name, num_kv_heads=2, mlp_dim=48)
  assert mfu.model_flops_per_step(model, 4, 16) == _old_flops_per_step(model, 4, 16)
  assert model.train_flops_per_token(16) * 4 * 16 == pytest.approx(
      _old_flops_per_step(model, 4, 16), rel=1e-12)
  # Decoding: the forward of every weight once, and attention over the whole context (one
  # query sees every position so far: nothing halved).
  head_dim = SIZES["dim"] // SIZES["num_heads"]
  assert model.decode_flops_per_token(10) == 2 * _matmul_weights(model) + (
      4 * SIZES["num_layers"] * 10 * SIZES["num_heads"] * head_dim)


@pytest.mark.parametrize("experiment, expected", [
    # PyCodeTiny's GPT-J rotates 16 of 32 dims per head: 8 of the tiny 16.
    ("PyCodeTiny", {"num_layers": 2, "dim": 64, "num_heads": 4, "head_dim": None,
                    "mlp_dim": None, "num_kv_heads": None, "rotary_dim": 8, "max_length": 64,
                    "dtype": "float32", "block": "parallel"}),
    ("PyCodeLlamaTiny", {"num_layers": 2, "dim": 64, "num_kv_heads": 2, "rotary_dim": None,
                         "mlp_dim": None, "max_length": 64, "norm": "rmsnorm"}),
    ("PyCodeGpt2Tiny", {"num_layers": 2, "dim": 64, "position": "learned", "max_length": 64}),
    # GPT-J-6B rotates 64 of 256 dims per head: a quarter of the tiny 16 is 4.
    ("GptJ6B", {"rotary_dim": 4, "dtype": "float32", "param_dtype": "float32",
                "scan_layers": True}),
    ("Llama1B", {"num_kv_heads": 2, "head_dim": None, "dtype": "float32"}),
])
def test_tiny_shrinks_each_family_as_it_says(experiment, expected):
  model = testing.tiny_config(experiment).model
  assert {name: getattr(model, name) for name in expected} == expected
  fdl.build(model).validate(target.host())


def test_the_fields_of_a_family_are_documented_as_the_transformer_s():
  """--fdl_help lists each field's doc: a family's come from the class they are declared in."""
  base = config_help.field_docs(TransformerLM)
  assert "vocab_size" in base and "remat_policy" in base
  for cls in (family.FAMILIES[name] for name in CHOICES):
    assert config_help.field_docs(cls) == base


def test_an_old_job_s_config_is_the_same_model_as_its_experiment_now():
  """The fixture's config.json (made before the families were classes) names TransformerLM
  with GPT-J's fields; resuming it with --exp=PyCodeTiny is not a model change, while a
  change of a field still is."""
  old = config_files.load(epath.Path(testing.source_root() / "tests" / "fixtures"
                                     / "job_before_house_move" / "config.json"))
  new = testing.tiny_config("PyCodeTiny")
  new.model.dim, new.model.num_layers = 32, 1
  assert fdl.get_callable(old.model) is TransformerLM
  assert fdl.get_callable(new.model) is family.FAMILIES["gptj"]
  assert config_files.incompatible_changes(old, new) == []
  new.model.scan_layers = True  # Resumable: the family says so.
  assert config_files.incompatible_changes(old, new) == []
  new.model.norm = "rmsnorm"
  assert config_files.incompatible_changes(old, new) == ["model.norm: 'layernorm' -> 'rmsnorm'"]
  other = testing.tiny_config("PyCodeLlamaTiny")
  assert "model: <lingvo_lite.models.gptj.GptJ> -> <lingvo_lite.models.llama.Llama>" in \
      config_files.incompatible_changes(testing.tiny_config("PyCodeTiny"), other)


def test_a_size_no_machine_holds_names_the_largest_field():
  model = _model("llama", num_layers=10**9, dim=4096, num_heads=32)
  with pytest.raises(UsageError) as error:
    model.validate(target.host())
  assert str(error.value).startswith("model.num_layers=1000000000: makes ")
  assert str(error.value).endswith("more than any machine holds (1e+14); use smaller model sizes")


def test_learned_positions_bound_the_sequence_length_rotary_ones_do_not():
  with pytest.raises(UsageError, match=r"^train_data.sequence_length=17: exceeds "
                                       r"model.max_length=16 of learned positions$"):
    _model("gpt2").check_sequence_length("train_data.sequence_length", 17)
  _model("llama").check_sequence_length("train_data.sequence_length", 10**6)
