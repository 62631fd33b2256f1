"""One trainer per job dir: a second one is refused naming the holder, a dead holder's lock is
taken over with a warning, and nothing of the lock outlives its run."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from etils import epath

from lingvo_lite.errors import UsageError
from lingvo_lite.runtime import lock as job_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Takes the lock, says so, and holds it until its stdin closes (or it is killed).
_HOLDER = """
import sys
from etils import epath
from lingvo_lite.runtime.lock import JobLock
with JobLock(epath.Path(sys.argv[1]), True):
  print("held", flush=True)
  sys.stdin.read()
"""


def _env():
  return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT,
                                                                    os.environ.get("PYTHONPATH")])))


def _start_holder(job):
  process = subprocess.Popen([sys.executable, "-c", _HOLDER, str(job)], env=_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  assert process.stdout.readline().strip() == "held"
  return process


def test_a_second_trainer_is_refused_naming_the_holder(tmp_path):
  job = epath.Path(tmp_path) / "job"
  holder = _start_holder(job)
  try:
    with pytest.raises(UsageError) as refused:
      with job_lock.JobLock(job, True, shown="runs/a"):
        pass
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--job_log_dir=runs/a: in use by another training run (pid "
                              f"{holder.pid} on host {socket.gethostname()}, started 2")
    assert " UTC); wait for it to finish or stop it, or use another --job_log_dir" in message
  finally:
    holder.communicate("")
  assert holder.returncode == 0
  assert not job.exists()  # The holder created it and left it empty.
  with job_lock.JobLock(job, True):  # Free again.
    assert (job / job_lock.LOCK_NAME).exists()


def test_a_killed_holders_lock_is_taken_over_with_one_warning(tmp_path, caplog):
  job = epath.Path(tmp_path)
  holder = _start_holder(job)
  holder.send_signal(signal.SIGKILL)  # No clean-up: the lock file stays, the flock does not.
  holder.wait()
  assert json.loads((job / job_lock.LOCK_NAME).read_text())["pid"] == holder.pid
  with caplog.at_level("WARNING"):
    with job_lock.JobLock(job, True, shown="runs/a"):
      mine = json.loads((job / job_lock.LOCK_NAME).read_text())
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert len(warnings) == 1, warnings
  assert warnings[0].startswith("--job_log_dir=runs/a: taking over the lock file of a training "
                                f"run that is gone (pid {holder.pid} on host ")
  assert (mine["pid"], mine["host"]) == (os.getpid(), socket.gethostname())
  assert mine["started"] and mine["argv"] == sys.argv
  assert not (job / job_lock.LOCK_NAME).exists()


def test_release_removes_the_file_and_the_folders_it_created_if_empty(tmp_path):
  job = epath.Path(tmp_path) / "runs" / "job"
  with job_lock.JobLock(job, True):
    assert (job / job_lock.LOCK_NAME).exists()
  assert not (epath.Path(tmp_path) / "runs").exists()  # A failed run leaves no trace.

  with job_lock.JobLock(job, True):
    (job / "config.json").write_text("{}")
  assert [p.name for p in job.iterdir()] == ["config.json"]  # What the run wrote stays.

  with job_lock.JobLock(job, True):
    pass
  assert [p.name for p in job.iterdir()] == ["config.json"]  # It existed before: kept.


def test_the_same_job_dir_cannot_be_locked_twice_in_one_process(tmp_path):
  job = epath.Path(tmp_path)
  with job_lock.JobLock(job, True):
    with pytest.raises(UsageError, match=f"pid {os.getpid()} on host"):
      with job_lock.JobLock(job, True):
        pass
  assert not list(job.iterdir())


def test_disabled_and_remote_locks_do_nothing(tmp_path):
  job = epath.Path(tmp_path) / "job"
  with job_lock.JobLock(job, False):
    assert not job.exists()
  with job_lock.JobLock(epath.Path("gs://no-such-bucket/job"), True):
    pass  # Object stores have no locks (see the module doc); nothing is contacted.


@pytest.mark.slow
def test_two_concurrent_trainers_one_trains_the_other_is_refused(tmp_path):
  job = tmp_path / "job"
  args = [sys.executable, "-m", "lingvo_lite", "--exp=PyCodeTiny", "--fiddler=tiny",
          "--fiddler=synthetic_data", "--fdl.train.steps=300", f"--job_log_dir={job}"]
  processes = [subprocess.Popen(args, env=_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
  try:
    outputs = [p.communicate(timeout=500) for p in processes]
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  codes = sorted(p.returncode for p in processes)
  assert codes == [0, 2], [err[-2000:] for _, err in outputs]
  winner = next(p for p in processes if p.returncode == 0)
  refused = next(err for p, (_, err) in zip(processes, outputs) if p.returncode == 2)
  lines = refused.strip().splitlines()
  assert len(lines) == 1, refused
  assert "in use by another training run (pid " in lines[0] and f"pid {winner.pid} " in lines[0]
  steps = [json.loads(line)["step"] for line in (job / "metrics.jsonl").read_text().splitlines()]
  assert steps == sorted(set(steps)) and steps[-1] == 300
  assert not (job / job_lock.LOCK_NAME).exists()
