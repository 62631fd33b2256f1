"""`--mode=export` into a full disk (a real one: a small tmpfs) ends with one line naming the
file that could not be written and ENOSPC, exit 1, and leaves nothing behind: no partial
export, no staging folder, an earlier export byte for byte as it was, no job dir made, the
weights untouched. Every format (hf, gguf, slim) fails alike; the export writes through
output_folders.write_folder, the training side's writer of whole folders.

The model: a tiny Llama's Hugging Face folder (tests/weights/tiny_weights.py) that a new job
dir exports (--init_from): nothing to train. The cases run in this process where the disk is
mounted here (root), one in a child process from the repository root, as a user runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lingvo_lite.runtime import small_disk
from lingvo_lite.testing import run_cli, source_root
from tests.weights import tiny_weights
from tests.trained_jobs import tree_digest

FULL = "64k"  # Room for the folders, none for the model's 380 KB.
ERROR = ("lingvo_lite: error: --export_dir='{out}': cannot write {file}: the disk is full "
         "(ENOSPC); nothing was left there; free space, or export again\n")


@pytest.fixture
def disk(tmp_path):
  with small_disk.for_test(tmp_path / "disk", FULL) as mounted:
    yield mounted


@pytest.fixture
def weights(tmp_path):
  tiny_weights.hf_folder(tmp_path / "hf")
  return tmp_path / "hf"


def _export(disk, tmp_path, out, *extra):
  """`--mode=export` of the tiny weights from a new job dir (tmp_path/job) to `out`."""
  args = ["--mode=export", "--exp=PyCodeTiny", f"--init_from=hf:{tmp_path / 'hf'}",
          f"--job_log_dir={tmp_path / 'job'}", f"--export_dir={out}", *extra]
  if disk.command(["x"]) != ["x"]:  # The disk is mounted in a namespace of its own.
    env = dict(os.environ, PYTHONPATH=str(source_root()))
    done = subprocess.run(disk.command([sys.executable, "-m", "lingvo_lite", *args]),
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    return done.returncode, done.stderr
  result = run_cli(args)
  return result.code, result.stderr


def _out(tmp_path, name="out"):
  """A folder on the disk, as the export is told it (where the disk is mounted in a namespace
  of its own, `disk.path` reaches the same folder from this process)."""
  return tmp_path / "disk" / name


def _watched(tmp_path, disk):
  """What a failed export must leave as it was: the weights, the job dir (absent), the disk."""
  return (tree_digest(tmp_path / "hf"), os.path.exists(tmp_path / "job"),
          sorted(os.listdir(disk.path)))


@pytest.mark.parametrize("export_format, file", [("hf", "model.safetensors"),
                                                 ("gguf", "model.gguf"),
                                                 ("slim", "params")])
def test_a_full_disk_is_one_line_naming_the_file(disk, weights, tmp_path, export_format, file):
  before = _watched(tmp_path, disk)
  out = _out(tmp_path)
  code, stderr = _export(disk, tmp_path, out, f"--export_format={export_format}")
  assert code == 1, stderr
  assert stderr == ERROR.format(out=out, file=out / file)
  assert _watched(tmp_path, disk) == before  # No partial export, no job dir.


def test_the_file_named_is_the_one_that_did_not_fit(disk, weights, tmp_path):
  """Room for the safetensors file and one page more: after the shard the export writes the
  tokenizer's tokenizer.json (a page) and then tokenizer_config.json, which the line names;
  the disk is empty again."""
  disk.resize("64m")
  code, stderr = _export(disk, tmp_path, _out(tmp_path, "first"))
  assert code == 0, stderr
  pages = -(-os.path.getsize(disk.path / "first" / "model.safetensors") // small_disk.PAGE)
  for name in os.listdir(disk.path / "first"):
    os.remove(disk.path / "first" / name)
  os.rmdir(disk.path / "first")
  disk.resize(f"{(pages + 1) * small_disk.PAGE // 1024}k")
  out = _out(tmp_path)
  code, stderr = _export(disk, tmp_path, out)
  assert code == 1, stderr
  assert stderr == ERROR.format(out=out, file=out / "tokenizer_config.json")
  assert os.listdir(disk.path) == []


def test_an_earlier_export_stays_whole_when_the_next_one_fails(disk, weights, tmp_path):
  disk.resize("64m")
  out = _out(tmp_path)
  code, stderr = _export(disk, tmp_path, out)
  assert code == 0, stderr
  earlier = tree_digest(disk.path / "out")
  disk.fill()
  code, stderr = _export(disk, tmp_path, out, "--export_dtype=bfloat16")
  assert code == 1, stderr
  assert stderr == ERROR.format(out=out, file=out / "model.safetensors")
  assert tree_digest(disk.path / "out") == earlier
  assert sorted(os.listdir(disk.path)) == ["filler", "out"]  # No staging folder beside it.


def test_a_full_disk_as_a_user_runs_it(disk, weights, tmp_path):
  """From the repository root, paths relative to it, in a child process."""
  before = _watched(tmp_path, disk)
  root = source_root()
  out = os.path.relpath(_out(tmp_path), root)
  env = dict(os.environ, PYTHONPATH=str(root))
  done = subprocess.run(disk.command([
      sys.executable, "-m", "lingvo_lite", "--mode=export", "--exp=PyCodeTiny",
      f"--init_from=hf:{os.path.relpath(tmp_path / 'hf', root)}",
      f"--job_log_dir={os.path.relpath(tmp_path / 'job', root)}", f"--export_dir={out}"]),
      cwd=root, capture_output=True, text=True, timeout=300, check=False, env=env)
  assert done.returncode == 1, done.stderr
  assert done.stderr == ERROR.format(out=out, file=os.path.join(out, "model.safetensors"))
  assert _watched(tmp_path, disk) == before
