"""The compile program: reports checked against independent counts, saved steps that train
exactly like compiled ones (and refuse to load where they are not valid), TPU compiles from
this CPU host, and the maximum-batch search against brute force."""

import json
import math
import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from lingvo_lite import target as targets
from lingvo_lite.partitioning import Partitioner
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs.compile import aot, analyses, compile_report, fit_advice
from lingvo_lite.testing import run_cli, run_process, source_root, synthetic_tiny_setup
from tests.trained_jobs import tree_digest

TINY = ["--exp=PyCodeTiny", "--fiddler=tiny", "--fiddler=synthetic_data",
        "--fdl.train_data.global_batch_size=8", "--fdl.eval_data.global_batch_size=8"]
# A mesh with every kind of split: parameters over fsdp, the batch over data x fsdp.
SHARDED = ["--fdl.partitioner.ici_data=2", "--fdl.partitioner.ici_fsdp=4"]


def _eight_cpu_env():
  return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")


def _report(job: pathlib.Path) -> dict:
  return json.loads((job / "compile" / "report.json").read_text())


def _v5e8_compile(job: pathlib.Path, *flags: str):
  """TINY's --mode=compile for a v5e-8 with `flags`, into the job folder `job`: (the run,
  its report.json)."""
  result = run_cli([*TINY, "--mode=compile", "--compile_topology=v5e-8", *flags,
                    f"--job_log_dir={job}"])
  assert result.code == 0, result.stderr
  return result, _report(job)


def _need_libtpu():
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    pytest.fail(f"libtpu is not installed ({e}): bin/setup.sh installs it (requirements.lock "
                "pins the libtpu that matches jax); TPU compiles cannot be tested without it")


def test_cpu8_argument_bytes_equal_an_independent_count(tmp_path):
  job = tmp_path / "job"
  # A process of its own, as every cpu:N compile here: one in this process would leave it
  # 8 CPU devices, which the cases after it would see.
  completed = run_process([*TINY, *SHARDED, "--mode=compile", "--compile_topology=cpu:8",
                       f"--job_log_dir={job}"])
  assert completed.returncode == 0, completed.stderr
  report = _report(job)
  assert report["mesh"] == {"stage": 1, "data": 2, "fsdp": 4, "expert": 1, "tensor": 1}
  assert report["verdict"] == "FITS" and report["target"]["num_devices"] == 8
  # Independently: each parameter's shard from its logical axes and the rules' mesh axes,
  # three copies (parameters, Adam's mu and nu), three int32 counters (the state's step,
  # Adam's count, the learning-rate schedule's count), and this device's rows of the batch.
  setup = synthetic_tiny_setup("PyCodeTiny", "train_data.global_batch_size=8",
                               "eval_data.global_batch_size=8")
  sizes = {"stage": 1, "data": 2, "fsdp": 4, "expert": 1, "tensor": 1}
  rules = dict(setup.partitioner.rules)
  parameters = 0
  for p in setup.model.parameter_shapes():
    shard = 1
    for size, axis in zip(p.shape, p.axes):
      mesh_axes = rules.get(axis) or ()
      mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
      shard *= -(-size // math.prod(sizes[a] for a in mesh_axes))
    parameters += p.repeats * shard * np.dtype(p.dtype).itemsize
  rows = 8 // (2 * 4)
  batch = rows * 64 * (4 + 4 + 4)  # inputs, targets int32; weights float32
  expected = 3 * parameters + 3 * 4 + batch
  assert report["memory"]["arguments"] == expected
  assert report["analytic"]["total"] == expected
  assert report["analytic"]["by_part"]["parameters"] == parameters
  assert report["parameters"] == setup.model.num_parameters()
  text = (job / "compile" / "report.txt").read_text()
  assert "verdict: FITS" in text and "largest buffers" in text
  assert len(report["largest_buffers"]) == 10
  assert report["flops"]["xla_per_device"] > 0
  assert report["step_time"]["seconds_at_50_mfu"] == pytest.approx(
      2 * report["step_time"]["seconds_at_100_mfu"])


@pytest.mark.slow
def test_saved_step_trains_exactly_and_refuses_what_differs(tmp_path):
  step = tmp_path / "step"
  completed = run_process([*TINY, *SHARDED, "--fdl.train.steps=4", "--mode=compile",
                       "--compile_topology=cpu:8", f"--compiled_step_out={step}"],
                      env=_eight_cpu_env())
  assert completed.returncode == 0, completed.stderr
  assert (step / "manifest.json").exists() and (step / "executable.bin").exists()

  def edited(name: str, edit) -> pathlib.Path:
    copy = tmp_path / name
    copy.mkdir()
    (copy / "executable.bin").write_bytes((step / "executable.bin").read_bytes())
    manifest = json.loads((step / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy

  variants = {
      "batch": edited("batch", lambda m: m["step config"].update(
          {"train_data batch inputs": "int32[16, 64]"})),
      "topology": edited("topology", lambda m: m.update(topology="v5e-8")),
      "device order": edited("order", lambda m: m.update(
          {"device order": list(reversed(m["device order"]))})),
      "xla flags": edited("flags", lambda m: m["xla flags"].update(
          XLA_FLAGS="--xla_cpu_enable_fast_math=true")),
      "versions": edited("versions", lambda m: m["versions"].update(jax="0.0.1")),
  }
  train = [*TINY, *SHARDED, "--fdl.train.steps=4"]  # The suite's cache: see the worker's doc.
  runs = [[*train, f"--job_log_dir={tmp_path / 'compiled'}"],
          [*train, f"--job_log_dir={tmp_path / 'loaded'}", f"--compiled_step_in={step}"],
          [*train, f"--job_log_dir={tmp_path / 'other_steps'}", "--fdl.train.steps=5",
           f"--compiled_step_in={step}"]]
  runs += [[*train, f"--job_log_dir={tmp_path / name}", f"--compiled_step_in={path}"]
           for name, path in variants.items()]
  worker = subprocess.run([sys.executable, "-m", "tests.compiled_step_worker", json.dumps(runs)],
                          cwd=source_root(), capture_output=True, text=True, timeout=600,
                          check=False, env=_eight_cpu_env())
  assert worker.returncode == 0, worker.stderr
  compiled, loaded, *refused = json.loads(worker.stdout.strip().splitlines()[-1])
  assert compiled["code"] == 0 and loaded["code"] == 0, (compiled, loaded)
  # The listener sees the train step compile in a normal run, and not with the saved step.
  assert any("train_step" in name for name in compiled["compiled"]), compiled["compiled"]
  assert not any("train_step" in name for name in loaded["compiled"]), loaded["compiled"]
  losses = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").open()]
            for run in ("compiled", "loaded")]
  assert losses[0] == losses[1] and len(losses[0]) >= 1
  expected = {"other_steps": "step config.train.steps was '4' when compiled, is '5' now",
              "batch": "train_data batch inputs was 'int32[16, 64]' when compiled, is "
                       "'int32[8, 64]' now",
              "topology": "topology was 'v5e-8' when compiled, is 'cpu:8' now",
              "device order": "compiled for a different device order: device order was [",
              "xla flags": "xla flags.XLA_FLAGS was '--xla_cpu_enable_fast_math=true'",
              "versions": "versions.jax was '0.0.1' when compiled"}
  for (name, fragment), result in zip(expected.items(), refused):
    lines = result["stderr"].strip().splitlines()
    assert result["code"] == 2 and len(lines) == 1, (name, result)
    assert fragment in lines[0], (name, lines[0])
    assert not (tmp_path / name / "checkpoints").exists() or not any(
        (tmp_path / name / "checkpoints").iterdir()), name


def test_tpu_compile_lowers_the_tpu_form_of_the_model():
  """The weight matmul's CPU variant (an optimization barrier around a transpose) is chosen
  by the target's platform, not by this CPU host's backend."""
  _need_libtpu()
  setup = synthetic_tiny_setup("PyCodeTiny", "train_data.global_batch_size=8",
                               "eval_data.global_batch_size=8")
  tpu = targets.compile_target("v5e-8")
  with targets.active(tpu):
    tpu_text = JittedSteps(setup, target=tpu).lower_train_step().as_text()
  host_setup = synthetic_tiny_setup("PyCodeTiny")
  host_text = JittedSteps(host_setup).lower_train_step().as_text()
  # The embedding lookup's barrier over the table [259, 64] (models/embedding_lookup.py) is
  # in both forms; the weight matmul's barriers only in the host's.
  matmul_barriers = lambda text: [line for line in text.splitlines()
                                  if "optimization_barrier" in line and "259x64" not in line]
  assert matmul_barriers(host_text) and not matmul_barriers(tpu_text)
  assert "optimization_barrier" in tpu_text  # The lookup's: the filter above has work to do.
  assert tpu.num_devices == 8 and tpu.device_kind.startswith("TPU v5")
  assert jax.default_backend() == "cpu"


def test_tpu_compiles_one_and_two_slices(tmp_path):
  _need_libtpu()
  for name, args, devices, mesh in (
      ("one", ["--compile_topology=v5e-8"], 8, {"stage": 1, "data": 8, "fsdp": 1, "expert": 1, "tensor": 1}),
      ("two", ["--compile_topology=v5e-16", "--compile_num_slices=2",
               "--fdl.train_data.global_batch_size=32", "--fdl.eval_data.global_batch_size=32"],
       32, {"stage": 1, "data": 32, "fsdp": 1, "expert": 1, "tensor": 1})):
    job = tmp_path / name
    argv = [*TINY, "--mode=compile", f"--job_log_dir={job}", *args]
    # One slice in this process (the v5e-8 compile the other cases run in it too); two as a
    # process of its own, whose stderr holds what libtpu's C++ would print there.
    completed = run_cli(argv) if name == "one" else run_process(argv)
    code = completed.code if name == "one" else completed.returncode
    assert code == 0, completed.stderr
    assert completed.stderr.strip() == "", completed.stderr  # libtpu's warnings kept out
    report = _report(job)
    assert report["verdict"] == "FITS"
    assert report["target"]["num_devices"] == devices
    assert report["target"]["platform"] == "tpu"
    assert report["mesh"] == mesh
    # The step time counted from the optimized HLO: data parallelism's gradients cross ICI
    # (and, over two slices, the data-center network too).
    estimate = report["estimate"]
    assert estimate["made"] and estimate["chip"]["name"] == "v5e"
    assert estimate["seconds"] == pytest.approx(sum(estimate["parts"].values()))
    assert estimate["counted"]["ici_bytes"] > 0 and estimate["counted"]["kernels"] > 0
    assert (estimate["counted"]["dcn_bytes"] > 0) == (name == "two")
    assert "  step time estimate: " in completed.stdout
  assert _report(tmp_path / "two")["target"]["num_slices"] == 2


def test_a_two_axis_mesh_across_hosts_compiles_for_a_large_v5e_slice(tmp_path):
  """A v5e-32's 8 hosts each drive 2x2 chips: every host's block of the mesh is laid out
  alike, so the groups of an axis across hosts are translates of one another (jax's v5e mesh
  rings only the first host's chips, and XLA:TPU's limited ICI routing refused the data
  axis's collectives). A subprocess: XLA aborts the process on that refusal."""
  _need_libtpu()
  mesh = Partitioner(ici_data=4, ici_fsdp=8).make_mesh(targets.compile_target("v5e-32").devices)
  layouts = set()
  for host_block in mesh.devices.reshape(8, 4):  # [data x fsdp's 2 hosts, a host's 4 chips]
    assert len({d.process_index for d in host_block}) == 1
    origin = [min(axis) for axis in zip(*(d.coords for d in host_block))]
    layouts.add(tuple(tuple(c - o for c, o in zip(d.coords, origin)) for d in host_block))
  assert len(layouts) == 1, layouts
  job = tmp_path / "job"
  completed = run_process([*TINY, "--mode=compile", "--compile_topology=v5e-32",
                       f"--job_log_dir={job}", "--fdl.train_data.global_batch_size=32",
                       "--fdl.eval_data.global_batch_size=32", "--fdl.partitioner.ici_data=4",
                       "--fdl.partitioner.ici_fsdp=8"])
  assert completed.returncode == 0, completed.stderr[-2000:]
  report = _report(job)
  assert report["verdict"] == "FITS"
  assert report["mesh"] == {"stage": 1, "data": 4, "fsdp": 8, "expert": 1, "tensor": 1}


def test_the_same_compile_again_reads_xlas_analyses_from_the_cache(tmp_path):
  _need_libtpu()
  cache = tmp_path / "cache"
  args = [*TINY, "--mode=compile", "--compile_topology=v5e-8", f"--compilation_cache_dir={cache}"]
  reports = {}
  for name in ("first", "again"):
    completed = run_cli([*args, f"--job_log_dir={tmp_path / name}"])
    assert completed.code == 0, completed.stderr
    reports[name] = _report(tmp_path / name)
  first, again = reports["first"], reports["again"]
  assert not first["compile_cached"] and again["compile_cached"]
  assert "read XLA's analyses of the same program from the compilation cache" in completed.stdout
  # Everything XLA said, and the first compile's seconds, as the first compile reported them.
  for field in ("verdict", "memory", "margin", "largest_buffers", "flops", "compile_seconds",
                "estimate"):
    assert again[field] == first[field], field
  kept = list((cache / analyses.KIND).iterdir())
  assert len(kept) == 1
  # Another program (a larger batch) compiles; so does one whose kept file is damaged.
  completed = run_cli([*args, f"--job_log_dir={tmp_path / 'other'}",
                       "--fdl.train_data.global_batch_size=16"])
  assert completed.code == 0 and not _report(tmp_path / "other")["compile_cached"]
  kept[0].write_text('{"schema": 1, "seconds": "not a number"')
  completed = run_cli([*args, f"--job_log_dir={tmp_path / 'damaged'}"])
  assert completed.code == 0, completed.stderr
  assert not _report(tmp_path / "damaged")["compile_cached"]
  assert _report(tmp_path / "damaged")["memory"] == first["memory"]
  # Without a cache, nothing is kept or read.
  completed = run_cli([*TINY, "--mode=compile", "--compile_topology=v5e-8",
                       "--compilation_cache_dir=", f"--job_log_dir={tmp_path / 'none'}"])
  assert completed.code == 0 and not _report(tmp_path / "none")["compile_cached"]
  assert len(list((cache / analyses.KIND).iterdir())) == 2


def test_an_executable_that_is_needed_is_compiled_whatever_was_kept(tmp_path):
  lowered = jax.jit(lambda x: x * 2 + 1).lower(jax.ShapeDtypeStruct((4, 8), np.float32))
  with targets.active(targets.host()), analyses.kept_in(str(tmp_path)):
    first = aot.compile_lowered(lowered, 0.0)
    again = aot.compile_lowered(lowered, 0.0)
    needed = aot.compile_lowered(lowered, 0.0, need_executable=True)
  assert first.executable is not None and not first.cached
  assert again.executable is None and again.cached and again.memory == first.memory
  assert needed.executable is not None and not needed.cached
  np.testing.assert_array_equal(needed.executable(np.ones((4, 8), np.float32)),
                                np.full((4, 8), 3.0, np.float32))


def test_too_large_reports_does_not_fit_and_max_batch_agrees_with_brute_force(tmp_path):
  # Rows of 2048 tokens over a 65536-token vocabulary: float32 logits of 512 MiB per row,
  # about 1.2 GiB a row in all, so the boundary lies at a few rows a device (2 with 24 GiB of
  # RAM over 8 devices) and brute force needs few compiles.
  heavy = [*TINY, "--fdl.model.vocab_size=65536", "--fdl.train_data.vocab_size=65536",
           "--fdl.eval_data.vocab_size=65536", "--fdl.train_data.sequence_length=2048",
           "--fdl.eval_data.sequence_length=2048", "--fiddler=no_eval", "--mode=compile",
           "--compile_topology=cpu:8", "--fdl.partitioner.ici_data=8"]
  job = tmp_path / "search"
  completed = run_process([*heavy, f"--job_log_dir={job}", "--compile_find_max_batch"])
  assert completed.returncode == 0, completed.stderr
  search = _report(job)["max_batch"]["policies"][0]
  best = search["max_per_device_batch_size"]
  assert best and best >= 2, search
  made = {c["per_device_batch_size"]: c for c in search["compiles"]}
  assert made[best]["fits"] and not made[best + 1]["fits"]
  # Brute force at the boundary: the best batch and the next compiled each on its own (really
  # compiled, not read from the analyses the search kept of the same programs). Memory grows
  # with the batch, so these two decide where the boundary lies.
  for per_device in (best, best + 1):
    job = tmp_path / f"b{per_device}"
    completed = run_process([*heavy, f"--job_log_dir={job}", "--compilation_cache_dir=",
                         f"--fdl.train_data.global_batch_size={8 * per_device}"])
    assert completed.returncode == (0 if per_device <= best else 3), (per_device,
                                                                       completed.stderr)
    report = _report(job)
    assert report["verdict"] == ("FITS" if per_device <= best else "DOES NOT FIT")
    if per_device > best:  # The state fits; the activations do not: their knob, in one line.
      assert report["next_knob"].startswith("does not fit: the activations"), report
      assert f"  {report['next_knob']}\n" in completed.stdout
    else:
      assert report["next_knob"] is None


def test_remat_policies_alone_show_which_fit_each_as_its_own_compile_says(tmp_path):
  """--compile_remat_policies needs no other flag: a row per policy at the configured batch,
  each the report of that policy's own compile. The reference is the plain compile of the
  same config with --fdl.model.remat_policy=full: it finds the very program the table
  compiled in the kept analyses (the digest of the lowered program), and says the same."""
  _need_libtpu()
  table, report = _v5e8_compile(tmp_path / "table", "--compile_remat_policies=none,full")
  rows = {row["remat_policy"]: row for row in report["remat_policies"]["rows"]}
  assert list(rows) == ["none", "full"] and report["remat_policy"] == "none"
  assert rows["none"]["bytes"] == report["memory"]["deciding"]  # The report's own compile.
  plain, full = _v5e8_compile(tmp_path / "full", "--fdl.model.remat_policy='full'")
  assert full["compile_cached"], "the table compiled another program than remat_policy=full's"
  assert (rows["full"]["bytes"], rows["full"]["verdict"], rows["full"]["margin"]) == (
      full["memory"]["deciding"], full["verdict"], full["margin"])
  # Remat changed the program: its temporaries (the decided peak of so small a step can be
  # the same, held by the state).
  assert full["memory"]["temporaries"] != report["memory"]["temporaries"]
  for policy, row in rows.items():
    assert re.search(rf"^    {policy} +{re.escape(compile_report.gib(row['bytes']))}  FITS  ",
                     table.stdout, re.M), table.stdout
  assert ("  remat policy: full; which policies fit at this batch: "
          "--compile_remat_policies=all (a compile each)") in plain.stdout


def test_optimizer_options_count_an_offloaded_state_in_host_memory(tmp_path):
  """--compile_optimizer_options: a row per way of keeping the moments, each its own compile
  (the offloaded one is the very program --fdl.optimizer.offload_state=True compiles). XLA's
  device arguments of the offloaded step are the plain step's less the state it keeps in
  host memory; that state, counted from shapes, is Adam's two float32 moments of every
  parameter (replicated over 8 data-parallel chips), and the verdict compares device bytes."""
  _need_libtpu()
  table, report = _v5e8_compile(tmp_path / "table",
                                "--compile_optimizer_options=param_dtype,offload")
  section = report["optimizer_options"]
  rows = {row["optimizer_option"]: row for row in section["rows"]}
  assert list(rows) == ["param_dtype", "offload"] and section["own"] == "param_dtype"
  assert rows["param_dtype"]["bytes"] == report["memory"]["deciding"]
  assert rows["param_dtype"]["host_bytes"] == 0 < rows["offload"]["host_bytes"]
  offloaded, moved = _v5e8_compile(tmp_path / "offload", "--fdl.optimizer.offload_state=True")
  plain = report["memory"]
  assert moved["compile_cached"], "the table compiled another program than offload_state's"
  assert rows["offload"]["bytes"] == moved["memory"]["deciding"] < plain["deciding"]
  host = moved["memory"]["host"]
  assert moved["memory"]["arguments"] == plain["arguments"] - host["arguments"]
  assert host["arguments"] == host["outputs"] == host["aliased"]  # Donated, given back.
  count = synthetic_tiny_setup("PyCodeTiny").model.num_parameters()
  analytic = moved["analytic"]
  assert analytic["host_by_part"] == {"optimizer first moment (mu)": 4 * count,
                                      "optimizer second moment (nu)": 4 * count,
                                      "other_state": 8}  # Adam's and the schedule's counts.
  assert analytic["xla_host_arguments"] == host["arguments"] >= analytic["host_total"]
  assert "optimizer first moment" not in str(analytic["by_part"])
  assert "analytic bytes in host memory per device (not in the total above)" in offloaded.stdout
  assert re.search(r"^    offload +[\d.]+ [KM]iB +[\d.]+ [KM]iB  FITS  ", table.stdout,
                   re.M), table.stdout


def _advice_setup(remat="full", batch=1024, accumulate=1, dcn_fsdp=1, moments=None,
                  offload=False):
  return SimpleNamespace(
      model=SimpleNamespace(remat_policy=remat),
      partitioner=SimpleNamespace(dcn_fsdp=dcn_fsdp, dcn_data=1),
      optimizer=SimpleNamespace(moment_dtype=moments, offload_state=offload),
      train=SimpleNamespace(grad_accum_steps=accumulate),
      train_data=SimpleNamespace(global_batch_size=batch))


_V5E_256 = SimpleNamespace(num_slices=1, num_devices=256, platform="tpu")
_TWO_V5E_256 = SimpleNamespace(num_slices=2, num_devices=512, platform="tpu")
_GIB = 2**30
# (case, setup, target, program, mesh, state bytes, the knob named): the state's knobs when
# the parameters and moments alone exceed the device's 16 GiB, else the activations'.
ADVICE = [
    ("state over two slices, fsdp within each", _advice_setup(), _TWO_V5E_256, "train",
     {"data": 2, "fsdp": 256}, 20 * _GIB, "partitioner.dcn_fsdp=2, partitioner.dcn_data=1"),
    ("state, fsdp over a quarter of the slice", _advice_setup(), _V5E_256, "train",
     {"data": 4, "fsdp": 64}, 20 * _GIB, "(partitioner.ici_fsdp=-1, partitioner.ici_data=1)"),
    ("state, fsdp x tensor short of the slice", _advice_setup(), _V5E_256, "train",
     {"fsdp": 16, "tensor": 4}, 20 * _GIB, "(partitioner.ici_fsdp=-1)"),
    ("state, fsdp over every chip already", _advice_setup(dcn_fsdp=2), _TWO_V5E_256, "train",
     {"fsdp": 512}, 20 * _GIB, "optimizer.moment_dtype='bfloat16'"),
    ("state, bfloat16 moments already", _advice_setup(moments="bfloat16"), _V5E_256, "train",
     {"fsdp": 256}, 20 * _GIB, "optimizer.offload_state=True"),
    ("state, moments offloaded already", _advice_setup(moments="bfloat16", offload=True),
     _V5E_256, "train", {"fsdp": 256}, 20 * _GIB, "partitioner.ici_tensor"),
    ("activations under a policy that keeps some", _advice_setup(remat="minimal"), _V5E_256,
     "train", {"fsdp": 256}, 8 * _GIB, "model.remat_policy='full' (now 'minimal'"),
    ("activations, fully rematerialized", _advice_setup(accumulate=2), _V5E_256, "train",
     {"fsdp": 256}, 8 * _GIB, "train.grad_accum_steps=4 (each micro-batch 256 rows"),
    ("activations, one row a device", _advice_setup(batch=256), _V5E_256, "train",
     {"fsdp": 256}, 8 * _GIB, "partitioner.ici_tensor"),
    ("eval activations", _advice_setup(), _V5E_256, "eval", {"fsdp": 256}, 8 * _GIB,
     "eval_data.global_batch_size"),
]


@pytest.mark.parametrize("case,setup,target,program,mesh,state,knob", ADVICE,
                         ids=[case[0] for case in ADVICE])
def test_a_step_that_does_not_fit_names_its_next_knob(case, setup, target, program, mesh,
                                                      state, knob):
  del case
  line = fit_advice.next_knob(setup, target, program, mesh, state, 16 * _GIB)
  assert line.startswith("does not fit: ") and "\n" not in line
  assert ("state alone exceed" in line) == (state > 16 * _GIB), line
  assert "next knob: " in line and knob in line.split("next knob: ")[1], line


def test_out_of_memory_messages_become_bytes():
  # XLA:TPU's two phrasings (the first as MaxText quotes it).
  first = aot.parse_out_of_memory(
      "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent "
      "error. Ran out of memory in memory space hbm. the total memory required for HLO "
      "temporaries (94.65G) exceeds available HBM (15.75G).")
  assert (first.required, first.available) == (int(94.65 * 2**30), int(15.75 * 2**30))
  second = aot.parse_out_of_memory("RESOURCE_EXHAUSTED: Used 20.5G of 15.48G hbm. Exceeded")
  assert (second.required, second.available) == (int(20.5 * 2**30), int(15.48 * 2**30))
  assert aot.parse_out_of_memory("INVALID_ARGUMENT: bad shape") is None
  # XLA refused the step though its rounded figures are equal (MaxText128B on a v5e-256 with
  # FSDP over every chip): never FITS.
  equal = aot.parse_out_of_memory(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (15.75G) exceeds available HBM (15.75G).")
  needed, _, source = compile_report.deciding(None, equal, "tpu")
  assert needed == equal.available
  assert compile_report.judge(needed, equal.available, source)[0] == compile_report.DOES_NOT_FIT
  assert compile_report.judge(needed, equal.available)[0] == compile_report.FITS


def test_a_tpu_step_is_held_to_xlas_peak_not_to_the_sum_of_its_buffers():
  """The chip's rule, measured (bench/results/2026-12-07/tpu5): Llama1BOneChip at batch 5 ran
  on a v5e though arguments + outputs - aliased + temporaries were 16.03 GiB of its 15.75;
  XLA:TPU's heap-simulated peak, 12.95 GiB, is what decides. On CPU and GPU jaxlib's peak
  leaves temporaries out, so the sum decides there."""
  gib = 2**30
  step = aot.MemoryBytes(arguments=int(4.2 * gib), outputs=int(4.2 * gib),
                         aliased=int(4.2 * gib), temporaries=int(11.83 * gib),
                         generated_code=0, peak=int(12.95 * gib))
  available = int(15.75 * gib)
  needed, rule, source = compile_report.deciding(step, None, "tpu")
  assert needed == step.peak and "heap simulation" in rule
  assert compile_report.judge(needed, available, source)[0] == compile_report.FITS
  needed, rule, source = compile_report.deciding(step, None, "cpu")
  assert needed == step.total > available
  assert compile_report.judge(needed, available, source)[0] == compile_report.DOES_NOT_FIT
  # An offloaded optimizer state is in XLA:TPU's peak, not in the chip's memory.
  offloaded = aot.MemoryBytes(arguments=gib, outputs=gib, aliased=gib, temporaries=2 * gib,
                              generated_code=0, peak=9 * gib, host_arguments=6 * gib,
                              host_outputs=6 * gib, host_aliased=6 * gib)
  assert compile_report.deciding(offloaded, None, "tpu")[0] == 3 * gib
  # A TPU backend that reports no peak: the sum.
  no_peak = aot.MemoryBytes(**{**step.__dict__, "peak": None})
  assert compile_report.deciding(no_peak, None, "tpu")[0] == step.total


def test_a_tpu_step_with_offloaded_activations_is_held_to_what_it_allocates_in_hbm():
  """MaxText128B with `qkv_proj_offloaded` on a v5e-256 (bench/results/2026-12-08/
  maxtext128b/): XLA:TPU's peak was its arguments + the 12 GiB of q/k/v stacks it keeps in
  host memory (17.47 GiB), its buffer assignment 13.99 GiB in HBM, and XLA:TPU compiled the
  step under its own 15.75 GiB: what is allocated in the device's memory decides. Without
  host temporaries the peak decides as before."""
  gib = 2**30
  offloading = aot.MemoryBytes(
      arguments=5876123136, outputs=5875733504, aliased=5875729920, temporaries=12969324544,
      generated_code=54085632, peak=5876123136 + 12 * gib, host_temporaries=12 * gib,
      device_allocated=15022031360)
  needed, rule, source = compile_report.deciding(offloading, None, "tpu")
  assert needed == 15022031360 + 54085632 and "buffer assignment" in rule
  available = int(15.75 * gib)
  assert compile_report.judge(needed, available, source)[0] == compile_report.FITS
  assert compile_report.judge(offloading.peak, available)[0] == compile_report.DOES_NOT_FIT
  on_device = aot.MemoryBytes(**{**offloading.__dict__, "host_temporaries": 0})
  assert compile_report.deciding(on_device, None, "tpu")[0] == on_device.peak
  unassigned = aot.MemoryBytes(**{**offloading.__dict__, "device_allocated": None})
  assert compile_report.deciding(unassigned, None, "tpu")[0] == unassigned.peak


def _buffer_assignment_message():
  """xla/service/hlo.proto's BufferAssignmentProto, its allocations' sizes and memory spaces,
  built with protobuf's own descriptors (the field numbers are hlo.proto's: logical_buffers 1,
  buffer_allocations 3; an allocation's index 1, size 2, is_thread_local 3,
  is_entry_computation_parameter 5, color 8): an independent reading of an assignment."""
  from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # pylint: disable=import-outside-toplevel
  field = descriptor_pb2.FieldDescriptorProto
  file = descriptor_pb2.FileDescriptorProto(name="buffer_assignment_test.proto",
                                            package="assignment_test", syntax="proto3")
  allocation = file.message_type.add(name="BufferAllocationProto")
  for name, number, kind in (("index", 1, field.TYPE_INT64), ("size", 2, field.TYPE_INT64),
                             ("is_thread_local", 3, field.TYPE_BOOL),
                             ("is_entry_computation_parameter", 5, field.TYPE_BOOL),
                             ("color", 8, field.TYPE_INT64)):
    allocation.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
  assignment = file.message_type.add(name="BufferAssignmentProto")
  assignment.field.add(name="logical_buffers", number=1, type=field.TYPE_BYTES,
                       label=field.LABEL_REPEATED)
  assignment.field.add(name="buffer_allocations", number=3, type=field.TYPE_MESSAGE,
                       type_name=".assignment_test.BufferAllocationProto",
                       label=field.LABEL_REPEATED)
  pool = descriptor_pool.DescriptorPool()
  pool.Add(file)
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName("assignment_test.BufferAssignmentProto"))


def test_the_buffer_assignment_is_read_by_memory_space(tmp_path, monkeypatch):
  """What the compile reads of XLA's buffer assignment (its text, as a compile writes it into
  a folder of its own) equals protobuf's decoding of the same assignment, which XLA:CPU also
  sends serialized with its memory analysis (XLA:TPU sends none); with XLA_FLAGS dumping, the
  newest assignment in their folder is read. The lines' memory spaces are read as written."""
  from jax._src import compilation_cache  # pylint: disable=import-outside-toplevel
  from lingvo_lite.programs.compile import buffer_assignment  # pylint: disable=import-outside-toplevel
  # As the compile program runs (a cached executable is not compiled, so XLA writes no
  # assignment); conftest's fixture turns the cache back on after the test.
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  step = jax.jit(lambda a, b: jax.numpy.tanh(a @ b).sum(0))
  lowered = step.lower(np.ones((64, 128), np.float32), np.ones((128, 96), np.float32))
  executable, device = buffer_assignment.compile_with_device_bytes(lowered)
  serialized = executable.memory_analysis().serialized_buffer_assignment_proto
  decoded = _buffer_assignment_message().FromString(serialized).buffer_allocations
  assert device == sum(a.size for a in decoded if a.color == 0 and not a.is_thread_local)
  assert device >= (64 + 96) * 128 * 4  # The two parameters at least.

  text = "\n".join([
      "BufferAssignment:", "allocation 0: size 512, thread-local:",
      "allocation 1: size 5876123136, parameter 10, shape |f32[64,3584,512]| at ShapeIndex {}, "
      "maybe-live-out:", "allocation 2: size 12884901888, color 5, preallocated-temp:",
      " value: <5 reduce_sum.43 @0> (size=512,offset=0): f32[]{:T(128)}",
      "allocation 3: size 9145908224, preallocated-temp:",
      "allocation 4: size 117440512, color 1, preallocated-temp:"])
  assert [(a.size, a.color, a.parameter, a.thread_local)
          for a in buffer_assignment.allocations(text)] == [
              (512, 0, False, True), (5876123136, 0, True, False), (12884901888, 5, False, False),
              (9145908224, 0, False, False), (117440512, 1, False, False)]
  assert buffer_assignment.device_bytes(text) == 5876123136 + 9145908224
  assert buffer_assignment.device_bytes("BufferAssignment:\n") is None
  dumped = tmp_path / "module_0001.jit_f.after_optimizations-buffer-assignment.txt"
  dumped.write_text(text)
  later = os.path.getmtime(dumped) + 60  # As if XLA had written it during the compile.
  os.utime(dumped, (later, later))
  monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=1 "
                                  f"--xla_dump_to={tmp_path}")
  assert buffer_assignment.compile_with_device_bytes(lowered)[1] == 5876123136 + 9145908224


def test_no_memory_analysis_is_unknown_never_fits():
  class Stats:  # What some backends return (jax #18954): zeros, or -1.
    argument_size_in_bytes = output_size_in_bytes = alias_size_in_bytes = 0
    temp_size_in_bytes = generated_code_size_in_bytes = 0

  class Executable:
    def memory_analysis(self):
      return Stats()

  assert aot._memory(Executable()) is None  # pylint: disable=protected-access
  Stats.temp_size_in_bytes = -1
  assert aot._memory(Executable()) is None  # pylint: disable=protected-access
  setup = synthetic_tiny_setup()
  result = aot.CompileResult(object(), 1.0, None, None, None, [], jitted=JittedSteps(setup),
                             program="train")
  report = compile_report.build(result)
  assert report["verdict"] == "UNKNOWN" and report["margin"] is None
  assert "verdict: UNKNOWN: XLA reported no memory analysis" in compile_report.to_text(report)


def test_largest_buffers_skip_fused_and_aliasing_instructions():
  hlo = "\n".join([
      "%fused_computation (p: f32[1024,1024]) -> f32[1024,1024] {",
      "  %p = f32[1024,1024]{1,0} parameter(0)",
      "  ROOT %huge = f32[4096,4096]{1,0} add(%p, %p)",
      "}",
      "ENTRY %main (a: f32[8,8]) -> f32[64,64] {",
      '  %a = f32[8,8]{1,0} parameter(0), metadata={op_name="state.params[\\\'w\\\']"}',
      "  %b = bf16[64,64]{1,0} bitcast(%a)",
      '  ROOT %c = f32[64,64]{1,0} dot(%a, %a), metadata={op_name="jit(step)/dot_general"}',
      "}"])
  buffers = aot.largest_buffers(hlo)
  assert [(b.bytes, b.shape, b.op_name) for b in buffers] == [
      (64 * 64 * 4, "f32[64,64]", "jit(step)/dot_general"),
      (8 * 8 * 4, "f32[8,8]", "state.params['w']")]


def test_largest_buffers_in_host_memory_come_after_the_devices_and_say_so():
  """An offloaded remat stack (`S(5)`: pinned host memory) larger than any device buffer is
  listed after the device's largest, marked, and never displaces them."""
  device = [f"  %d{i} = bf16[{i + 1},1024]{{1,0:T(8,128)(2,1)}} add(%p, %p)" for i in range(12)]
  hlo = "\n".join([
      "ENTRY %main (p: bf16[64,1024]) -> bf16[64,1024] {",
      "  %p = bf16[64,1024]{1,0:T(8,128)(2,1)} parameter(0)", *device,
      "  %stack = bf16[64,16,1024]{2,1,0:T(8,128)(2,1)S(5)} dynamic-update-slice-done(%s)",
      "  ROOT %v = bf16[2,1024]{1,0:T(8,128)(2,1)S(1)} add(%p, %p)",
      "}"])
  buffers = aot.largest_buffers(hlo, count=3)
  assert [(b.instruction, b.memory_space) for b in buffers] == [
      ("parameter %p", 0), ("add %d11", 0), ("add %d10", 0),
      ("dynamic-update-slice-done %stack", 5), ("add %v", 1)]
  lines = compile_report.buffer_lines([vars(b) for b in buffers])
  assert "%stack (in host memory)" in lines[4] and "%v (memory space 1)" in lines[5]
  assert "in host memory" not in "".join(lines[:4])


def test_reports_written_by_two_writers_at_once_stay_whole(tmp_path):
  """Two compiles into one job write the same report files (paths.write_atomically)."""
  import threading  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel
  from lingvo_lite import paths  # pylint: disable=import-outside-toplevel
  target = epath.Path(tmp_path) / "report.json"
  versions = [json.dumps({"writer": w, "pad": "x" * 100_000}) for w in range(2)]
  errors = []

  def write(version: str) -> None:
    try:
      for _ in range(200):
        paths.write_atomically(target, version)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=write, args=(v,)) for v in versions]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors
  assert target.read_text() in versions
  assert sorted(p.name for p in epath.Path(tmp_path).iterdir()) == ["report.json"]


def test_a_saved_step_never_replaces_the_users_folder(tmp_path):
  """--compiled_step_out onto a folder of the user's, which holds a manifest.json and an
  executable.bin of their own: one line naming the flag, the folder's files and the fix, exit 2,
  before anything compiles, and the folder as it was. (lingvo_lite's own earlier step is
  replaced whole: tests/test_outputs.py.)"""
  theirs = tmp_path / "theirs"
  theirs.mkdir()
  for name, text in {"manifest.json": '{"schema": "my_tool/3"}', "executable.bin": "mine",
                     "notes.txt": "keep"}.items():
    (theirs / name).write_text(text)
  before = tree_digest(tmp_path)
  relative = os.path.relpath(theirs, source_root())
  completed = run_process([*TINY, "--mode=compile", "--compile_topology=cpu:1",
                       "--compilation_cache_dir=", f"--compiled_step_out={relative}"])
  assert completed.returncode == 2, completed.stderr
  assert completed.stderr.splitlines() == [
      f"lingvo_lite: error: --compiled_step_out='{relative}': the folder holds files "
      "lingvo_lite did not write (executable.bin, manifest.json, notes.txt), and it never "
      "replaces them; name a new or empty folder, or move them away"], completed.stderr
  assert "verdict" not in completed.stdout  # Refused before the compile.
  assert tree_digest(tmp_path) == before
