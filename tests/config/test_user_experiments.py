"""User experiments outside the repository, as real `python -m lingvo_lite` processes.

One user project exercises both routes: its working directory holds its own `experiments/` and
`tasks/` packages (which, first on sys.path, would hide the built-in ones), and a distribution
made visible by a `NAME.dist-info/` folder on PYTHONPATH declares its experiment module in the
`lingvo_lite.experiments` entry-point group (as `pip install` of the user's package would).
"""

import os
import subprocess
import sys
import textwrap

import pytest

import lingvo_lite

# The folder holding the `lingvo_lite` package: the repository, or a Bazel runfiles tree.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lingvo_lite.__file__)))

_FILES = {
    # The user's own packages, named like the built-in ones.
    "project/experiments/__init__.py": "raise RuntimeError('the user __init__ is not run')\n",
    "project/experiments/mine.py": """\
        '''The user's experiments, beside the built-in ones.'''
        from experiments.lm import pycode
        from lingvo_lite.config.registry import register
        from tasks import user_task

        @register
        class UserDirExp(pycode.PyCodeTiny):
          '''Lives in the user's experiments/ folder.'''
        """,
    "project/experiments/broken_user.py": "x = (\n",
    "project/tasks/__init__.py": "",
    "project/tasks/user_task.py": "NAME = 'user'\n",
    # An installed distribution with an entry point (and a stale one).
    "site/user_dist/__init__.py": "",
    "site/user_dist/exps.py": """\
        '''Experiments of an installed distribution.'''
        from experiments.lm import pycode
        from lingvo_lite.config.registry import register

        @register
        class SuffixNameExp(pycode.PyCodeTiny):
          '''Found through the lingvo_lite.experiments entry point.'''
        """,
    "site/user_dist-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: user-dist\n"
                                             "Version: 0.1\n",
    "site/user_dist-0.1.dist-info/entry_points.txt": "[lingvo_lite.experiments]\n"
                                                     "exps = user_dist.exps\n"
                                                     "stale = user_dist.removed\n",
}


@pytest.fixture(scope="module", name="project")
def fixture_project(tmp_path_factory):
  root = tmp_path_factory.mktemp("user")
  for relative, text in _FILES.items():
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
  return root


def _run(project, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(project / "site")]))
  return subprocess.run([sys.executable, "-m", "lingvo_lite", *args], cwd=project / "project",
                        env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_list_shows_builtin_user_folder_and_entry_point_experiments(project):
  result = _run(project, "--mode=list")
  assert result.returncode == 0, result.stderr
  names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
  for expected in ("lm.pycode.PyCodeTiny", "lm.gptj.GptJ6B", "mine.UserDirExp",
                   "user_dist.exps.SuffixNameExp"):
    assert expected in names, result.stdout
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_lookups_find_builtin_and_entry_point_experiments_by_suffix(project):
  for exp in ("PyCodeTiny", "SuffixNameExp"):
    result = _run(project, "--mode=print", f"--exp={exp}", "--fiddler=tiny")
    assert result.returncode == 0, (exp, result.stderr)
    assert "model.num_layers" in result.stdout, result.stdout
  # A name found nowhere names the modules that failed to import.
  result = _run(project, "--mode=print", "--exp=NoSuchUserExp")
  assert result.returncode == 2
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith("lingvo_lite: error: --exp=NoSuchUserExp: no such experiment; ")
  assert ("2 experiment modules failed to import: experiments.broken_user, user_dist.removed"
          in line), line
