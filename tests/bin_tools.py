"""The tools of bin/ as modules, for tests that call a tool's `main` in their own process."""

from __future__ import annotations

import importlib.util
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tool(name: str) -> types.ModuleType:
  """bin/<name>.py as a module, imported once, leaving this process's environment as it was
  (the tools hide GPUs from their TensorFlow when imported)."""
  module_name = f"bin_{name}_under_test"
  if module_name not in sys.modules:
    saved = dict(os.environ)
    spec = importlib.util.spec_from_file_location(module_name,
                                                  os.path.join(ROOT, "bin", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    os.environ.clear()
    os.environ.update(saved)
  return sys.modules[module_name]
