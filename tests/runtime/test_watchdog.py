"""Stack dumps of a job that hangs: the watchdog's stall dumps, SIGUSR1 (also while the main
thread is blocked in C, and through the supervisor of a two-process run), and the files."""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lingvo_lite import programs, testing
from lingvo_lite.errors import UsageError
from lingvo_lite.programs.train import loop as train_loop
from lingvo_lite.runtime import job_dirs, stack_dumps
from lingvo_lite.runtime.watchdog import Watchdog, WatchdogSettings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NAME = re.compile(r"^[A-Za-z0-9._-]+-(\d+)-\d{8}T\d{6}\.\d{3}Z(-\d+)?\.txt$")


class _Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def _dumps(folder):
  """The finished dumps in `folder`: a dump is written as `.NAME.tmp` and renamed into place,
  so a test polling the folder may list the temporary first."""
  names = os.listdir(folder) if os.path.isdir(folder) else []
  return sorted(name for name in names if not name.startswith("."))


def _section(text, title):
  """The lines of one `== title ... ==` section of a dump."""
  start = text.index(f"== {title}")
  end = text.find("\n== ", start + 1)
  return text[start:end if end >= 0 else None]


def _main_thread(python_section):
  """The main thread's stack in the Python section."""
  start = python_section.index("Thread 'MainThread'")
  end = python_section.find("\nThread ", start + 1)
  return python_section[start:end if end >= 0 else None]


# ----------------------------------------------------------------------------- the limit


def test_the_stall_limit_is_n_times_the_median_and_at_least_the_floor():
  settings = WatchdogSettings(stall_multiple=10.0, min_stall_seconds=300.0)
  assert settings.stall_limit(None) == 300.0  # No step time known yet: the floor alone.
  assert settings.stall_limit(1.2) == 300.0
  assert settings.stall_limit(45.0) == 450.0
  clock = _Clock()
  watchdog = Watchdog(settings, "unused", process_count=1, clock=clock)
  for interval in (0, 40.0, 50.0, 60.0, 1000.0):  # The first step starts the intervals.
    clock.now += interval
    watchdog.step_done()
  assert watchdog.median_step_seconds() == 55.0  # Median, not mean: one slow step is no shift.
  assert watchdog.stall_limit() == 550.0
  # A span excused in between starts the intervals again: its time is in none of them.
  with watchdog.excused("checkpoint"):
    clock.now += 5000.0
  clock.now += 1.0
  watchdog.step_done()
  clock.now += 70.0
  watchdog.step_done()
  assert watchdog.median_step_seconds() == 60.0  # 40, 50, 60, 1000 and 70.


def test_enabled_none_watches_multi_process_runs_only():
  assert not WatchdogSettings().watches(1)
  assert WatchdogSettings().watches(2)
  assert not WatchdogSettings(enabled=False).watches(8)
  assert WatchdogSettings(enabled=True).watches(1)


# ----------------------------------------------------------------------------- stalls


def test_one_dump_per_stall_none_while_excused_and_periodic_dumps(tmp_path, capsys):
  clock = _Clock()
  folder = tmp_path / "stacks"
  watchdog = Watchdog(WatchdogSettings(enabled=True, stall_multiple=10, min_stall_seconds=5),
                      folder, process_count=1, clock=clock)
  for _ in range(4):
    clock.now += 1.0
    watchdog.step_done()
  clock.now += 9.9
  watchdog.check()
  assert _dumps(folder) == []  # 9.9 s < 10 x the median 1 s.
  clock.now += 0.2
  watchdog.check()
  [name] = _dumps(folder)
  assert _NAME.match(name) and _NAME.match(name).group(1) == str(os.getpid()), name
  err = capsys.readouterr().err
  assert err == ("lingvo_lite: warning: no train step finished in 10.1 s (10 x the median step "
                 "time 1 s, at least 5 s); stacks of every thread written to "
                 f"{folder / name}\n")
  assert (folder / name).read_text().startswith(
      "lingvo_lite stack dump: watchdog: no train step finished in 10.1 s (10 x the median")
  clock.now += 100.0
  watchdog.check()
  assert len(_dumps(folder)) == 1  # Still the same stall.
  watchdog.step_done()
  clock.now += 10.1
  watchdog.check()
  assert len(_dumps(folder)) == 2  # A new stall after a step.
  capsys.readouterr()

  # Excused time is no stall, and the clock starts again when the span ends.
  watchdog.step_done()
  with watchdog.excused("compile"):
    clock.now += 1000.0
    watchdog.check()
  clock.now += 9.0
  watchdog.check()
  assert len(_dumps(folder)) == 2 and capsys.readouterr().err == ""

  # Periodic dumps, stalled or not, here with stall watching off.
  periodic = Watchdog(WatchdogSettings(enabled=False, interval_seconds=60), tmp_path / "p",
                      process_count=1, clock=clock)
  clock.now += 59.0
  periodic.check()
  assert _dumps(tmp_path / "p") == []
  clock.now += 1.0
  periodic.check()
  periodic.check()
  clock.now += 60.0
  with periodic.excused("eval"):
    periodic.check()
  assert len(_dumps(tmp_path / "p")) == 2
  assert "(during: eval)" in (tmp_path / "p" / _dumps(tmp_path / "p")[1]).read_text()
  assert capsys.readouterr().err.count("periodic stack dump (watchdog.interval_seconds=60)") == 2


def _wait_for_a_dump(folder, showing: str, seconds: float) -> None:
  """Blocks on one line until a dump in `folder` contains `showing` (or `seconds` pass).

  Another thread looks for the dump, so that whenever the watchdog takes its stacks, the
  caller's thread is on the `dumped.wait` line (a polling loop here would sometimes be caught
  listing the folder instead).
  """
  dumped = threading.Event()

  def look_for_the_dump():
    while not dumped.is_set() and not any(
        showing in (folder / name).read_text() for name in _dumps(folder)):
      time.sleep(0.05)
    dumped.set()

  threading.Thread(target=look_for_the_dump, daemon=True).start()
  dumped.wait(seconds)
  dumped.set()


def _sleeping_train_step(folder, seconds):
  """A train step that hangs until the watchdog has written its dump."""
  _wait_for_a_dump(folder, "", seconds)
  time.sleep(1.0)  # Three more stall limits: still one dump.


def test_a_step_made_to_sleep_is_dumped_with_its_frame(tmp_path, capsys):
  folder = tmp_path / "stacks"
  settings = WatchdogSettings(enabled=True, min_stall_seconds=0.3)
  with Watchdog(settings, folder, process_count=1, poll_seconds=0.05) as watchdog:
    for _ in range(3):
      watchdog.step_done()
    _sleeping_train_step(folder, 20)
  [name] = _dumps(folder)
  text = (folder / name).read_text()
  main = _main_thread(_section(text, "Python stacks of every thread"))
  # Most recent call last: the sleep inside the step, called from this test.
  assert main.index("test_a_step_made_to_sleep_is_dumped_with_its_frame") < main.index(
      "in _sleeping_train_step") < main.index("_wait_for_a_dump(folder"), main
  assert "Thread 'lingvo_lite-watchdog'" in text and "this thread, writing the dump" in text
  assert f"pid: {os.getpid()}" in text and f"host: {socket.gethostname()}" in text
  assert "== Native stacks (py-spy dump --native" in text
  assert capsys.readouterr().err.endswith(f"stacks of every thread written to {folder / name}\n")


def test_a_train_step_made_to_sleep_in_a_real_run_is_dumped_once(tmp_path, monkeypatch):
  """Through the train program: compile and checkpoints excused, the stalled step dumped."""
  job = tmp_path / "job"
  compile_step = train_loop.compiled

  def compiled_with_one_sleeping_step(jitted):
    step, calls = compile_step(jitted), []

    def _sleeping_train_step(state, batch):
      calls.append(None)
      if len(calls) == 4:
        # Blocked on one line until a dump shows this frame (another thread looks).
        _wait_for_a_dump(job / "stacks", "_sleeping_train_step", 30)
        time.sleep(2.5)  # Two more polls, more than twice the limit: still one dump.
      return step(state, batch)
    return _sleeping_train_step

  monkeypatch.setattr(train_loop, "compiled", compiled_with_one_sleeping_step)
  result = testing.run_cli(["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
                            "--fiddler=no_eval", "--fdl.train.steps=6",
                            "--fdl.checkpoint.every_steps=2", f"--job_log_dir={job}",
                            "--fdl.watchdog.enabled=True",
                            "--fdl.watchdog.min_stall_seconds=1",
                            # No peak measured: seconds before the compile, in no excused span.
                            "--fdl.train.peak_tflops_per_device=1"])
  assert result.code == 0, result.stderr
  texts = {name: (job / "stacks" / name).read_text() for name in _dumps(job / "stacks")}
  mains = {name: _main_thread(_section(text, "Python stacks of every thread"))
           for name, text in texts.items()}
  [slept] = [name for name, main in mains.items() if "in _sleeping_train_step" in main]
  assert "_wait_for_a_dump(" in mains[slept] and "programs/train/loop.py" in mains[slept]
  # Steps measured before it: the limit is the floor over 10 x their median.
  assert re.search(r"lingvo_lite: warning: no train step finished in [\d.]+ s \(10 x the median "
                   r"step time [\d.e-]+ s, at least 1 s\); stacks of every thread written to "
                   + re.escape(str(job / "stacks" / slept)) + "\n", result.stderr), result.stderr
  # The compile (seconds here) and the saves are excused: no dump caught them.
  assert not [name for name, main in mains.items()
              if "in _compiled" in main or "in save" in main], texts


def test_dumps_in_one_millisecond_get_distinct_names_and_no_folder_means_stderr(tmp_path,
                                                                                 capsys,
                                                                                 monkeypatch):
  monkeypatch.setattr(stack_dumps, "native_stacks", lambda: "(skipped)\n")
  paths = [stack_dumps.dump(tmp_path / "a" / "b", "test") for _ in range(5)]
  assert len(set(paths)) == 5 and sorted(os.listdir(tmp_path / "a" / "b")) == sorted(
      os.path.basename(p) for p in paths)  # No temporary file left.
  assert stack_dumps.dump_or_print(None, "why") == "stderr (no job folder known)"
  assert "lingvo_lite stack dump: why" in capsys.readouterr().err
  (tmp_path / "file").write_text("")
  where = stack_dumps.dump_or_print(tmp_path / "file" / "stacks", "why")
  assert where.startswith(f"stderr ({tmp_path / 'file' / 'stacks'} could not be written: ")


def test_a_file_named_stacks_is_one_line_in_every_mode(tmp_path):
  (tmp_path / "stacks").write_text("")
  for mode in ("train", "eval", "decode"):
    with pytest.raises(UsageError) as error:
      job_dirs.check(tmp_path, programs.PROGRAMS[mode].job_files, "job")
    assert str(error.value) == (f"--job_log_dir=job: {tmp_path / 'stacks'} is a file, not a "
                                "folder; move it away, or use another --job_log_dir")


# ----------------------------------------------------------------------------- SIGUSR1

_BLOCKED_CHILD = textwrap.dedent("""
    import ctypes, os, signal, sys
    from lingvo_lite.runtime import stack_dumps

    stack_dumps.install_signal_handler()
    stack_dumps.install_signal_handler()  # A second install is a no-op.
    stack_dumps.set_folder(sys.argv[1])
    # A Python-level handler, as signal.signal gives, with restarted system calls: it runs
    # only when the main thread is back in Python.
    signal.signal(signal.SIGUSR2, lambda *_: open(sys.argv[2], "w").close())
    signal.siginterrupt(signal.SIGUSR2, False)

    def _blocked_in_c():
      # read(2) through ctypes, the GIL released: what a thread waiting in XLA looks like.
      return ctypes.CDLL(None, use_errno=True).read(0, ctypes.create_string_buffer(1), 1)

    print("ready", flush=True)
    print("read returned", _blocked_in_c(), flush=True)
""")


def test_sigusr1_dumps_while_the_main_thread_is_blocked_in_c(tmp_path):
  folder, marker = tmp_path / "stacks", tmp_path / "python_handler_ran"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
      "PYTHONPATH")])))
  child = subprocess.Popen([sys.executable, "-c", _BLOCKED_CHILD, str(folder), str(marker)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, text=True)
  try:
    assert child.stdout.readline() == "ready\n"
    time.sleep(0.2)  # Into read(2).
    child.send_signal(signal.SIGUSR2)
    child.send_signal(signal.SIGUSR1)
    deadline = time.time() + 30
    while not _dumps(folder) and time.time() < deadline:
      time.sleep(0.05)
    [name] = _dumps(folder)
    # Written while the main thread is still in read(2), where the Python-level handler of
    # SIGUSR2 has not run (and never would, in a real hang).
    assert child.poll() is None and not marker.exists()
    child.stdin.write("x")
    child.stdin.flush()
    out, err = child.communicate(timeout=30)
  finally:
    if child.poll() is None:
      child.kill()
  assert child.returncode == 0 and out == "read returned 1\n", err
  assert marker.exists()  # Once back in Python, the Python-level handler ran.
  assert _NAME.match(name).group(1) == str(child.pid)
  assert err == ("lingvo_lite: warning: SIGUSR1: stacks of every thread written to "
                 f"{folder / name}\n")
  text = (folder / name).read_text()
  assert text.startswith(f"lingvo_lite stack dump: SIGUSR1 (kill -USR1 {child.pid})\n")
  assert "in _blocked_in_c" in _main_thread(_section(text, "Python stacks of every thread"))
  faulthandler_text = _section(text, "faulthandler, written in C")
  assert re.search(r'File "<string>", line \d+ in _blocked_in_c', faulthandler_text), text


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _child_of(pid):
  deadline = time.time() + 60
  while time.time() < deadline:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      children = f.read().split()
    if children:
      return int(children[0])
    time.sleep(0.1)
  pytest.fail(f"process {pid} started no child")


def _communicate_or_show_stacks(parents, stacks, timeout):
  """Each process's (stdout, stderr) once all have exited; a run still going after `timeout`
  fails the test with what its processes were doing (their SIGUSR1 dumps) and their logs."""
  deadline = time.time() + timeout
  try:
    return [p.communicate(timeout=max(1.0, deadline - time.time())) for p in parents]
  except subprocess.TimeoutExpired:
    before = set(_dumps(stacks))
    for parent in parents:
      parent.send_signal(signal.SIGUSR1)
    time.sleep(20)  # py-spy's native view of each.
    for parent in parents:
      parent.kill()
    logs = [p.communicate() for p in parents]
    dumps = [(stacks / name).read_text()[-4000:] for name in sorted(set(_dumps(stacks)) - before)]
    pytest.fail(f"still running {timeout} s after SIGTERM;\n" + "\n".join(
        dumps + [f"process {i} stderr: {err[-2000:]}" for i, (_, err) in enumerate(logs)]))


@pytest.mark.slow
def test_sigusr1_to_a_supervised_two_process_run_dumps_and_the_run_goes_on(tmp_path):
  job = tmp_path / "job"
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  common = ["--exp=PyCodeLlamaTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
            "--fdl.model.vocab_size=256", "--fdl.train_data.vocab_size=256",
            "--fdl.eval_data.vocab_size=256", "--fdl.train_data.global_batch_size=2",
            "--fdl.eval_data.global_batch_size=2", "--fdl.eval_data.num_batches=1",
            "--fdl.train.log_every_steps=1", "--fdl.train.steps=100000", f"--job_log_dir={job}",
            f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
            "--heartbeat_timeout_seconds=10"]
  parents = [subprocess.Popen([sys.executable, "-m", "lingvo_lite", *common,
                               f"--process_id={i}"], env=env, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(2)]
  try:
    # Process 1's child gets one at once, while it starts: it waits (blocked) for the handler
    # instead of killing the child, and is dumped onto stderr (no job folder known yet).
    _child_of(parents[1].pid)
    parents[1].send_signal(signal.SIGUSR1)
    deadline = time.time() + 120
    while not (job / "metrics.jsonl").exists() or len(
        (job / "metrics.jsonl").read_text().splitlines()) < 2:
      assert time.time() < deadline and all(p.poll() is None for p in parents), "no training"
      time.sleep(0.1)
    child = _child_of(parents[0].pid)
    parents[0].send_signal(signal.SIGUSR1)
    deadline = time.time() + 60
    while not any(_NAME.match(n).group(1) == str(child) for n in _dumps(job / "stacks")):
      assert time.time() < deadline, "no dump"
      time.sleep(0.1)
    assert all(p.poll() is None for p in parents)  # The supervisors did not die of it.
    rows = len((job / "metrics.jsonl").read_text().splitlines())
    while len((job / "metrics.jsonl").read_text().splitlines()) <= rows:  # It trains on.
      assert time.time() < deadline and all(p.poll() is None for p in parents), "stopped"
      time.sleep(0.1)
    # Both asked to stop; they stop after the same step, with a save. (A notice reaching the
    # other process through JAX's preemption service: tests/runtime/test_multiprocess.py.)
    for parent in parents:
      parent.send_signal(signal.SIGTERM)
    outputs = _communicate_or_show_stacks(parents, job / "stacks", timeout=120)
  finally:
    for process in parents:
      if process.poll() is None:
        process.kill()
  for process, (_, err) in zip(parents, outputs):
    assert process.returncode == 0, err[-3000:]
  assert "lingvo_lite: warning: SIGUSR1: stacks of every thread written to " in outputs[1][1]
  assert re.search(r"^done: step \d+ \(stopped by signal\)$", outputs[0][0], re.M), outputs[0][0]
  [name] = [n for n in _dumps(job / "stacks") if _NAME.match(n).group(1) == str(child)]
  assert (f"lingvo_lite: warning: SIGUSR1: stacks of every thread written to "
          f"{job / 'stacks' / name}\n") in outputs[0][1]
  text = (job / "stacks" / name).read_text()
  assert "\nprocess: 0 of 2 (jax.distributed)\n" in text
  assert f"lingvo_lite{os.sep}programs{os.sep}train{os.sep}" in _main_thread(
      _section(text, "Python stacks of every thread"))


def test_sigusr1_during_the_start_up_imports_waits_for_its_handler():
  """`python -m lingvo_lite` blocks SIGUSR1 from its package's first line: one sent during the
  imports (seconds before the executor installs the handler) is dumped, not fatal."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  child = subprocess.Popen([sys.executable, "-m", "lingvo_lite", "--mode=list"], cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(0.3)  # Inside the imports of jax and the executor.
  child.send_signal(signal.SIGUSR1)
  stdout, stderr = child.communicate(timeout=120)
  assert child.returncode == 0, stderr[-2000:]
  assert "PyCodeTiny" in stdout
  # No job dir in --mode=list: the dump goes to stderr, with the main thread's stack.
  assert "lingvo_lite stack dump: SIGUSR1" in stderr, stderr[-2000:]
