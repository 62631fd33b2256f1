"""A warm start from another job's checkpoint (weights/job_checkpoint.py, --init_from): the
source's parameters exactly, on any mesh, with a fresh optimizer; the job's own checkpoint
first on every later run, a kill -9 included; one line and an untouched job dir for a source
that cannot be used."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from etils import epath

from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.testing import kill_9_when, run_cli, synthetic_tiny_setup
from lingvo_lite.errors import UsageError
from lingvo_lite.weights import formats, job_checkpoint
from lingvo_lite.weights.job_checkpoint import JobCheckpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.train.log_every_steps=1", "--fdl.checkpoint.every_steps=2",
        "--fdl.checkpoint.max_to_keep=None",
        # A fixed decay horizon keeps the schedule the same whatever train.steps.
        "--fdl.optimizer.decay_steps=20", "--fdl.optimizer.warmup_steps=2"]


def _losses(job):
  with open(job / "metrics.jsonl") as f:
    return {row["step"]: row["loss"] for row in map(json.loads, f)}


def _train(job, *extra):
  result = run_cli([*TINY, f"--job_log_dir={job}", *extra])
  assert result.code == 0, result.stderr[-3000:]
  return result


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A job trained 4 steps with checkpoints at 2 and 4, and a different seed from the jobs
  that start from it (so its parameters are not what they would initialize)."""
  job = tmp_path_factory.mktemp("source") / "job"
  _train(job, "--fdl.train.steps=4", "--fdl.train.seed=7")
  return job


def _leaves(tree):
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_flag_values_name_a_job_and_perhaps_a_step():
  assert job_checkpoint.flag_arguments("runs/a") == {"job_log_dir": "runs/a", "step": None}
  assert job_checkpoint.flag_arguments("runs/a@20") == {"job_log_dir": "runs/a", "step": 20}
  assert job_checkpoint.flag_arguments("runs/x@y") == {"job_log_dir": "runs/x@y", "step": None}


def test_the_flag_names_a_folder_a_job_or_refuses(tmp_path, monkeypatch):
  """A scheme of the formats' table names its format; a value without one is a job folder,
  which may have a ':' in its name (a URL, an existing folder, one written ./NAME); a value
  that starts like another scheme is refused in one line listing the valid ones."""
  assert formats.source_config("hf:some/folder").path == "some/folder"
  assert formats.source_config("gguf:a/m.gguf").path == "a/m.gguf"
  assert formats.source_config("runs/a@3").step == 3
  monkeypatch.chdir(tmp_path)
  (tmp_path / "exp:1").mkdir()
  for job in ("gs://bucket/runs/a", "runs/a:b", "exp:1", "exp:1@3", "./ggml:x"):
    assert formats.source_config(job).job_log_dir == job.removesuffix("@3")
  for value, words in (("hf:", "give the folder after hf:"),
                       ("gguf: ", "give the file after gguf:"),
                       ("ggml:model.bin", "--init_from=ggml:model.bin: ggml: is no weight "
                        "format's scheme; give JOB, JOB@STEP, hf:PATH, gguf:PATH, slim:PATH or "
                        "peft:PATH[,base=SOURCE]"),
                       ("HF:folder", "HF: is no weight format's scheme"),
                       ("peft:a,base=ggml:b", "ggml: is no weight format's scheme")):
    with pytest.raises(UsageError) as error:
      formats.source_config(value)
    assert words in str(error.value) and "\n" not in str(error.value), error.value


def test_the_source_steps_parameters_load_exactly(source):
  jitted = JittedSteps(synthetic_tiny_setup())
  with jitted.activated():
    params, loaded = JobCheckpoint(str(source), step=2).load(jitted)
  # The reference: the step's parameters as a full restore of the source's own state reads them.
  reader = Checkpointer(epath.Path(source / "checkpoints"), CheckpointSettings(), create=False)
  with jitted.activated():
    whole = jitted.restore_state(reader, 2)
  expected, got = _leaves(whole.params), _leaves(params)
  assert sorted(got) == sorted(expected)
  assert all(got[name].tobytes() == expected[name].tobytes() for name in expected)
  fresh = _leaves(jitted.init_state().params)
  assert any(fresh[name].tobytes() != expected[name].tobytes() for name in expected)
  assert loaded == f"{source}@2 {job_checkpoint.fingerprint(source / 'checkpoints' / '2')}"
  assert loaded.split()[1].startswith("sha256:") and len(loaded.split()[1]) == 7 + 64


def test_a_warm_started_job_counts_from_zero_and_resumes_from_its_own_steps(source, tmp_path):
  job = tmp_path / "warm"
  first = _train(job, "--fdl.train.steps=4", f"--init_from={source}@4")
  assert f"with the parameters of {source}@4 sha256:" in first.stdout
  assert "the optimizer starts fresh" in first.stdout
  # Steps count from 0: its checkpoints are 2 and 4, not the source's 6 and 8; and the
  # optimizer started fresh: Adam's step count in its step-2 state is 2, not the source's 6.
  assert sorted(os.listdir(job / "checkpoints"), key=int) == ["2", "4"]
  jitted = JittedSteps(synthetic_tiny_setup())
  reader = Checkpointer(epath.Path(job / "checkpoints"), CheckpointSettings(), create=False)
  with jitted.activated():
    state = jitted.restore_state(reader, 2)
  counts = [int(leaf) for name, leaf in _leaves(state.opt_state).items() if "count" in name]
  assert counts and set(counts) == {2}, _leaves(state.opt_state).keys()
  # Another start from the source's step 4 gives the same first losses: the start is the
  # source's parameters, not this job's seed.
  again = tmp_path / "again"
  _train(again, "--fdl.train.steps=2", f"--init_from={source}@4", "--fdl.train.seed=3")
  assert _losses(again) == {s: l for s, l in _losses(job).items() if s <= 2}
  # config.json records the source: a rerun from the job dir alone resumes from the job's
  # own step 4 (the source is not read: it is gone), and the config names it.
  moved = source.parent / "moved"
  source.rename(moved)
  try:
    resumed = run_cli([f"--job_log_dir={job}", "--fdl.train.steps=6"])
  finally:
    moved.rename(source)
  assert resumed.code == 0, resumed.stderr[-2000:]
  assert "resumed from step 4" in resumed.stdout and "with the parameters of" not in resumed.stdout
  assert sorted(_losses(job)) == [1, 2, 3, 4, 5, 6]
  assert f"train.init_from.job_log_dir = '{source}'" in (job / "config.txt").read_text()
  # run_info.jsonl: the first start names what it loaded, checksums' digest included; the
  # resume loaded nothing.
  rows = [json.loads(line) for line in (job / "run_info.jsonl").read_text().splitlines()]
  fingerprint = job_checkpoint.fingerprint(source / "checkpoints" / "4")
  assert [row["initialized_from"] for row in rows] == [f"{source}@4 {fingerprint}", None]


@pytest.mark.slow
@pytest.mark.compares_a_child
def test_a_kill_9_after_a_warm_start_resumes_from_the_jobs_own_checkpoint(source, tmp_path):
  """The uninterrupted warm-started run's curve, from a run killed after its step-2 save and
  rerun with the source gone."""
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  args = ["--fdl.train.steps=8", f"--init_from={source}@4"]
  _train(whole, *args)
  kill_9_when([*TINY, *args, "--fdl.train.steps=1000", f"--job_log_dir={parts}"],
              parts / "checkpoints" / "4")
  moved = source.parent / "gone"
  source.rename(moved)
  try:
    resumed = run_cli([*TINY, *args, f"--job_log_dir={parts}", "--fdl.train.steps=1000",
                       "--fdl.train.steps=8"])
  finally:
    moved.rename(source)
  # The same config as the killed run's but train.steps, which may change on resume.
  assert resumed.code == 0, resumed.stderr[-2000:]
  assert "resumed from step" in resumed.stdout and "with the parameters of" not in resumed.stdout
  assert _losses(parts) == _losses(whole)


# A source the run cannot use: one line, exit 2, and no job folder made.
BAD = {
    "no_such_job": (["--init_from={tmp}/nope"],
                    "train.init_from.job_log_dir={tmp}/nope: no such folder"),
    "no_such_step": (["--init_from={source}@3"],
                     "train.init_from.step=3: no such checkpoint in {source}/checkpoints; "
                     "its steps: 2, 4"),
    "other_shapes": (["--init_from={source}", "--fdl.model.dim=32"],
                     "does not fit this config: its params/embedding has shape (259, 64), "
                     "this config's has (259, 32)"),
    "a_job_without_checkpoints": (["--init_from={tmp}"], "train.init_from.job_log_dir={tmp}: "
                                  "no checkpoint in {tmp}/checkpoints"),
    "gguf_missing": (["--init_from=gguf:{tmp}/m.gguf"], "gguf:{tmp}/m.gguf: no such file"),
    "hf_without_config": (["--init_from=hf:{tmp}"], "{tmp}/config.json: no such file"),
    "empty": (["--init_from="], "--init_from=: empty"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_source_that_cannot_be_used_is_one_line_and_makes_nothing(source, tmp_path, name):
  args, expected = BAD[name]
  fill = lambda text: text.format(tmp=tmp_path, source=source)
  job = tmp_path / "job"
  result = run_cli([*TINY, "--fdl.train.steps=2", f"--job_log_dir={job}",
                    *[fill(a) for a in args]])
  lines = result.stderr.strip().splitlines()
  assert result.code == 2, result
  assert len(lines) == 1 and lines[0].startswith("lingvo_lite: error: "), result.stderr
  assert fill(expected) in lines[0], lines[0]
  assert not job.exists()


# The source trained on 8 devices with fsdp=8 (a child with 8 forced CPU devices, which also
# loads it onto data=2 x tensor=2 x fsdp=2); this process, one device, loads it too.
_RESHARD_CHILD = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from etils import epath
    from lingvo_lite.checkpoints.manager import CheckpointSettings, Checkpointer
    from lingvo_lite.on_mesh.jitted import JittedSteps
    from lingvo_lite.testing import synthetic_tiny_setup
    from lingvo_lite.weights.job_checkpoint import JobCheckpoint

    source, reference = sys.argv[1], sys.argv[2]
    def leaves(tree):
      return {jax.tree_util.keystr(p): np.asarray(x)
              for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    # Random values, no two leaves alike, saved from an fsdp=8 mesh as training saves them.
    # A vocabulary the tensor axis divides; batches the data-parallel size divides.
    batches = ("model.vocab_size=260", "train_data.global_batch_size=8",
               "eval_data.global_batch_size=8")
    jitted = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "partitioner.ici_data=1",
                                              "partitioner.ici_fsdp=8", *batches))
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda x: jax.device_put(rng.standard_normal(x.shape).astype(x.dtype),
                                                  x.sharding), jitted.sharded_state.abstract)
    # Its step counter is the step it is saved as: a restore checks that they agree.
    state = state.replace(step=jax.device_put(np.asarray(1, state.step.dtype),
                                              state.step.sharding))
    saver = Checkpointer(epath.Path(source) / "checkpoints", CheckpointSettings(every_steps=1))
    saver.save(1, state, force=True, metadata=jitted.checkpoint_metadata)
    saver.close()
    np.savez(reference, **leaves(state.params))
    other = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "partitioner.ici_data=2",
                                             "partitioner.ici_fsdp=2",
                                             "partitioner.ici_tensor=2", *batches))
    with other.activated():
      params, _ = JobCheckpoint(source).load(other)
      # A resume onto this mesh (the partitioner may change on resume): the whole state.
      reader = Checkpointer(epath.Path(source) / "checkpoints", CheckpointSettings(),
                            create=False)
      whole = other.restore_state(reader, 1)
    shardings = jax.tree.leaves(jax.tree.map(lambda x: x.sharding, other.sharded_state.abstract.params))
    assert all(p.sharding.is_equivalent_to(s, p.ndim) for p, s in zip(jax.tree.leaves(params), shardings))
    got, saved = leaves(params), leaves(state.params)
    print(json.dumps({"mesh": dict(other.mesh.shape), "sharded": sum(
        len(p.sharding.device_set) > 1 and not p.sharding.is_fully_replicated
        for p in jax.tree.leaves(params)),
        "equal": sorted(got) == sorted(saved) and all(
            got[k].tobytes() == saved[k].tobytes() for k in saved),
        "state_equal": leaves(whole).keys() == leaves(state).keys() and all(
            leaves(whole)[k].tobytes() == leaves(state)[k].tobytes() for k in leaves(state))}))
    np.savez(reference + ".state.npz", **leaves(state))
    """)


@pytest.mark.slow
def test_a_state_saved_with_fsdp_8_loads_equal_on_one_device_and_on_a_2x2x2_mesh(tmp_path):
  """Its parameters as a warm start loads them, and its whole state as a resume restores it
  (the partitioner may change on resume): bit for bit, on both meshes."""
  source, reference = tmp_path / "fsdp8", tmp_path / "reference.npz"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  child = subprocess.run([sys.executable, "-c", _RESHARD_CHILD, str(source), str(reference)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
  assert child.returncode == 0, child.stderr[-3000:]
  report = json.loads(child.stdout.strip().splitlines()[-1])
  assert report["mesh"] == {"stage": 1, "data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
  assert report["sharded"] > 0 and report["equal"] and report["state_equal"], report
  # One device, this process.
  jitted = JittedSteps(synthetic_tiny_setup("PyCodeTiny", "model.vocab_size=260"))
  assert jitted.target.num_devices == 1
  with jitted.activated():
    params, _ = JobCheckpoint(str(source)).load(jitted)
  saved = dict(np.load(reference))
  got = _leaves(params)
  assert sorted(got) == sorted(saved)
  assert all(got[name].tobytes() == saved[name].tobytes() for name in saved)
  # And the whole train state, moments included, as a resume on one device restores it.
  reader = Checkpointer(epath.Path(source / "checkpoints"), CheckpointSettings(), create=False)
  with jitted.activated():
    whole = _leaves(jitted.restore_state(reader, 1))
  saved_state = dict(np.load(str(reference) + ".state.npz"))
  assert sorted(whole) == sorted(saved_state) and len(whole) > len(got)
  assert all(whole[name].tobytes() == saved_state[name].tobytes() for name in saved_state)
