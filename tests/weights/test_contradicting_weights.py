"""Weights that contradict themselves are refused in one line (exit 2), never loaded as garbage;
tensors that no part of the model reads are named in one warning; nothing is written.

The rule (weights/tensor_checks.py, for every source; weights/gguf_header.py for a GGUF file
against itself): float widths convert; an integer or boolean tensor where a float weight belongs
is refused, naming the file and the tensor; a GGUF tensor whose stored type was changed (its
bytes no longer its type's, or a type id that names no type) is refused; a GGUF file whose
metadata is not what its tensors and other keys make it is refused, naming the key and the
tensor (every integer key of every family, in one in-process table); GGUF's quantized types
load. Each case runs `--mode=export` from the weights in this process, as `python -m
lingvo_lite` would (the load, then the export: nothing compiles); one runs as a user runs it, in
a child process from the repository root. Eval and decode of a new job dir from such weights
leave no job dir behind either. Slim weights and a model its source cannot describe get the
same checks."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import gguf
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from lingvo_lite.errors import UsageError
from lingvo_lite.models import format_names
from lingvo_lite.models.format_names import GgufNames
from lingvo_lite.testing import run_cli, run_process, source_root
from lingvo_lite.weights import gguf_header
from tests.weights import tiny_weights
from tests.trained_jobs import tree_digest

F32, F16, I32 = (int(gguf.GGMLQuantizationType.F32), int(gguf.GGMLQuantizationType.F16),
                 int(gguf.GGMLQuantizationType.I32))
NORM = ("model.norm.weight", "output_norm.weight", (64,))  # HF name, GGUF name, GGUF shape.
QUERY = "model.layers.0.self_attn.q_proj.weight"


@dataclasses.dataclass(frozen=True)
class Case:
  """Weights made by `make(folder)` (which returns the --init_from value), exported: exit
  `code`, and one stderr line holding `expected` (an error for 2, a warning for 0)."""

  name: str
  make: Callable[[str], str]
  code: int
  expected: str


def _hf(replaced=None, edit=None, **changes):
  def make(folder: str) -> str:
    tiny_weights.hf_folder(os.path.join(folder, "hf"), tiny_weights.model(**changes), replaced)
    if edit:
      edit(os.path.join(folder, "hf", "model.safetensors"))
    return "hf:hf"
  return make


def _gguf(retype=None, **options):
  def make(folder: str) -> str:
    path = os.path.join(folder, "model.gguf")
    tiny_weights.gguf_file(path, **options)
    if retype:
      tiny_weights.retype_gguf(path, *retype)
    return "gguf:model.gguf"
  return make


def _query(dtype):
  return {QUERY: tiny_weights.tensors(tiny_weights.model())[QUERY].astype(dtype)}


CASES = [
    # Float widths convert (test_float_widths_convert_value_for_value); integers and booleans
    # are refused.
    Case("an int32 tensor", _hf(_query(np.int32)), 2,
         f"hf/model.safetensors: tensor {QUERY} is int32, not floating point, where the model "
         "reads the float weight layer_0/attention/query_kernel; weights convert between float "
         "widths"),
    Case("a bool tensor", _hf({NORM[0]: np.ones(64, bool)}), 2,
         f"hf/model.safetensors: tensor {NORM[0]} is bool, not floating point"),
    Case("an F32 tensor's dtype edited to I32", _hf(edit=lambda file: tiny_weights
                                                     .retype_safetensors(file, QUERY, "I32")),
         2, f"tensor {QUERY} is int32, not floating point"),
    Case("an F32 tensor's dtype edited to F16", _hf(edit=lambda file: tiny_weights
                                                     .retype_safetensors(file, NORM[0], "F16")),
         2, "hf/model.safetensors: not a readable safetensors file"),
    Case("float8, which NumPy cannot hold", _hf({NORM[0]: np.zeros(64, np.uint8)},
                                                edit=lambda file: tiny_weights
                                                .retype_safetensors(file, NORM[0], "F8_E4M3")),
         2, f"hf/model.safetensors: tensor {NORM[0]} is F8_E4M3, which lingvo_lite does not "
         "read"),
    # Tensors nothing reads: one warning, and the rest loads.
    Case("an old Llama's inv_freq and a tied model's lm_head", _hf({
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32),
        "lm_head.weight": tiny_weights.tensors(tiny_weights.model(tie_embeddings=True))[
            "model.embed_tokens.weight"]}, tie_embeddings=True), 0,
         "hf:hf: 2 tensors that no part of the model reads, left unread: lm_head.weight, "
         "model.layers.0.self_attn.rotary_emb.inv_freq"),
    Case("a GGUF tensor nothing reads", _gguf(extra={"blk.0.attn_rot_embd": np.ones(
        8, np.float32)}), 0, "gguf:model.gguf: 1 tensor that no part of the model reads, left "
         "unread: blk.0.attn_rot_embd"),
    # GGUF: quantized types load; a type id changed in place does not.
    Case("a GGUF of Q8_0 matrices", _gguf(quantized=gguf.GGMLQuantizationType.Q8_0), 0, ""),
    Case("a GGUF type id changed to a narrower float", _gguf((NORM[1], NORM[2], F16)), 2,
         "gguf:model.gguf: tensor output_norm.weight is F16 of shape [64], 128 bytes, but the "
         "file holds 256 bytes for it: its type or shape was changed"),
    Case("a GGUF type id changed to an integer", _gguf((NORM[1], NORM[2], I32)), 2,
         "gguf:model.gguf: tensor output_norm.weight is I32, not floating point, where the "
         "model reads the float weight final_norm/scale"),
    Case("a GGUF type id that names no type", _gguf((NORM[1], NORM[2], 99)), 2,
         "gguf:model.gguf: a tensor's type id is no GGUF type"),
    # GGUF metadata sizes that are not the tensors': as a user meets them (every key of every
    # family: test_every_size_key_of_every_family_is_checked_against_the_tensors).
    Case("vocab_size", _gguf(metadata={"vocab_size": 300}), 2,
         "gguf:model.gguf: llama.vocab_size=300 makes dimension 0 of tensor token_embd.weight "
         "300, but its shape is [259, 64]; the file contradicts itself"),
    Case("block_count too small", _gguf(metadata={"block_count": 1}), 2,
         "llama.block_count=1, but the file holds tensor blk.1.attn_norm.weight of block 1"),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_weights_that_contradict_themselves(case, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  source = case.make(str(tmp_path))
  before = tree_digest(tmp_path)
  result = run_cli(["--mode=export", "--exp=PyCodeTiny", f"--init_from={source}",
                    "--job_log_dir=job", "--export_dir=out"])
  assert result.code == case.code, result
  lines = result.stderr.splitlines(keepends=True)
  if case.code == 0:
    assert len(lines) == (1 if case.expected else 0), result.stderr
    if case.expected:
      assert lines[0].startswith("lingvo_lite: warning: ") and lines[0].endswith("\n"), lines
      assert case.expected in lines[0], lines[0]
    return
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  assert case.expected in lines[0], lines[0]
  assert tree_digest(tmp_path) == before  # No job dir, no export, the weights untouched.


# The programs besides export that may make a new job dir from --init_from's weights (serve
# records after loading too, before it listens), with what each needs to run.
READERS = {"eval": ["--fdl.eval_data.num_batches=1"],
           "decode": ["--prompt=x", "--fdl.decode.max_new_tokens=2"]}


@pytest.mark.parametrize("mode", READERS)
def test_a_new_job_dir_is_recorded_only_once_the_weights_are_read(mode, tmp_path, monkeypatch):
  """Weights that cannot be read leave no job dir behind (no config.json of a run that never
  read a weight); readable ones leave the config that a later command finds by the job dir
  alone."""
  monkeypatch.chdir(tmp_path)
  _hf(_query(np.int32))(str(tmp_path))
  tiny_weights.hf_folder(tmp_path / "good", tiny_weights.model())
  before = tree_digest(tmp_path)
  args = [f"--mode={mode}", "--exp=PyCodeTiny", "--job_log_dir=job", *READERS[mode]]
  result = run_cli([*args, "--init_from=hf:hf"])
  assert result.code == 2 and result.stderr.count("\n") == 1, result
  assert f"tensor {QUERY} is int32, not floating point" in result.stderr, result.stderr
  assert tree_digest(tmp_path) == before
  if mode == "eval":  # (A decode compiles for seconds more; eval calls back once it has read.)
    result = run_cli([*args, "--init_from=hf:good"])
    assert result.code == 0, result
    assert {"config.json", "config.txt"} <= set(os.listdir(tmp_path / "job"))


def test_float_widths_convert_value_for_value(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  held = tiny_weights.hf_folder(tmp_path / "hf", replaced={
      "model.norm.weight": np.linspace(-2, 2, 64).astype(np.float16), **_query(
          ml_dtypes.bfloat16)})
  result = run_cli(["--mode=export", "--exp=PyCodeTiny", "--init_from=hf:hf",
                    "--job_log_dir=job", "--export_dir=out"])
  assert result.code == 0 and result.stderr == "", result
  exported = load_file(str(tmp_path / "out" / "model.safetensors"))
  for name in ("model.norm.weight", QUERY):
    np.testing.assert_array_equal(exported[name], held[name].astype(np.float32))


def test_a_gguf_that_contradicts_itself_as_a_user_runs_it(tmp_path):
  """From the repository root, the file named relative to it: one line, exit 2, and the
  file is as it was."""
  tiny_weights.gguf_file(tmp_path / "model.gguf", metadata={"vocab_size": 300})
  before = tree_digest(tmp_path)
  relative = os.path.relpath(tmp_path / "model.gguf", source_root())
  result = run_process(["--mode=print", "--exp=PyCodeTiny", f"--init_from=gguf:{relative}"],
                       timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr == (
      f"lingvo_lite: error: gguf:{relative}: llama.vocab_size=300 makes dimension 0 of tensor "
      "token_embd.weight 300, but its shape is [259, 64]; the file contradicts itself (edited "
      "or damaged): convert the model again\n")
  assert result.stdout == "" and tree_digest(tmp_path) == before


# ------------------------------------------------------------------ every size key of every family

# A small model of each family with GGUF names, as its GGUF architecture can write it: sizes
# all different (a key named wrongly cannot pass by a coincidence of values), heads grouped
# where the family's metadata says so.
SIZES = dict(vocab_size=72, num_layers=2, dim=64, num_heads=4, mlp_dim=96, max_length=128)
FAMILIES = {
    "gptj": dict(rotary_dim=8), "gpt2": {}, "llama": dict(num_kv_heads=2),
    "mistral": dict(num_kv_heads=2, window=128),
    "qwen3": dict(num_kv_heads=2, head_dim=32),
    "gemma3": dict(num_layers=6, num_kv_heads=2, head_dim=32, window=16,
                   query_pre_attention_scalar=32.0),
    "olmo3": dict(num_layers=5, num_kv_heads=2, window=16),
    "mixtral": dict(num_kv_heads=2, num_experts=4, experts_per_token=2),
    "qwen3_moe": dict(num_kv_heads=2, num_experts=4, experts_per_token=2, expert_mlp_dim=80),
    "gpt_oss": dict(num_layers=3, num_kv_heads=2, num_experts=4, experts_per_token=2,
                    expert_mlp_dim=80, window=16),
    # Latent attention's sizes all different; one dense layer, then experts in groups.
    "deepseek_v3": dict(num_layers=3, q_lora_rank=24, kv_lora_rank=40, qk_nope_head_dim=20,
                        qk_rope_head_dim=12, v_head_dim=28, num_experts=8, experts_per_token=2,
                        expert_mlp_dim=80, shared_expert_mlp_dim=160, expert_groups=4,
                        expert_groups_per_token=2, first_dense_layers=1,
                        rotary_scaling="none"),
    "deepseek_v2": dict(num_layers=3, kv_lora_rank=40, qk_nope_head_dim=20,
                        qk_rope_head_dim=12, v_head_dim=28, num_experts=8, experts_per_token=2,
                        expert_mlp_dim=80, shared_expert_mlp_dim=160, first_dense_layers=1,
                        rotary_scaling="none"),
}


def _init_shapes(model) -> dict[str, tuple[int, ...]]:
  """Each GGUF tensor's shape from the model's parameters as its init makes them (the shapes
  the loader places into), through the family's names: what `expected_shapes` must say."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from lingvo_lite.models.format_names import HfNames  # pylint: disable=g-import-not-at-top
  params = nn.meta.unbox(jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.zeros((1, 1), np.int32)))["params"])
  flat = {"/".join(str(key.key) for key in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  hf = {tensor.name: tensor.format_shape([flat[path] for path in tensor.paths])
        for tensor in format_names.bound(model, HfNames).tensors()}
  return {name: tensor.shape_from_hf(hf[tensor.hf_names()[0]])
          for name, tensor in format_names.bound(model, GgufNames).tensors().items()}


def test_every_size_key_of_every_family_is_checked_against_the_tensors():
  """For every family with GGUF names and every integer key its metadata holds, the key
  doubled is either refused in one line naming the key and its value, or read by the model as
  the file says (a setting no tensor sizes, a head count that GPT-2's fused matrix hides): the
  model a file describes never contradicts its tensors or its keys in silence. The shapes the
  check derives (`expected_shapes`, from `parameter_shapes`) are the model's own init's."""
  readers = {family.family_name: (family, names)
             for family, names in format_names.families_with(GgufNames)}
  assert set(readers) == set(FAMILIES)  # A new family gets a row here.
  for family_name, changes in FAMILIES.items():
    family, names_class = readers[family_name]
    model = family(**{**SIZES, **changes})
    names = names_class(model)
    names.check_writable()
    arch = names.architecture
    shapes = dict(gguf_header.expected_shapes(model))
    if family_name == "olmo3":  # One init per kind of family: the slow part of this test.
      assert shapes == _init_shapes(model)
    metadata = {"general.architecture": arch,
                **{f"{arch}.{key}": value for key, value in names.metadata().items()}}
    fields = gguf_header.model_fields(family, names_class, metadata, shapes, "gguf:m.gguf")
    assert names_class(family(**fields)).metadata() == names.metadata(), family_name
    sizes = [key for key, value in names.metadata().items()
             if isinstance(value, int) and not isinstance(value, bool)]
    for key in sizes:
      lie = 2 * metadata[f"{arch}.{key}"]
      try:
        read = gguf_header.model_fields(family, names_class, {**metadata, f"{arch}.{key}": lie},
                                        shapes, "gguf:m.gguf")
      except UsageError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("gguf:m.gguf: "), message
        assert f"{arch}.{key}={lie}" in message and "contradicts itself" in message, message
        continue
      assert names_class(family(**read)).metadata()[key] == lie, (family_name, key)


def test_a_model_its_source_cannot_describe_is_one_line_before_a_tensor_is_read(tmp_path):
  """A model whose fields were set apart from the folder's (what `--fdl.model.output_bias=True`
  over a Llama folder makes) has parameters no tensor holds: one line naming the source, the
  parameters and the fields the format cannot say, never "a bug"."""
  from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
  from lingvo_lite.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.hf_checkpoint import HfCheckpoint  # pylint: disable=g-import-not-at-top
  tiny_weights.hf_folder(tmp_path / "hf", tiny_weights.model())
  model = tiny_weights.model(output_bias=True)
  partitioner = Partitioner()
  abstract = MeshParams(model, 16, partitioner, partitioner.make_mesh()).abstract
  with pytest.raises(UsageError) as error:
    HfCheckpoint(str(tmp_path / "hf")).read_params(model, abstract)
  assert str(error.value) == (
      f"hf:{tmp_path / 'hf'}: the source holds no tensor for this model's parameter output/bias "
      "(model.output_bias=True: a llama checkpoint cannot say it, so the source is not this "
      "model); leave the model's fields as the source sets them (drop the --fdl.model "
      "overrides that change them)")


def test_slim_weights_get_the_checks_every_source_gets(tmp_path, capsys):
  """Slim weights (an orbax tree of the parameters) against the model: an integer leaf where
  a float weight belongs is refused naming it; a leaf nothing reads is named in one warning
  and the rest loads as written."""
  import json  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from lingvo_lite import outputs  # pylint: disable=g-import-not-at-top
  from lingvo_lite.checkpoints.params import MeshParams  # pylint: disable=g-import-not-at-top
  from lingvo_lite.partitioning import Partitioner  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights import slim_weights  # pylint: disable=g-import-not-at-top
  model = tiny_weights.model()
  partitioner = Partitioner()
  mesh_params = MeshParams(model, 16, partitioner, partitioner.make_mesh())
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda leaf: rng.standard_normal(leaf.shape).astype(np.float32),
                        mesh_params.abstract)
  norm = {"scale": params["final_norm"]["scale"].astype(np.int32)}
  for name, tree, words in (
      ("int32", {**params, "final_norm": norm},
       "slim_int32: tensor final_norm/scale is int32, not floating point, where the model reads "
       "the float weight final_norm/scale [64]"),
      ("extra", {**params, "notes": {"scale": np.ones(3, np.float32)}},
       "slim_extra: 1 tensor that no part of the model reads, left unread: notes/scale")):
    folder = tmp_path / f"slim_{name}"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save((folder / slim_weights.PARAMS_DIR).absolute(), tree)
    checkpointer.wait_until_finished()
    checkpointer.close()
    (folder / "manifest.json").write_text(json.dumps({
        "schema": outputs.schema(slim_weights.KIND), "dtype": "float32", "scan_layers": False}))
    capsys.readouterr()
    if name == "int32":
      with pytest.raises(UsageError) as error:
        slim_weights.SlimCheckpoint(str(folder)).load_params(mesh_params)
      assert words in str(error.value) and "\n" not in str(error.value), error.value
      continue
    loaded, _ = slim_weights.SlimCheckpoint(str(folder)).load_params(mesh_params)
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, loaded), params)
