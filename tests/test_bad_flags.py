"""Flags that would vanish or wait in silence are one line and exit code 2 instead: flag files
absl would skip (an empty name, a loop) or cannot read, flags given empty, a compilation cache
that cannot be written, distributed flags that cannot start a run; and a config flag that gives
something other than a Setup's config (a model, a data source, a task, a config.json of one),
in every mode. Nothing is written, and a job dir that exists stays byte for byte the same."""

import os
import sys

import fiddle as fdl
import pytest
from absl import flags

from lingvo_lite import executor  # pylint: disable=unused-import  # Defines the flags used below.
from lingvo_lite.config import files as config_files
from lingvo_lite.models.gptj import GptJ
from lingvo_lite.runtime import supervisor
from lingvo_lite.testing import run_cli, run_process, source_root
from tests.trained_jobs import tree_digest

PRINT = ["--mode=print", "--exp=PyCodeTiny"]
TRAIN = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data", "--job_log_dir=job"]
MULTI = ["--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=1"]
MOE = ["--exp=PyCodeMixtralTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
       "--job_log_dir=job"]


def test_an_empty_flagfile_as_a_user_types_it_is_one_line_exit_2(tmp_path):
  """`--flagfile=$UNSET`, run from the repository root as the README does."""
  result = run_process([*TRAIN, "--flagfile=",
                        f"--job_log_dir={os.path.relpath(tmp_path / 'job', source_root())}"],
                       timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr == ("lingvo_lite: error: --flagfile=: empty file name (an unset shell "
                           "variable gives one); name a text file of flags, one per line, or "
                           "drop the flag\n")
  assert result.stdout == "" and os.listdir(tmp_path) == []


def test_a_model_config_as_a_user_types_it_is_one_line_exit_2(tmp_path):
  """The issue's command: a config function that builds a model, not a Setup, from the
  repository root; it wrote nothing (the job dir is not made)."""
  job = os.path.relpath(tmp_path / "runs" / "x", source_root())
  result = run_process(["--fdl_config=experiments.lm.architectures.gptj(vocab_size=16, "
                        "num_layers=2)", f"--job_log_dir={job}"], timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr == (
      "lingvo_lite: error: --fdl_config=experiments.lm.architectures.gptj(vocab_size=16, "
      "num_layers=2): the config builds a GptJ, not a lingvo_lite Setup (a GptJ is what a "
      "Setup's model holds); name an experiment (see --mode=list), or a function returning a "
      "Setup's config (lingvo_lite.experiment.setup_config(model=..., optimizer=..., "
      "train_data=...))\n")
  assert result.stdout == "" and os.listdir(tmp_path) == []


def test_a_bad_moe_setting_as_a_user_types_it_is_one_line_exit_2(tmp_path):
  """A mixture of experts' setting the model cannot run (the table has the rest), from the
  repository root: one line naming the field, and no job dir."""
  job = os.path.relpath(tmp_path / "job", source_root())
  result = run_process(["--exp=PyCodeMixtralTiny", "--fdl.model.experts_per_token=9",
                        f"--job_log_dir={job}"], timeout=120)
  assert result.returncode == 2, result.stderr
  assert result.stderr == ("lingvo_lite: error: model.experts_per_token=9: is more than "
                           "model.num_experts=8; route each token to at most every expert\n")
  assert result.stdout == "" and os.listdir(tmp_path) == []


def test_a_config_of_a_setup_subclass_is_accepted_with_its_own_defaults(tmp_path, monkeypatch):
  """A Setup subclass is a user's extension (a field of their own, other defaults): it builds
  and validates, its default parts are Configs that --fdl reaches (keeping the subclass's own
  values), and its config.json reloads."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, "dont_write_bytecode", True)
  (tmp_path / "lk39_subclass.py").write_text(
      "import dataclasses\nimport fiddle as fdl\nfrom experiments.lm.pycode import PyCodeTiny\n"
      "from lingvo_lite.experiment import Setup, TrainLoop\n"
      "@dataclasses.dataclass(frozen=True)\nclass NotedSetup(Setup):\n  note: str = 'mine'\n"
      "  train: TrainLoop = TrainLoop(steps=7, seed=3)\n"
      "def config() -> fdl.Config:\n  cfg = PyCodeTiny.config()\n"
      "  return fdl.Config(NotedSetup, model=cfg.model, optimizer=cfg.optimizer, "
      "train_data=cfg.train_data, eval_data=None)\n")
  args = ["--mode=print", "--fdl_config=lk39_subclass.config", "--fdl.train.seed=4",
          "--fdl.partitioner.ici_fsdp=1", "--fdl.note='ours'"]
  printed = run_cli(args)
  assert printed.code == 0, printed.stderr
  lines = {line.split("#")[0].strip() for line in printed.stdout.splitlines()}
  assert {"train.steps = 7", "train.seed = 4", "partitioner.ici_fsdp = 1",
          "note = 'ours'"} <= lines, printed.stdout
  as_json = run_cli([*args, "--format=json"])
  assert as_json.code == 0, as_json.stderr
  (tmp_path / "config.json").write_text(as_json.stdout)
  reloaded = run_cli(["--mode=print", "--fdl_config_file=config.json"])
  assert reloaded.code == 0, reloaded.stderr
  assert "note = 'ours'" in reloaded.stdout and "train.steps = 7" in reloaded.stdout


def test_a_setup_without_a_model_takes_it_from_a_hugging_face_folder(tmp_path, monkeypatch):
  """The one part an option may give: --init_from=hf:PATH sets `model` from the folder's
  config.json, so a Setup's config may leave it out (the table refuses it without one)."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, "dont_write_bytecode", True)
  _write("lk39_modelless.py", _SETUP_WITHOUT.format("model"))(tmp_path)
  _write("hf/config.json", '{"model_type": "gpt2", "vocab_size": 320, "n_embd": 64, '
         '"n_layer": 2, "n_head": 4, "n_positions": 1024}')(tmp_path)
  result = run_cli(["--mode=print", "--fdl_config=lk39_modelless.config", "--init_from=hf:hf"])
  assert result.code == 0, result.stderr
  lines = {line.split("#")[0].strip() for line in result.stdout.splitlines()}
  assert {"model = <lingvo_lite.models.gpt2.Gpt2>", "model.num_layers = 2",
          "model.vocab_size = 320"} <= lines, result.stdout


def _write(relative, text):
  def prepare(folder):
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return prepare


def _both(*steps):
  def prepare(folder):
    for step in steps:
      step(folder)
  return prepare


def _config_json(relative, cfg):
  """Writes a config.json of `cfg` as a run would (config_files.to_json)."""
  return _write(relative, config_files.to_json(cfg))


# What a config flag may give that is not a Setup's config (the command, as typed).
MODEL = "--fdl_config=experiments.lm.architectures.gptj(vocab_size=16)"
NOT_A_SETUP = ("the config builds a GptJ, not a lingvo_lite Setup (a GptJ is what a Setup's "
               "model holds)")
# A job dir that a model's config.json (and a file of the user's) is in.
MODEL_JOB = _both(_config_json("job/config.json", fdl.Config(GptJ, vocab_size=16)),
                  _write("job/notes.txt", "mine\n"))
# User modules of config functions, each under a name of its own (modules stay imported).
_SETUP_WITHOUT = ("from experiments.lm.pycode import PyCodeTiny\ndef config():\n"
                  "  cfg = PyCodeTiny.config()\n  del cfg.{}\n  return cfg\n")
# A config training the next-token loss on preference pairs (the fixture jobs' data).
_PAIRS_CONFIG = f"""import fiddle as fdl
from experiments.lm.pycode import PyCodeTiny
from lingvo_lite.data.preference_data import PreferenceStoreData
from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from tasks.formats.preference import preference_task
DATA = {str(source_root() / "tests" / "fixtures" / "jobs_before_objective_parts" / "data")!r}
def config():
  cfg = PyCodeTiny.config()
  task = fdl.Config(preference_task, files={{"train": DATA + "/train.jsonl"}},
                    vocabulary=fdl.Config(PretrainedTokenizer, path=DATA + "/tok"))
  cfg.train_data = fdl.Config(PreferenceStoreData, task=task, split="train", store_dir="pairs",
                              sequence_length=256, global_batch_size=2)
  cfg.eval_data = None
  return cfg
"""
# A config whose objective is the base class, which computes nothing.
_BARE_OBJECTIVE = ("import fiddle as fdl\nfrom experiments.lm.pycode import PyCodeTiny\n"
                   "from lingvo_lite.training.objectives.objective import Objective\n"
                   "def config():\n  cfg = PyCodeTiny.config()\n"
                   "  cfg.train.objective = fdl.Config(Objective)\n  return cfg\n")

# (args, the one line's expected text, what to write into the working directory first).
CASES = {
    # Flag files: an empty name, as each spelling gives it.
    "empty flagfile": ([*PRINT, "--flagfile="], "--flagfile=: empty file name", None),
    "empty flagfile, one dash": ([*PRINT, "-flagfile="], "-flagfile=: empty file name", None),
    "empty flagfile, two arguments": ([*PRINT, "--flagfile", ""],
                                      "--flagfile=: empty file name", None),
    "blank flagfile": ([*PRINT, "--flagfile= "], "--flagfile= : empty file name", None),
    "flagfile as the last argument": ([*PRINT, "--flagfile"],
                                      "--flagfile: missing value; write --flagfile=FILE", None),
    "empty flagfile inside a flagfile": (
        [*PRINT, "--flagfile=outer.txt"],
        "--flagfile=outer.txt line 2: --flagfile=: empty file name",
        _write("outer.txt", "--fiddler=tiny\n--flagfile=\n")),
    # Flag files that cannot be read.
    "missing flagfile": ([*PRINT, "--flagfile=missing.txt"],
                         "--flagfile=missing.txt: cannot read the flag file (No such file or "
                         "directory); name a text file of flags", None),
    "flagfile is a folder": ([*PRINT, "--flagfile=folder"],
                             "--flagfile=folder: cannot read the flag file (Is a directory)",
                             _write("folder/x.txt", "")),
    "unreadable flagfile": ([*PRINT, "--flagfile=/proc/self/mem"],
                            "--flagfile=/proc/self/mem: cannot read the flag file", None),
    "flagfile of endless bytes": ([*PRINT, "--flagfile=/dev/zero"],
                                  "--flagfile=/dev/zero: is a character device, not a regular "
                                  "file", None),
    "flagfile too long to be one": ([*PRINT, "--flagfile=big.txt"],
                                    "--flagfile=big.txt: more than 1 MiB, not a flag file",
                                    _write("big.txt", "#" * (1 << 20) + "\n")),
    # Flag files that include themselves (absl skips them with a warning).
    "flagfile includes itself": (
        [*PRINT, "--flagfile=self.txt"],
        "--flagfile=self.txt line 2: --flagfile=./self.txt: the flag file includes itself",
        _write("self.txt", "--fiddler=tiny\n--flagfile=./self.txt\n")),
    "flagfiles include each other": (
        [*PRINT, "--flagfile=a.txt"],
        "--flagfile=a.txt line 1: --flagfile=b.txt line 1: --flagfile=a.txt: the flag file "
        "includes itself ({tmp}/a.txt -> {tmp}/b.txt -> {tmp}/a.txt); remove the --flagfile "
        "line that closes the loop",
        _both(_write("a.txt", "--flagfile=b.txt\n"), _write("b.txt", "--flagfile=a.txt\n"))),
    "flagfile line with a space": ([*PRINT, "--flagfile=outer.txt"],
                                   "--flagfile=outer.txt line 1: --flagfile other.txt: write "
                                   "--flagfile=FILE on one line",
                                   _write("outer.txt", "--flagfile other.txt\n")),
    # Flags whose empty value a program would read as not given.
    "empty experiment": (["--mode=print", "--exp="], "flag --exp=: empty (an unset shell "
                         "variable gives an empty value); give a value, or leave the flag out",
                         None),
    "empty config file": ([*PRINT, "--fdl_config_file="], "flag --fdl_config_file=: empty",
                          None),
    "empty job dir": ([*PRINT, "--job_log_dir="], "flag --job_log_dir=: empty", None),
    "empty job dir in a flagfile": ([*PRINT, "--flagfile=flags.txt"],
                                    "flag --job_log_dir=: empty",
                                    _write("flags.txt", "--job_log_dir=\n")),
    "empty prompts file": (["--mode=decode", "--job_log_dir=job", "--prompts_file="],
                           "flag --prompts_file=: empty", None),
    "empty module list": (["--mode=list", "--experiments_module="],
                          "flag --experiments_module=: empty", None),
    "empty module in a list": (["--mode=list", "--experiments_module=a,,b"],
                               "flag --experiments_module=a,,b: item 2 is empty", None),
    # The compilation cache: JAX would warn at each compile and train on.
    "cache dir blank": ([*TRAIN, "--compilation_cache_dir= "],
                        "--compilation_cache_dir=' ': blank; give a folder for JAX's compiled "
                        "programs, or --compilation_cache_dir= to run without the cache", None),
    "cache dir is a file": ([*TRAIN, "--compilation_cache_dir=cache"],
                            "--compilation_cache_dir=cache: is not a folder; give a folder for "
                            "JAX's compiled programs, or --compilation_cache_dir= to run "
                            "without the cache", _write("cache", "x")),
    "cache dir under a file": ([*TRAIN, "--compilation_cache_dir=cache/jax"],
                               "--compilation_cache_dir=cache/jax: is under {tmp}/cache, which "
                               "is no folder", _write("cache", "x")),
    "cache dir not writable": ([*TRAIN, "--compilation_cache_dir=/sys/lingvo_lite_cache"],
                               "--compilation_cache_dir=/sys/lingvo_lite_cache: cannot be "
                               "written (creating a folder in /sys fails: ", None),
    "cache dir in a job's checkpoints": (
        [*TRAIN, "--compilation_cache_dir=job/checkpoints/jax"],
        "--compilation_cache_dir=job/checkpoints/jax: is inside the job's checkpoints folder "
        "{tmp}/job/checkpoints", _write("job/config.json", "{}")),
    # Distributed flags, refused before a supervised child starts.
    "zero start-up timeout": ([*TRAIN, *MULTI, "--distributed_init_timeout_seconds=0"],
                              "--distributed_init_timeout_seconds=0: must be in [1, ", None),
    "negative start-up timeout": ([*TRAIN, *MULTI, "--distributed_init_timeout_seconds=-5"],
                                  "--distributed_init_timeout_seconds=-5: must be in [1, ", None),
    "start-up timeout too long": ([*TRAIN, *MULTI, f"--distributed_init_timeout_seconds={2**31}"],
                                  f"--distributed_init_timeout_seconds={2**31}: must be in [1, ",
                                  None),
    "start-up timeout not a number": ([*TRAIN, *MULTI, "--distributed_init_timeout_seconds=5s"],
                                      "flag --distributed_init_timeout_seconds=5s: ", None),
    "zero heartbeat timeout": ([*TRAIN, *MULTI, "--heartbeat_timeout_seconds=0"],
                               "--heartbeat_timeout_seconds=0: must be in [1, ", None),
    "process id out of range": ([*TRAIN, *MULTI, "--process_id=2"],
                                "--process_id=2: must be in [0, --num_processes=2)", None),
    "negative process id": ([*TRAIN, *MULTI, "--process_id=-1"],
                            "--process_id=-1: must be in [0, --num_processes=2)", None),
    "no processes": ([*TRAIN, *MULTI, "--num_processes=0"],
                     "--num_processes=0: must be a positive integer", None),
    "address without a port": ([*TRAIN, *MULTI, "--coordinator_address=localhost"],
                               "--coordinator_address=localhost: expected HOST:PORT", None),
    "empty address": ([*TRAIN, *MULTI, "--coordinator_address="],
                      "flag --coordinator_address=: empty", None),
    # A config that is not a Setup's, checked before any program option (--init_from), fiddler
    # or --fdl_help reads a field of it: every mode that takes a config (list takes none).
    "model config, train": ([MODEL, "--job_log_dir=runs/x"],
                            f"{MODEL}: {NOT_A_SETUP}; name an experiment (see --mode=list)",
                            None),
    "model config, train from a weight source": (
        [MODEL, "--job_log_dir=runs/x", "--init_from=hf:weights"], f"{MODEL}: {NOT_A_SETUP}",
        None),
    "model config, tiny": ([MODEL, "--fiddler=tiny", "--job_log_dir=runs/x"],
                           f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, eval": (["--mode=eval", MODEL, "--job_log_dir=runs/x"],
                           f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, decode": (["--mode=decode", MODEL, "--job_log_dir=runs/x", "--prompt=def"],
                             f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, serve": (["--mode=serve", MODEL, "--job_log_dir=runs/x"],
                            f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, export": (["--mode=export", MODEL, "--job_log_dir=runs/x"],
                             f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, compile": (["--mode=compile", MODEL, "--compile_topology=v5e-8"],
                              f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, print": (["--mode=print", MODEL], f"{MODEL}: {NOT_A_SETUP}", None),
    "model config, fdl_help": ([MODEL, "--fdl_help"], f"{MODEL}: {NOT_A_SETUP}", None),
    "model function as experiment": (["--exp=experiments.lm.architectures.llama",
                                      "--job_log_dir=runs/x"],
                                     "--exp=experiments.lm.architectures.llama: the config "
                                     "builds a Llama, not a lingvo_lite Setup", None),
    "data source config": (["--mode=compile", "--fdl_config=experiments.lm.synthetic."
                            "synthetic_lm_data(vocab_size=16, sequence_length=8, "
                            "global_batch_size=2)"],
                           "the config builds a SyntheticData, not a lingvo_lite Setup (a "
                           "SyntheticData is what a Setup's train_data holds)", None),
    "task function": (["--mode=decode", "--exp=tasks.pycode.pycode_task", "--job_log_dir=x",
                       "--prompt=def"],
                      "--exp=tasks.pycode.pycode_task: tasks.pycode.pycode_task is part of "
                      "lingvo_lite itself, not a config function", None),
    "task config": (["--mode=eval", "--fdl_config=lk39_task.config", "--job_log_dir=runs/x"],
                     "--fdl_config=lk39_task.config: the config calls pycode_task(), not a "
                     "lingvo_lite Setup itself",
                     _write("lk39_task.py", "import fiddle as fdl\nfrom tasks import pycode\n"
                                            "def config():\n  return fdl.Config("
                                            "pycode.pycode_task)\n")),
    "config function returns a number": (
        ["--mode=serve", "--fdl_config=lk39_number.config", "--job_log_dir=runs/x"],
        "--fdl_config=lk39_number.config: lk39_number.config() returned a int, not a fdl.Config",
        _write("lk39_number.py", "def config():\n  return 3\n")),
    "partial of a setup": (
        ["--mode=export", "--fdl_config=lk39_partial.config", "--job_log_dir=runs/x"],
        "--fdl_config=lk39_partial.config: the config is a fdl.Partial of Setup, which builds "
        "a function, not a lingvo_lite Setup",
        _write("lk39_partial.py", "import fiddle as fdl\nfrom lingvo_lite.experiment import "
                                  "Setup\ndef config():\n  return fdl.Partial(Setup)\n")),
    "model config file, print": (["--mode=print", "--fdl_config_file=model.json"],
                                 f"--fdl_config_file={{tmp}}/model.json: {NOT_A_SETUP}; give a "
                                 "config.json that a lingvo_lite run wrote",
                                 _config_json("model.json", fdl.Config(GptJ, vocab_size=16))),
    "model config file, fdl_help": (["--fdl_help", "--fdl_config_file=model.json"],
                                    f"--fdl_config_file={{tmp}}/model.json: {NOT_A_SETUP}",
                                    _config_json("model.json", fdl.Config(GptJ, vocab_size=16))),
    # A job dir whose config.json holds a model's config: every mode that reads it.
    **{f"job of a model config, {mode}": ([*args, "--job_log_dir=job"],
                                          f"--job_log_dir={{tmp}}/job/config.json: {NOT_A_SETUP}",
                                          MODEL_JOB)
       for mode, args in {"train": [], "eval": ["--mode=eval"],
                          "decode": ["--mode=decode", "--prompt=def"], "serve": ["--mode=serve"],
                          "export": ["--mode=export"], "compile": ["--mode=compile"],
                          "print": ["--mode=print"], "report": ["--mode=report"],
                          "fdl_help": ["--fdl_help"]}.items()},
    # A Setup's config without a part it needs: one line naming the part, whatever reaches it.
    "setup without train data": (["--fdl_config=lk39_no_data.config", "--job_log_dir=runs/x"],
                                 "train_data: required by Setup and not set; give it in the "
                                 "experiment's config() (a config of DataSource)",
                                 _write("lk39_no_data.py", _SETUP_WITHOUT.format("train_data"))),
    "setup without train data, tiny": (
        ["--fdl_config=lk39_no_data_tiny.config", "--fiddler=tiny", "--job_log_dir=runs/x"],
        "--fiddler=tiny: the fiddler raised AttributeError on a config that does not set "
        "train_data (required by Setup)",
        _write("lk39_no_data_tiny.py", _SETUP_WITHOUT.format("train_data"))),
    "setup without train data, a field of it": (
        ["--fdl_config=lk39_no_data_set.config", "--fdl.train_data.global_batch_size=8",
         "--job_log_dir=runs/x"],
        "--fdl.train_data.global_batch_size=8: train_data is not set (required by Setup), so "
        "it has no fields to set",
        _write("lk39_no_data_set.py", _SETUP_WITHOUT.format("train_data"))),
    "setup without a model, eval": (
        ["--mode=eval", "--fdl_config=lk39_no_model.config", "--job_log_dir=runs/x"],
        "model: required by Setup and not set; give it in the experiment's config() (a config "
        "of LanguageModel)", _write("lk39_no_model.py", _SETUP_WITHOUT.format("model"))),
    # Post-training settings that cannot train (tests/weights/test_peft.py refuses a PEFT
    # folder for another base).
    "lora of rank 0": ([*TRAIN, "--fiddler=lora", "--fdl.train.lora.rank=0"],
                       "--fdl.train.lora.rank=0: must be a positive integer", None),
    "lora targets matching nothing": (
        [*TRAIN, "--fiddler=lora", "--fdl.train.lora.targets='attention/qkv'"],
        "train.lora.targets='attention/qkv': matches none of the model's weight matrices; "
        "name some of layer_N/attention/key_kernel, layer_N/attention/out_kernel", None),
    "dpo on a text store": (
        ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=dpo", "--job_log_dir=job"],
        "train.objective=Dpo(beta=0.1, label_smoothing=0.0): reads preference pairs, but "
        "train_data (a TokenStoreData of pycode_bytes_", None),
    "the next-token loss on preference pairs": (
        ["--fdl_config=lk51_pairs.config", "--job_log_dir=job"],
        "train.objective=LanguageModelling(): reads documents, but train_data (a "
        "PreferenceStoreData of local_preference_", _write("lk51_pairs.py", _PAIRS_CONFIG)),
    "an objective that computes no loss": (
        ["--fdl_config=lk51_bare_objective.config", "--job_log_dir=job"],
        "train.objective=Objective(): Objective does not define loss, train_metrics, "
        "eval_sums, eval_metrics; give an objective of training/objectives/",
        _write("lk51_bare_objective.py", _BARE_OBJECTIVE)),
    # The objective's former spellings (a name, train.dpo), refused naming the new ones.
    "objective as a name": (
        [*TRAIN, "--fdl.train.objective='dpo'"],
        "--fdl.train.objective='dpo': train.objective is a config part now, not a name; give "
        "--fiddler=dpo (lingvo_lite.training.objectives.dpo.Dpo), then its fields as "
        "--fdl.train.objective.FIELD=VALUE", None),
    "objective as the default's name": (
        [*TRAIN, "--fdl_set=train.objective='lm'"],
        "--fdl_set=train.objective='lm': train.objective is a config part now, and "
        "LanguageModelling (the next-token loss) its default; leave the flag out", None),
    "dpo's settings where they were": (
        [*TRAIN, "--fdl.train.dpo.beta=0.2"],
        "--fdl.train.dpo.beta=0.2: train.dpo is gone: Dpo's settings are train.objective's "
        "fields now; give --fiddler=dpo --fdl.train.objective.beta=VALUE", None),
    "setup without an optimizer, compile": (
        ["--mode=compile", "--fdl_config=lk39_no_optimizer.config", "--compile_topology=v5e-8"],
        "optimizer: required by Setup and not set",
        _write("lk39_no_optimizer.py", _SETUP_WITHOUT.format("optimizer"))),
    # A mixture of experts' settings (issue 44), refused before anything is written.
    "moe: top-k over the experts": (
        [*MOE, "--fdl.model.experts_per_token=9"],
        "model.experts_per_token=9: is more than model.num_experts=4; route each token to at "
        "most every expert", None),
    "moe: no experts": ([*MOE, "--fdl.model.num_experts=0"],
                        "--fdl.model.num_experts=0: must be a positive integer", None),
    "moe: capacity factor 0": ([*MOE, "--fdl.model.capacity_factor=0.0"],
                               "--fdl.model.capacity_factor=0.0: must be a positive number",
                               None),
    "moe: unknown dispatch": ([*MOE, "--fdl.model.dispatch='megablox'"],
                              "model.dispatch must be one of 'dropless', 'all_to_all', "
                              "'capacity', 'dense', got str 'megablox'", None),
    "moe: no feed-forward kind": ([*MOE, "--fdl.model.mlp_kinds=()"],
                                  "model.mlp_kinds=(): names no feed-forward kind", None),
    # DeepSeek's groups of experts and multi-token prediction (issue 55).
    "moe: groups that do not divide the experts": (
        [*MOE, "--fdl.model.expert_groups=3"],
        "model.expert_groups=3: does not divide model.num_experts=4 into equal groups; give a "
        "divisor of num_experts (1: no groups)", None),
    "moe: more groups per token than groups": (
        [*MOE, "--fdl.model.expert_groups=2", "--fdl.model.expert_groups_per_token=3"],
        "model.expert_groups_per_token=3: is more than model.expert_groups=2; choose at most "
        "every group", None),
    "moe: top-k past the experts of the chosen groups": (
        [*MOE, "--fdl.model.expert_groups=4", "--fdl.model.expert_groups_per_token=1"],
        "model.experts_per_token=2: is more than the 1 experts of 1 of model.expert_groups=4 "
        "groups a token chooses from; raise expert_groups_per_token or lower "
        "experts_per_token", None),
    "moe: an unknown group score": (
        [*MOE, "--fdl.model.group_score='sum'"],
        "model.group_score must be one of 'max', 'top2_sum', got str 'sum'", None),
    "multi-token prediction on a dense family": (
        [*TRAIN, "--fiddler=multi_token_prediction"],
        "train.objective=MultiTokenPrediction(weight=0.3): trains multi-token modules, and the "
        "model (a GptJ) has none; set model.multi_token_layers (1, as DeepSeek-V3) on a "
        "mixture-of-experts family, or train with LanguageModelling", None),
    "multi-token prediction without modules": (
        [*MOE, "--fiddler=multi_token_prediction", "--fdl.model.multi_token_layers=0"],
        "train.objective=MultiTokenPrediction(weight=0.3): trains multi-token modules, and the "
        "model (a Mixtral) has none; set model.multi_token_layers (1, as DeepSeek-V3) on a "
        "mixture-of-experts family, or train with LanguageModelling", None),
    "moe: an expert axis that does not divide the experts, compile": (
        ["--mode=compile", "--exp=PyCodeMixtralTiny", "--compile_topology=v5e-8",
         "--fdl.partitioner.ici_expert=4", "--fdl.model.num_experts=6"],
        "model.num_experts=6: the 'experts' dimension of parameter ['layer_0']['mlp']"
        "['router_kernel'] is not divisible by mesh axes expert = 4", None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_flag_that_would_vanish_or_wait_is_one_line_exit_2(name, tmp_path, monkeypatch):
  args, expected, prepare = CASES[name]
  monkeypatch.chdir(tmp_path)
  # As under `python -m lingvo_lite`, the working directory is first on sys.path (user modules).
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, "dont_write_bytecode", True)  # No __pycache__ in the folder.
  # A case that passed the checks would start a supervised child: fail instead.
  monkeypatch.setattr(supervisor, "supervise", lambda *_, **__: pytest.fail("supervised"))
  if prepare:
    prepare(tmp_path)
  before = tree_digest(tmp_path)
  result = run_cli(args)
  assert result.code == 2, result
  assert result.stderr.startswith("lingvo_lite: error: ") and result.stderr.count("\n") == 1, (
      result.stderr)
  assert expected.format(tmp=os.path.realpath(tmp_path)) in result.stderr
  # No job dir, no cache folder; a job dir already there is byte for byte the same.
  assert tree_digest(tmp_path) == before


def test_a_flagfile_given_twice_or_through_dev_fd_still_works(tmp_path, monkeypatch):
  """Only a loop is refused; a file included twice (not inside itself) is read twice, as absl
  does, and a pipe (bash's `--flagfile=<(...)`) is read by its /dev/fd name."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "tiny.txt").write_text("--fiddler=tiny\n# a comment\n\n--fdl.train.steps=7\n")
  (tmp_path / "outer.txt").write_text("--flagfile=tiny.txt\n--flagfile=./tiny.txt\n")
  result = run_cli([*PRINT, "--flagfile=outer.txt"])
  assert result.code == 0, result.stderr
  assert "train.steps = 7" in result.stdout and "model.dim = 64" in result.stdout
  read, write = os.pipe()
  os.write(write, b"--fdl.train.steps=9\n")
  os.close(write)
  try:
    result = run_cli([*PRINT, f"--flagfile=/dev/fd/{read}"])
  finally:
    os.close(read)
  assert result.code == 0, result.stderr
  assert "train.steps = 9" in result.stdout


def test_a_default_compilation_cache_that_cannot_be_written_only_costs_the_cache(
    tmp_path, monkeypatch):
  """Not the user's mistake (a read-only home, say): one warning once the run gets as far as
  compiling, and the run goes on (here to the next check, which stops it); a run refused
  before that says its one line alone."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "home").write_text("x")
  monkeypatch.setattr(flags.FLAGS["compilation_cache_dir"], "default", "home/.cache/jax")
  result = run_cli(["--mode=eval", "--job_log_dir=job"])
  assert result.code == 2 and len(result.stderr.splitlines()) == 1, result.stderr
  assert "--job_log_dir=job: no such folder" in result.stderr
  # A job whose recorded config differs is refused inside the program, after the cache is set.
  tiny = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data"]
  printed = run_cli(["--mode=print", "--format=json", *tiny])
  assert printed.code == 0, printed.stderr
  (tmp_path / "job").mkdir()
  (tmp_path / "job" / "config.json").write_text(printed.stdout)
  result = run_cli(["--mode=train", "--job_log_dir=job", *tiny, "--fdl.model.num_layers=3"])
  assert result.code == 2, result.stderr
  assert result.stderr.splitlines()[0] == (
      f"lingvo_lite: warning: running without the compilation cache: {tmp_path}/home/.cache/jax "
      f"is under {tmp_path}/home, which is no folder; pass --compilation_cache_dir=FOLDER, or "
      "--compilation_cache_dir= to silence this")
  assert "the config differs from the one it was first run with, having no checkpoint" in (
      result.stderr.splitlines()[1])  # Only its config.json: nothing was trained there.
  # Where the cache is not used, the default is not looked at.
  result = run_cli(["--mode=print", "--exp=PyCodeTiny"])
  assert result.code == 0 and result.stderr == ""
