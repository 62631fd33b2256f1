"""lingvo_lite: declarative language-model experiments on JAX, configured with Fiddle."""

import os
import signal
import sys

if sys.argv[:1] == ["-m"]:  # `python -m lingvo_lite` is starting (argv[0] while it is found).
  # SIGUSR1 asks for stack dumps (stack_dumps.py); until the executor installs their handler,
  # after the imports, the signal's default action would kill the process. Blocked, it waits,
  # and the handler (or the multi-process supervisor, which forwards it) takes it then.
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

# Old import paths (`lingvo_lite.registry`, from before the modules moved into packages) still
# resolve, for experiment modules written against them.
from lingvo_lite.config import moved_modules as _moved_modules  # pylint: disable=g-import-not-at-top

_moved_modules.install()

# TensorFlow is only the data pipeline's engine here: keep its C++ start-up chatter quiet.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _skip_absent_tpu() -> None:
  """With libtpu installed (the `tpu` extra, for AOT compiles) and no TPU chip on the host,
  JAX would still try to start a TPU runtime in every process, and libtpu prints five lines
  of warnings about the TPU VM it is not on before JAX falls back to the CPU. Without a chip
  the TPU backend fails at once, quietly, as JAX lets a backend fail; its lowering rules stay
  registered, and TPU topologies for compiles load libtpu on their own
  (`jax.experimental.topologies`). An explicit JAX_PLATFORMS is left as the user set it."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return
  try:  # JAX internals: where another jax version lacks them, JAX's own behaviour stands.
    from jax._src import hardware_utils, xla_bridge  # pylint: disable=g-import-not-at-top
    registration = xla_bridge._backend_factories.get("tpu")  # pylint: disable=protected-access
    if (registration is None or xla_bridge.backends_are_initialized()
        or hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0):
      return
  except (ImportError, AttributeError):
    return

  def no_tpu():
    raise RuntimeError("no TPU chip on this host")
  xla_bridge._backend_factories["tpu"] = dataclasses.replace(  # pylint: disable=protected-access
      registration, factory=no_tpu, fail_quietly=True)


_skip_absent_tpu()
