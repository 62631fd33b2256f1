"""Bad input never crashes or damages a job: one line on stderr, exit code 2, and the job
directory it pointed at is byte-for-byte unchanged."""

import dataclasses
import errno
import glob
import json
import os
import shutil
import subprocess
import sys
import types
from typing import Callable

import fiddle as fdl
import pytest
from etils import epath

from experiments.lm import architectures
from lingvo_lite import input_files, paths, target
from lingvo_lite.errors import UsageError
from lingvo_lite.runtime import summaries
from lingvo_lite.testing import run_cli, source_root
from tests.trained_jobs import tree_digest


@dataclasses.dataclass(frozen=True)
class Case:
  """One bad command line.

  `args` are as a program receives them, after the shell removed its quoting; `{job}` is an
  existing, trained job dir shared by every case and `{tmp}` a fresh folder of this case's
  own (the working directory of the run), which `prepare(tmp)` may fill first. The one-line
  message must contain `expected`.
  """

  name: str
  args: list[str]
  expected: str
  prepare: Callable[[str], None] | None = None


def _write(relative: str, text: str) -> Callable[[str], None]:
  """A `prepare` that writes one file under the case's folder."""
  def prepare(tmp: str) -> None:
    path = os.path.join(tmp, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  return prepare


_JOB = []  # The trained job dir, once the module's fixture made it.


def _copy_job(edit: Callable[[str], None] | None = None) -> Callable[[str], None]:
  """A `prepare` that copies the trained job to `{tmp}/job`, then lets `edit(job)` damage it."""
  def prepare(tmp: str) -> None:
    job = os.path.join(tmp, "job")
    shutil.copytree(_JOB[0], job)
    if edit is not None:
      edit(job)
  return prepare


def _replace_in(relative: str, old: str, new: str) -> Callable[[str], None]:
  def edit(job: str) -> None:
    path = os.path.join(job, relative)
    with open(path) as f:
      text = f.read()
    assert old in text, (old, path)
    with open(path, "w") as f:
      f.write(text.replace(old, new))
  return edit


def _truncate(relative: str, keep: int) -> Callable[[str], None]:
  def edit(job: str) -> None:
    with open(os.path.join(job, relative), "r+") as f:
      f.truncate(keep)
  return edit


def _make_file(relative: str) -> Callable[[str], None]:
  """Replaces a file or folder of the job by a one-byte file."""
  def edit(job: str) -> None:
    path = os.path.join(job, relative)
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif os.path.exists(path):
      os.remove(path)
    with open(path, "w") as f:
      f.write("x")
  return edit


def _make_folder(relative: str) -> Callable[[str], None]:
  def edit(job: str) -> None:
    path = os.path.join(job, relative)
    if os.path.exists(path):
      os.remove(path)
    os.makedirs(path)
  return edit


def _remove(relative: str) -> Callable[[str], None]:
  def edit(job: str) -> None:
    os.remove(os.path.join(job, relative))
  return edit


TRAIN_TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
              "--fdl.train.steps=2"]

# The table, by family. Each family's mistakes are caught at one root (named in its header).

# Command-line syntax and flags (executor, absl parsing).
CLI_CASES = [
    Case("unknown mode", ["--mode=fly", "--job_log_dir={job}"], "--mode=fly"),
    Case("train without job dir", ["--exp=PyCodeTiny", "--fiddler=tiny"],
     "--job_log_dir: required for --mode=train"),
    Case("conflicting flags", ["--exp=PyCodeTiny", "--fdl_config=PyCodeTiny", "--job_log_dir={job}"],
     "conflicting flags; give only one of --exp, --fdl_config, --fdl_config_file"),
    Case("unknown flag", ["--mdoe=train", "--job_log_dir={job}"], "Unknown command line flag 'mdoe'"),
    # A host name no socket takes: Python's bind raises TypeError, not OSError, for it.
    Case("serve on a host name that is not text", ["--mode=serve", "--job_log_dir={job}",
                                                    "--port=0", "--host=\udcff"],
         "--host=\\xff --port=0: cannot listen there (encoding of hostname failed)"),
    Case("serve on a host name with a NUL", ["--mode=serve", "--job_log_dir={job}", "--port=0",
                                             "--host=a\0b"],
         "--host=a\\x00b --port=0: cannot listen there (host name must not contain null"),
    Case("stray positional argument", ["--job_log_dir={job}", "train"],
     "unexpected argument 'train'"),
    Case("set without a value", ["--fdl_set=model.num_layers", "--job_log_dir={job}"],
     "expected PATH=VALUE"),
    Case("config flag in list mode", ["--mode=list", "--exp=PyCodeTiny"],
         "--exp: --mode=list takes no config or job dir"),
    Case("override in list mode", ["--mode=list", "--fdl.model.dim=3"],
         "--fdl.PATH=VALUE: --mode=list takes no config"),
    Case("fiddler in list mode", ["--mode=list", "-fiddler=tiny"],
         "--fiddler: --mode=list takes no config"),
    Case("job dir in list mode", ["--mode=list", "--job_log_dir={job}"],
         "--job_log_dir: --mode=list takes no config"),
    Case("dotted set without a value", ["--job_log_dir={job}", "--fdl.model.dim"],
         "--fdl.model.dim: missing value; write --fdl.PATH=VALUE"),
    Case("empty dotted path", ["--job_log_dir={job}", "--fdl.=3"], "expected PATH=VALUE"),
    Case("flag without its value", ["--job_log_dir={job}", "--fiddler", "--mode=train"],
         "no fiddler named '--mode=train'"),
    Case("missing flagfile", ["--flagfile=no_such_flags.txt", "--job_log_dir={job}"],
         "no_such_flags.txt"),
    Case("bad override inside a flagfile", ["--flagfile=flags.txt", "--job_log_dir={job}"],
         "--fdl.model.num_layer=2: ", _write("flags.txt", "--fdl.model.num_layer=2\n")),
    Case("unknown flag inside a flagfile", ["--flagfile=flags.txt", "--job_log_dir={job}"],
         "Unknown command line flag 'mdoe'", _write("flags.txt", "--mdoe=eval\n")),
    Case("override after double dash", ["--job_log_dir={job}", "--", "--fdl.model.dim=3"],
         "unexpected argument '--fdl.model.dim=3'"),
    Case("integer flag not a number", ["--job_log_dir={job}", "--num_processes=two"],
         "--num_processes"),
    Case("boolean flag with a value", ["--job_log_dir={job}", "--fdl_help=maybe"], "fdl_help"),
    Case("distributed on without coordinator", ["--job_log_dir={job}", "--distributed=on"],
         "--distributed=on: no --coordinator_address/--num_processes/--process_id given"),
    Case("coordinator without the rest", ["--job_log_dir={job}", "--coordinator_address=h:1"],
         "--coordinator_address, --num_processes and --process_id go together"),
    Case("process id out of range", ["--job_log_dir={job}", "--coordinator_address=h:1",
                                     "--num_processes=2", "--process_id=2"],
         "--process_id=2: must be in [0, --num_processes=2)"),
    Case("distributed off with coordinator", ["--job_log_dir={job}", "--distributed=off",
                                              "--coordinator_address=h:1"],
         "--distributed=off: conflicts with"),
    Case("eval without job dir", ["--mode=eval", "--exp=PyCodeTiny"],
         "--job_log_dir: required for --mode=eval"),
    Case("print validates", ["--mode=print", "--exp=PyCodeTiny", "--fdl.model.num_heads=3"],
         "model.num_heads=3: does not divide model.dim=128"),
    Case("missing experiments module", ["--experiments_module=lk_nomod", "--exp=PyCodeTiny",
                                        "--job_log_dir={job}"],
         "--experiments_module=lk_nomod: no module named 'lk_nomod'"),
    Case("broken experiments module", ["--experiments_module=lk_flagbad", "--exp=PyCodeTiny",
                                       "--job_log_dir={job}"],
         "importing module lk_flagbad failed: SyntaxError: ", _write("lk_flagbad.py", "def f(:\n")),
    Case("experiments module not a name", ["--experiments_module=my-exps", "--mode=list"],
         "not a dotted module name"),
    # Control characters the user typed are escaped: the message stays one line.
    Case("newline inside a set value", ["--job_log_dir={job}", '--fdl.model.norm="""rms\nnorm"""'],
         "--fdl.model.norm=\"\"\"rms\\nnorm\"\"\": model.norm must be one of"),
    Case("newline inside --exp", ["--exp=PyCode\nTiny", "--job_log_dir={job}"],
         "--exp=PyCode\\nTiny: "),
    Case("carriage return and tab inside --exp", ["--exp=Py\rCode\tTiny", "--job_log_dir={job}"],
         "--exp=Py\\rCode\\tTiny: "),
    Case("newline inside --job_log_dir", ["--mode=eval", "--job_log_dir=no\nsuch"],
         "--job_log_dir=no\\nsuch: no such folder"),
    Case("coordinator without a port", ["--job_log_dir={job}", "--coordinator_address=localhost",
                                        "--num_processes=1", "--process_id=0"],
         "--coordinator_address=localhost: expected HOST:PORT"),
    Case("coordinator port out of range", ["--job_log_dir={job}", "--num_processes=1",
                                           "--coordinator_address=127.0.0.1:99999",
                                           "--process_id=0"],
         "with a port in 1..65535"),
    Case("zero processes", ["--job_log_dir={job}", "--coordinator_address=h:1",
                            "--num_processes=0", "--process_id=0"],
         "--num_processes=0: must be a positive integer"),
    Case("negative heartbeat timeout", ["--job_log_dir={job}", "--heartbeat_timeout_seconds=-1"],
         "--heartbeat_timeout_seconds=-1: must be in [1, 2147483647] seconds"),
]  # End of CLI_CASES.

# Experiment and fiddler lookup (registry), user modules.
LOOKUP_CASES = [
    Case("unknown experiment", ["--exp=NoSuchExp", "--job_log_dir={job}"],
     "--exp=NoSuchExp: no such experiment"),
    Case("experiment typo", ["--exp=PyCodeTiyn", "--job_log_dir={job}"],
     "did you mean lm.pycode.PyCodeTiny"),
    Case("unknown fiddler", ["--exp=PyCodeTiny", "--fiddler=nope", "--job_log_dir={job}"],
     "no fiddler named 'nope'; valid choices:"),
    Case("bad experiment arguments", ["--fdl_config=PyCodeTiny(layers=2)", "--job_log_dir={job}"],
     "unexpected keyword argument 'layers'"),
    Case("user module raises at import", ["--exp=lk_raises.LkExp", "--job_log_dir={job}"],
     "--exp=lk_raises.LkExp: importing module lk_raises failed: RuntimeError: half-written "
     "(at lk_raises.py:1)", _write("lk_raises.py", "raise RuntimeError('half-written')\n")),
    Case("user module syntax error", ["--exp=lk_syntax.LkExp", "--job_log_dir={job}"],
     "--exp=lk_syntax.LkExp: importing module lk_syntax failed: SyntaxError: ",
     _write("lk_syntax.py", "def f(:\n")),
    Case("user module lacks a dependency", ["--exp=lk_dep.LkExp", "--job_log_dir={job}"],
     "importing module lk_dep failed: ModuleNotFoundError: No module named "
     "'lk_no_such_dependency' (at lk_dep.py:1)",
     _write("lk_dep.py", "import lk_no_such_dependency\n")),
    Case("user module has no such class", ["--exp=lk_empty.LkMissing", "--job_log_dir={job}"],
     "--exp=lk_empty.LkMissing: no such experiment (lk_empty has no attribute 'LkMissing')",
     _write("lk_empty.py", "")),
    Case("user class without config", ["--exp=lk_noconfig.Plain", "--job_log_dir={job}"],
     "the class lk_noconfig.Plain has no config() classmethod",
     _write("lk_noconfig.py", "class Plain:\n  pass\n")),
    Case("library class without config", ["--exp=lingvo_lite.experiment.Setup",
                                          "--job_log_dir={job}"],
     "the class lingvo_lite.experiment.Setup has no config() classmethod"),
    Case("standard library function", ["--exp=os.path.join", "--job_log_dir={job}"],
     "--exp=os.path.join: posixpath.join is a Python standard library function, not a config "
     "function"),
    Case("standard library function with arguments",
     ["--fdl_config=shutil.rmtree(path='{tmp}')", "--job_log_dir={job}"],
     "shutil.rmtree is a Python standard library function"),
    Case("built-in function", ["--fdl_config=os.remove(path='x')", "--job_log_dir={job}"],
     "is a built-in function, not an experiment class"),
    Case("module instead of experiment", ["--exp=json", "--job_log_dir={job}"],
     "--exp=json: is a module, not an experiment"),
    Case("constant instead of experiment", ["--exp=os.sep", "--job_log_dir={job}"],
     "--exp=os.sep: is a str value, not an experiment class"),
    Case("config function raises", ["--fdl_config=lk_cfgraise.config", "--job_log_dir={job}"],
     "lk_cfgraise.config() raised KeyError: 'model' (at lk_cfgraise.py:2)",
     _write("lk_cfgraise.py", "def config():\n  return {}['model']\n")),
    Case("config function returns no config", ["--fdl_config=lk_cfgnone.config",
                                               "--job_log_dir={job}"],
     "lk_cfgnone.config() returned a NoneType, not a fdl.Config",
     _write("lk_cfgnone.py", "def config():\n  return None\n")),
    Case("config function missing an argument", ["--fdl_config=lk_cfgargs.config",
                                                 "--job_log_dir={job}"],
     "missing a required argument: 'layers'; lk_cfgargs.config() takes layers",
     _write("lk_cfgargs.py", "def config(layers):\n  raise AssertionError('must not run')\n")),
    Case("experiment config raises", ["--exp=lk_expraise.LkRaisingExp", "--job_log_dir={job}"],
     "LkRaisingExp.config() raised AttributeError: type object 'LkRaisingExp' has no attribute "
     "'base' (at lk_expraise.py:4)",
     _write("lk_expraise.py", "class LkRaisingExp:\n  @classmethod\n  def config(cls):\n"
                              "    return cls.base\n")),
    Case("positional experiment argument", ["--fdl_config=PyCodeTiny(2)", "--job_log_dir={job}"],
     "pass arguments by keyword"),
    Case("non-literal experiment argument",
     ["--fdl_config=PyCodeTiny(layers=len('ab'))", "--job_log_dir={job}"],
     "arguments must be Python literals"),
    Case("unknown experiment with a broken entry point", ["--exp=LkNoSuchExp",
                                                          "--job_log_dir={job}"],
     "experiment module lk_ep_gone failed to import: entry point lk = lk_ep_gone of "
     "distribution lk-dist (group lingvo_lite.experiments): no module named 'lk_ep_gone'",
     lambda tmp: [_write(f"lk_dist-0.1.dist-info/{name}", text)(tmp) for name, text in (
         ("METADATA", "Metadata-Version: 2.1\nName: lk-dist\nVersion: 0.1\n"),
         ("entry_points.txt", "[lingvo_lite.experiments]\nlk = lk_ep_gone\n"))]),
    Case("ambiguous entry-point experiments", ["--exp=LkTwinExp", "--job_log_dir={job}"],
     "--exp=LkTwinExp: ambiguous, matches lk_twin_a.LkTwinExp, lk_twin_b.LkTwinExp",
     lambda tmp: [_write(name, text)(tmp) for name, text in [
         ("lk_twins-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: lk-twins\n"),
         ("lk_twins-0.1.dist-info/entry_points.txt",
          "[lingvo_lite.experiments]\na = lk_twin_a\nb = lk_twin_b\n")] + [
         (f"lk_twin_{x}.py", "from lingvo_lite.experiment import Experiment\n"
          "from lingvo_lite.config.registry import register\n"
          "@register\nclass LkTwinExp(Experiment):\n  pass\n") for x in "ab"]]),
    # Fiddlers named by import path: imported like experiment modules, their failures one line.
    Case("fiddler raises", ["--job_log_dir={job}", "--fiddler=lk_fidraise.fid"],
     "--fiddler=lk_fidraise.fid: the fiddler raised KeyError: 'model' (at lk_fidraise.py:2)",
     _write("lk_fidraise.py", "def fid(cfg):\n  return {}['model']\n")),
    Case("fiddler exits", ["--job_log_dir={job}", "--fiddler=lk_fidexit.fid"],
     "--fiddler=lk_fidexit.fid: the fiddler raised SystemExit: 3 (at lk_fidexit.py:3)",
     _write("lk_fidexit.py", "import sys\ndef fid(cfg):\n  sys.exit(3)\n")),
    Case("fiddler fails inside fiddle", ["--job_log_dir={job}", "--fiddler=lk_fidkey.fid"],
     "the fiddler raised AssertionError: Key must be an int or slice, got model. (at fiddle/",
     _write("lk_fidkey.py", "def fid(cfg):\n  return cfg['model']\n")),
    Case("fiddler module syntax error", ["--job_log_dir={job}", "--fiddler=lk_fidsyntax.fid"],
     "--fiddler=lk_fidsyntax.fid: importing module lk_fidsyntax failed: SyntaxError: ",
     _write("lk_fidsyntax.py", "def fid(cfg:\n  pass\n")),
    Case("fiddler module lacks a dependency", ["--job_log_dir={job}", "--fiddler=lk_fiddep.fid"],
     "importing module lk_fiddep failed: ModuleNotFoundError: No module named "
     "'lk_no_such_dependency' (at lk_fiddep.py:1)",
     _write("lk_fiddep.py", "import lk_no_such_dependency\ndef fid(cfg):\n  pass\n")),
    Case("fiddler path with an empty part", ["--job_log_dir={job}", "--fiddler=..x"],
     "--fiddler=..x: '..x' is neither a fiddler name nor a dotted import path"),
    Case("built-in function as fiddler", ["--job_log_dir={job}", "--fiddler=sys.exit"],
     "--fiddler=sys.exit: is a built-in function, not a fiddler"),
    Case("standard library function as fiddler", ["--job_log_dir={job}",
                                                  "--fiddler=shutil.rmtree"],
     "--fiddler=shutil.rmtree: shutil.rmtree is a Python standard library function, not a "
     "fiddler"),
    Case("class as fiddler", ["--job_log_dir={job}", "--fiddler=threading.Thread"],
     "--fiddler=threading.Thread: is the class threading.Thread, not a fiddler"),
    # Config functions that exit, library functions, lingvo_lite's own functions.
    Case("config function exits", ["--fdl_config=lk_cfgexit.config", "--job_log_dir={job}"],
     "lk_cfgexit.config() raised SystemExit: 0 (at lk_cfgexit.py:3)",
     _write("lk_cfgexit.py", "import sys\ndef config():\n  sys.exit(0)\n")),
    Case("config function exits with two lines", ["--fdl_config=lk_cfgexit2.config",
                                                  "--job_log_dir={job}"],
     "lk_cfgexit2.config() raised SystemExit: bad (at lk_cfgexit2.py:2)",
     _write("lk_cfgexit2.py", "def config():\n  raise SystemExit('bad\\nthing')\n")),
    Case("installed library function", ["--fdl_config=tensorflow.io.gfile.rmtree(path='victim')",
                                        "--job_log_dir={job}"],
     "tensorflow.python.lib.io.file_io.delete_recursively_v2 is a function of the installed "
     "distribution tensorflow, not a config function",
     _write("victim/precious.txt", "data")),
    Case("lingvo_lite's own function", ["--exp=lingvo_lite.executor.run_main",
                                        "--job_log_dir={job}"],
     "--exp=lingvo_lite.executor.run_main: lingvo_lite.executor.run_main is part of lingvo_lite "
     "itself, not a config function"),
    Case("experiment arguments nested too deep",
     ["--fdl_config=PyCodeTiny(layers=" + "-" * 5000 + "1)", "--job_log_dir={job}"],
     "expected NAME or NAME(key=literal, ...)"),
    Case("experiment name too long", ["--exp=" + "A" * 20000, "--job_log_dir={job}"],
     "--exp: the value is 20000 characters long, more than the 10000"),
]  # End of LOOKUP_CASES.

# Values: types, whole parts replaced by literals, sizes, validate() rules.
VALUES_CASES = [
    Case("misspelled field", ["--job_log_dir={job}", "--fdl.model.num_layer=2"],
     "did you mean 'num_layers'"),
    Case("wrong type", ["--job_log_dir={job}", "--fdl.model.num_layers=\"two\""],
     "model.num_layers must be int, got str 'two'"),
    Case("bare word", ["--job_log_dir={job}", "--fdl.model.norm=rmsnorm"],
     "--fdl.model.norm='\"rmsnorm\"'"),
    Case("not a choice", ["--job_log_dir={job}", "--fdl.model.norm=\"rms\""],
     "must be one of 'layernorm', 'rmsnorm'"),
    Case("heads do not divide dim", ["--job_log_dir={job}", "--fdl.model.num_heads=3"],
     "model.num_heads=3: does not divide model.dim=64"),
    Case("negative steps", ["--job_log_dir={job}", "--fdl.train.steps=-5"],
     "train.steps=-5: must be a positive integer"),
    Case("data vocabulary too large", ["--job_log_dir={job}", "--fdl.train_data.vocab_size=1000"],
     "train_data.vocab_size=1000: exceeds model.vocab_size=259"),
    Case("missing data folder", ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir={job}",
                             "--fdl.train_data.task.source_dir='/no/such/dir'"],
     "train_data.task.source_dir='/no/such/dir': no such folder"),
    Case("flash attention without a GPU",
     ["--job_log_dir={job}", "--fdl.model.attention_implementation=\"cudnn\""],
     "model.attention_implementation='cudnn': needs an NVIDIA GPU (this device: cpu); "
     "or use 'einsum' or 'xla'"),
    Case("mesh larger than the devices", ["--job_log_dir={job}", "--fdl.partitioner.ici_data=3"],
     "the mesh has 3 devices but 1 are available"),
    Case("field of a non-config", ["--job_log_dir={job}", "--fdl.train.steps.every=1"],
     "train.steps is a int, not a config"),
    # Whole parts replaced by a literal, or by the wrong part (type check, config/checks.py).
    Case("model replaced by a number", ["--job_log_dir={job}", "--fdl.model=3"],
     "--fdl.model=3: model must be LanguageModel, got int 3"),
    Case("train data replaced by None", ["--job_log_dir={job}", "--fdl.train_data=None"],
     "train_data must be DataSource, got NoneType None"),
    Case("optimizer replaced by a string", ["--job_log_dir={job}", "--fdl.optimizer=\"adam\""],
     "optimizer must be AdamW, got str 'adam'"),
    Case("partitioner replaced by None", ["--job_log_dir={job}", "--fdl.partitioner=None"],
     "partitioner must be Partitioner, got NoneType None"),
    Case("fiddler sets a size to a string", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "model.num_layers='4': must be int, got str",
     _write("mod.py", "def fiddle(cfg):\n  cfg.model.num_layers = '4'\n")),
    Case("fiddler leaves a required field unset", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "model.num_layers: required by GptJ and not set",
     _write("mod.py", "import fiddle as fdl\n"
            "def fiddle(cfg):\n"
            "  cfg.model = fdl.Config(fdl.get_callable(cfg.model), vocab_size=259, dim=64,\n"
            "                         num_heads=4)\n")),
    Case("fiddler puts an optimizer where the model goes",
     ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "model=<config of AdamW>: must be LanguageModel",
     _write("mod.py", "import fiddle as fdl\nfrom lingvo_lite.optimizers import AdamW\n"
            "def fiddle(cfg):\n  cfg.model = fdl.Config(AdamW)\n")),
    # Values of the right type that make no sense (constraints declared with the fields).
    Case("zero dcn axis", ["--job_log_dir={job}", "--fdl.partitioner.dcn_data=0"],
     "--fdl.partitioner.dcn_data=0: must be a positive integer"),
    Case("zero ici axis", ["--job_log_dir={job}", "--fdl.partitioner.ici_fsdp=0"],
     "must be a positive integer or -1 (-1 takes the devices left over)"),
    Case("negative kv heads", ["--job_log_dir={job}", "--fdl.model.num_kv_heads=-1"],
     "--fdl.model.num_kv_heads=-1: must be a positive integer or None"),
    Case("zero heads set by a fiddler", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "model.num_heads=0: must be a positive integer",
     _write("mod.py", "def fiddle(cfg):\n  cfg.model.num_heads = 0\n")),
    Case("zero eval sequence length", ["--job_log_dir={job}", "--fdl.eval_data.sequence_length=0"],
     "--fdl.eval_data.sequence_length=0: must be in [1, 2147483647]"),
    Case("zero eval batch", ["--job_log_dir={job}", "--fdl.eval_data.global_batch_size=0"],
     "--fdl.eval_data.global_batch_size=0: must be a positive integer or None"),
    Case("zero mlp width", ["--job_log_dir={job}", "--fdl.model.mlp_dim=0"],
     "--fdl.model.mlp_dim=0: must be a positive integer or None"),
    Case("negative head width", ["--job_log_dir={job}", "--fdl.model.head_dim=-2"],
     "--fdl.model.head_dim=-2: must be a positive integer or None"),
    Case("model vocabulary smaller than the bytes",
     ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir={job}", "--fdl.model.vocab_size=100"],
     "model.vocab_size=100: is smaller than the 259 tokens of train_data's vocabulary"),
    Case("unknown data split", ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir={job}",
                                "--fdl.eval_data.split=\"valid\""],
     "eval_data.split='valid': the task has no such split; valid choices: 'train', "
     "'validation'"),
    Case("moments in float16", ["--job_log_dir={job}", "--fdl.optimizer.moment_dtype='float16'"],
     "optimizer.moment_dtype must be one of 'float32', 'bfloat16' or None"),
    Case("optimizer state offloaded on a CPU", [*TRAIN_TINY, "--job_log_dir=new",
                                                "--fdl.optimizer.offload_state=True"],
     "optimizer.offload_state=True: moves the optimizer state to host memory, which a CPU "
     "target does not have apart from its own"),
    Case("zero learning rate", ["--job_log_dir={job}", "--fdl.optimizer.peak_learning_rate=0.0"],
     "--fdl.optimizer.peak_learning_rate=0.0: must be a positive number"),
    Case("negative learning rate set by a fiddler", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "optimizer.peak_learning_rate=-0.001: must be a positive number",
     _write("mod.py", "def fiddle(cfg):\n  cfg.optimizer.peak_learning_rate = -1e-3\n")),
    Case("infinite learning rate",
     ["--job_log_dir={job}", "--fdl.optimizer.peak_learning_rate=1e999"],
     "--fdl.optimizer.peak_learning_rate=1e999: must be a finite number"),
    Case("minus infinite z-loss", ["--job_log_dir={job}", "--fdl.train.z_loss=-1e999"],
     "--fdl.train.z_loss=-1e999: must be a finite number"),
    Case("nan set by a fiddler", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "train.z_loss=nan: must be a finite number",
     _write("mod.py", "def fiddle(cfg):\n  cfg.train.z_loss = float('nan')\n")),
    Case("negative weight decay", ["--job_log_dir={job}", "--fdl.optimizer.weight_decay=-0.1"],
     "--fdl.optimizer.weight_decay=-0.1: must be >= 0"),
    Case("beta of one", ["--job_log_dir={job}", "--fdl.optimizer.b2=1.0"],
     "--fdl.optimizer.b2=1.0: must be in [0, 1)"),
    Case("negative warmup", ["--job_log_dir={job}", "--fdl.optimizer.warmup_steps=-1"],
     "--fdl.optimizer.warmup_steps=-1: must be >= 0"),
    Case("profile start below -1", ["--job_log_dir={job}", "--fdl.train.profile_start_step=-2"],
     "must be >= -1 (-1 disables tracing)"),
    Case("zero checkpoint interval", ["--job_log_dir={job}", "--fdl.checkpoint.every_steps=0"],
     "--fdl.checkpoint.every_steps=0: must be a positive integer"),
    Case("two batch sizes", ["--job_log_dir={job}", "--fdl.train_data.per_device_batch_size=2"],
     "train_data.global_batch_size=4: give exactly one of global_batch_size and "
     "per_device_batch_size (per_device_batch_size=2)"),
    # Absurd sizes: counted before anything is traced or allocated.
    Case("absurd width", ["--job_log_dir={job}", "--fdl.model.dim=1000000000"],
     "model.dim=1000000000: makes 2.4e+19 parameters, more than any machine holds"),
    Case("size past int64", ["--job_log_dir={job}", "--fdl.model.mlp_dim=10000000000000000000"],
     "--fdl.model.mlp_dim=10000000000000000000: is past int64"),
    Case("absurd depth does not fit this host",
     ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
      "--job_log_dir={tmp}/new", "--fdl.model.num_layers=1000000000",
      "--fdl.model.scan_layers=True"],
     "do not fit: training needs at least"),
    # The compile program has no memory check before it traces: a million layers unrolled
    # would be traced one by one for days.
    Case("absurd unrolled depth to compile",
     ["--exp=PyCodeTiny", "--mode=compile", "--compile_topology=cpu:1",
      "--job_log_dir={tmp}/new", "--fdl.model.num_layers=1000000"],
     "model.num_layers=1000000: unrolled (model.scan_layers=False): more than 1024 layers"),
    # Values Python's parser or repr cannot take: nesting, length, ints of 4300+ digits.
    Case("value nested too deep", ["--job_log_dir={job}", "--fdl.train.steps=" + "-" * 5000 + "1"],
     ": the value is not a Python literal"),
    Case("value too long", ["--job_log_dir={job}", "--fdl.model.norm=\"" + "a" * 20000 + "\""],
     "--fdl.model.norm=...: the value is 20002 characters long, more than the 10000"),
    Case("int too long to print", ["--job_log_dir={job}", "--fdl.model.norm=0x" + "f" * 4000],
     "model.norm must be one of 'layernorm', 'rmsnorm', 'rmsnorm_plus_one', got int <int of "
     "16000 bits>"),
    Case("fiddler sets an int too long to print", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "model.norm=<int of 20001 bits>: valid choices: 'layernorm', 'rmsnorm'",
     _write("mod.py", "def fiddle(cfg):\n  cfg.model.norm = 1 << 20000\n")),
    # Partitioner rules: what Flax or JAX would refuse only once arrays are sharded.
    Case("rule target not a mesh axis", ["--job_log_dir={job}", "--fiddler=mod.fiddle"],
     "partitioner.rules=('batch', 3): a rule maps a logical axis to None, a mesh axis name or "
     "a tuple of mesh axis names",
     _write("mod.py", "def fiddle(cfg):\n  cfg.partitioner.rules = tuple(\n"
            "      (n, 3 if n == 'batch' else t) for n, t in cfg.partitioner.rules)\n")),
    Case("rule names a mesh axis twice", [*TRAIN_TINY, "--job_log_dir=new", "--fiddler=mod.fiddle"],
     "partitioner.rules=('embed', ('fsdp', 'fsdp')): names a mesh axis twice",
     _write("mod.py", "def fiddle(cfg):\n  cfg.partitioner.rules = tuple(\n"
            "      (n, ('fsdp', 'fsdp') if n == 'embed' else t) for n, t in "
            "cfg.partitioner.rules)\n")),
    Case("two dimensions of a parameter on one mesh axis",
     ["--mode=print", "--exp=PyCodeTiny", "--fiddler=mod.fiddle"],
     "partitioner.rules='embed -> fsdp, mlp -> fsdp': parameter ",
     _write("mod.py", "def fiddle(cfg):\n  cfg.partitioner.rules = tuple(\n"
            "      (n, 'fsdp' if n == 'mlp' else t) for n, t in cfg.partitioner.rules)\n")),
    # Data sources that lack what they read, found when the config is built.
    Case("data task replaced by None", ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir=new",
                                        "--fdl.train_data.task=None"],
     "train_data.task=None: is a NoneType, not a seqio Task"),
    Case("empty data folder", ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir=new",
                               "--fdl.train_data.task.source_dir='empty'"],
     "train_data.task.source_dir='empty': has no .py files", _write("empty/notes.txt", "x")),
    Case("missing vocabulary file", ["--exp=PyCodeSpTiny", "--fiddler=tiny", "--job_log_dir=new",
                                     "--fdl.train_data.task.vocabulary='no/sp.model'"],
     "train_data.task.vocabulary='no/sp.model': "),
    Case("vocabulary smaller than bytes", ["--exp=PyCodeSpTiny", "--fiddler=tiny",
                                           "--job_log_dir=new",
                                           "--fdl.train_data.task.vocabulary.vocab_size=100"],
     "train_data.task.vocabulary.vocab_size=100: must be an int above 259"),
    Case("model vocabulary smaller than the tokenizer's",
     ["--exp=PyCodeSpTiny", "--fiddler=tiny", "--job_log_dir=new", "--fdl.model.vocab_size=1000"],
     "model.vocab_size=1000"),
    Case("store that must exist", ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir=new",
                                   "--fdl.train_data.store_dir='nowhere'",
                                   "--fdl.train_data.build=False"],
     "train_data.store_dir="),
    Case("mixture rate not positive", ["--exp=PyCodeMixtureTiny", "--fiddler=tiny",
                                       "--job_log_dir=new", "--fdl.train_data.rates=[1.0, 0.0]"],
     "train_data.rates[1]=0.0: must be a positive number"),
]  # End of VALUES_CASES.

# Job dirs, config files and checkpoints.
JOBDIR_CASES = [
    Case("missing config file", ["--fdl_config_file=/no/such/config.json", "--job_log_dir={job}"],
     "--fdl_config_file=/no/such/config.json: no such file"),
    Case("config file not json", ["--fdl_config_file={job}/config.txt", "--job_log_dir={job}"],
     "not a config.json written by lingvo_lite"),
    Case("resume with another model", ["--job_log_dir={job}", "--fdl.model.dim=32"],
     "the config differs from the one this job was trained with (model.dim: 64 -> 32)"),
    Case("resume with bfloat16 moments", ["--job_log_dir={job}",
                                          "--fdl.optimizer.moment_dtype='bfloat16'"],
     "the config differs from the one this job was trained with (optimizer.moment_dtype: "
     "None -> 'bfloat16')"),
    Case("eval without eval data", ["--mode=eval", "--job_log_dir={job}", "--fdl.eval_data=None"],
     "this config has no eval data"),
    Case("job dir is a file", [*TRAIN_TINY, "--job_log_dir=job"],
         "--job_log_dir=job: is a file, not a folder", _write("job", "x")),
    Case("job dir under a file", [*TRAIN_TINY, "--job_log_dir=file/job"],
         "file is a file, so the job folder cannot be created", _write("file", "x")),
    Case("eval of a missing job dir", ["--mode=eval", "--job_log_dir=no_such_job"],
         "--job_log_dir=no_such_job: no such folder"),
    Case("checkpoints is a file", ["--job_log_dir=job"], "checkpoints is a file, not a folder",
         _copy_job(_make_file("checkpoints"))),
    Case("checkpoints is a file at eval", ["--mode=eval", "--job_log_dir=job"],
         "checkpoints is a file, not a folder", _copy_job(_make_file("checkpoints"))),
    Case("config.json is a folder", ["--job_log_dir=job"], "config.json is a folder, not a file",
         _copy_job(_make_folder("config.json"))),
    Case("summaries is a file", ["--job_log_dir=job"], "summaries is a file, not a folder",
         _copy_job(_make_file("summaries"))),
    Case("truncated config.json", ["--mode=eval", "--job_log_dir=job"],
         "not a config.json written by lingvo_lite (JSONDecodeError",
         _copy_job(_truncate("config.json", 300))),
    Case("empty config.json", ["--job_log_dir=job"], "not a config.json written by lingvo_lite",
         _copy_job(_truncate("config.json", 0))),
    Case("config.json holds a list", ["--job_log_dir=job"], "holds a JSON list, not an object",
         _write("job/config.json", "[1, 2]")),
    Case("config.json names a missing class", ["--mode=eval", "--job_log_dir=job"],
         "names code that no longer exists",
         _copy_job(_replace_in("config.json", '"GptJ"', '"GptJv2"'))),
    Case("config.json names a missing module", ["--mode=eval", "--job_log_dir=job"],
         "names code that no longer exists",
         _copy_job(_replace_in("config.json", '"lingvo_lite.training.optimizers"',
                               '"lingvo_lite.no_such_module"'))),
    Case("config file is a folder", ["--fdl_config_file=.", "--job_log_dir={job}"],
         "is a folder; give the config.json file in it"),
    Case("relative config file missing", ["--fdl_config_file=runs/a/config.json",
                                          "--job_log_dir={job}"], "no such file"),
    Case("eval with another model, same shapes", ["--mode=eval", "--job_log_dir={job}",
                                                  "--fdl.model.norm=\"rmsnorm\""],
         "the model config differs from the one this job was trained with "
         "(model.norm: 'layernorm' -> 'rmsnorm')"),
    Case("eval with another model from --exp", ["--mode=eval", "--job_log_dir={job}",
                                                "--exp=PyCodeTiny"],
         "the model config differs from the one this job was trained with"),
    Case("eval without config.json, other shapes",
         ["--mode=eval", "--job_log_dir=job", *TRAIN_TINY, "--fdl.model.dim=32"],
         "checkpoint step 2 in", _copy_job(_remove("config.json"))),
    Case("resume without config.json, other shapes",
         [*TRAIN_TINY, "--fdl.train.steps=4", "--fdl.model.mlp_dim=48", "--job_log_dir=job"],
         "does not fit this config: its params/layer_0/mlp/wi/bias has shape (256,), this "
         "config's has (48,)",
         _copy_job(_remove("config.json"))),
    Case("eval of a job without checkpoints", ["--mode=eval", "--job_log_dir=job"],
         "no checkpoint in", _copy_job(lambda job: shutil.rmtree(os.path.join(job, "checkpoints")))),
    # Paths job_dirs.check and paths.resolve refuse before anything is created.
    Case("job dir a dangling symlink", [*TRAIN_TINY, "--job_log_dir=link"],
         "link is a symlink whose target does not exist (-> no_such_target)",
         lambda tmp: os.symlink("no_such_target", os.path.join(tmp, "link"))),
    Case("job dir a symlink loop", [*TRAIN_TINY, "--job_log_dir=loop"],
         "loop is a symlink loop (-> loop)",
         lambda tmp: os.symlink("loop", os.path.join(tmp, "loop"))),
    Case("job dir name too long", [*TRAIN_TINY, "--job_log_dir=" + "j" * 300],
         "is 300 bytes long, and this file system allows 255; use a shorter name"),
    Case("job dir path too long", [*TRAIN_TINY, "--job_log_dir=" + "/".join(["d" * 200] * 22)],
         "bytes a run writes below it, and this system allows paths of 4095"),
    Case("job dir under /proc", [*TRAIN_TINY, "--job_log_dir=/proc/lk_job"],
         "create folders in /proc"),
    Case("job dir not UTF-8", [*TRAIN_TINY, "--job_log_dir=j\udcff"],
         "--job_log_dir=j\\xff: the path "),
    Case("checkpoints a dangling symlink", ["--job_log_dir=job"],
         "checkpoints is a symlink whose target does not exist",
         _copy_job(lambda job: (shutil.rmtree(os.path.join(job, "checkpoints")),
                                os.symlink("no_such_folder", os.path.join(job, "checkpoints"))))),
    # Every folder a mode creates, not only the top-level ones.
    Case("summaries/train is a file", ["--job_log_dir=job", "--fdl.train.steps=3"],
         "summaries/train is a file, not a folder", _copy_job(_make_file("summaries/train"))),
    Case("eval is a file", ["--mode=eval", "--job_log_dir=job"], "eval is a file, not a folder",
         _copy_job(_make_file("eval"))),
    Case("eval/summaries is a file", ["--mode=eval", "--job_log_dir=job"],
         "eval/summaries is a file, not a folder",
         _copy_job(lambda job: (os.makedirs(os.path.join(job, "eval")),
                                _make_file("eval/summaries")(job)))),
    Case("profile is a file", ["--job_log_dir=job", "--fdl.train.steps=4",
                               "--fdl.train.profile_start_step=2", "--fdl.train.profile_steps=1"],
         "summaries/train/plugins is a file, not a folder",
         _copy_job(_make_file("summaries/train/plugins"))),
    # URLs: file:// is a local path; an unreachable store is one line.
    Case("file URL of a missing job", ["--mode=eval", "--job_log_dir=file://{tmp}/nope"],
         "/nope: no such folder; give the --job_log_dir of a training run"),
    Case("unknown URL scheme", ["--mode=eval", "--job_log_dir=foo://bucket/job"],
         "--job_log_dir=foo://bucket/job: unknown URL scheme 'foo://'"),
    Case("unreachable s3 job dir", ["--mode=eval", "--job_log_dir=s3://lk-bucket/job"],
         "--job_log_dir=s3://lk-bucket/job: cannot be reached ("),
    # Sizes the eval program and a resumed training would only meet as an out-of-memory abort.
    Case("eval batch larger than the host", ["--mode=eval", "--job_log_dir={job}",
                                             "--fdl.eval_data.global_batch_size=20000000"],
         "with eval_data batches of 20000000 x 64 tokens do not fit: eval needs at least"),
    Case("eval sequence longer than the host holds", ["--mode=eval", "--job_log_dir={job}",
                                                      "--fdl.eval_data.sequence_length=200000"],
         "with eval_data batches of 4 x 200000 tokens do not fit: eval needs at least"),
    Case("train attention scores larger than the host",
         [*TRAIN_TINY, "--job_log_dir={tmp}/new", "--fdl.train_data.sequence_length=200000",
          "--fdl.eval_data.sequence_length=64"],
         "with train_data batches of 4 x 200000 tokens do not fit: training needs at least"),
    Case("resume with an eval batch larger than the host",
         ["--job_log_dir=job", "--fdl.train.steps=3", "--fdl.eval_data.global_batch_size=20000000"],
         "with eval_data batches of 20000000 x 64 tokens do not fit: training needs at least",
         _copy_job()),
    # No usable step: the one line says why.
    Case("eval when the only step is incomplete", ["--mode=eval", "--job_log_dir=job"],
         "checkpoints: step 2 is incomplete (no _CHECKPOINT_METADATA",
         _copy_job(_remove("checkpoints/2/_CHECKPOINT_METADATA"))),
    Case("eval when the only step lacks checksums", ["--mode=eval", "--job_log_dir=job"],
         "checkpoints: step 2 has no checksums",
         _copy_job(_remove("checkpoints/2/lingvo_lite_checksums.json"))),
]  # End of JOBDIR_CASES.

# --mode=compile: the target (lingvo_lite/target.py) and the config against it, checked before
# anything compiles; flags of one program refused by the others (lingvo_lite/programs).
COMPILE_TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data", "--mode=compile",
                "--fdl.train_data.global_batch_size=8", "--fdl.eval_data.global_batch_size=8"]
COMPILE_CASES = [
    Case("compile without a topology", COMPILE_TINY, "--compile_topology: required"),
    Case("unknown topology", [*COMPILE_TINY, "--compile_topology=v9z-8"],
         "--compile_topology='v9z-8': unknown topology; known: cpu:N"),
    Case("topology in capitals", [*COMPILE_TINY, "--compile_topology=V5E-08"],
         "--compile_topology='V5E-08': unknown topology; did you mean v5e-8? known: cpu:N"),
    Case("compile into a job with another model", [*COMPILE_TINY, "--job_log_dir={job}",
                                                   "--compile_topology=v5e-8",
                                                   "--fdl.model.num_layers=3"],
         "the config differs from the one this job was trained with (model.num_layers: 2 -> 3;"),
    Case("compiled step folder under a file", [*COMPILE_TINY, "--compile_topology=v5e-8",
                                               "--compiled_step_out=afile/step"],
         "afile is a file, not a folder; name a folder you can write", _write("afile", "x")),
    Case("compiled step folder where none can be made",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--compiled_step_out=/proc/step"],
         "--compiled_step_out='/proc/step': cannot create a folder in /proc: that file system "
         "takes no new files (ENOENT)"),
    Case("saved step manifest nested too deep", [*TRAIN_TINY, "--job_log_dir={tmp}/new",
                                                 "--compiled_step_in=step"],
         "--compiled_step_in='step': cannot read the saved step (ValueError: nested too deeply",
         lambda tmp: (_write("step/manifest.json", "[" * 100000 + "]" * 100000)(tmp),
                      _write("step/executable.bin", "x")(tmp))),
    Case("topology name of the wrong count", [*COMPILE_TINY, "--compile_topology=v4-4"],
         "v4 (TensorCores, 2 per chip): v4-8 v4-16"),
    Case("zero slices", [*COMPILE_TINY, "--compile_topology=v5e-8", "--compile_num_slices=0"],
         "--compile_num_slices=0: must be 1..1024"),
    Case("a million slices", [*COMPILE_TINY, "--compile_topology=v5e-8",
                              "--compile_num_slices=1000000"],
         "--compile_num_slices=1000000: must be 1..1024"),
    Case("empty saved-step folder", [*COMPILE_TINY, "--compile_topology=v5e-8",
                                     "--compiled_step_out="],
         "--compiled_step_out='': empty; give a folder"),
    Case("empty saved step to load", [*TRAIN_TINY, "--job_log_dir={tmp}/new",
                                      "--compiled_step_in="],
         "--compiled_step_in='': empty; give the folder"),
    Case("slices of a CPU topology", [*COMPILE_TINY, "--compile_topology=cpu:8",
                                      "--compile_num_slices=2"],
         "--compile_num_slices=2: only TPU topologies have slices"),
    Case("zero virtual CPU devices", [*COMPILE_TINY, "--compile_topology=cpu:0"],
         "--compile_topology=cpu:0: N must be 1..4096"),
    Case("mesh that does not match the chip count",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--fdl.partitioner.ici_data=3"],
         "partitioner.ici_*="),
    Case("batch that does not split over the topology",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--fdl.train_data.global_batch_size=12"],
         "train_data.global_batch_size=12: must split evenly over the data-parallel size 8"),
    Case("axes across slices that do not match the slices",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--compile_num_slices=2",
          "--fdl.partitioner.dcn_data=4", "--fdl.train_data.global_batch_size=16",
          "--fdl.eval_data.global_batch_size=16"],
         "partitioner.dcn_*={'stage': 1, 'data': 4, 'fsdp': 1, 'expert': 1, 'tensor': 1}: "
         "the mesh axes across slices multiply to 4"),
    Case("axes across slices on a one-slice TPU target",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--fdl.partitioner.dcn_data=2",
          "--fdl.train_data.global_batch_size=16", "--fdl.eval_data.global_batch_size=16"],
         "partitioner.dcn_*={'stage': 1, 'data': 2, 'fsdp': 1, 'expert': 1, 'tensor': 1}: "
         "the mesh axes across slices multiply to 2, but v5e-8 has 1 slice; make their product "
         "1 (e.g. --fdl.partitioner.dcn_data=1)"),
    # A set dcn axis keeps the slice count from becoming dcn_data: the fix completes it.
    Case("fsdp across fewer slices than the target has",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--compile_num_slices=4",
          "--fdl.partitioner.dcn_fsdp=2", "--fdl.train_data.global_batch_size=64",
          "--fdl.eval_data.global_batch_size=64"],
         "partitioner.dcn_*={'stage': 1, 'data': 1, 'fsdp': 2, 'expert': 1, 'tensor': 1}: "
         "the mesh axes across slices multiply to 2, but v5e-8 x 4 slices has 4 slices; make "
         "their product 4 (e.g. --fdl.partitioner.dcn_data=2)"),
    Case("unknown remat policy", [*COMPILE_TINY, "--compile_topology=v5e-8",
                                  "--compile_find_max_batch", "--compile_remat_policies=bogus"],
         "unknown policy 'bogus'; valid: none, full"),
    Case("unknown optimizer option", [*COMPILE_TINY, "--compile_topology=v5e-8",
                                      "--compile_optimizer_options=bf16"],
         "unknown option 'bf16'; valid: param_dtype, bfloat16, offload, bfloat16_offload, all"),
    Case("an optimizer option the target cannot run, before any compile",
         [*COMPILE_TINY, "--compile_topology=cpu:1",
          "--compile_optimizer_options=bfloat16,offload"],
         "--compile_optimizer_options: option 'offload': optimizer.offload_state=True: moves "
         "the optimizer state to host memory, which a CPU target does not have"),
    Case("optimizer options of the decode functions",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--compile_program=decode",
          "--compile_optimizer_options=all"],
         "--compile_optimizer_options: the decode functions take no gradients and no "
         "optimizer step"),
    Case("a remat policy the target cannot run, before any compile",
         [*COMPILE_TINY, "--compile_topology=cpu:1",
          "--compile_remat_policies=full,minimal_offloaded"],
         "--compile_remat_policies: policy 'minimal_offloaded': model.remat_policy="),
    Case("eval step of a config without eval data",
         [*COMPILE_TINY, "--fiddler=no_eval", "--compile_topology=v5e-8",
          "--compile_program=eval"], "--compile_program=eval: this config has no eval_data"),
    Case("compiled step written over a file",
         [*COMPILE_TINY, "--compile_topology=v5e-8", "--compiled_step_out=step"],
         "--compiled_step_out='step': exists and is not a folder", _write("step", "x")),
    Case("compile flag given to train", [*TRAIN_TINY, "--job_log_dir={tmp}/new",
                                         "--compile_topology=v5e-8"],
         "--compile_topology: --mode=train does not use this flag (only --mode=compile"),
    Case("saved step given to compile", [*COMPILE_TINY, "--compile_topology=v5e-8",
                                         "--compiled_step_in=step"],
         "--compiled_step_in: --mode=compile does not use this flag (only --mode=train"),
    Case("missing saved step", [*TRAIN_TINY, "--job_log_dir={tmp}/new",
                                "--compiled_step_in=nowhere"],
         "--compiled_step_in='nowhere': no saved step there (manifest.json is missing)"),
    Case("saved step that is not a manifest", [*TRAIN_TINY, "--job_log_dir={tmp}/new",
                                               "--compiled_step_in=step"],
         "--compiled_step_in='step': cannot read the saved step (JSONDecodeError",
         lambda tmp: (_write("step/manifest.json", "{")(tmp),
                      _write("step/executable.bin", "x")(tmp))),
]


# Outputs (lingvo_lite/outputs.py): never over what the user made, never inside a job's
# checkpoints/ (retention deletes a step with whatever is in it), nothing created by a refused
# or failed run. The job is trained on synthetic ids, so the decode requests are ids.
DECODE_IDS = ["--mode=decode", "--prompts_file=ids.jsonl", "--fdl.decode.max_new_tokens=2"]


def _with_ids(*prepares: Callable[[str], None]) -> Callable[[str], None]:
  """A `prepare` that writes the decode requests, then runs `prepares`."""
  def prepare(tmp: str) -> None:
    _write("ids.jsonl", '{"prompt_ids": [5, 6, 7]}\n')(tmp)
    for other in prepares:
      other(tmp)
  return prepare


def _link_into_job(name: str, relative: str) -> Callable[[str], None]:
  """A `prepare` that makes `{tmp}/name` a symlink to the shared job's `relative`."""
  return lambda tmp: os.symlink(os.path.join(_JOB[0], relative), os.path.join(tmp, name))


def _step_folder(**files: str) -> Callable[[str], None]:
  """A `prepare` that makes `{tmp}/step` holding `files` (name: text)."""
  def prepare(tmp: str) -> None:
    os.makedirs(os.path.join(tmp, "step"), exist_ok=True)
    for name, text in files.items():
      _write(f"step/{name.replace('_dot_', '.')}", text)(tmp)
  return prepare


INSIDE_CHECKPOINTS = "is inside the job's checkpoints folder"
OWN_MANIFEST = '{"schema": "lingvo_lite.compiled_step/1"}'
COMPILE_CPU = ["--mode=compile", "--compile_topology=cpu:1"]  # The job's own config.
OUTPUT_CASES = [
    Case("decode into a checkpoint step", [*DECODE_IDS, "--job_log_dir={job}",
                                           "--decode_out={job}/checkpoints/2/answers.jsonl"],
         INSIDE_CHECKPOINTS, _with_ids()),
    Case("decode into checkpoints through ..", [
        *DECODE_IDS, "--job_log_dir={job}",
        "--decode_out={job}/summaries/../checkpoints/answers.jsonl"],
         INSIDE_CHECKPOINTS, _with_ids()),
    Case("decode into checkpoints through a symlink", [
        *DECODE_IDS, "--job_log_dir={job}", "--decode_out=ck/answers.jsonl"],
         INSIDE_CHECKPOINTS, _with_ids(_link_into_job("ck", "checkpoints/2"))),
    Case("decode into another job's checkpoints", [
        *DECODE_IDS, "--job_log_dir={job}", "--decode_out=job/checkpoints/answers.jsonl"],
         INSIDE_CHECKPOINTS, _with_ids(_copy_job())),
    Case("decode onto a dangling symlink", [*DECODE_IDS, "--job_log_dir={job}",
                                            "--decode_out=link"],
         "--decode_out=link: already exists, and is never overwritten",
         _with_ids(lambda tmp: os.symlink("nowhere", os.path.join(tmp, "link")))),
    Case("decode over the user's file", [*DECODE_IDS, "--job_log_dir={job}",
                                         "--decode_out=taken.jsonl"],
         "--decode_out=taken.jsonl: already exists, and is never overwritten",
         _with_ids(_write("taken.jsonl", "mine\n"))),
    Case("decode into a folder that takes no files", [*DECODE_IDS, "--job_log_dir={job}",
                                                      "--decode_out=/proc/answers.jsonl"],
         "--decode_out=/proc/answers.jsonl: cannot create files in /proc: that file system "
         "takes no new files (ENOENT)", _with_ids()),
    Case("decode where JOB/decode is a file", [*DECODE_IDS, "--job_log_dir=job"],
         "decode is a file, not a folder", _with_ids(_copy_job(_make_file("decode")))),
    # Refused at the restore, after the writer was made: no empty JOB/decode/ is left.
    Case("decode of a corrupt checkpoint", [*DECODE_IDS, "--job_log_dir=job"],
         "checkpoint step 2 is corrupt: ",
         _with_ids(_copy_job(lambda job: _flip_a_byte(
             sorted(glob.glob(f"{job}/checkpoints/2/default/ocdbt.process_0/d/*"))[0])))),
    Case("compiled step over the user's folder", [*COMPILE_CPU, "--job_log_dir={job}",
                                                  "--compiled_step_out=step"],
         "--compiled_step_out='step': the folder holds files lingvo_lite did not write "
         "(notes.txt), and it never replaces them", _step_folder(notes_dot_txt="mine")),
    Case("compiled step over the user's manifest", [*COMPILE_CPU, "--job_log_dir={job}",
                                                    "--compiled_step_out=step"],
         "the folder holds files lingvo_lite did not write (executable.bin, manifest.json)",
         _step_folder(manifest_dot_json='{"schema": "mine"}', executable_dot_bin="x")),
    Case("compiled step beside the user's file", [*COMPILE_CPU, "--job_log_dir={job}",
                                                  "--compiled_step_out=step"],
         "the folder holds notes.txt besides the compiled step lingvo_lite wrote",
         _step_folder(manifest_dot_json=OWN_MANIFEST, notes_dot_txt="mine")),
    Case("compiled step over another kind of output", [*COMPILE_CPU, "--job_log_dir={job}",
                                                       "--compiled_step_out=step"],
         "holds another kind of lingvo_lite output ('lingvo_lite.export/1'), which is not "
         "replaced", _step_folder(manifest_dot_json='{"schema": "lingvo_lite.export/1"}')),
    Case("compiled step over the job dir", [*COMPILE_CPU, "--job_log_dir={job}",
                                            "--compiled_step_out={job}"],
         "the folder holds files lingvo_lite did not write (checkpoints, config.json, "
         "config.txt, ...)"),
    Case("compiled step inside the job's checkpoints", [
        *COMPILE_CPU, "--job_log_dir={job}", "--compiled_step_out={job}/checkpoints/step"],
         INSIDE_CHECKPOINTS),
    Case("compiled step through a symlink into checkpoints", [
        *COMPILE_CPU, "--job_log_dir={job}", "--compiled_step_out=ck/step"],
         INSIDE_CHECKPOINTS, _link_into_job("ck", "checkpoints")),
    Case("compiled step into another job's checkpoints", [
        *COMPILE_TINY, "--compile_topology=v5e-8", "--compiled_step_out=job/checkpoints/2/s"],
         INSIDE_CHECKPOINTS, _copy_job()),
    Case("compiled step onto a dangling symlink", [*COMPILE_CPU, "--job_log_dir={job}",
                                                   "--compiled_step_out=link"],
         "--compiled_step_out='link': is a symlink whose target does not exist (-> nowhere)",
         lambda tmp: os.symlink("nowhere", os.path.join(tmp, "link"))),
]  # End of OUTPUT_CASES.


def _flip_a_byte(path: str) -> None:
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


CASES = CLI_CASES + LOOKUP_CASES + VALUES_CASES + JOBDIR_CASES + COMPILE_CASES + OUTPUT_CASES


@pytest.fixture(scope="module", name="job")
def fixture_job(tmp_path_factory):
  job = tmp_path_factory.mktemp("job")
  result = run_cli([*TRAIN_TINY, f"--job_log_dir={job}"])
  assert result.code == 0, result.stderr
  _JOB[:] = [str(job)]
  return job


def test_case_names_are_unique():
  names = [case.name for case in CASES]
  assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_the_job_untouched(job, tmp_path, monkeypatch,
                                                                   case):
  if case.prepare is not None:
    case.prepare(str(tmp_path))
  # As under `python -m lingvo_lite`: relative paths start at the case's own folder, which is
  # also first on sys.path (so user modules written there import).
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, "dont_write_bytecode", True)  # No __pycache__ in the case's folder.
  before = tree_digest(job), tree_digest(tmp_path)
  result = run_cli([arg.format(job=job, tmp=tmp_path) for arg in case.args]
                   + ["--compilation_cache_dir="])
  lines = result.stderr.strip().splitlines()
  assert result.code == 2, result
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  assert case.expected in lines[0], lines[0]
  assert "Traceback" not in result.stderr + result.stdout
  assert (tree_digest(job), tree_digest(tmp_path)) == before


def test_a_report_that_cannot_be_written_is_one_line_exit_1_and_leaves_nothing(job, tmp_path,
                                                                             monkeypatch):
  """A full disk under --mode=report's pages: the cause by its errno (not a traceback, not
  "fix the permissions"), exit 1, and no report/ folder left in the job."""
  shutil.copytree(job, tmp_path / "job")
  before = tree_digest(tmp_path / "job")

  def full(path, content):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
  monkeypatch.setattr(paths, "write_atomically", full)
  monkeypatch.chdir(tmp_path)
  result = run_cli(["--mode=report", "--job_log_dir=job"])
  assert result.code == 1, result
  assert result.stderr.splitlines() == [
      "lingvo_lite: error: cannot write the report to job/report: the disk is full (ENOSPC); "
      "free space, or write elsewhere, then make the report again"]
  assert tree_digest(tmp_path / "job") == before


# A JSON line nested 100,000 deep: Python's parser raises RecursionError on it, not the
# ValueError its readers catch (input_files.json_value makes it one).
_DEEP_LINE = '{"step": 4, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"


def test_job_files_nested_past_the_parser_are_read_as_bad_lines(job, tmp_path, monkeypatch):
  """A line of metrics.jsonl, run_info.jsonl or an eval set's records that no JSON parser
  returns from (a damaged or planted file) is skipped as a half-written line is, by the report
  and by the metrics a resumed run reads first: each was a RecursionError's traceback."""
  shutil.copytree(job, tmp_path / "job")
  with open(tmp_path / "job" / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f]
  for name in ("metrics.jsonl", "run_info.jsonl", "eval_validation.jsonl"):
    with open(tmp_path / "job" / name, "a") as f:
      f.write(_DEEP_LINE)
  monkeypatch.chdir(tmp_path)
  result = run_cli(["--mode=report", "--job_log_dir=job"])
  assert result.code == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  metrics = epath.Path(tmp_path / "job" / "metrics.jsonl")
  assert steps and summaries.logged_steps(metrics) == steps  # The deep line left out.
  assert [row["step"] for row in summaries.read_rows(metrics)] == steps
  with pytest.raises(ValueError, match="nested too deeply"):
    input_files.json_value(_DEEP_LINE)


@pytest.fixture(autouse=True)
def _forget_user_modules(tmp_path):
  """Modules a case imported from its folder must not leak into the next case."""
  yield
  for name, module in list(sys.modules.items()):
    if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
      del sys.modules[name]


# Runs "$@" with the folder $1 bind-mounted read-only, in a mount namespace of its own (chmod
# does not stop root; the mount ends with the namespace). Exit 97: the mount was not read-only.
_READ_ONLY = ('job="$1"; shift; mount --bind "$job" "$job" && mount -o remount,bind,ro "$job" '
              '"$job" || exit 98; touch "$job/.rw_probe" 2>/dev/null && { rm "$job/.rw_probe"; '
              'exit 97; }; exec "$@"')


def _read_only_prefix(folder: str) -> tuple[list[str], str]:
  """The command prefix that runs a command with `folder` mounted read-only, and how (unshare
  as an unprivileged user's root, or as root); ([], why not) where neither works here."""
  tries = [["unshare", "--user", "--map-root-user", "--mount"]]
  if os.geteuid() == 0:
    tries.append(["unshare", "--mount"])
  for prefix in tries:
    command = prefix + ["sh", "-c", _READ_ONLY, "sh", folder]
    try:
      if subprocess.run(command + ["true"], cwd=source_root(), capture_output=True, timeout=30,
                        check=False).returncode == 0:
        return command, " ".join(prefix)
    except (OSError, subprocess.TimeoutExpired):
      continue
  return [], "this machine allows no user or mount namespace (unshare failed)"


def test_completions_that_cannot_be_written_are_one_line_and_exit_1(job, tmp_path):
  """As a user runs it, from the repository root with relative paths: `--decode_out=-` from a
  job dir mounted read-only (a decode to stdout needs nothing on disk, so it is served) into a
  pipe whose reader has gone (`... | head -c 10`). The closed pipe is named as what it is, in
  one line, exit 1: no traceback, no "Exception ignored" at interpreter shutdown; the job is as
  it was. (A closed stdout is refused before: the next test.)"""
  (tmp_path / "ids.jsonl").write_text('{"prompt_ids": [5, 6, 7]}\n')
  relative = os.path.relpath(job, source_root())
  before = tree_digest(job)
  prefix, how = _read_only_prefix(relative)
  process = subprocess.Popen(
      prefix + [sys.executable, "-m", "lingvo_lite", "--mode=decode", f"--job_log_dir={relative}",
                f"--prompts_file={os.path.relpath(tmp_path / 'ids.jsonl', source_root())}",
                "--fdl.decode.max_new_tokens=2", "--decode_out=-"],
      cwd=source_root(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  process.stdout.close()  # The reader is gone before the first line.
  try:
    stderr = process.stderr.read()
  finally:
    process.wait(timeout=300)
  assert process.returncode == 1, (how, stderr)
  assert stderr.splitlines() == [
      "lingvo_lite: error: cannot write the completions to stdout: the reader closed the pipe "
      "(EPIPE); keep the reader open until the output ends, or write to a file, then decode "
      "again"], (how, stderr)
  assert tree_digest(job) == before
  if not prefix:
    pytest.skip(f"the closed pipe was checked, but not from a read-only job dir: {how}")


def test_completions_to_a_closed_stdout_are_refused_exit_1(job):
  """`--decode_out=- >&-` used to decode, print nothing and say "written to stdout" with exit
  0: the completions were lost. It is a failed write of results (exit 1), found before the
  checkpoint is read, and the job is as it was."""
  relative = os.path.relpath(job, source_root())
  before = tree_digest(job)
  completed = subprocess.run(
      f"{sys.executable} -m lingvo_lite --mode=decode --job_log_dir={relative} "
      "--prompt=x --decode_out=- --compilation_cache_dir= >&-", shell=True,
      cwd=source_root(), stderr=subprocess.PIPE, text=True, timeout=300, check=False)
  assert completed.returncode == 1, completed.stderr
  assert completed.stderr.splitlines() == [
      "lingvo_lite: error: --decode_out=-: stdout is closed, so the results would be lost; run "
      "it with stdout open (a file, a pipe or a terminal), or give --decode_out=FILE"], (
          completed.stderr)
  assert tree_digest(job) == before


@pytest.mark.parametrize("args", [["--exp=NoSuchExp"], ["--mdoe=train"],
                                  ["--exp=PyCodeTiny", "--fdl.model.norm=rmsnorm"]])
def test_a_real_process_prints_one_line_and_exits_2(job, args):
  before = tree_digest(job)
  completed = subprocess.run([sys.executable, "-m", "lingvo_lite", f"--job_log_dir={job}",
                              *args], capture_output=True, text=True, timeout=120, check=False)
  assert completed.returncode == 2
  assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
  assert tree_digest(job) == before


@pytest.mark.parametrize("capability, fields, message", [
    ("9.0", {"dtype": "float32"}, "needs model.dtype 'bfloat16' or 'float16' (got 'float32')"),
    ("9.0", {"dtype": "bfloat16", "head_dim": 12},
     "a multiple of 8 and at most 256 on NVIDIA H200 (got 12)"),
    ("9.0", {"dtype": "bfloat16", "head_dim": 512},
     "a multiple of 8 and at most 256 on NVIDIA H200 (got 512)"),
    ("8.0", {"dtype": "bfloat16", "head_dim": 160},
     "a multiple of 8 and at most 128 on NVIDIA H200 (got 160)"),
])
def test_cudnn_attention_limits_are_checked_before_device_time(monkeypatch, capability, fields,
                                                               message):
  """On an NVIDIA GPU (faked here), what the cuDNN kernel refuses is a one-line config error."""
  del monkeypatch
  gpu = types.SimpleNamespace(device_kind="NVIDIA H200", compute_capability=capability,
                              process_index=0)
  # The check reads the target's devices, not this CPU host's backend.
  host_gpu = target.Target(name="local", platform="gpu", devices=(gpu,), memory_per_device=None,
                           memory_source="")
  model = fdl.build(architectures.llama(vocab_size=64, num_layers=1, dim=64, num_heads=4,
                                        attention_implementation="cudnn", **fields))
  with pytest.raises(UsageError) as error:
    model.validate(host_gpu)
  assert str(error.value).startswith("model.attention_implementation='cudnn': ")
  assert message in str(error.value)
  fdl.build(architectures.llama(vocab_size=64, num_layers=1, dim=64, num_heads=4,
                                attention_implementation="cudnn", dtype="bfloat16")
            ).validate(host_gpu)
  with pytest.raises(UsageError, match="needs an NVIDIA GPU"):
    model.validate(target.host())
