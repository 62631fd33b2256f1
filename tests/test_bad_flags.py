"""Flags that would vanish or wait in silence are one line and exit code 2 instead: flag files
absl would skip (an empty name, a loop) or cannot read, flags given empty, a compilation cache
that cannot be written, distributed flags that cannot start a run. Nothing is written."""

import os
import subprocess
import sys

import pytest
from absl import flags

from lingvo_lite import executor  # pylint: disable=unused-import  # Defines the flags used below.
from lingvo_lite.runtime import supervisor
from lingvo_lite.testing import run_cli, source_root

PRINT = ["--mode=print", "--exp=PyCodeTiny"]
TRAIN = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data", "--job_log_dir=job"]
MULTI = ["--coordinator_address=127.0.0.1:1234", "--num_processes=2", "--process_id=1"]


def test_an_empty_flagfile_as_a_user_types_it_is_one_line_exit_2(tmp_path):
  """`--flagfile=$UNSET`, run from the repository root as the README does."""
  result = subprocess.run([sys.executable, "-m", "lingvo_lite", *TRAIN, "--flagfile=",
                           f"--job_log_dir={os.path.relpath(tmp_path / 'job', source_root())}"],
                          cwd=source_root(), capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr == ("lingvo_lite: error: --flagfile=: empty file name (an unset shell "
                           "variable gives one); name a text file of flags, one per line, or "
                           "drop the flag\n")
  assert result.stdout == "" and os.listdir(tmp_path) == []


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
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_flag_that_would_vanish_or_wait_is_one_line_exit_2(name, tmp_path, monkeypatch):
  args, expected, prepare = CASES[name]
  monkeypatch.chdir(tmp_path)
  # A case that passed the checks would start a supervised child: fail instead.
  monkeypatch.setattr(supervisor, "supervise", lambda *_, **__: pytest.fail("supervised"))
  if prepare:
    prepare(tmp_path)
  before = sorted(os.listdir(tmp_path))
  result = run_cli(args)
  assert result.code == 2, result
  assert result.stderr.startswith("lingvo_lite: error: ") and result.stderr.count("\n") == 1, (
      result.stderr)
  assert expected.format(tmp=os.path.realpath(tmp_path)) in result.stderr
  assert sorted(os.listdir(tmp_path)) == before  # No job dir, no cache folder.


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
  assert "the config differs from the one this job was trained with" in (
      result.stderr.splitlines()[1])
  # Where the cache is not used, the default is not looked at.
  result = run_cli(["--mode=print", "--exp=PyCodeTiny"])
  assert result.code == 0 and result.stderr == ""
