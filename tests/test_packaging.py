"""The project installs as a package: a wheel builds from pyproject.toml with the three
packages and the `lingvo_lite` console script."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_wheel_has_the_packages_and_the_console_script(tmp_path):
  source = tmp_path / "src"
  source.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), source / name)
  for package in ("lingvo_lite", "experiments", "tasks"):
    shutil.copytree(os.path.join(ROOT, package), source / package,
                    ignore=shutil.ignore_patterns("__pycache__", "BUILD.bazel"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(tmp_path / "dist"), str(source)], check=True, timeout=300)
  (wheel,) = os.listdir(tmp_path / "dist")
  with zipfile.ZipFile(tmp_path / "dist" / wheel) as archive:
    names = archive.namelist()
    entry_points = next(archive.read(n).decode() for n in names
                        if n.endswith("entry_points.txt"))
  for module in ("lingvo_lite/executor.py", "lingvo_lite/models/transformer.py",
                 "experiments/lm/pycode.py", "tasks/pycode.py"):
    assert module in names
  assert "lingvo_lite = lingvo_lite.executor:run_main" in entry_points
