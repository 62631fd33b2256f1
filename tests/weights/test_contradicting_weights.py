"""Weights that contradict themselves are refused in one line (exit 2), never loaded as garbage;
tensors that no part of the model reads are named in one warning; nothing is written.

The rule (weights/placing.py, weights/gguf_checkpoint.py): float widths convert; an integer or
boolean tensor where a float weight belongs is refused, naming the file and the tensor; a GGUF
tensor whose stored type was changed (its bytes no longer its type's, or a type id that names no
type) is refused; a GGUF file whose metadata sizes are not its tensors' is refused, naming the
key and the tensor; GGUF's quantized types load. Each case runs `--mode=export` from the
weights in this process, as `python -m lingvo_lite` would (the load, then the export: nothing
compiles); one runs as a user runs it, in a child process from the repository root. Eval and
decode of a new job dir from such weights leave no job dir behind either.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Callable

import gguf
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from lingvo_lite.testing import run_cli, source_root, tree_digest
from tests.weights import tiny_weights

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
    # GGUF metadata sizes that are not the tensors'.
    Case("vocab_size", _gguf(metadata={"vocab_size": 300}), 2,
         "gguf:model.gguf: llama.vocab_size=300 makes dimension 0 of tensor token_embd.weight "
         "300, but its shape is [259, 64]; the file contradicts itself"),
    Case("embedding_length", _gguf(metadata={"embedding_length": 48}), 2,
         "llama.embedding_length=48 makes dimension 1 of tensor token_embd.weight 48"),
    Case("block_count too small", _gguf(metadata={"block_count": 1}), 2,
         "llama.block_count=1, but the file holds tensor blk.1.attn_norm.weight of block 1"),
    Case("block_count too large", _gguf(metadata={"block_count": 3}), 2,
         "llama.block_count=3, but the file holds no tensor of block 2 (blk.2.*)"),
    Case("feed_forward_length", _gguf(metadata={"feed_forward_length": 80}), 2,
         "llama.feed_forward_length=80 makes dimension 0 of tensor blk.0.ffn_gate.weight 80"),
    Case("head_count", _gguf(metadata={"attention.head_count": 8}), 2,
         "llama.attention.head_count=8 makes dimension 0 of tensor blk.0.attn_q.weight 128"),
    Case("head_count_kv", _gguf(metadata={"attention.head_count_kv": 1}), 2,
         "llama.attention.head_count_kv=1 makes dimension 0 of tensor blk.0.attn_k.weight 16"),
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
  result = subprocess.run([sys.executable, "-m", "lingvo_lite", "--mode=print",
                           "--exp=PyCodeTiny", f"--init_from=gguf:{relative}"],
                          cwd=source_root(), capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr == (
      f"lingvo_lite: error: gguf:{relative}: llama.vocab_size=300 makes dimension 0 of tensor "
      "token_embd.weight 300, but its shape is [259, 64]; the file contradicts itself (edited "
      "or damaged): convert the model again\n")
  assert result.stdout == "" and tree_digest(tmp_path) == before
