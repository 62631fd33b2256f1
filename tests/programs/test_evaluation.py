"""Eval sets and the eval program, checked against computations that share no loss, metric or
packing code with lingvo_lite: NumPy cross-entropy over `model.apply`'s logits, each document
run alone (unpacked) against the packed pass, and the documents read from the files."""

import copy
import dataclasses
import functools
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zlib

import fiddle as fdl
import jax
import numpy as np
import pytest
from etils import epath

from lingvo_lite.on_mesh import evaluation
from lingvo_lite.checkpoints import integrity as checkpoint_integrity
from lingvo_lite.checkpoints.manager import Checkpointer
from lingvo_lite.config import building
from lingvo_lite.data.sentencepiece_training import train_sentencepiece
from lingvo_lite.data.store_data import TokenStoreData
from lingvo_lite.errors import UsageError
from lingvo_lite.on_mesh.jitted import JittedSteps
from lingvo_lite.programs import eval as eval_program, train as train_program
from lingvo_lite.runtime import summaries
from lingvo_lite.testing import run_cli, tiny_config
from tests.trained_jobs import tree_digest
from tasks import pycode

LENGTH = 64
# Small stdlib modules (a few KB each), copied under names of the wanted split.
_MODULES = ("bisect.py", "colorsys.py", "keyword.py", "this.py", "token.py", "stat.py",
            "fnmatch.py", "glob.py", "sched.py", "shlex.py", "numbers.py", "abc.py")


def _names(split, count):
  """`count` file names that tasks/pycode puts in `split` (its rule: crc32 % 10 == 0)."""
  names, i = [], 0
  while len(names) < count:
    name = f"module_{i}.py"
    if (zlib.crc32(name.encode()) % 10 == 0) == (split == "validation"):
      names.append(name)
    i += 1
  return names


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A source folder of 6 train and 6 validation files (one with non-ASCII text)."""
  root = tmp_path_factory.mktemp("corpus")
  stdlib = sysconfig.get_paths()["stdlib"]
  for name, module in zip(_names("train", 6) + _names("validation", 6), _MODULES):
    shutil.copy(os.path.join(stdlib, module), root / name)
  with open(root / _names("validation", 6)[0], "ab") as f:
    f.write("# café, ünïcödé, 数字\n".encode())
  return root


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
  """A job trained 30 steps on the corpus (checkpoints at 15 and 30), long enough that a
  token's context moves its loss, with two eval sets: a 2-batch sample of the validation
  split, and the whole split unshuffled."""
  job = epath.Path(tmp_path_factory.mktemp("job"))
  stores = tmp_path_factory.mktemp("stores")
  cfg = tiny_config("PyCodeTiny", "train.steps=30", "checkpoint.every_steps=15",
                    "checkpoint.max_to_keep=None", "optimizer.warmup_steps=2",
                    "optimizer.peak_learning_rate=1e-2")
  task = fdl.Config(pycode.pycode_task, source_dir=str(corpus))
  for data in (cfg.train_data, cfg.eval_data):
    data.task = task
    data.sequence_length = LENGTH
    data.store_dir = str(stores / data.split)
  # The same files (and store), with a seqio score metric function, and a prediction one
  # an eval pass cannot run.
  scored = fdl.Config(pycode.pycode_task, source_dir=str(corpus),
                      metric_fns=[document_log_likelihoods, exact_match])
  whole = fdl.Config(TokenStoreData, task=scored, split="validation", sequence_length=LENGTH,
                     global_batch_size=8, num_batches=None, shuffle=False,
                     store_dir=str(stores / "validation"))
  cfg.eval_data = {"validation": cfg.eval_data, "whole": whole}
  setup = building.build(cfg)
  setup.check_data()
  train_program.run(setup, job)
  return setup, job


_SCORED = {}


def document_log_likelihoods(targets, scores):
  """A seqio score metric function; keeps what it was given, for the test to compare."""
  _SCORED["targets"], _SCORED["scores"] = list(targets), np.asarray(scores)
  return {"mean_document_log_likelihood": float(np.mean(scores))}


def exact_match(targets, predictions):
  raise AssertionError("a prediction metric needs generated text; eval makes none")


def _params(setup, job, step):
  """The step's parameters by a full-state restore (the eval program restores params only)."""
  jitted = JittedSteps(setup)
  checkpointer = Checkpointer(job / "checkpoints", setup.checkpoint, create=False)
  with jitted.activated():
    state = checkpointer.restore(step, jitted.sharded_state.abstract)
  checkpointer.close()
  return jax.device_get(state.params)


@functools.lru_cache(maxsize=None)
def _forward(model):
  """The model's forward pass, jitted: compiled once per shape, where an eager pass compiles
  each of its operations again for every new shape."""
  return jax.jit(model.apply)


def _token_nats(setup, params, inputs, segment_ids=None, positions=None):
  """float64 [R, T, V] log-probabilities by NumPy from the model's logits."""
  logits = np.asarray(_forward(setup.model)({"params": params}, inputs, segment_ids, positions),
                      dtype=np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_eval_of_a_checkpoint_equals_a_numpy_computation(trained):
  setup, job = trained
  results = eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=30)[30]
  got = results["validation"]
  source = setup.eval_sets["validation"]
  params = _params(setup, job, 30)
  nats = correct = weight = text_bytes = 0.0
  for step in range(source.num_batches):
    batch = source.batch(step)
    log_probs = _token_nats(setup, params, batch["inputs"], batch["segment_ids"],
                            batch["positions"])
    target = np.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
    w = batch["weights"].astype(np.float64)
    nats += float(np.sum(-target * w))
    correct += float(np.sum((log_probs.argmax(-1) == batch["targets"]) * w))
    weight += float(np.sum(w))
    # seqio's ByteVocabulary: ids 3.. are the bytes 0..255; pad, EOS and UNK are no text.
    text_bytes += float(np.sum((batch["targets"] >= 3) * (w > 0)))
  assert got["tokens"] == weight
  assert got["bytes"] == text_bytes
  assert got["loss"] == pytest.approx(nats / weight, rel=1e-5)
  assert got["perplexity"] == pytest.approx(math.exp(nats / weight), rel=1e-5)
  assert got["bits_per_byte"] == pytest.approx(nats / math.log(2) / text_bytes, rel=1e-5)
  assert got["accuracy"] == pytest.approx(correct / weight, abs=1.5 / weight)
  # What the eval program wrote is what it returned.
  rows = [json.loads(line) for line in open(job / "eval" / "eval_validation.jsonl")]
  assert rows[-1]["step"] == 30 and rows[-1]["loss"] == got["loss"]


def _documents(corpus):
  """The validation split's documents as token ids, read from the files: bytes + 3, EOS 1."""
  return sorted(tuple(b + 3 for b in open(corpus / name, "rb").read()) + (1,)
                for name in _names("validation", 6))


def _target_nats(log_probs, targets):
  return -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def test_the_packed_whole_split_equals_each_document_chunk_run_alone(trained, corpus):
  setup, job = trained
  got = eval_program.run(eval_program.selected_sets(setup, ["whole"]), job, checkpoint_step=30)[30]["whole"]
  params = _params(setup, job, 30)
  pieces, packed, leaky = _packed_pieces(setup, params, setup.eval_sets["whole"])
  # The pieces, joined where no document ends, are exactly the files' documents.
  joined, starts = _joined(pieces)
  assert sorted(joined) == _documents(corpus)
  alone = _pieces_alone(setup, params, pieces)
  # The task's score metric got each document's text and the log-likelihood of its chunks.
  text_of = lambda ids: bytes(i - 3 for i in ids[:-1]).decode()
  expected = {text_of(doc): -float(sum(np.sum(alone[i]) for i in range(first, last)))
              for doc, first, last in zip(joined, starts, starts[1:] + [len(pieces)])}
  got_scores = dict(zip(_SCORED["targets"], _SCORED["scores"]))
  assert sorted(got_scores) == sorted(expected)
  for text, score in expected.items():
    assert got_scores[text] == pytest.approx(score, rel=1e-5)
  assert got["mean_document_log_likelihood"] == pytest.approx(np.mean(list(expected.values())),
                                                              rel=1e-5)
  alone, packed, leaky = map(np.concatenate, (alone, packed, leaky))
  assert got["tokens"] == len(alone) == sum(len(d) for d in _documents(corpus))
  np.testing.assert_allclose(packed, alone, atol=2e-4, rtol=0)
  assert got["loss"] * got["tokens"] == pytest.approx(float(np.sum(alone)), rel=1e-5)
  # The check can tell: without the segments, tokens that see another document score
  # clearly otherwise.
  assert np.max(np.abs(leaky - alone)) > 0.05


def _packed_pieces(setup, params, source):
  """Every row's pieces by segment, in stream order (unshuffled), with each token's nats as
  the packed row scores it, and as the row scores it run without its segments (one causal
  sequence: a document then sees the one before it): (pieces, packed, leaky)."""
  pieces, packed, leaky = [], [], []
  num_batches, examples = evaluation.pass_length(source)
  for step in range(num_batches):
    batch = source.batch(step)
    with_segments = _target_nats(_token_nats(setup, params, batch["inputs"],
                                             batch["segment_ids"], batch["positions"]),
                                 batch["targets"])
    without = _target_nats(_token_nats(setup, params, batch["inputs"]), batch["targets"])
    for row in range(source.global_batch_size):
      if step * source.global_batch_size + row >= examples:
        continue  # Past the split's end: the eval pass weighs it 0.
      segments = batch["segment_ids"][row]
      for segment in np.unique(segments[segments > 0]):
        where = segments == segment
        pieces.append(batch["targets"][row][where].tolist())
        packed.append(with_segments[row][where])
        leaky.append(without[row][where])
  return pieces, packed, leaky


def _joined(pieces):
  """The pieces joined into documents where one ends (EOS, 1), and the index of each
  document's first piece; every piece belongs to a document that ends."""
  joined, current, starts = [], [], []
  for index, piece in enumerate(pieces):
    if not current:
      starts.append(index)
    current += piece
    if current[-1] == 1:
      joined.append(tuple(current))
      current = []
  assert not current
  return joined, starts


def _pieces_alone(setup, params, pieces):
  """Each piece's token nats with the piece run alone: inputs are its tokens shifted right
  behind a 0, positions from 0."""
  alone = []
  for start in range(0, len(pieces), 64):
    group = pieces[start:start + 64]
    inputs = np.zeros((64, LENGTH), np.int32)  # Rows past the group: all padding, unread.
    targets = np.zeros((64, LENGTH), np.int32)
    for i, piece in enumerate(group):
      targets[i, :len(piece)] = piece
      inputs[i, 1:len(piece)] = piece[:-1]
    nats = _target_nats(_token_nats(setup, params, inputs), targets)
    alone += [nats[i, :len(piece)] for i, piece in enumerate(group)]
  return alone


def test_whole_split_pass_counts_each_example_once(trained, corpus):
  setup, _ = trained
  source = setup.eval_sets["whole"]
  num_batches, examples = evaluation.pass_length(source)
  tokens = sum(len(d) for d in _documents(corpus))  # From the files, not the store.
  assert examples == math.ceil(tokens / LENGTH)
  assert num_batches == math.ceil(examples / source.global_batch_size)


def test_a_killed_runs_unrecorded_row_is_replaced_and_results_go_under_eval(trained):
  setup, job = trained
  rows_file = job / "eval" / "eval_validation.jsonl"
  eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=15)
  with open(rows_file, "a") as f:  # A killed run wrote its row of step 30, not its record.
    f.write(json.dumps({"step": 30, "loss": -1.0}) + "\n" + '{"step": 30, "lo')
  record = json.loads((job / "eval" / eval_program.RECORD).read_text())["evaluated"]
  record.pop("30", None)
  (job / "eval" / eval_program.RECORD).write_text(json.dumps({"evaluated": record}))
  eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=30)
  rows = [json.loads(line) for line in open(rows_file)]
  assert sorted(row["step"] for row in rows) == [15, 30]
  assert all(row["loss"] > 0 for row in rows)
  assert (job / "eval" / "summaries" / "eval_validation").is_dir()
  # Evaluated again on purpose: its row is replaced, not added to.
  eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=30)
  assert sorted(json.loads(line)["step"] for line in open(rows_file)) == [15, 30]
  # A lost record is rebuilt from the rows, which are all kept.
  (job / "eval" / eval_program.RECORD).unlink()
  eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=15)
  assert sorted(json.loads(line)["step"] for line in open(rows_file)) == [15, 30]
  assert _record(job) == {"15": ["validation"], "30": ["validation"]}
  # Training's own eval files are the trainer's alone.
  train_rows = [json.loads(line) for line in open(job / "eval_validation.jsonl")]
  assert [row["step"] for row in train_rows] == [30]


def test_bad_eval_program_inputs_are_one_line_each(trained):
  setup, job = trained
  with pytest.raises(UsageError, match=r"^--checkpoint_step=3: no such checkpoint in .*; "
                     r"its steps: 15, 30$"):
    eval_program.run(setup, job, checkpoint_step=3)
  with pytest.raises(UsageError, match=r"^--eval_sets=held_out: no eval set named "
                     r"'held_out'; valid choices: validation, whole$"):
    eval_program.selected_sets(setup, ["held_out"])


def test_an_eval_set_with_another_vocabulary_is_refused(trained):
  setup, _ = trained

  @dataclasses.dataclass(frozen=True)
  class OtherVocabulary:
    global_batch_size: int = 4
    sequence_length: int = LENGTH
    num_batches: int = 1
    vocabulary_fingerprint: str = "sentencepiece:0123"

    def batch(self, step, process_index=0, process_count=1):
      raise AssertionError("not read")

    def batch_spec(self):
      return {}

  other = dataclasses.replace(setup, eval_data={**setup.eval_sets, "other": OtherVocabulary()})
  with pytest.raises(UsageError, match=r"^eval_data\.other\.task=.*: tokenizes with another "
                     r"vocabulary \(sentencepiece:0123\) than the model's train data "
                     r"\(bytes:259\); give the eval set the train data's vocabulary$"):
    other.check_data(train=False)


def test_eval_time_is_kept_out_of_the_step_time(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(summaries.time, "perf_counter", lambda: now[0])
  throughput = summaries.Throughput(0, 100, tokens_per_step=10, flops_per_step=1e9,
                                    num_devices=1, peak_flops_per_device=1e12)
  now[0] += 30.0  # 10 steps in 10 s, and a 20 s evaluation between them.
  throughput.exclude(20.0)
  report = throughput.report(10)
  assert report["step_time_s"] == pytest.approx(1.0)
  assert report["mfu"] == pytest.approx(1e9 / 1e12)
  now[0] += 5.0  # The next window has no evaluation.
  assert throughput.report(15)["step_time_s"] == pytest.approx(1.0)


def _copy_job(job, destination):
  shutil.copytree(job, destination, ignore=shutil.ignore_patterns("eval"))
  return epath.Path(destination)


def _record(job):
  return json.loads((job / "eval" / eval_program.RECORD).read_text())["evaluated"]


def test_continuous_eval_skips_damaged_and_unfinished_steps(trained, tmp_path, caplog):
  setup, job = trained
  job = _copy_job(job, tmp_path / "job")
  checkpoints = job / "checkpoints"
  # Step 15 fails verification; step 40 has no checksums yet (its trainer has not reached
  # the next step); step 45 is still being written (orbax's temporary name).
  data_file = max((p for p in pathlib.Path(checkpoints / "15").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
  data_file.write_bytes(b"\0" * data_file.stat().st_size)
  shutil.copytree(checkpoints / "30", checkpoints / "40")
  (checkpoints / "40" / checkpoint_integrity.CHECKSUMS_FILE).unlink()
  shutil.copytree(checkpoints / "30", checkpoints / "45.orbax-checkpoint-tmp-1")
  evaluated = eval_program.run(setup, job, continuous=True, poll_seconds=0.05,
                               timeout_seconds=30)
  assert sorted(evaluated) == [30]  # Then the final step (train.steps=30) is done.
  assert _record(job) == {"30": ["validation", "whole"]}
  assert any("skipping checkpoint step 15 for now: checkpoint step 15 is corrupt" in r.message
             for r in caplog.records)


def test_continuous_eval_stops_when_the_trainer_goes_quiet(trained, tmp_path, capsys):
  setup, job = trained
  job = _copy_job(job, tmp_path / "job")
  shutil.rmtree(job / "checkpoints" / "30")
  evaluated = eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, continuous=True,
                               poll_seconds=0.05, timeout_seconds=1)
  assert sorted(evaluated) == [15]
  assert ("stopping: the trainer wrote nothing in" in capsys.readouterr().out)
  assert _record(job) == {"15": ["validation"]}


def _wait_for(condition, seconds, what):
  deadline = time.time() + seconds
  while not condition():
    assert time.time() < deadline, f"timed out waiting for {what}"
    time.sleep(0.1)


@pytest.mark.slow
def test_continuous_eval_beside_training_evaluates_each_checkpoint_once_across_a_restart(
    tmp_path):
  job = tmp_path / "job"
  common = [f"--job_log_dir={job}"]
  trainer = subprocess.Popen(
      [sys.executable, "-m", "lingvo_lite", "--exp=PyCodeTiny", "--fiddler=tiny", *common,
       "--fdl.train.steps=1200", "--fdl.train.log_every_steps=100",
       "--fdl.checkpoint.every_steps=100", "--fdl.checkpoint.max_to_keep=None"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  evaluator = [sys.executable, "-m", "lingvo_lite", "--mode=eval", "--eval_continuous",
               "--eval_poll_seconds=0.2", "--eval_timeout_seconds=120", *common]
  try:
    _wait_for(lambda: (job / "config.json").exists(), 120, "the trainer's config.json")
    first = subprocess.Popen(evaluator, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    record = job / "eval" / eval_program.RECORD
    _wait_for(lambda: record.exists() and len(json.loads(record.read_text())["evaluated"]) >= 2,
              180, "two evaluated checkpoints")
    trainer_was_running = trainer.poll() is None
    first.kill()  # SIGKILL: no clean-up of any kind.
    first.communicate()
    second = subprocess.run(evaluator, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "evaluated the final step 1200; done" in second.stdout
    assert trainer.wait(timeout=300) == 0, trainer.stderr.read()[-2000:]
  finally:
    trainer.kill()
  assert trainer_was_running  # The eval ran beside the training run, not after it.
  steps = list(range(100, 1201, 100))
  assert sorted(int(name) for name in os.listdir(job / "checkpoints")) == steps
  assert _record(epath.Path(job)) == {str(step): ["validation"] for step in steps}
  rows = [json.loads(line) for line in open(job / "eval" / "eval_validation.jsonl")]
  assert sorted(row["step"] for row in rows) == steps  # Each once: none lost, none twice.
  # The trainer's own eval rows are untouched: only its final evaluation.
  train_rows = [json.loads(line) for line in open(job / "eval_validation.jsonl")]
  assert [row["step"] for row in train_rows] == [1200]
  assert train_rows[0]["loss"] == pytest.approx(rows[-1]["loss"], rel=1e-6)


def held_out_set(cfg):
  """A fiddler, named by import path on the command lines below: a second eval set, another
  sample (seed) of the validation split."""
  held_out = copy.deepcopy(cfg.eval_data)
  held_out.seed = 2
  cfg.eval_data = {"validation": cfg.eval_data, "held_out": held_out}


def test_named_eval_sets_from_the_command_line(tmp_path):
  job = tmp_path / "job"
  common = [f"--job_log_dir={job}"]
  train = ["--exp=PyCodeTiny", "--fiddler=tiny", f"--fiddler={__name__}.held_out_set",
           "--fdl.eval_data.held_out.num_batches=1", "--fdl.eval_data['validation'].seed=5",
           "--fdl.train.steps=4", "--fdl.checkpoint.every_steps=2",
           "--fdl.checkpoint.max_to_keep=None", *common]
  result = run_cli(train)
  assert result.code == 0, result.stderr
  assert re.search(r"final eval loss \(validation\): \d", result.stdout)
  assert re.search(r"final eval loss \(held_out\): \d", result.stdout)
  for name in ("validation", "held_out"):
    assert (job / f"eval_{name}.jsonl").is_file() and (job / "summaries" / f"eval_{name}").is_dir()
  config = (job / "config.txt").read_text()
  assert re.search(r"^eval_data\.held_out\.num_batches = 1 .*--fdl\.eval_data\.held_out", config,
                   re.MULTILINE)
  assert re.search(r"^eval_data\.validation\.seed = 5 ", config, re.MULTILINE)
  # A set's fields are resumable: a longer run with a bigger held-out pass resumes.
  result = run_cli([*train[:-4], "--fdl.eval_data.held_out.num_batches=2",
                    "--fdl.train.steps=6", *train[-3:]])
  assert result.code == 0 and "resumed from step 4" in result.stdout, result.stderr
  # One set, with a command-line change, from the job's own config.
  result = run_cli(["--mode=eval", "--eval_sets=held_out", "--fdl.eval_data.held_out.num_batches=3",
                    *common])
  assert result.code == 0, result.stderr
  assert re.search(r"^  held_out +\d", result.stdout, re.MULTILINE)
  rows = [json.loads(line) for line in open(job / "eval" / "eval_held_out.jsonl")]
  assert [row["step"] for row in rows] == [6] and rows[0]["tokens"] == 3 * 4 * 64
  assert not (job / "eval" / "eval_validation.jsonl").exists()
  for args, message in (
      (["--eval_sets=typo"], "--eval_sets=typo: no eval set named 'typo'; valid choices: "
       "validation, held_out"),
      (["--checkpoint_step=3"], "--checkpoint_step=3: no such checkpoint in "),
      (["--fdl.eval_data.typo.num_batches=1"], "--fdl.eval_data.typo.num_batches=1: "
       "eval_data has no entry 'typo'"),
      (["--checkpoint_step=4", "--eval_continuous"], "conflicting flags")):
    result = run_cli(["--mode=eval", *args, *common])
    assert result.code == 2, (args, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (args, lines)
  assert "its steps: 2, 4, 6" in run_cli(["--mode=eval", "--checkpoint_step=3", *common]).stderr


_OTHER_VOCABULARY = {}


def sentencepiece_eval_set(cfg):
  """A fiddler (by import path): the eval set tokenized by another vocabulary, a SentencePiece
  model the test trained; the train data keeps the model's bytes."""
  cfg.eval_data.task = fdl.Config(pycode.pycode_task, source_dir=_OTHER_VOCABULARY["corpus"],
                                  vocabulary=_OTHER_VOCABULARY["model"])


def test_an_eval_set_tokenized_by_another_vocabulary_is_one_line(corpus, tmp_path):
  model = tmp_path / "other.model"
  train_sentencepiece(
      [open(corpus / name, "rb").read() for name in _names("train", 6)], str(model), 400)
  _OTHER_VOCABULARY.update(corpus=str(corpus), model=str(model))
  result = run_cli(["--mode=eval", f"--job_log_dir={tmp_path}", "--exp=PyCodeTiny",
                    "--fiddler=tiny", "--fdl.model.vocab_size=512",
                    f"--fiddler={__name__}.sentencepiece_eval_set"])
  assert result.code == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and re.search(
      r"eval_data\.task='pycode_sp400_\w+': tokenizes with another vocabulary "
      r"\(sentencepiece:[0-9a-f]+\) than the model's train data \(bytes:259\)", lines[0]), lines


def test_a_failed_re_evaluation_leaves_the_eval_results_as_they_were(trained, tmp_path):
  setup, job = trained
  job = _copy_job(job, tmp_path / "job")
  eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=30)
  before = tree_digest(job)
  step_dir = pathlib.Path(job / "checkpoints" / "30")
  data_file = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  data_file.write_bytes(b"\0" * data_file.stat().st_size)
  after_damage = tree_digest(job)
  with pytest.raises(UsageError, match=r"^checkpoint step 30 is corrupt: "):
    eval_program.run(eval_program.selected_sets(setup, ["validation"]), job, checkpoint_step=30)
  assert tree_digest(job) == after_damage != before  # Nothing under JOB/eval changed.
  assert _record(job) == {"30": ["validation"]}
