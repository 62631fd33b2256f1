"""bin/build_store.py as a user runs it: from the repository root, with relative paths."""

import json
import os
import subprocess
import sys

import pytest

from etils import epath

from lingvo_lite.data import token_store
from tests import bin_tools

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_tool(cwd, *args):
  env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
  return subprocess.run([sys.executable, os.path.join(ROOT, "bin", "build_store.py"), *args],
                        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                        check=False)


def run_main(cwd, monkeypatch, capfd, *args):
  """The tool's main in this process, from `cwd`: (exit code, stdout, stderr). A process start
  less than run_tool (TensorFlow and seqio load once per test process), for runs whose class
  (a build, a usage error) a real process covers in the same test."""
  capfd.readouterr()  # What the test printed before is not the tool's.
  with monkeypatch.context() as patch:
    patch.chdir(cwd)
    patch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # As run_tool sets it.
    code = bin_tools.tool("build_store").main(list(args))
  out, err = capfd.readouterr()
  return code, out, err


@pytest.mark.slow
def test_builds_json_lines_with_two_workers_then_keeps_it_and_refuses_bad_input(
    tmp_path, monkeypatch, capfd):
  (tmp_path / "data").mkdir()
  for i in range(4):
    records = [{"text": f"document {i}.{j}: " + "word " * (j * 7), "id": j} for j in range(30)]
    (tmp_path / "data" / f"part{i}.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))
  (tmp_path / "val.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
  args = ["--format=jsonl", "--files=train=data/*.jsonl", "--files=validation=val.jsonl",
          "--out=stores/mine", "--workers=2", "--shard_bytes=2000", "--no_progress"]
  built = run_tool(tmp_path, *args)
  assert built.returncode == 0, built.stderr[-2000:]
  assert "train: built" in built.stdout and "120 documents" in built.stdout, built.stdout
  manifest = token_store.read_manifest(epath.Path(tmp_path / "stores" / "mine" / "train"))
  expected = sum(len(("document %d.%d: " % (i, j) + "word " * (j * 7)).encode()) + 1
                 for i in range(4) for j in range(30))
  assert manifest["tokens"] == expected and manifest["build"]["workers"] == 2
  # The second build in this process: the first one's process already ran the tool as a user
  # does; this checks what that build left is seen as up to date.
  code, out, _ = run_main(tmp_path, monkeypatch, capfd, *args)
  assert code == 0 and "train: kept (up to date)" in out, out

  missing = run_tool(tmp_path, "--format=jsonl", "--files=train=nothing/*.jsonl", "--out=x")
  assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
  assert "files['train']='nothing/*.jsonl': matches no file" in missing.stderr
  # The same class of failure (a usage error, exit 2) as `missing`: in this process.
  code, out, err = run_main(tmp_path, monkeypatch, capfd, "--format=jsonl",
                            "--files=train=data/*.jsonl", "--text_field=body", "--out=x")
  assert code == 2 and err.count("\n") == 1 and not out, err
  assert "text_field='body'" in err, err

  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "a.jsonl").write_text('{"text": "fine"}\n{"text": "also"}\n{oops\n')
  bad = run_tool(tmp_path, "--format=jsonl", "--files=train=bad/*.jsonl", "--out=stores/bad",
                 "--workers=1", "--no_progress")
  assert bad.returncode == 1, bad.stderr
  assert bad.stderr.strip().count("\n") == 0, bad.stderr
  assert "a.jsonl: line 3: not valid JSON" in bad.stderr
  # Nothing left behind in the folder the build made: no partial store, lock file or log.
  assert not (tmp_path / "stores" / "bad").exists()


@pytest.mark.parametrize("args, expected", [
    (["--format=text", "--files=data=data/*.txt", "--out=."],
     "store_dir='{tmp}/data': exists and is not a token store"),
    (["--task=tasks.pycode.pycode_task", "--vocabulary=sp:512:bpe", "--out=x"],
     "--task: --vocabulary would be ignored"),
    (["--format=text", "--files=train=data/*.txt", "--out=x", "--workers=0"],
     "--workers=0: must be at least 1"),
    (["--format=nope", "--out=x"], "argument --format: invalid choice: 'nope'"),
    (["--format=text", "--files=train=", "--out=x"], "--files='train=': is not SPLIT=GLOB"),
    (["--task=tasks.pycode.stdlib_dir", "--out=x"],
     "--task='tasks.pycode.stdlib_dir': returned a str, not a seqio Task"),
    (["--format=text", "--files=train=data/*.txt", "--out=data/a.txt"],
     "--out='data/a.txt': is a file, not a folder"),
])
def test_bad_command_lines_are_one_line_exit_2_and_touch_nothing(tmp_path, args, expected,
                                                               monkeypatch, capfd):
  """The tool's main in this process (a process start a case less; the test above runs the
  tool as a process for this class of failure)."""
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "a.txt").write_text("the user's own data\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # As run_tool sets it.
  code = bin_tools.tool("build_store").main(list(args))
  out, err = capfd.readouterr()
  assert code == 2, err
  assert err.count("\n") == 1, err
  assert expected.format(tmp=tmp_path) in err, err
  assert not out
  assert (tmp_path / "data" / "a.txt").read_text() == "the user's own data\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
