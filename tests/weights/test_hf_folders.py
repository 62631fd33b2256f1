"""Hugging Face folders in and out: tiny random models of every family, written by
`transformers`' `save_pretrained`, load into lingvo_lite and compute transformers' logits;
`--mode=export` writes them back bit for bit, and a trained job's export computes in
transformers what it computes here.

The reference is transformers itself (torch CPU, float32, eager attention) on the same folder.
Each model's norms and biases are perturbed away from their initial values (ones and zeros
hide a swapped scale or a missing bias), its weights are scaled so that logits are O(1) (at
the default 0.02 initialization they are ~1e-2 and any error looks small), and the prompt is
600 tokens long: a rotary layout or window bug shows only at long distances.
"""

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.data import pretrained_tokenizer, vocabulary_tokenizer
from lingvo_lite.data.sentencepiece_training import train_sentencepiece
from lingvo_lite.errors import UsageError
from lingvo_lite.models import checkpoint_names
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.testing import kill_9_when, run_cli
from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
from lingvo_lite.weights.hf_checkpoint import HfCheckpoint, names_of
from tasks.pycode import read_documents, stdlib_dir
from tests.weights import hf_reference
from tests.weights.hf_reference import TOLERANCE, export as _export, load as _load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT_LENGTH = 600
VOCAB = 320  # At least PyCodeTiny's 259 (the export tests run it with these folders).

# Each family's tiny config: grouped-query heads where the family has them, a partial rotary
# for GPT-J, a window shorter than the prompt for Mistral, biases and tied embeddings on one
# Llama.
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, rms_norm_eps=1e-5, rope_theta=5000.0,
        max_position_embeddings=1024)),
    "llama_tied_biased": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=96, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
        max_position_embeddings=1024)),
    # Llama 3.1's rotary scaling, with an original context short enough (64) that the
    # rescaled band of frequencies matters within the prompt.
    "llama3_scaled": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=1024, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, sliding_window=100, max_position_embeddings=1024)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(
        n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=1024)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=64, n_layer=2, n_head=4, n_positions=1024)),
}


def _reference_model(case: str):
  return hf_reference.reference_model(CASES[case], VOCAB, bos_token_id=0, eos_token_id=1)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """case -> (its folder, transformers' float32 logits of the prompt)."""
  return hf_reference.saved(
      tmp_path_factory.mktemp("hf"), CASES, _reference_model,
      lambda case, model: hf_reference.their_logits(model, _prompt()))


def _prompt() -> np.ndarray:
  return np.random.default_rng(0).integers(0, VOCAB, (1, PROMPT_LENGTH))


def _logits(model, params) -> np.ndarray:
  return hf_reference.our_logits(model, params, _prompt())


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers(folders, case, scan_layers):
  folder, expected = folders[case]
  model, params, _ = _load(folder, scan_layers=scan_layers)
  assert names_of(model).model_type == json.loads((folder / "config.json").read_text())[
      "model_type"]
  hf_reference.assert_close(_logits(model, params), expected, case)


def test_the_mistral_window_is_read_and_matters(folders):
  # Without the window (the whole context), the same weights compute other logits past it.
  folder, expected = folders["mistral"]
  model, params, _ = _load(folder)
  assert model.window == 100
  wide, wide_params, _ = _load(folder, window=PROMPT_LENGTH)
  beyond = np.abs(_logits(wide, wide_params) - expected)[:, 100:].max()
  assert beyond > 1e-2
  assert np.abs(_logits(wide, wide_params) - expected)[:, :100].max() < TOLERANCE


def test_llama3_scaling_is_read_and_matters(folders):
  # Without the scaling the same weights compute other logits: the rescaled frequencies
  # are what makes the match above.
  folder, expected = folders["llama3_scaled"]
  model, params, _ = _load(folder)
  assert (model.rotary_scaling, model.rotary_original_max_length) == ("llama3", 64)
  plain, plain_params, _ = _load(folder, rotary_scaling="none")
  assert np.abs(_logits(plain, plain_params) - expected).max() > 1e-2


def test_config_fields_come_from_config_json(folders):
  family, fields = HfCheckpoint(str(folders["llama"][0])).model_fields()
  assert family.family_name == "llama"
  assert fields == {"vocab_size": VOCAB, "num_layers": 2, "dim": 64, "num_heads": 4,
                    "num_kv_heads": 2, "head_dim": 16, "mlp_dim": 96, "norm_eps": 1e-5,
                    "rotary_base": 5000.0, "max_length": 1024, "tie_embeddings": False,
                    "attention_bias": False, "mlp_bias": False}
  _, gptj = HfCheckpoint(str(folders["gptj"][0])).model_fields()
  assert (gptj["rotary_dim"], gptj["num_heads"], gptj["dim"]) == (8, 4, 64)


def test_the_fingerprint_is_the_tensors(folders, tmp_path):
  # The same tensors in another folder, even in shards, give the same digest; other values
  # another one.
  _, _, loaded = _load(folders["llama"][0])
  model = _reference_model("llama")
  model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  _, _, again = _load(tmp_path / "sharded")
  assert loaded.split()[1] == again.split()[1]
  with torch.no_grad():
    model.model.norm.weight.add_(1.0)
  model.save_pretrained(tmp_path / "changed")
  _, _, changed = _load(tmp_path / "changed")
  assert changed.split()[1] != loaded.split()[1]


def test_sharded_and_bfloat16_folders_load(folders, tmp_path):
  model = _reference_model("llama").to(torch.bfloat16)
  model.save_pretrained(tmp_path / "bf16", max_shard_size="20KB")
  loaded_model, params, _ = _load(tmp_path / "bf16")
  # float32 parameters holding the bfloat16 values exactly.
  expected = model.model.layers[1].mlp.up_proj.weight.detach().float().numpy()
  np.testing.assert_array_equal(np.asarray(params["layer_1"]["mlp"]["wi_gate"]["kernel"]),
                                expected.T)
  assert loaded_model.param_dtype == "float32"


def test_gpt2_names_without_the_transformer_prefix_load(folders, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  folder, expected = folders["gpt2"]
  shutil.copytree(folder, tmp_path / "hub")
  tensors = load_file(str(folder / "model.safetensors"))
  save_file({name.removeprefix("transformer."): value for name, value in tensors.items()},
            str(tmp_path / "hub" / "model.safetensors"))
  model, params, _ = _load(tmp_path / "hub")
  assert np.abs(_logits(model, params) - expected).max() < TOLERANCE


def test_tensor_names_convert_both_ways():
  # Each kind of tensor: ours -> the format's -> ours is the identity, in the format's shape.
  rng = np.random.default_rng(0)
  kernel, out = rng.normal(size=(8, 2, 3)), rng.normal(size=(2, 3, 8))
  query = checkpoint_names.TensorName("q", ("a",))
  assert query.from_ours([kernel]).shape == (6, 8)
  np.testing.assert_array_equal(query.to_ours(query.from_ours([kernel]), [(8, 2, 3)], "x")[0],
                                kernel)
  output = checkpoint_names.TensorName("o", ("a",), 2)
  assert output.from_ours([out]).shape == (8, 6)
  fused = checkpoint_names.TensorName("qkv", ("q", "k", "v"), 1, False)
  parts = [kernel, kernel + 1, kernel + 2]
  assert fused.from_ours(parts).shape == (8, 18)
  for got, want in zip(fused.to_ours(fused.from_ours(parts), [(8, 2, 3)] * 3, "x"), parts):
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ bad input

def _one_line(error: Exception) -> str:
  message = str(error)
  assert "\n" not in message and "Traceback" not in message, message
  return message


def test_a_folder_without_config_json_is_refused(folders, tmp_path):
  shutil.copytree(folders["llama"][0], tmp_path / "no_config")
  os.remove(tmp_path / "no_config" / "config.json")
  with pytest.raises(UsageError) as error:
    HfCheckpoint(str(tmp_path / "no_config")).model_fields()
  assert "config.json: no such file" in _one_line(error.value)
  with pytest.raises(UsageError) as error:
    HfCheckpoint(str(tmp_path / "missing")).model_fields()
  assert "no such folder" in _one_line(error.value)


def test_a_truncated_safetensors_file_is_refused(folders, tmp_path):
  shutil.copytree(folders["llama"][0], tmp_path / "cut")
  data = (tmp_path / "cut" / "model.safetensors").read_bytes()
  (tmp_path / "cut" / "model.safetensors").write_bytes(data[:len(data) // 2])
  with pytest.raises(UsageError) as error:
    _load(tmp_path / "cut")
  assert "model.safetensors" in _one_line(error.value) and "truncated" in str(error.value)


def test_a_shape_that_does_not_match_is_refused_naming_the_tensor(folders):
  with pytest.raises(UsageError) as error:
    _load(folders["llama"][0], mlp_dim=128)
  message = _one_line(error.value)
  assert "model.layers.0.mlp.gate_proj.weight has shape [96, 64]" in message
  assert "[128, 64]" in message
  with pytest.raises(UsageError) as error:
    _load(folders["llama"][0], num_layers=3)
  assert "no tensor model.layers.2." in _one_line(error.value)


@pytest.mark.parametrize("change, words", [
    ({"model_type": "bert"}, "model_type='bert': no lingvo_lite family reads it; supported:"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}},
     "rope_scaling.rope_type='longrope': lingvo_lite's rotary positions implement only"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"sliding_window": 64}, "sliding_window=64"),
    ({"num_hidden_layers": None}, "no 'num_hidden_layers'"),
    # A value of the wrong JSON type: named, never converted ("yes" is not true).
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps='tiny': must be a number"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings='yes': must be true or false"),
    ({"rope_parameters": 5}, "rope_parameters=5: must be a JSON object"),
    ({"rope_parameters": {"rope_theta": "x"}}, "rope_theta='x': must be a number"),
])
def test_unsupported_settings_are_refused_naming_the_key(folders, tmp_path, change, words):
  shutil.copytree(folders["llama"][0], tmp_path / "changed")
  config = json.loads((tmp_path / "changed" / "config.json").read_text())
  config.update(change)
  (tmp_path / "changed" / "config.json").write_text(json.dumps(config))
  with pytest.raises(UsageError) as error:
    HfCheckpoint(str(tmp_path / "changed")).model_fields()
  assert words in _one_line(error.value)


# ------------------------------------------------------------------------------ warm start

# PyCodeTiny's vocabulary (bytes and 3 specials) and the sizes --fiddler=tiny gives a Llama.
TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.train.log_every_steps=1", "--fdl.checkpoint.every_steps=2",
        "--fdl.checkpoint.max_to_keep=None", "--fdl.optimizer.decay_steps=20",
        "--fdl.optimizer.warmup_steps=2"]


def _losses(job):
  with open(job / "metrics.jsonl") as f:
    return {row["step"]: row["loss"] for row in map(json.loads, f)}


@pytest.mark.slow
@pytest.mark.compares_a_child
def test_a_warm_start_from_hf_then_kill_9_resumes_from_the_jobs_own_checkpoint(tmp_path):
  """--init_from=hf:PATH sets the model from config.json and its parameters from the
  safetensors; a run killed after its step-4 save resumes from its own checkpoint, without
  reading the weights again, on the uninterrupted run's curve."""
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=259, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, intermediate_size=256, max_position_embeddings=128)
  transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  args = ["--fdl.train.steps=8", f"--init_from=hf:{tmp_path / 'llama'}"]
  first = run_cli([*TINY, *args, f"--job_log_dir={whole}"])
  assert first.code == 0, first.stderr[-3000:]
  assert f"with the parameters of hf:{tmp_path / 'llama'} sha256:" in first.stdout
  with open(whole / "run_info.jsonl") as f:
    assert json.loads(f.readline())["initialized_from"].startswith("hf:")
  config_text = (whole / "config.txt").read_text()
  assert "model = <lingvo_lite.models.llama.Llama>" in config_text
  assert re.search(r"^model.vocab_size = 259 +# .*llama/config.json$", config_text,
                   re.M), config_text

  kill_9_when([*TINY, *args, "--fdl.train.steps=1000", f"--job_log_dir={parts}"],
              parts / "checkpoints" / "4")
  # The weights are not read again: emptied, they would fail the run (config.json, which
  # sets the model, stays).
  (tmp_path / "llama" / "model.safetensors").write_bytes(b"")
  resumed = run_cli([*TINY, *args, f"--job_log_dir={parts}", "--fdl.train.steps=1000",
                     "--fdl.train.steps=8"])
  assert resumed.code == 0, resumed.stderr[-2000:]
  assert "resumed from step" in resumed.stdout and "with the parameters of" not in resumed.stdout
  assert _losses(parts) == _losses(whole)


# ------------------------------------------------------------------------------ decode

@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama", "mistral", "gptj", "gpt2"])
def test_32_greedy_tokens_through_decode_equal_transformers_generate(folders, case, tmp_path):
  hf_reference.assert_greedy_decode_equals_generate(
      _reference_model(case), folders[case][0], _prompt()[0, :40].tolist(), tmp_path)


# ------------------------------------------------------------------------------ export

@pytest.mark.parametrize("case", sorted(CASES))
def test_hf_in_then_out_gives_the_same_tensors_bit_for_bit(folders, case, tmp_path):
  # A job dir without a checkpoint exports its source's parameters (train.init_from).
  folder = folders[case][0]
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{folder}")
  assert result.code == 0, result.stderr[-3000:]
  assert "train.init_from" in result.stdout and "has no checkpoint yet" in result.stdout
  hf_reference.assert_same_tensors(folder, tmp_path / "out")
  config = json.loads((tmp_path / "out" / "config.json").read_text())
  assert config["model_type"] == json.loads((folder / "config.json").read_text())["model_type"]
  # The job dir records the config it exported with: a later program names just the job.
  assert (tmp_path / "job" / "config.json").exists()


def test_a_bfloat16_folder_exports_bit_for_bit_in_bfloat16_and_sharded(tmp_path):
  model = _reference_model("llama").to(torch.bfloat16)
  model.save_pretrained(tmp_path / "bf16")
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{tmp_path / 'bf16'}",
                   "--export_dtype=bfloat16", "--export_shard_bytes=40000")
  assert result.code == 0, result.stderr[-3000:]
  index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  hf_reference.assert_same_tensors(tmp_path / "bf16", tmp_path / "out")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
  assert reloaded.dtype == torch.bfloat16


def _job_logits(job, tokens):
  """Our model's logits from the job's config and its newest checkpoint, read by orbax."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from lingvo_lite import executor  # pylint: disable=g-import-not-at-top
  from lingvo_lite.config import files as config_files  # pylint: disable=g-import-not-at-top
  setup = executor.build(config_files.load(job / "config.json"))
  step = max(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())
  state = ocp.StandardCheckpointer().restore((job / "checkpoints" / str(step) / "default")
                                            .absolute())
  with jax.default_matmul_precision("highest"):
    return np.asarray(setup.model.apply({"params": state["params"]}, tokens)), step


def test_a_trained_gptj_job_exports_what_transformers_computes_the_same(tiny_job, tmp_path):
  # The shared tiny job: PyCodeTiny (GPT-J) trained 20 steps, its embedding bias no longer
  # zero (the export folds it into the rows).
  job = tiny_job / "runs" / "tiny"
  out = tmp_path / "gptj_hf"
  result = run_cli(["--mode=export", f"--job_log_dir={job}", f"--export_dir={out}"])
  assert result.code == 0, result.stderr[-3000:]
  # As long as the model's context (transformers' GPT-J has a sin/cos table of n_positions).
  length = json.loads((out / "config.json").read_text())["n_positions"]
  tokens = np.random.default_rng(1).integers(0, 259, (2, length))
  ours, step = _job_logits(job, tokens)
  assert f"exported step {step} of {job}" in result.stdout
  reference = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
  with torch.no_grad():
    theirs = reference(torch.tensor(tokens)).logits.numpy()
  assert np.abs(ours - theirs).max() < TOLERANCE
  # The job's byte vocabulary went along as tokenizer files (data/vocabulary_tokenizer.py):
  # transformers' tokenizer gives the ids the job trained on, and their text back.
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  text = "def f(x):\n    return x  # π ≈ 3.14 </s>\n"
  ids = [b + 3 for b in text.encode("utf-8")]
  # "</s>" in a text is text to lingvo_lite, EOS to transformers unless told otherwise.
  assert tokenizer(text, add_special_tokens=False, split_special_tokens=True)[
      "input_ids"] == ids
  assert tokenizer.decode(ids) == text and (tokenizer.eos_token_id, tokenizer.pad_token_id) == (
      1, 0)
  # Again into the same folder: lingvo_lite's earlier export is replaced.
  again = run_cli(["--mode=export", f"--job_log_dir={job}", f"--export_dir={out}"])
  assert again.code == 0 and "replaced the earlier export" in again.stdout, again.stderr


def test_a_sentencepiece_vocabulary_exports_as_a_tokenizer_transformers_reads(tmp_path):
  """What an export of a SentencePiece job writes (data/vocabulary_tokenizer.py, through
  pretrained_tokenizer.write_hf_files as export does): transformers' AutoTokenizer gives the
  converted tokenizer's ids, and its text back."""
  model = tmp_path / "sp.model"
  train_sentencepiece(iter(read_documents(stdlib_dir(), "train")[::32]), str(model), 512,
                      "unigram")
  files = vocabulary_tokenizer.sentencepiece_files(model.read_bytes(), "sp.model")
  folder = tmp_path / "hf"
  folder.mkdir()
  pretrained_tokenizer.write_hf_files(files, str(folder), 256)
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
  processor = spm.SentencePieceProcessor(model_file=str(model))
  for document in read_documents(stdlib_dir(), "validation")[:3]:
    text = document.decode("utf-8")[:3000]
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ids == files.encode(text)
    assert tokenizer.decode(ids) == text == processor.DecodeIds(ids)
  assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.unk_token_id,
          tokenizer.pad_token_id) == ("</s>", 1, 2, 0)


def _gguf_model(path):
  """The model and the parameters our reader reads from the GGUF file at `path`."""
  source = GgufCheckpoint(str(path))
  family, fields = source.model_fields()
  model = family(**fields)
  abstract = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh()).abstract
  params, _ = source.read_params(model, abstract)
  return model, params


def _gguf_logits(path, tokens):
  """Our reader's float32 logits of `tokens` for the model in the GGUF file at `path`."""
  model, params = _gguf_model(path)
  with jax.default_matmul_precision("highest"):
    return np.asarray(model.apply({"params": params}, tokens))


def test_folders_exported_as_gguf_give_transformers_the_same_logits(folders, tmp_path):
  # Llama (grouped-query heads) and Mistral with no window inside its context write the
  # llama architecture, GPT-2 its own; transformers reads each file with its own GGUF loader.
  # Its gpt2 loader takes the vocabulary size from a token list, which a model without a
  # pretrained tokenizer has not: given here as the folder's config says.
  for case, extra, architecture in (("llama", [], "llama"),
                                    ("mistral", ["--fdl.model.window=1024"], "llama"),
                                    ("gpt2", [], "gpt2")):
    folder, expected = folders[case]
    out = tmp_path / f"{case}_gguf"
    result = _export(tmp_path / f"{case}_job", out, f"--init_from=hf:{folder}",
                     "--export_format=gguf", *extra)
    assert result.code == 0, result.stderr[-3000:]
    assert f"model.gguf ({architecture})" in result.stdout, result.stdout
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), gguf_file="model.gguf", dtype=torch.float32, attn_implementation="eager",
        **({"vocab_size": VOCAB} if case == "gpt2" else {})).eval()
    # Not a Mistral there: transformers would give one its default 4096-token window, which
    # the first 100 positions compared below could not show.
    assert getattr(exported.config, "sliding_window", None) is None, exported.config
    with torch.no_grad():
      theirs = exported(torch.tensor(_prompt()[:, :100])).logits.numpy()
    assert np.abs(theirs - expected[:, :100]).max() < TOLERANCE, case
  # F16: our reader gives the folder's matrices rounded to float16 (norms stay F32, as
  # llama.cpp writes them), and transformers loads the same rounded weights: equal logits.
  out = tmp_path / "llama_f16"
  result = _export(tmp_path / "llama_job", out, f"--init_from=hf:{folders['llama'][0]}",
                   "--export_format=gguf", "--export_dtype=float16")
  assert result.code == 0, result.stderr[-3000:]
  model, params = _gguf_model(out / "model.gguf")
  _, original, _ = _load(folders["llama"][0])
  for read, source in zip(jax.tree.leaves(params), jax.tree.leaves(original)):
    expected = np.asarray(source)
    if expected.ndim > 1:
      expected = expected.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(read), expected)
  exported = transformers.AutoModelForCausalLM.from_pretrained(
      str(out), gguf_file="model.gguf", dtype=torch.float32, attn_implementation="eager").eval()
  with torch.no_grad():
    theirs = exported(torch.tensor(_prompt()[:, :100])).logits.numpy()
  with jax.default_matmul_precision("highest"):
    ours = np.asarray(model.apply({"params": params}, _prompt()[:, :100]))
  assert np.abs(ours - theirs).max() < TOLERANCE
  assert np.abs(ours - folders["llama"][1][:, :100]).max() > TOLERANCE  # It is rounded.


def test_a_gptj_exported_as_gguf_reads_back_as_the_same_model(folders, tmp_path):
  # transformers reads no GPT-J GGUF: our reader is the other end (llama.cpp's gptj names and
  # metadata, partial interleaved rotary), checked against transformers' logits of the folder.
  folder, expected = folders["gptj"]
  out = tmp_path / "gguf"
  result = _export(tmp_path / "job", out, f"--init_from=hf:{folder}", "--export_format=gguf")
  assert result.code == 0, result.stderr[-3000:]
  assert "model.gguf (gptj)" in result.stdout, result.stdout
  family, fields = GgufCheckpoint(str(out / "model.gguf")).model_fields()
  assert family.family_name == "gptj" and fields["rotary_dim"] == 8, fields
  ours = _gguf_logits(out / "model.gguf", _prompt())
  assert np.abs(ours - expected).max() < TOLERANCE


@pytest.mark.parametrize("case, args, words", [
    ("mistral", [], "a mistral model with a sliding window of 100"),
    ("llama3_scaled", [], "rope scaling 'llama3'"),
    ("llama", ["--export_dtype=bfloat16"], "--export_dtype=bfloat16: not a dtype the gguf"),
])
def test_what_gguf_cannot_express_is_one_line_and_writes_nothing(folders, tmp_path, case, args,
                                                                 words):
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{folders[case][0]}",
                   "--export_format=gguf", *args)
  hf_reference.assert_refused_in_one_line(result, words, tmp_path / "out")


def test_slim_weights_are_the_parameters_alone_and_read_back_onto_a_mesh(tiny_job, tmp_path):
  """--export_format=slim: the job's parameters without the optimizer state (float32, or
  bfloat16 at half the bytes, or int8 weight matrices with their scales at about a quarter);
  --init_from=slim:PATH reads them into this model's shardings and dtype: float32 exactly,
  bfloat16 as the rounded values, int8 as values times scales (within half a step of each
  weight's channel)."""
  from lingvo_lite import executor  # pylint: disable=g-import-not-at-top
  from lingvo_lite.config import files as config_files  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  job = tiny_job / "runs" / "tiny"
  sizes, array_bytes = _slim_exports(job, tmp_path)
  # The arrays themselves: bfloat16 half the bytes; int8 the weight matrices at a quarter, with
  # the tiny model's norms, biases and scales beside them (not quite a quarter in all).
  assert array_bytes["bfloat16"] * 2 == array_bytes["float32"], array_bytes
  assert array_bytes["int8"] < 0.3 * array_bytes["float32"], array_bytes
  # On disk each file also holds the checkpoint's own metadata (its size varies with the
  # writer's threads): the order still holds.
  assert sizes["int8"] < sizes["bfloat16"] < 0.6 * sizes["float32"], sizes
  _, step = _job_logits(job, np.zeros((1, 4), np.int32))
  saved = ocp.StandardCheckpointer().restore(
      (job / "checkpoints" / str(step) / "default").absolute())["params"]
  setup = executor.build(config_files.load(tmp_path / "slim_float32" / "config.json"))
  mesh_params = MeshParams(setup.model, setup.train_data.sequence_length, setup.partitioner,
                           setup.partitioner.make_mesh())
  for dtype in ("float32", "bfloat16", "int8"):
    _assert_slim_reads_back(tmp_path / f"slim_{dtype}", dtype, mesh_params, saved, step)
  _assert_slim_refusals(tmp_path, mesh_params)


def _slim_exports(job, tmp_path):
  """The job exported as slim weights in each dtype, to tmp_path/slim_<dtype>: each file's
  bytes on disk and its arrays' bytes, by dtype."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  sizes, array_bytes = {}, {}
  for dtype in ("float32", "bfloat16", "int8"):
    out = tmp_path / f"slim_{dtype}"
    result = run_cli(["--mode=export", f"--job_log_dir={job}", f"--export_dir={out}",
                      "--export_format=slim", f"--export_dtype={dtype}"])
    assert result.code == 0, result.stderr[-3000:]
    assert "(the checkpoint step: " in result.stdout and "on disk" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    sizes[dtype] = manifest["files"]["params"]
    assert manifest["dtype"] == dtype and (out / "config.json").exists()
    array_bytes[dtype] = sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(
        ocp.StandardCheckpointer().restore((out / "params").absolute())))
  return sizes, array_bytes


def _assert_slim_reads_back(folder, dtype, mesh_params, saved, step):
  """The slim `folder` of `dtype` read onto the mesh: the `saved` parameters of checkpoint
  `step`, float32 exactly, bfloat16 rounded, int8 within half a step of each channel."""
  from lingvo_lite.weights.slim_weights import SlimCheckpoint  # pylint: disable=g-import-not-at-top
  params, what = SlimCheckpoint(str(folder)).load_params(mesh_params)
  assert what.startswith("slim:") and f"step {step}" in what
  rounded = 0
  for ours, theirs in zip(jax.tree.leaves(params), jax.tree.leaves(saved)):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    if dtype == "int8" and theirs.ndim >= 2:  # A weight matrix: rounded per channel.
      step_size = np.max(np.abs(theirs)) / 127.5  # At least each channel's own step.
      assert np.all(np.abs(ours - theirs) <= step_size * 0.5 * (1 + 1e-5)), ours.shape
      rounded += not np.array_equal(ours, theirs)
      continue
    expected = theirs if dtype != "bfloat16" else np.asarray(
        jnp.asarray(theirs, jnp.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(ours, expected)
  assert (rounded > 0) == (dtype == "int8")


def _assert_slim_refusals(tmp_path, mesh_params):
  """A model of other shapes, and a truncated copy of tmp_path/slim_float32: one line each."""
  from lingvo_lite import executor  # pylint: disable=g-import-not-at-top
  from lingvo_lite.config import files as config_files  # pylint: disable=g-import-not-at-top
  from lingvo_lite.weights.slim_weights import SlimCheckpoint  # pylint: disable=g-import-not-at-top
  other = executor.build(config_files.load(tmp_path / "slim_float32" / "config.json"))
  wider = MeshParams(other.model.clone(parent=None, dim=other.model.dim * 2),
                     other.train_data.sequence_length, other.partitioner,
                     other.partitioner.make_mesh())
  with pytest.raises(UsageError) as error:
    SlimCheckpoint(str(tmp_path / "slim_float32")).load_params(wider)
  assert "tensor embedding has shape" in str(error.value) and "\n" not in str(error.value)
  # A truncated data file (a copy cut short) is one line too, not orbax's traceback.
  truncated = shutil.copytree(tmp_path / "slim_float32", tmp_path / "slim_truncated")
  largest = max((p for p in (truncated / "params").rglob("*") if p.is_file()),
                key=lambda p: p.stat().st_size)
  os.truncate(largest, largest.stat().st_size // 2)
  with pytest.raises(UsageError) as error:
    SlimCheckpoint(str(truncated)).load_params(mesh_params)
  message = str(error.value)
  assert message.startswith(f"train.init_from=slim:{truncated}: its parameters cannot be read "
                            "(") and "\n" not in message, message
  assert message.endswith("the folder is truncated or damaged: copy or export it again")


@pytest.mark.parametrize("args, words", [
    (["--exp=PyCodeGpt2Tiny"],
     "model.tied_output_scale='rsqrt_dim': a Hugging Face gpt2 model cannot express it"),
    (["--exp=PyCodeTiny", "--fiddler=tiny", "--fdl.model.norm='rmsnorm'"],
     "model.norm='rmsnorm': a Hugging Face gptj model cannot express it"),
    (["--exp=PyCodeTiny", "--export_format=onnx"],
     "--export_format=onnx: unknown format; valid choices: hf, gguf, slim"),
    (["--exp=PyCodeGpt2Tiny", "--export_format=gguf"],
     "model.tied_output_scale='rsqrt_dim': a Hugging Face gpt2 model cannot express it"),
    (["--exp=PyCodeTiny", "--export_dtype=float16"],
     "--export_dtype=float16: not a dtype the hf export writes; valid choices: float32, "
     "bfloat16"),
    (["--exp=PyCodeTiny", "--fiddler=tiny"], "no checkpoint in"),
])
def test_what_cannot_be_exported_is_one_line_and_writes_nothing(tmp_path, args, words):
  (tmp_path / "job").mkdir()
  result = run_cli(["--mode=export", f"--job_log_dir={tmp_path / 'job'}",
                    f"--export_dir={tmp_path / 'out'}", *args])
  lines = result.stderr.strip().splitlines()
  assert result.code == 2 and len(lines) == 1, result.stderr[-2000:]
  assert words in lines[0], lines[0]
  assert not (tmp_path / "out").exists()


def test_an_export_never_overwrites_what_lingvo_lite_did_not_write(folders, tmp_path):
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "notes.txt").write_text("mine")
  result = _export(tmp_path / "job", tmp_path / "out", f"--init_from=hf:{folders['gpt2'][0]}")
  assert result.code == 2 and "never replaces them" in result.stderr, result.stderr
  assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt"]
