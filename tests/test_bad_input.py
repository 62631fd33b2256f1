"""Bad input never crashes or damages a job: one line on stderr, exit code 2, and the job
directory it pointed at is byte-for-byte unchanged."""

import subprocess
import sys
import types

import fiddle as fdl
import jax
import pytest

from experiments.lm import architectures
from lingvo_lite import experiment
from lingvo_lite.errors import UsageError
from lingvo_lite.testing import run_cli, tree_digest

# (case id, arguments with {job} for the existing job dir, text the one-line message holds).
# Arguments are as a program receives them, after the shell removed its quoting.
CASES = [
    ("unknown experiment", ["--exp=NoSuchExp", "--job_log_dir={job}"],
     "--exp=NoSuchExp: no such experiment"),
    ("experiment typo", ["--exp=PyCodeTiyn", "--job_log_dir={job}"],
     "did you mean lm.pycode.PyCodeTiny"),
    ("unknown mode", ["--mode=fly", "--job_log_dir={job}"], "--mode=fly"),
    ("unknown fiddler", ["--exp=PyCodeTiny", "--fiddler=nope", "--job_log_dir={job}"],
     "no fiddler named 'nope'; valid choices:"),
    ("misspelled field", ["--job_log_dir={job}", "--fdl.model.num_layer=2"],
     "did you mean 'num_layers'"),
    ("wrong type", ["--job_log_dir={job}", "--fdl.model.num_layers=\"two\""],
     "model.num_layers must be int, got str 'two'"),
    ("bare word", ["--job_log_dir={job}", "--fdl.model.norm=rmsnorm"],
     "--fdl.model.norm='\"rmsnorm\"'"),
    ("not a choice", ["--job_log_dir={job}", "--fdl.model.norm=\"rms\""],
     "must be one of 'layernorm', 'rmsnorm'"),
    ("train without job dir", ["--exp=PyCodeTiny", "--fiddler=tiny"],
     "--job_log_dir: required for --mode=train"),
    ("conflicting flags", ["--exp=PyCodeTiny", "--fdl_config=PyCodeTiny", "--job_log_dir={job}"],
     "conflicting flags; give only one of --exp, --fdl_config, --fdl_config_file"),
    ("missing config file", ["--fdl_config_file=/no/such/config.json", "--job_log_dir={job}"],
     "--fdl_config_file=/no/such/config.json: no such file"),
    ("config file not json", ["--fdl_config_file={job}/config.txt", "--job_log_dir={job}"],
     "not a config.json written by lingvo_lite"),
    ("unknown flag", ["--mdoe=train", "--job_log_dir={job}"], "Unknown command line flag 'mdoe'"),
    ("heads do not divide dim", ["--job_log_dir={job}", "--fdl.model.num_heads=3"],
     "model.num_heads=3: does not divide model.dim=64"),
    ("negative steps", ["--job_log_dir={job}", "--fdl.train.steps=-5"],
     "train.steps=-5: must be a positive integer"),
    ("resume with another model", ["--job_log_dir={job}", "--fdl.model.dim=32"],
     "the config differs from the one this job was trained with (model.dim: 64 -> 32)"),
    ("data vocabulary too large", ["--job_log_dir={job}", "--fdl.train_data.vocab_size=1000"],
     "train_data.vocab_size=1000: exceeds model.vocab_size=259"),
    ("eval without eval data", ["--mode=eval", "--job_log_dir={job}", "--fdl.eval_data=None"],
     "this config has no eval data"),
    ("missing data folder", ["--exp=PyCodeTiny", "--fiddler=tiny", "--job_log_dir={job}",
                             "--fdl.train_data.task.source_dir='/no/such/dir'"],
     "train_data.task: no such folder: /no/such/dir"),
    ("flash attention without a GPU",
     ["--job_log_dir={job}", "--fdl.model.attention_implementation=\"cudnn\""],
     "model.attention_implementation='cudnn': needs an NVIDIA GPU (this device: cpu); "
     "or use 'einsum' or 'xla'"),
    ("mesh larger than the devices", ["--job_log_dir={job}", "--fdl.partitioner.ici_data=3"],
     "the mesh has 3 devices but 1 are available"),
    ("bad experiment arguments", ["--fdl_config=PyCodeTiny(layers=2)", "--job_log_dir={job}"],
     "unexpected keyword argument 'layers'"),
    ("stray positional argument", ["--job_log_dir={job}", "train"],
     "unexpected argument 'train'"),
    ("set without a value", ["--fdl_set=model.num_layers", "--job_log_dir={job}"],
     "expected PATH=VALUE"),
    ("field of a non-config", ["--job_log_dir={job}", "--fdl.train.steps.every=1"],
     "train.steps is a int, not a config"),
]


@pytest.fixture(scope="module", name="job")
def fixture_job(tmp_path_factory):
  job = tmp_path_factory.mktemp("job")
  result = run_cli(["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                    "--fdl.train.steps=2", f"--job_log_dir={job}", "--compilation_cache_dir="])
  assert result.code == 0, result.stderr
  return job


def test_there_are_at_least_15_cases():
  assert len(CASES) >= 15


@pytest.mark.parametrize("args, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_the_job_untouched(job, args, expected):
  before = tree_digest(job)
  result = run_cli([arg.format(job=job) for arg in args] + ["--compilation_cache_dir="])
  lines = result.stderr.strip().splitlines()
  assert result.code == 2, result
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  assert expected in lines[0], lines[0]
  assert "Traceback" not in result.stderr + result.stdout
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
