"""bin/build_store.py and bin/train_vocab.py given hostile input: a --task whose code fails (at
import, when called, when its recipe runs), Beam options Beam would refuse or drop, files that
cannot be read, a worker that raises. Each is one line on stderr with its cause and the house's
exit code (2 before anything runs, 1 for a failed build or read), and nothing is left behind: no
new --out folder, lock file or log, and an existing store untouched.

Two commands run as a user runs them (a subprocess from the repository root, relative paths);
the table calls the tools' main(argv) in this process, which shares one import of TensorFlow
and Beam among the cases.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
from typing import Callable

import pytest

from lingvo_lite.data import sentencepiece_training, store_build, token_store
from tests import bin_tools
from tests.data import chat_tokenizers
from tests.trained_jobs import tree_digest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The user's own task module: each function goes wrong in its own way.
TASKS_MODULE = '''
import sys
from tasks import local_files
from tasks.formats import text as text_format
from tasks.deferred import DeferredTask

def raises(): raise ValueError("no corpus configured")
def raises_type_error(): return len(3)
def exits(): sys.exit(0)
def interrupts(): raise KeyboardInterrupt
def generator_exit(): raise GeneratorExit

class Unprintable(Exception):
  def __str__(self): raise RuntimeError("no message")
def raises_unprintable(): raise Unprintable()
def returns_none(): return None
async def a_coroutine(): return None
def needs_argument(path): return path
def no_splits(): return DeferredTask("lk_empty", (), 256, lambda: None)

def recipe_raises():
  def make(): raise EOFError
  return DeferredTask("lk_recipe", ("train",), 256, make)

def text_task(): return text_format.text_files_task({"train": "data/*.txt"})

# Text tasks whose own reader fails on every file: the user's code, not a patched module's.
def _failing(error):
  def reader(path):
    raise error
    yield
  return reader
def reader_raises():
  return local_files.text_task("text_file", {"train": "data/*.txt"}, None, {},
                               _failing(ValueError()))
def reader_exits():
  return local_files.text_task("text_file", {"train": "data/*.txt"}, None, {},
                               _failing(SystemExit(3)))
'''
MODULES = {"lk_bt_tasks.py": TASKS_MODULE,
           "lk_bt_import.py": "raise RuntimeError('broken at import')\n",
           "lk_bt_syntax.py": "def task(:\n"}


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory):
  """The folder of the user's task modules, on sys.path while the module's tests run."""
  folder = tmp_path_factory.mktemp("mods")
  for name, text in MODULES.items():
    (folder / name).write_text(text)
  sys.path.insert(0, str(folder))
  yield folder
  sys.path.remove(str(folder))
  for name in MODULES:
    sys.modules.pop(name[:-3], None)


def _store(folder, task="another task"):
  """A published store (its manifest; a shard file) of another task."""
  (folder / "shards").mkdir(parents=True)
  (folder / "shards" / "tokens").write_bytes(b"\x01\x02")
  (folder / "manifest.json").write_text(json.dumps({"schema": token_store.SCHEMA,
                                                    "task": task}))


def _full_disk_at_publish(monkeypatch):
  """The manifest of a finished store meets a full disk."""
  def publish(partial, final, manifest):
    del final, manifest
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial / "manifest.json"))
  monkeypatch.setattr(token_store, "publish", publish)


def _interrupted_training(monkeypatch):
  """Ctrl-C reaches SentencePiece's training, once the model's folders are made."""
  def train(texts, path, vocab_size, model_type):
    del texts, path, vocab_size, model_type
    raise KeyboardInterrupt
  monkeypatch.setattr(sentencepiece_training, "_train", train)


def _interrupted_mid_write(monkeypatch):
  """Ctrl-C reaches the runner (not a worker) while the partial store holds files."""
  def run_pipeline(task, split, partial, *args):
    (partial / "shards" / "00000").mkdir(parents=True)
    (partial / "shards" / "00000" / "7.__lock").write_bytes(b"")
    raise KeyboardInterrupt
  monkeypatch.setattr(store_build, "_run_pipeline", run_pipeline)


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  tool: str
  args: tuple[str, ...]
  code: int
  expected: str
  setup: Callable | None = None  # (work folder, monkeypatch)


# A good conversation, then one whose message has no content.
_CHAT_LINES = (json.dumps({"messages": [{"role": "user", "content": "2+2?"},
                                        {"role": "assistant", "content": "4"}]}) + "\n"
               + json.dumps({"messages": [{"role": "user"}]}) + "\n")


def _case(name, tool, args, code, expected, setup=None):
  return pytest.param(Case(name, tool, tuple(args), code, expected, setup), id=name)


CASES = [
    # Class 1: the user's code, called by the tools.
    _case("task module raises at import", "build_store",
          ["--task=lk_bt_import.task", "--out=new"], 2,
          "--task='lk_bt_import.task': importing module lk_bt_import failed: RuntimeError: "
          "broken at import (at "),
    _case("task module has a syntax error", "build_store",
          ["--task=lk_bt_syntax.task", "--out=new"], 2,
          "importing module lk_bt_syntax failed: SyntaxError: "),
    _case("task raises", "build_store", ["--task=lk_bt_tasks.raises", "--out=new"], 2,
          "--task='lk_bt_tasks.raises': lk_bt_tasks.raises() raised ValueError: no corpus "
          "configured (at "),
    _case("task raises a TypeError", "build_store",
          ["--task=lk_bt_tasks.raises_type_error", "--out=new"], 2,
          "lk_bt_tasks.raises_type_error() raised TypeError: object of type 'int' has no len()"),
    _case("task exits 0", "build_store", ["--task=lk_bt_tasks.exits", "--out=new"], 2,
          "lk_bt_tasks.exits() raised SystemExit: 0 (at "),
    _case("task raises KeyboardInterrupt", "build_store",
          ["--task=lk_bt_tasks.interrupts", "--out=new"], 2,
          "lk_bt_tasks.interrupts() raised KeyboardInterrupt (at "),
    _case("task raises GeneratorExit", "build_store",
          ["--task=lk_bt_tasks.generator_exit", "--out=new"], 2,
          "lk_bt_tasks.generator_exit() raised GeneratorExit (at "),
    _case("task raises an error whose message itself raises", "build_store",
          ["--task=lk_bt_tasks.raises_unprintable", "--out=new"], 2,
          "--task='lk_bt_tasks.raises_unprintable': lk_bt_tasks.raises_unprintable() raised "
          "Unprintable (at "),
    _case("task returns None", "build_store", ["--task=lk_bt_tasks.returns_none", "--out=new"],
          2, "--task='lk_bt_tasks.returns_none': returned a NoneType, not a seqio Task"),
    # A coroutine left unrun would add Python's "never awaited" warning to the one line.
    pytest.param(Case("task is a coroutine function", "build_store",
                      ("--task=lk_bt_tasks.a_coroutine", "--out=new"), 2,
                      "--task='lk_bt_tasks.a_coroutine': returned a coroutine, not a seqio Task",
                      None),
                 marks=pytest.mark.filterwarnings(
                     "error::RuntimeWarning", "error::pytest.PytestUnraisableExceptionWarning"),
                 id="task is a coroutine function"),
    _case("task needs an argument", "build_store",
          ["--task=lk_bt_tasks.needs_argument", "--out=new"], 2,
          "--task='lk_bt_tasks.needs_argument': cannot be called with no arguments"),
    _case("task has no splits", "build_store", ["--task=lk_bt_tasks.no_splits", "--out=new"],
          2, "returned the task 'lk_empty' with splits (); give a function that returns"),
    _case("task's recipe raises", "build_store",
          ["--task=lk_bt_tasks.recipe_raises", "--out=new"], 2,
          "task='lk_recipe': making the seqio Task raised EOFError (at "),
    _case("task is a standard library function", "build_store", ["--task=os.abort",
                                                                  "--out=new"], 2,
          "--task='os.abort': posix.abort is a Python standard library function, not a task "
          "function"),
    _case("vocab task raises", "train_vocab",
          ["--task=lk_bt_tasks.raises", "--output=vocab/new.model"], 2,
          "train_vocab: error: --task='lk_bt_tasks.raises': lk_bt_tasks.raises() raised "
          "ValueError: no corpus configured (at "),
    _case("vocab task exits", "train_vocab",
          ["--task=lk_bt_tasks.exits", "--output=vocab/new.model"], 2,
          "lk_bt_tasks.exits() raised SystemExit: 0 (at "),
    _case("vocab task module raises at import", "train_vocab",
          ["--task=lk_bt_import.task", "--output=vocab/new.model"], 2,
          "importing module lk_bt_import failed: RuntimeError: broken at import"),
    _case("vocab task's recipe raises", "train_vocab",
          ["--task=lk_bt_tasks.recipe_raises", "--output=vocab/new.model"], 2,
          "task='lk_recipe': making the seqio Task raised EOFError (at "),
    # The one overwrite rule: never over what lingvo_lite did not write.
    _case("vocab output over the user's file", "train_vocab",
          ["--task=lk_bt_tasks.text_task", "--output=data/a.txt"], 2,
          "train_vocab: error: --output='data/a.txt': already exists, and lingvo_lite did not "
          "write it (no a.txt.json beside it names this model), so it is never overwritten"),
    _case("vocab output onto a FIFO", "train_vocab",
          ["--task=lk_bt_tasks.text_task", "--output=pipe.model"], 2,
          "--output='pipe.model': already exists and is not a regular file, and it is never "
          "replaced", lambda work, _: os.mkfifo(work / "pipe.model")),
    # Flags given empty (`--task=$UNSET`): never read as left out.
    _case("empty --task", "build_store", ["--task=", "--out=new"], 2,
          "build_store: --task=: empty (an unset shell variable gives an empty value); give a "
          "value, or leave the flag out"),
    _case("empty --splits", "build_store",
          ["--task=lk_bt_tasks.text_task", "--splits=", "--out=new"], 2,
          "--splits=: empty (an unset shell variable gives an empty value)"),
    _case("vocab empty --split", "train_vocab",
          ["--task=lk_bt_tasks.text_task", "--split=", "--output=vocab/new.model"], 2,
          "train_vocab: error: --split=: empty (an unset shell variable gives an empty value)"),
    # A NUL in any value (a caller's, not argv's): refused by the parser, not met by os.stat.
    _case("NUL in a split name", "build_store",
          ["--format=text", "--files=a\0b=data/*.txt", "--out=new"], 2,
          "build_store: --files=a\\x00b=data/*.txt: holds a NUL character (\\x00), which no "
          "file or split name can hold; give the value without it (see --help)\n"),
    _case("NUL in make_prompts' --out", "make_prompts",
          ["--task=arithmetic", "--count=2", "--out=o\0.jsonl"], 2,
          "--out=o\\x00.jsonl: holds a NUL character"),
    # Numbers that would run for hours and fill the memory (every problem is held) before any
    # check could fail, or that no problem fits: refused where the generators check arguments.
    _case("more problems than a set holds", "make_prompts",
          ["--task=arithmetic", f"--count={10**8}", "--out=p.jsonl"], 2,
          "make_prompts: --task=arithmetic: count=100000000: at most 100,000 problems per set; "
          "make several sets with different seeds for more\n"),
    _case("numbers no problem can hold", "make_prompts",
          ["--task=arithmetic", f"--max_number={10**26}", "--out=p.jsonl"], 2,
          f"--task=arithmetic: max_number={10**26}: at most 999, the largest quantity a problem "
          "holds\n"),
    _case("more drawn tests than a problem needs", "make_prompts",
          ["--task=code", f"--tests_per_problem={10**8}", "--out=p.jsonl"], 2,
          "--task=code: tests_per_problem=100000000: give 0 to 1000 drawn test cases per "
          "problem\n"),
    # A prompt set's pattern that names a folder: the user's mistake (2), as a glob of
    # folders is for build_store, not a read that failed (it was exit 1, "cannot be read").
    _case("prompt set pattern of a folder", "make_prompts", ["--check=data"], 2,
          "make_prompts: --check='data': matches 1 folder(s) but no file; give JSON-lines files "
          "of prompt records, e.g. FOLDER/*.jsonl\n"),
    # A flag what the tool does reads not: ignored, it would look obeyed (the executor refuses
    # a flag its --mode does not read the same way).
    _case("arithmetic's flag for the code task", "make_prompts",
          ["--task=code", "--operations=add", "--out=p.jsonl"], 2,
          "make_prompts: --operations: --task=code does not read it (only --task=arithmetic "
          "does); drop the flag (see --help)\n"),
    _case("a check's flag when writing a set", "make_prompts",
          ["--task=arithmetic", "--rewards=exact_answer", "--out=p.jsonl"], 2,
          "--rewards: --task=arithmetic does not read it (only --check does)"),
    _case("a set's flag when checking one", "make_prompts", ["--check=data/a.txt", "--count=5"],
          2, "--count: --check does not read it (only --task=arithmetic does)"),
    _case("another format's setting", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--text_field=body", "--out=new"], 2,
          "build_store: --text_field: --format=text does not read it (only --format=jsonl does); "
          "drop the flag (see --help)\n"),
    _case("a flag setting of other formats", "build_store",
          ["--format=lines", "--files=train=data/*.txt", "--skip_bad_records", "--out=new"], 2,
          "--skip_bad_records: --format=lines does not read it (only --format=chat and "
          "--format=preference do)"),
    # Class 2: Beam's options, the files, and what a worker raises.
    _case("pipeline option Beam refuses", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=new",
           "--pipeline_arg=--direct_num_workers=many"], 2,
          "--pipeline_arg='--direct_num_workers=many': Beam refuses it (argument "
          "--direct_num_workers: invalid int value: 'many')"),
    _case("pipeline option Beam would drop", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=new",
           "--pipeline_arg=--runer=DataflowRunner"], 2,
          "--pipeline_arg='--runer=DataflowRunner': not a Beam pipeline option"),
    _case("unknown runner", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=new",
           "--pipeline_arg=--runner=NoSuchRunner"], 2,
          "--pipeline_arg='--runner=NoSuchRunner': Beam cannot use this runner here"),
    _case("a FIFO", "build_store",
          ["--format=lines", "--files=train=pipe.txt", "--out=new"], 2,
          "files['train']='pipe.txt': is not a regular file (a FIFO, a device or a socket)",
          lambda work, _: os.mkfifo(work / "pipe.txt")),
    pytest.param(Case("an unreadable file", "build_store",
                      ("--format=jsonl", "--files=train=secret.jsonl", "--out=new"), 2,
                      "files='{tmp}/work/secret.jsonl': cannot be read (Permission denied)",
                      lambda work, _: (work / "secret.jsonl").write_text("{}\n")
                      or os.chmod(work / "secret.jsonl", 0)),
                 marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file"),
                 id="an unreadable file"),
    _case("a glob of folders", "build_store", ["--format=text", "--files=train=*", "--out=new"],
          2, "files['train']='*': matches 1 path but no regular file"),
    _case("a file name that is not UTF-8", "build_store",
          ["--format=text", "--files=train=../odd/*.txt", "--out=new"], 2,
          "matches {tmp}/odd/\\xff.txt, whose name is not valid UTF-8",
          lambda work, _: (work.parent / "odd" / os.fsdecode(b"\xff.txt")).write_text("x\n")),
    _case("out is a file", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=data/a.txt"], 2,
          "--out='data/a.txt': is a file, not a folder; give a folder of the stores"),
    _case("out under a file", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=data/a.txt/stores"], 2,
          "--out='data/a.txt/stores': {tmp}/work/data/a.txt is a file, not a folder; give a "
          "folder of the stores"),
    _case("out where no file can be made", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=/proc/stores"], 2,
          "--out='/proc/stores': cannot create a folder in /proc: that file system takes no "
          "new files (ENOENT)"),
    _case("out at an existing store", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=stores/train"], 2,
          "--out='stores/train': is a token store itself, not the folder of the stores; give "
          "the folder that holds it, {tmp}/work/stores",
          lambda work, _: _store(work / "stores" / "train")),
    _case("out inside an existing store", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=stores/train/shards/x"], 2,
          "--out='stores/train/shards/x': is inside the token store {tmp}/work/stores/train",
          lambda work, _: _store(work / "stores" / "train")),
    _case("worker raises an error without a message", "build_store",
          ["--task=lk_bt_tasks.reader_raises", "--out=new/deeper", "--no_progress"], 1,
          "build_store: {tmp}/work/data/a.txt: ValueError\n"),
    _case("Ctrl-C during a build into a new folder", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=new/deeper", "--no_progress"],
          130, "build_store: interrupted (Ctrl-C); nothing of the unfinished store is left\n",
          lambda work, monkeypatch: _interrupted_mid_write(monkeypatch)),
    _case("full disk publishing the store", "build_store",
          ["--format=text", "--files=train=data/*.txt", "--out=new/deeper", "--no_progress"],
          1, "the disk is full (ENOSPC); free space, or give --out on another disk, then build "
          "again\n", lambda work, monkeypatch: _full_disk_at_publish(monkeypatch)),
    _case("a TFRecord file too short for a record", "build_store",
          ["--format=tfrecord", "--vocab_size=300", "--files=train=cut.tfrecord", "--out=new",
           "--no_progress"], 1,
          "build_store: {tmp}/work/cut.tfrecord: record 0: truncated TFRecord (7 bytes after "
          "the last complete record",
          lambda work, _: (work / "cut.tfrecord").write_bytes(b"garbage")),
    _case("a chat record with a message without content", "build_store",
          ["--format=chat", "--files=train=chat.jsonl", "--vocabulary=tokenizer:tok",
           "--out=new", "--no_progress"], 1,
          "build_store: {tmp}/work/chat.jsonl: line 2: message 0 has no string 'content'\n",
          lambda work, _: (chat_tokenizers.byte_level_folder(work / "tok"),
                           (work / "chat.jsonl").write_text(_CHAT_LINES))),
    _case("JSON lines that are not UTF-8", "build_store",
          ["--format=jsonl", "--files=train=bad.jsonl", "--out=new", "--no_progress"], 1,
          "build_store: {tmp}/work/bad.jsonl: line 2: not valid UTF-8 (byte 0xff at offset 4)",
          lambda work, _: (work / "bad.jsonl").write_bytes(b'{"text": "fine"}\n{"te\xff": 1}\n')),
    _case("failed rebuild of an existing store", "build_store",
          ["--task=lk_bt_tasks.reader_exits", "--out=stores", "--no_progress"], 1,
          "build_store: {tmp}/work/data/a.txt: SystemExit: 3\n",
          lambda work, _: _store(work / "stores" / "train")),
    _case("Ctrl-C while a vocabulary trains", "train_vocab",
          ["--task=lk_bt_tasks.text_task", "--output=vocab/new/x.model"], 130,
          "train_vocab: error: interrupted (Ctrl-C)\n",
          lambda work, monkeypatch: _interrupted_training(monkeypatch)),
    # The task's own reader raises: no module is patched, so no other test's imports matter.
    _case("vocab reader raises", "train_vocab",
          ["--task=lk_bt_tasks.reader_raises", "--output=vocab/new/x.model"], 1,
          "': reading split 'train' failed: ValueError\n"),
]


@pytest.mark.parametrize("case", CASES)
def test_hostile_input_is_one_line_with_its_exit_code_and_leaves_nothing_behind(
    case, user_modules, tmp_path, monkeypatch, capfd):
  del user_modules  # On sys.path.
  work = tmp_path / "work"
  (work / "data").mkdir(parents=True)
  (work / "data" / "a.txt").write_text("the user's own data\n")
  (tmp_path / "odd").mkdir()
  monkeypatch.chdir(work)
  # What the tools set for themselves when run: their TensorFlow neither probes for a GPU nor
  # logs (either would print a line of its own).
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
  if case.setup:
    case.setup(work, monkeypatch)
  before = tree_digest(work)
  code = bin_tools.tool(case.tool).main(list(case.args))
  out, err = capfd.readouterr()
  assert code == case.code, err
  assert err.count("\n") == 1 and err.endswith("\n"), err
  assert case.expected.format(tmp=tmp_path) in err, err
  assert not out
  assert tree_digest(work) == before, sorted(os.listdir(work))  # Nothing made, nothing changed.


def _run_as_user(tool, *args, modules=None):
  """`python bin/<tool>.py ARGS` from the repository root, as the README runs it."""
  path = os.pathsep.join([".", str(modules)] if modules else ["."])
  return subprocess.run([sys.executable, f"bin/{tool}.py", *args], cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                        timeout=300, check=False)


def test_a_task_that_exits_is_one_line_exit_2_not_a_silent_success(user_modules, tmp_path):
  out = os.path.relpath(tmp_path / "stores", ROOT)  # Relative, as users write it.
  done = _run_as_user("build_store", "--task=lk_bt_tasks.exits", f"--out={out}",
                      modules=user_modules)
  assert done.returncode == 2, (done.stdout, done.stderr)
  line = TASKS_MODULE.splitlines().index("def exits(): sys.exit(0)") + 1
  assert done.stderr == ("build_store: --task='lk_bt_tasks.exits': lk_bt_tasks.exits() raised "
                         f"SystemExit: 0 (at {user_modules / 'lk_bt_tasks.py'}:{line})\n")
  assert not done.stdout and not os.listdir(tmp_path)


def test_a_pipeline_option_beam_refuses_is_one_line_exit_2_and_leaves_nothing(tmp_path):
  (tmp_path / "a.txt").write_text("some text\n")
  work = os.path.relpath(tmp_path, ROOT)
  before = tree_digest(tmp_path)
  done = _run_as_user("build_store", "--format=text", f"--files=train={work}/*.txt",
                      f"--out={work}/stores", "--pipeline_arg=--direct_running_mode=threads")
  assert done.returncode == 2, done.stderr
  assert done.stderr.count("\n") == 1, done.stderr
  assert ("build_store: --pipeline_arg='--direct_running_mode=threads': Beam refuses it "
          "(argument --direct_running_mode: invalid choice: 'threads'" in done.stderr)
  assert tree_digest(tmp_path) == before
