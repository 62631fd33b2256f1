"""Bad input never crashes or damages a job: one line on stderr, exit code 2, and the job
directory it pointed at is byte-for-byte unchanged."""

import dataclasses
import os
import subprocess
import sys
import types
from typing import Callable

import fiddle as fdl
import jax
import pytest

from experiments.lm import architectures
from lingvo_lite import experiment
from lingvo_lite.errors import UsageError
from lingvo_lite.testing import run_cli, tree_digest


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


# The table, by family. Each family's mistakes are caught at one root (named in its header).

# Command-line syntax and flags (executor, absl parsing).
CLI_CASES = [
    Case("unknown mode", ["--mode=fly", "--job_log_dir={job}"], "--mode=fly"),
    Case("train without job dir", ["--exp=PyCodeTiny", "--fiddler=tiny"],
     "--job_log_dir: required for --mode=train"),
    Case("conflicting flags", ["--exp=PyCodeTiny", "--fdl_config=PyCodeTiny", "--job_log_dir={job}"],
     "conflicting flags; give only one of --exp, --fdl_config, --fdl_config_file"),
    Case("unknown flag", ["--mdoe=train", "--job_log_dir={job}"], "Unknown command line flag 'mdoe'"),
    Case("stray positional argument", ["--job_log_dir={job}", "train"],
     "unexpected argument 'train'"),
    Case("set without a value", ["--fdl_set=model.num_layers", "--job_log_dir={job}"],
     "expected PATH=VALUE"),
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
     "train_data.task: no such folder: /no/such/dir"),
    Case("flash attention without a GPU",
     ["--job_log_dir={job}", "--fdl.model.attention_implementation=\"cudnn\""],
     "model.attention_implementation='cudnn': needs an NVIDIA GPU (this device: cpu); "
     "or use 'einsum' or 'xla'"),
    Case("mesh larger than the devices", ["--job_log_dir={job}", "--fdl.partitioner.ici_data=3"],
     "the mesh has 3 devices but 1 are available"),
    Case("field of a non-config", ["--job_log_dir={job}", "--fdl.train.steps.every=1"],
     "train.steps is a int, not a config"),
]  # End of VALUES_CASES.

# Job dirs, config files and checkpoints.
JOBDIR_CASES = [
    Case("missing config file", ["--fdl_config_file=/no/such/config.json", "--job_log_dir={job}"],
     "--fdl_config_file=/no/such/config.json: no such file"),
    Case("config file not json", ["--fdl_config_file={job}/config.txt", "--job_log_dir={job}"],
     "not a config.json written by lingvo_lite"),
    Case("resume with another model", ["--job_log_dir={job}", "--fdl.model.dim=32"],
     "the config differs from the one this job was trained with (model.dim: 64 -> 32)"),
    Case("eval without eval data", ["--mode=eval", "--job_log_dir={job}", "--fdl.eval_data=None"],
     "this config has no eval data"),
]  # End of JOBDIR_CASES.

CASES = CLI_CASES + LOOKUP_CASES + VALUES_CASES + JOBDIR_CASES


@pytest.fixture(scope="module", name="job")
def fixture_job(tmp_path_factory):
  job = tmp_path_factory.mktemp("job")
  result = run_cli(["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                    "--fdl.train.steps=2", f"--job_log_dir={job}", "--compilation_cache_dir="])
  assert result.code == 0, result.stderr
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
  before = tree_digest(job), tree_digest(tmp_path)
  result = run_cli([arg.format(job=job, tmp=tmp_path) for arg in case.args]
                   + ["--compilation_cache_dir="])
  lines = result.stderr.strip().splitlines()
  assert result.code == 2, result
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  assert case.expected in lines[0], lines[0]
  assert "Traceback" not in result.stderr + result.stdout
  assert (tree_digest(job), tree_digest(tmp_path)) == before


@pytest.fixture(autouse=True)
def _forget_user_modules(tmp_path):
  """Modules a case imported from its folder must not leak into the next case."""
  yield
  for name, module in list(sys.modules.items()):
    if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
      del sys.modules[name]


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
  gpu = types.SimpleNamespace(device_kind="NVIDIA H200", compute_capability=capability)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(jax, "devices", lambda: [gpu])
  model = fdl.build(architectures.llama(vocab_size=64, num_layers=1, dim=64, num_heads=4,
                                        attention_implementation="cudnn", **fields))
  with pytest.raises(UsageError) as error:
    experiment._check_cudnn_attention(model)  # pylint: disable=protected-access
  assert str(error.value).startswith("model.attention_implementation='cudnn': ")
  assert message in str(error.value)
  experiment._check_cudnn_attention(  # pylint: disable=protected-access
      fdl.build(architectures.llama(vocab_size=64, num_layers=1, dim=64, num_heads=4,
                                    attention_implementation="cudnn", dtype="bfloat16")))
