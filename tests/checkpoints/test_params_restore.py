"""A params-only restore (what eval and decode need) reads the parameters of a training
checkpoint and nothing else: the same arrays as a full restore, bit for bit, in the params'
shardings, in either layer layout, with the same one-line errors, and without the optimizer
state's bytes in memory. Decode restores through checkpoints/params.py with no optimizer at
all: the same parameters in the same shardings as the train state's."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from lingvo_lite.checkpoints import integrity as checkpoint_integrity, saved_state
from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.checkpoints.params import MeshParams
from lingvo_lite.errors import UsageError
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.models.layer_layout import stack_layers
from lingvo_lite.testing import synthetic_tiny_setup

SCANNED = ("model.scan_layers=True",)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _random_state(jitted, seed=0, step=1):
  """A TrainState of random values in its shardings, without compiling anything: no two
  leaves alike (moments included, unlike at init), so a mix-up of any two would show. Its
  step counter is `step`, the step it is saved as (a restore checks that they agree)."""
  rng = np.random.default_rng(seed)
  state = jax.tree.map(
      lambda x: jax.device_put(rng.standard_normal(x.shape).astype(x.dtype), x.sharding),
      jitted.sharded_state.abstract)
  return state.replace(step=jax.device_put(np.asarray(step, state.step.dtype),
                                           state.step.sharding))


def _save(directory, jitted, state, step=1):
  """Through `Checkpointer.save`, the path training takes; verified like training's."""
  checkpointer = Checkpointer(epath.Path(directory), CheckpointSettings(every_steps=1))
  checkpointer.save(step, state, force=True, metadata=jitted.checkpoint_metadata)
  checkpointer.close()


def _reader(directory, **settings):
  """A fresh Checkpointer, as the eval program opens a job's checkpoints."""
  return Checkpointer(epath.Path(directory), CheckpointSettings(**settings), create=False)


def _paths(tree):
  return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _assert_bitwise_equal(got, want):
  assert _paths(got) == _paths(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def _assert_in_shardings(params, shardings):
  for leaf, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
    assert isinstance(leaf, jax.Array)
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), (leaf.sharding, sharding)


def test_params_only_equals_the_full_restore_and_holds_nothing_else(tmp_path):
  jitted = JittedSteps(synthetic_tiny_setup())
  state = _random_state(jitted, step=3)
  _save(tmp_path, jitted, state, step=3)
  with jitted.activated():
    full = jitted.restore_state(_reader(tmp_path), 3)
    live_before = {id(x) for x in jax.live_arrays()}
    params = jitted.restore_params(_reader(tmp_path), 3)
    new_arrays = [x for x in jax.live_arrays() if id(x) not in live_before]
  _assert_bitwise_equal(params, full.params)
  _assert_bitwise_equal(params, state.params)
  # A plain parameter tree: no TrainState, no step, no moments.
  assert isinstance(params, dict)
  assert jax.tree.structure(params) == jax.tree.structure(jitted.sharded_state.abstract.params)
  _assert_in_shardings(params, jitted.sharded_state.shardings.params)
  # Nothing but the parameters was allocated by the restore.
  params_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  assert sum(x.nbytes for x in new_arrays) == params_bytes
  assert len(new_arrays) == len(jax.tree.leaves(params))


def test_a_checkpoint_in_the_standard_save_format_restores_params_only(tmp_path):
  """Written by orbax directly as `Checkpointer.save` writes today (StandardCheckpointHandler,
  StandardSave, custom metadata, then checksums): old jobs' checkpoints keep working even if
  the save path changes."""
  jitted = JittedSteps(synthetic_tiny_setup())
  state = _random_state(jitted, step=5)
  manager = ocp.CheckpointManager(epath.Path(tmp_path),
                                  item_handlers=ocp.StandardCheckpointHandler())
  manager.save(5, args=ocp.args.StandardSave(saved_state.on_disk(state)),
               custom_metadata=jitted.checkpoint_metadata)
  manager.wait_until_finished()
  manager.close()
  checkpoint_integrity.write_checksums(epath.Path(tmp_path) / "5", 5, "a job")
  with jitted.activated():
    params = jitted.restore_params(_reader(tmp_path), 5)
    full = jitted.restore_state(_reader(tmp_path), 5)
  _assert_bitwise_equal(params, state.params)
  _assert_bitwise_equal(full, state)


def test_params_only_converts_between_unrolled_and_scanned_layers(tmp_path):
  unrolled = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "model.num_layers=3"))
  scanned = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "model.num_layers=3", *SCANNED))
  state = _random_state(unrolled)
  _save(tmp_path / "unrolled", unrolled, state)
  with scanned.activated():
    params = scanned.restore_params(_reader(tmp_path / "unrolled"), 1)
    full = scanned.restore_state(_reader(tmp_path / "unrolled"), 1)
  assert "layers" in params and "layer_0" not in params
  _assert_bitwise_equal(params, stack_layers(jax.device_get(state.params)))
  _assert_bitwise_equal(params, full.params)
  _assert_in_shardings(params, scanned.sharded_state.shardings.params)

  # And back: a scanned checkpoint restored params-only into unrolled layers.
  _save(tmp_path / "scanned", scanned, full)
  with unrolled.activated():
    params = unrolled.restore_params(_reader(tmp_path / "scanned"), 1)
  _assert_bitwise_equal(params, state.params)
  _assert_in_shardings(params, unrolled.sharded_state.shardings.params)


def _mesh_params(setup, mesh):
  """The parameters on `mesh` as decode shapes them: from the model alone, no optimizer."""
  return MeshParams(setup.model, setup.train_data.sequence_length, setup.partitioner, mesh)


def test_without_an_optimizer_the_shapes_shardings_and_arrays_are_the_train_states(tmp_path):
  """What decode restores (no optimizer, no JittedSteps) equals what eval and a full restore
  get, bit for bit and sharding for sharding, in the saved layout and converted from the other
  one (test_decode_program checks that decode makes no optimizer)."""
  unrolled_setup = synthetic_tiny_setup("PyCodeTiny", "model.num_layers=3")
  scanned_setup = synthetic_tiny_setup("PyCodeTiny", "model.num_layers=3", *SCANNED)
  unrolled, scanned = JittedSteps(unrolled_setup), JittedSteps(scanned_setup)
  state = _random_state(unrolled)
  _save(tmp_path, unrolled, state)
  for setup, jitted in ((unrolled_setup, unrolled), (scanned_setup, scanned)):
    placed = _mesh_params(setup, jitted.mesh)
    want = jitted.sharded_state.abstract.params
    assert jax.tree.structure(placed.abstract) == jax.tree.structure(want)
    for got, expected in zip(jax.tree.leaves(placed.abstract), jax.tree.leaves(want)):
      assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
      assert got.sharding == expected.sharding
    with jitted.activated():
      params = placed.restore(_reader(tmp_path), 1)
      _assert_bitwise_equal(params, jitted.restore_params(_reader(tmp_path), 1))
    _assert_in_shardings(params, jitted.sharded_state.shardings.params)
  _assert_bitwise_equal(params, stack_layers(jax.device_get(state.params)))


def _data_file(step_dir):
  files = [os.path.join(d, f) for d, _, names in os.walk(step_dir) for f in names
           if f != checkpoint_integrity.CHECKSUMS_FILE]
  return max(files, key=os.path.getsize)


def _one_line_usage_error(call, *expected):
  with pytest.raises(UsageError) as error:
    call()
  message = str(error.value)
  assert "\n" not in message, message
  for text in expected:
    assert text in message, message
  return message


def test_a_corrupt_unreadable_or_mismatched_checkpoint_gives_one_line(tmp_path):
  jitted = JittedSteps(synthetic_tiny_setup())
  state = _random_state(jitted)
  abstract = jitted.sharded_state.abstract.params
  _save(tmp_path / "corrupt", jitted, state)
  path = _data_file(tmp_path / "corrupt" / "1")
  with open(path, "r+b") as f:  # One flipped byte: orbax alone would restore it silently.
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))
  _one_line_usage_error(lambda: _reader(tmp_path / "corrupt").restore_params(1, abstract),
                        "checkpoint step 1 is corrupt: ", "does not match the CRC-32")

  _save(tmp_path / "truncated", jitted, state)
  # Every data file, as orbax's writers share the arrays out among them at random: one alone
  # may hold only moments, which a params-only read rightly never opens.
  for folder, _, names in os.walk(tmp_path / "truncated" / "1"):
    for name in names if os.path.basename(folder) == "d" else ():
      os.truncate(os.path.join(folder, name), 10)  # Unseen with checksums off.
  # orbax wraps this read error in a bare Exception; both restores still say it in one line.
  unchecked = _reader(tmp_path / "truncated", checksums=False)
  for restore in (lambda: unchecked.restore_params(1, abstract),
                  lambda: unchecked.restore(1, jitted.sharded_state.abstract)):
    _one_line_usage_error(restore, "checkpoint step 1 in ", " is unreadable (",
                          "out of the way to start from scratch")

  wider = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "model.dim=96"))
  _save(tmp_path / "wider", wider, _random_state(wider))
  _one_line_usage_error(
      lambda: _reader(tmp_path / "wider").restore_params(1, abstract),
      "does not fit this config: its params/", "has shape (", "the model differs")
  deeper = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "model.num_layers=3"))
  _save(tmp_path / "deeper", deeper, _random_state(deeper))
  _one_line_usage_error(
      lambda: _reader(tmp_path / "deeper").restore_params(1, abstract),
      "it holds params/layer_2/")


def test_only_the_params_subtree_must_fit(tmp_path):
  """Another optimizer's state (here none) does not stop an eval; a full restore refuses."""
  jitted = JittedSteps(synthetic_tiny_setup())
  state = _random_state(jitted)
  _save(tmp_path, jitted, state.replace(opt_state={"other": np.zeros(3, np.float32)}))
  with jitted.activated():
    _assert_bitwise_equal(jitted.restore_params(_reader(tmp_path), 1), state.params)
    _one_line_usage_error(lambda: jitted.restore_state(_reader(tmp_path), 1),
                          "does not fit this config: ", "the model or optimizer differs")


# A child process restoring one checkpoint, full or params-only, on 4 forced CPU devices with
# the parameters sharded over fsdp; prints its peak RSS. Both kinds build the same setup first,
# so the difference of their peaks is what the restore itself holds. The peak is VmHWM, not
# getrusage's ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest, here
# ~800 MB), which would hide both restores under the same number.
_WORKER = """
import json, sys
import jax
from etils import epath
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import synthetic_tiny_setup
directory, kind, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
setup = synthetic_tiny_setup("PyCodeTiny", *sets)
jitted = JittedSteps(setup)
checkpointer = Checkpointer(epath.Path(directory), setup.checkpoint, create=False)
with jitted.activated():
  restore = jitted.restore_params if kind == "params" else jitted.restore_state
  restored = jax.block_until_ready(restore(checkpointer, checkpointer.latest_step()))
params = restored if kind == "params" else restored.params
shardings = jitted.sharded_state.shardings.params
in_shardings = all(x.sharding.is_equivalent_to(s, x.ndim)
                   for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)))
with open("/proc/self/status") as f:
  peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"peak_kb": peak_kb, "in_shardings": in_shardings,
                  "sharded": any(not x.sharding.is_fully_replicated
                                 for x in jax.tree.leaves(params))}))
"""
# ~12.9M float32 parameters (52 MB), so Adam's moments are ~103 MB.
_MEMORY_SETS = ("model.dim=512", "model.num_layers=4")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's VmHWM")
def test_params_only_restore_peaks_lower_by_the_moments(tmp_path):
  jitted = JittedSteps(synthetic_tiny_setup("PyCodeTiny", *_MEMORY_SETS))
  _save(tmp_path, jitted, _random_state(jitted))
  moments_bytes = sum(x.size * x.dtype.itemsize
                      for x in jax.tree.leaves(jitted.sharded_state.abstract.opt_state))
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  sets = [*_MEMORY_SETS, "partitioner.ici_data=1", "partitioner.ici_fsdp=4"]
  # One at a time: on a shared 2-core machine two at once take as long.
  peaks = {}
  for kind in ("full", "params"):
    done = subprocess.run([sys.executable, "-c", _WORKER, str(tmp_path), kind, *sets], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["in_shardings"] and result["sharded"], result
    peaks[kind] = result["peak_kb"] * 1024
  saved = peaks["full"] - peaks["params"]
  assert saved >= moments_bytes / 2, (
      f"params-only peak {peaks['params'] / 2**20:.0f} MiB vs full {peaks['full'] / 2**20:.0f} "
      f"MiB: {saved / 2**20:.0f} MiB saved, the moments are {moments_bytes / 2**20:.0f} MiB")
