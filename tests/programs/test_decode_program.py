"""`python -m lingvo_lite --mode=decode` end to end, in this process (lingvo_lite.testing.run_cli)
and from a working directory with relative paths, as a user runs it: the suite's shared tiny
PyCodeTiny job (tests/trained_jobs.py: byte vocabulary, checkpoints at steps 10 and 20), copied
into the module's working directory, serves every test.

Independent references: the byte vocabulary's own rule (id - 3 is the byte; ids 0-2 are pad,
EOS and UNK), written out here rather than taken from seqio; a first run's completions, which
a second run with a stop string (or the same seed) must reproduce and cut; and the reported
log-probabilities, which bound how likely two seeds are to draw the same tokens.
"""

import glob
import json
import math
import os
import pathlib
import shutil
import signal

import pytest

from lingvo_lite.training import optimizers
from lingvo_lite.decode.records import STOP_REASONS
from lingvo_lite.testing import run_cli
from tests import trained_jobs
from tests.trained_jobs import tree_digest

# The shared tiny trained job (tests/trained_jobs.py: 20 steps of a quick rise, so its samples
# are not uniform noise; checkpoints 10 and 20), at a relative path: every test runs in the
# module's working directory.
JOB = trained_jobs.TINY_JOB
TRAIN = list(trained_jobs.TINY_TRAIN)
DECODE = ["--mode=decode", f"--job_log_dir={JOB}"]
MAX_LENGTH = 64  # model.max_length under --fiddler=tiny.
VOCAB_SIZE = 259  # Byte vocabulary: 3 special ids, then the 256 bytes.
EOS = 1

RECORD_KEYS = {"schema_version", "index", "source", "prompt", "prompt_ids", "completion",
               "completion_ids", "logprobs", "stop_reason", "stop_string", "settings",
               "checkpoint_step", "timing"}
SETTINGS_KEYS = {"max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop"}
TIMING_KEYS = {"prefill_seconds", "decode_seconds", "tokens_per_second"}

PROMPTS = ["def main(", "import os\n"]  # The --prompt requests; the config's settings.
CONFIG_MAX_NEW = 24  # --fdl.decode.max_new_tokens of the runs below.
SAMPLED_LENGTH = 48  # Enough draws that two seeds agreeing is negligible (see the test).
# The --prompts_file requests, by name; a blank line after the first (file line numbers).
FILE_REQUESTS = {
    "greedy_short": {"prompt": "class Foo:", "max_new_tokens": 10},
    "sampled_filtered": {"prompt": "def f(x):", "temperature": 0.9, "top_k": 40, "top_p": 0.95,
                         "seed": 7, "max_new_tokens": 40},
    "seed_a": {"prompt": "for i in", "temperature": 1.0, "seed": 11,
               "max_new_tokens": SAMPLED_LENGTH},
    "seed_a_again": {"prompt": "for i in", "temperature": 1.0, "seed": 11,
                     "max_new_tokens": SAMPLED_LENGTH},
    "seed_b": {"prompt": "for i in", "temperature": 1.0, "seed": 12,
               "max_new_tokens": SAMPLED_LENGTH},
    "greedy": {"prompt": "while ", "stop": []},
}
NAMES = [f"--prompt #{i}" for i in range(1, len(PROMPTS) + 1)] + list(FILE_REQUESTS)


def byte_text(ids):
  """The byte vocabulary's text of `ids`: special ids dropped, bytes as UTF-8 (seqio's
  ByteVocabulary drops bytes that are not UTF-8, so this does too)."""
  return bytes(i - 3 for i in ids if 3 <= i < VOCAB_SIZE).decode("utf-8", "ignore")


def byte_ids(text):
  return [b + 3 for b in text.encode("utf-8")]


def write_requests(path, requests):
  """One JSON line per request, with a blank line after the first (skipped, but counted in
  the file's line numbers)."""
  lines = [json.dumps(request) for request in requests.values()]
  pathlib.Path(path).write_text("\n".join(lines[:1] + [""] + lines[1:]) + "\n")
  return [1] + list(range(3, len(lines) + 2))


def training_files(job):
  """Digests of the job's own files: everything but the decode program's JOB/decode/."""
  return {name: tree_digest(job / name) if (job / name).is_dir() else (job / name).read_bytes()
          for name in sorted(os.listdir(job)) if name != "decode"}


def decode_files(job):
  folder = job / "decode"
  return sorted(os.listdir(folder)) if folder.is_dir() else []


@pytest.fixture(scope="module")
def workdir(tiny_job):
  """The module's working directory, holding its copy of the tiny trained job at JOB."""
  assert sorted(os.listdir(tiny_job / JOB / "checkpoints"), key=int) == ["10", "20"]
  return tiny_job


@pytest.fixture(autouse=True)
def _in_workdir(workdir, monkeypatch):
  monkeypatch.chdir(workdir)


@pytest.fixture(scope="module")
def reference(workdir):
  """A first decode of every request into JOB/decode/, with no stop strings: (the run's
  result, its records, the file it wrote, the file's line numbers)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(workdir)
    job = workdir / JOB
    before = training_files(job), decode_files(job)
    numbers = write_requests("prompts.jsonl", FILE_REQUESTS)
    result = run_cli(DECODE + [f"--prompt={p}" for p in PROMPTS] + [
        "--prompts_file=prompts.jsonl", f"--fdl.decode.max_new_tokens={CONFIG_MAX_NEW}"])
    assert result.code == 0, result.stderr[-3000:]
    assert training_files(job) == before[0], "decode changed the training files"
    new = [name for name in decode_files(job) if name not in before[1]]
    assert len(new) == 1 and new[0].endswith(".jsonl"), new  # No .partial left behind.
    path = job / "decode" / new[0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
  return result, records, path, numbers


def by_name(records):
  return dict(zip(NAMES, records))


# ----------------------------------------------------------------------------- text prompts


def test_text_prompts_write_one_record_per_request_in_order_as_documented(reference):
  result, records, path, numbers = reference
  assert result.stdout.strip().splitlines()[-1].endswith(f"written to {JOB}/decode/{path.name}")
  assert f"decoded {len(NAMES)} prompt(s) with checkpoint step 20" in result.stdout
  sources = [f"--prompt #{i}" for i in range(1, len(PROMPTS) + 1)] + [
      f"prompts.jsonl:{n}" for n in numbers]
  assert [r["source"] for r in records] == sources
  assert [r["index"] for r in records] == list(range(len(NAMES)))
  prompts = PROMPTS + [request["prompt"] for request in FILE_REQUESTS.values()]
  for record, prompt, name in zip(records, prompts, NAMES):
    assert set(record) == RECORD_KEYS, name
    assert set(record["settings"]) == SETTINGS_KEYS and set(record["timing"]) == TIMING_KEYS
    assert record["schema_version"] == 1 and record["checkpoint_step"] == 20
    assert record["prompt"] == prompt and record["prompt_ids"] == byte_ids(prompt), name
    given = FILE_REQUESTS.get(name, {})
    settings = record["settings"]
    assert settings["max_new_tokens"] == given.get("max_new_tokens", CONFIG_MAX_NEW), name
    assert settings["temperature"] == given.get("temperature", 0.0), name
    assert settings["top_k"] == given.get("top_k", 0) and settings["top_p"] == given.get(
        "top_p", 1.0) and settings["seed"] == given.get("seed", 0) and settings["stop"] == []

    ids, logprobs = record["completion_ids"], record["logprobs"]
    assert all(0 <= i < VOCAB_SIZE for i in ids), name
    assert len(logprobs) == len(ids) and all(
        p is not None and p <= 0 for p in logprobs), (name, logprobs)
    if settings["temperature"] == 0:
      # Greedy takes the argmax, whose probability is at least 1 / vocabulary size.
      assert min(logprobs) >= -math.log(VOCAB_SIZE) - 1e-4, (name, logprobs)
    assert record["stop_reason"] in STOP_REASONS and record["stop_reason"] != "stop", name
    assert record["stop_string"] is None
    if record["stop_reason"] == "eos":
      assert ids[-1] == EOS and EOS not in ids[:-1], name
      assert len(ids) <= settings["max_new_tokens"], name
      assert record["completion"] == byte_text(ids[:-1]), name
    else:
      assert EOS not in ids and len(ids) == settings["max_new_tokens"], name
      assert record["completion"] == byte_text(ids), name
    timing = record["timing"]
    assert timing["prefill_seconds"] > 0 and timing["decode_seconds"] >= 0, name


def _stop_inside(text):
  """A 2-character ASCII stop string whose first occurrence in `text` starts after its first
  2 characters (so the cut keeps some text), or None."""
  for start in range(2, len(text) - 1):
    stop = text[start:start + 2]
    if stop.isascii() and stop.isprintable() and text.find(stop) >= 2:
      return stop
  return None


@pytest.fixture(scope="module")
def with_stops(workdir, reference):
  """The reference's requests again, to stdout (--decode_out=-), with stop strings taken from
  the reference's completions of two of them: (result, records, the stop strings by name,
  JOB/decode's files before the run)."""
  _, records, _, _ = reference
  got = by_name(records)
  stops = {"sampled_filtered": _stop_inside(got["sampled_filtered"]["completion"]),
           # Greedy: its first two characters, wherever they first occur (maybe at 0).
           "greedy": got["greedy"]["completion"][:2]}
  assert stops["sampled_filtered"], got["sampled_filtered"]["completion"]
  assert len(stops["greedy"]) == 2 and stops["greedy"].isascii(), got["greedy"]["completion"]
  requests = {name: dict(request, **({"stop": stops[name]} if name in stops else {}))
              for name, request in FILE_REQUESTS.items()}
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(workdir)
    write_requests("prompts_stop.jsonl", requests)
    files = decode_files(workdir / JOB)
    result = run_cli(DECODE + [f"--prompt={p}" for p in PROMPTS] + [
        "--prompts_file=prompts_stop.jsonl", f"--fdl.decode.max_new_tokens={CONFIG_MAX_NEW}",
        "--decode_out=-"])
  assert result.code == 0, result.stderr[-3000:]
  return result, [json.loads(line) for line in result.stdout.splitlines()], stops, files


def test_a_stop_string_cuts_the_completion_before_it(reference, with_stops):
  _, records, _, _ = reference
  _, stopped, stops, _ = with_stops
  full, cut = by_name(records), by_name(stopped)
  for name, stop in stops.items():
    whole_text, whole_ids = full[name]["completion"], full[name]["completion_ids"]
    record = cut[name]
    assert record["settings"]["stop"] == [stop]
    assert record["stop_reason"] == "stop" and record["stop_string"] == stop, record
    # The same draws as without the stop string (same seed), up to the token that completed it.
    ids = record["completion_ids"]
    assert ids == whole_ids[:len(ids)] and len(ids) < len(whole_ids), (name, ids, whole_ids)
    assert record["completion"] == whole_text[:whole_text.index(stop)], (name, record)
    assert byte_text(ids) == record["completion"] + stop, name
    assert len(record["logprobs"]) == len(ids)


def test_decode_out_dash_writes_only_json_lines_to_stdout(workdir, with_stops):
  result, records, _, files_before = with_stops
  lines = result.stdout.splitlines()
  assert len(lines) == len(NAMES) == len(records)
  assert all(json.loads(line)["schema_version"] == 1 for line in lines)  # Each line parses.
  assert [r["index"] for r in records] == list(range(len(NAMES)))
  assert f"decoded {len(NAMES)} prompt(s) with checkpoint step 20" in result.stderr
  assert "written to stdout" in result.stderr
  assert decode_files(workdir / JOB) == files_before  # No file: stdout was the output.


def test_a_seed_reproduces_its_tokens_and_another_seed_draws_others(reference, with_stops):
  _, records, _, _ = reference
  _, again, _, _ = with_stops
  first, second = by_name(records), by_name(again)
  a, a_again, b = first["seed_a"], first["seed_a_again"], first["seed_b"]
  # The same request and seed: the same tokens in another slot of one run, and in another run.
  for other in (a_again, second["seed_a"], second["seed_a_again"]):
    assert other["completion_ids"] == a["completion_ids"]
    assert other["logprobs"] == pytest.approx(a["logprobs"], abs=1e-5)
  # Unchanged requests of the second run decode alike too (greedy ones included).
  for name in ("--prompt #1", "--prompt #2", "greedy_short", "seed_b"):
    assert second[name]["completion_ids"] == first[name]["completion_ids"], name
  # At temperature 1 with no filter the reported log-probabilities are the sampling
  # distribution's, so another seed draws seed_a's exact tokens with probability
  # exp(sum(logprobs)): check that it is negligible here, then that seed 12 differs.
  assert len(a["completion_ids"]) == SAMPLED_LENGTH
  assert sum(a["logprobs"]) < math.log(1e-9), sum(a["logprobs"])
  assert b["completion_ids"] != a["completion_ids"]


# ------------------------------------------------- an older checkpoint, an experiment without text


def _no_optimizer(*_):
  raise AssertionError("decode made an optimizer; it needs the parameters only")


@pytest.fixture(scope="module")
def older_ids_only(workdir):
  """One run for both (each decode run compiles for seconds): `--checkpoint_step=10` with
  --fiddler=synthetic_data, which gives the job's model synthetic ids and no text vocabulary
  (as a job trained on them has), so the requests are ids and the completions have no text.
  The ids are those of PROMPTS[0], to compare with the step-20 reference. Decode restores the
  parameters alone (checkpoints/params.py): making the job's optimizer fails the run."""
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(workdir)
    patch.setattr(optimizers.AdamW, "make", _no_optimizer)
    lines = [{"prompt_ids": [5, 6, 7], "max_new_tokens": 4},
             {"prompt_ids": byte_ids(PROMPTS[0]), "max_new_tokens": 2}]
    (workdir / "ids.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    # /dev/stdout is stdout, as "-" is (the other stdout runs use "-"): not a file that exists.
    result = run_cli(DECODE + ["--fiddler=synthetic_data", "--checkpoint_step=10",
                               "--prompts_file=ids.jsonl", "--decode_out=/dev/stdout"])
  assert result.code == 0, result.stderr[-3000:]
  return result, [json.loads(line) for line in result.stdout.splitlines()]


def test_checkpoint_step_decodes_with_that_older_step(reference, older_ids_only):
  _, latest, _, _ = reference
  result, records = older_ids_only
  assert "with checkpoint step 10" in result.stderr
  assert [r["checkpoint_step"] for r in records] == [10, 10]
  # Step 10's parameters, not step 20's under another label: the first token's probability
  # (which depends on the prompt alone) differs.
  assert records[1]["prompt_ids"] == latest[0]["prompt_ids"]
  assert abs(records[1]["logprobs"][0] - latest[0]["logprobs"][0]) > 1e-4


def test_an_experiment_without_text_decodes_prompt_ids_and_refuses_text(workdir,
                                                                       older_ids_only):
  _, records = older_ids_only
  record = records[0]
  assert record["prompt"] is None and record["completion"] is None
  assert record["prompt_ids"] == [5, 6, 7]
  # No vocabulary, so no EOS to stop at: exactly max_new_tokens ids.
  assert record["stop_reason"] == "max_new_tokens" and len(record["completion_ids"]) == 4
  assert all(0 <= i < VOCAB_SIZE for i in record["completion_ids"])
  assert len(record["logprobs"]) == 4 and all(p <= 0 for p in record["logprobs"])

  before = tree_digest(workdir / "runs")
  result = run_cli(DECODE + ["--fiddler=synthetic_data", "--prompt=def main(",
                             "--fdl.decode.max_new_tokens=4"])
  message = result.stderr.strip().splitlines()
  assert result.code == 2 and len(message) == 1, result.stderr
  assert "--prompt #1: prompt: this experiment's data has no text vocabulary" in message[0]
  assert "give prompt_ids" in message[0]
  assert "Traceback" not in result.stderr
  assert tree_digest(workdir / "runs") == before


# ----------------------------------------------------------------------------- bad input

LONG_40 = "x" * 40
LONG_PAST_CONTEXT = "x" * (MAX_LENGTH + 6)
# name: (arguments, a prompts file's lines or None, what the one line says). The default
# max_new_tokens=128 exceeds the tiny model's context, so the cases give a small one.
SMALL = ["--fdl.decode.max_new_tokens=4"]
BAD = {
    "empty_prompt": (DECODE + SMALL + ["--prompt="], None,
                     "--prompt #1='': an empty prompt"),
    "prompt_past_the_cache": (
        DECODE + SMALL + ["--fdl.decode.cache_length=32", f"--prompt={LONG_40}"], None,
        "--prompt #1: the prompt's 40 tokens and max_new_tokens=4 do not fit the decode cache "
        "(decode.cache_length=32"),
    "prompt_past_the_context": (
        DECODE + SMALL + [f"--prompt={LONG_PAST_CONTEXT}"], None,
        f"the prompt's {len(LONG_PAST_CONTEXT)} tokens and max_new_tokens=4 do not fit"),
    "top_p_above_1_in_the_file": (
        DECODE + SMALL + ["--prompts_file=bad.jsonl"], ['{"prompt": "a", "top_p": 1.5}'],
        "--prompts_file=bad.jsonl line 1: top_p=1.5: must be in (0, 1]"),
    "top_p_0_in_the_file": (
        DECODE + SMALL + ["--prompts_file=bad.jsonl"], ['{"prompt": "a"}', '{"prompt": "b", '
                                                        '"top_p": 0}'],
        "--prompts_file=bad.jsonl line 2: top_p=0: must be in (0, 1]"),
    "negative_temperature_in_the_file": (
        DECODE + SMALL + ["--prompts_file=bad.jsonl"], ['{"prompt": "a", "temperature": -0.5}'],
        "temperature=-0.5: must be >= 0"),
    "unknown_field_in_the_file": (
        DECODE + SMALL + ["--prompts_file=bad.jsonl"], ['{"prompt": "a", "max_tokens": 3}'],
        "unknown field 'max_tokens'; did you mean 'max_new_tokens'?"),
    "prompt_ids_outside_the_vocabulary": (
        DECODE + SMALL + ["--prompts_file=bad.jsonl"], ['{"prompt_ids": [5, 999999]}'],
        "token id 999999 is outside the model's vocabulary [0, 259)"),
    "config_top_p_0": (DECODE + SMALL + ["--fdl.decode.top_p=0", "--prompt=a"], None,
                       "--fdl.decode.top_p=0: must be in (0, 1]"),
    "no_prompt": (DECODE + SMALL, None, "no prompts to decode: pass --prompt=TEXT"),
    "missing_checkpoint_step": (DECODE + SMALL + ["--prompt=a", "--checkpoint_step=15"], None,
                                "--checkpoint_step=15: no such checkpoint in"),
    "negative_checkpoint_step": (DECODE + SMALL + ["--prompt=a", "--checkpoint_step=-1"], None,
                                 "--checkpoint_step=-1: must be a step number >= 0"),
    "model_override": (DECODE + SMALL + ["--fdl.model.num_layers=3", "--prompt=a"], None,
                       "the model config differs from the one this job was trained with "
                       "(model.num_layers: 2 -> 3)"),
    # A job with no checkpoint (a decode from --init_from made it): none to speak of.
    "model_override_on_a_job_without_checkpoints": (
        ["--mode=decode", "--job_log_dir=runs/config_only", "--fdl.model.num_layers=3",
         "--prompt=a"] + SMALL, None,
        "the model config differs from the one it was first run with, having no checkpoint "
        "(model.num_layers: 2 -> 3); decode with the job's own config"),
    "prompt_given_to_train": (TRAIN + ["--prompt=a"], None,
                              "--prompt: --mode=train does not use this flag"),
    "job_without_checkpoints": (
        ["--mode=decode", "--job_log_dir=runs/config_only",
         "--prompt=a"] + SMALL, None, "--job_log_dir=runs/config_only: no checkpoint in"),
    "empty_job_dir": (["--mode=decode", "--job_log_dir=runs/empty",
                       "--prompt=a"] + SMALL, None, "holds no config.json; pass --exp=NAME"),
    # Refused before anything is allocated (the cache alone would be ~700 GiB).
    "slots_past_memory": (DECODE + SMALL + ["--fdl.decode.slots=20000000", "--prompt=a"], None,
                          "decode.slots=20000000, decode.cache_length=64: decoding needs at "
                          "least"),
    "negative_bucket": (DECODE + SMALL + ["--fdl.decode.prefill_buckets=(-16, 32)",
                                          "--prompt=a"], None,
                        "decode.prefill_buckets=(-16, 32): must be prompt lengths"),
}


@pytest.fixture(scope="module")
def other_jobs(workdir):
  """runs/config_only (the job's config.json, no checkpoints) and runs/empty."""
  (workdir / "runs" / "config_only").mkdir()
  shutil.copy(workdir / JOB / "config.json", workdir / "runs" / "config_only")
  (workdir / "runs" / "empty").mkdir()


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_leaves_the_jobs_alone(workdir, other_jobs, name):
  args, lines, expected = BAD[name]
  if lines is not None:
    (workdir / "bad.jsonl").write_text("\n".join(lines) + "\n")
  before = tree_digest(workdir / "runs")
  result = run_cli(args)
  (workdir / "bad.jsonl").unlink(missing_ok=True)
  message = result.stderr.strip().splitlines()
  assert result.code == 2, result
  assert len(message) == 1 and message[0].startswith("lingvo_lite: error: "), result.stderr
  assert expected in message[0], message[0]
  assert "Traceback" not in result.stderr + result.stdout
  assert tree_digest(workdir / "runs") == before  # Nothing written, no JOB/decode/ file.
  if name == "missing_checkpoint_step":
    assert message[0].endswith("its steps: 10, 20"), message[0]


def test_a_prompt_past_the_model_context_names_only_fixes_that_exist():
  """decode.cache_length defaults to model.max_length, and may not exceed it: a prompt that
  does not fit the model's context cannot be helped by raising the cache length."""
  result = run_cli(DECODE + SMALL + [f"--prompt={LONG_PAST_CONTEXT}"])
  assert result.code == 2
  assert "raise --fdl.decode.cache_length" not in result.stderr, result.stderr


def test_the_design_contract_command_decodes_a_tiny_job():
  """The plainest decode command, `--mode=decode --job_log_dir=runs/tiny1 --prompt='def main('`
  (a job trained with --fiddler=tiny), with no decode settings given."""
  result = run_cli(DECODE + ["--prompt=def main(", "--decode_out=-"])
  assert result.code == 0, result.stderr
  assert json.loads(result.stdout)["stop_reason"] in STOP_REASONS


def test_a_stopped_decode_keeps_what_it_finished_as_partial(workdir, monkeypatch):
  """SIGTERM (as Ctrl-C) after two completions: the decode stops at the next device call,
  one line, exit 1, and the two finished completions in order in a `.partial` file, which
  does not look like a finished run's output."""
  from lingvo_lite.decode import generator as generation  # pylint: disable=g-import-not-at-top
  real_generate = generation.Generator.generate

  def signalled(self, requests, on_completion=None, should_stop=None):
    finished = []

    def count(index, completion):
      on_completion(index, completion)
      finished.append(index)
      if len(finished) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return real_generate(self, requests, on_completion=count, should_stop=should_stop)

  monkeypatch.setattr(generation.Generator, "generate", signalled)
  monkeypatch.chdir(workdir)
  before = set(glob.glob(f"{JOB}/decode/*"))
  result = run_cli(DECODE + SMALL + [f"--prompt=p{i}" for i in range(5)]
                   + ["--fdl.decode.slots=1"])
  assert result.code == 1, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "decode stopped by SIGTERM after 2 of 5 completions" in lines[0], \
      lines
  new = sorted(set(glob.glob(f"{JOB}/decode/*")) - before)
  assert len(new) == 1 and new[0].endswith(".jsonl.partial"), new
  assert new[0] in lines[0]  # Named as the user wrote the job dir.
  records = [json.loads(line) for line in open(new[0])]
  assert [r["source"] for r in records] == ["--prompt #1", "--prompt #2"]
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # The handler is put back.
