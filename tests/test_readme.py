"""Every command in README.md's code blocks runs as written, from a working copy of the repository.

The README is the first thing a new user runs, from a working directory and with relative
paths (`--job_log_dir=runs/a`), so that is how these tests run it: in README order (later
commands read earlier job directories), with `python` the test's interpreter and `PYTHONPATH`
the copy's root, as the README says `python -m lingvo_lite` needs.

`RULES` says how each kind of command runs here: the flags appended to it where the command
as written would take too long (appended last, so they win over the README's own flags), and
what its output must show. A README command no rule recognises fails
`test_every_readme_command_has_a_rule`, so a new README command needs a rule; commands that
cannot run inside a test are in the table too, with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Callable, Sequence

import pytest

from lingvo_lite import testing

README = testing.source_root() / "README.md"
TIMEOUT_S = 300

# Code blocks that hold no commands, known by their first line.
NOT_COMMANDS = {
    r"^train step \d+/\d+: loss": "bin/demo.sh's sample output",
    r"^training SentencePiece \(": "bin/demo.sh's first-run output (vocabulary, stores)",
    r"^bin/\s+demo\.sh": "the Layout section's list of folders",
    r"^eval_data=\{": "the Evaluation section's config example",
    r'^\{"prompt': "the Decode section's prompts file (the decode rule writes it)",
}


@dataclasses.dataclass(frozen=True)
class Command:
  """One README command line, as a shell reads it."""
  text: str  # Continuations joined, comment dropped: what the report shows.
  env: dict[str, str]  # Leading NAME=value assignments.
  argv: tuple[str, ...]

  def flag(self, name: str) -> str | None:
    """The last value of `--name=value` or `--name value`, else None."""
    return _flag(self.argv, name)


def _flag(argv: Sequence[str], name: str) -> str | None:
  value = None
  for i, token in enumerate(argv):
    if token.startswith(f"--{name}="):
      value = token.partition("=")[2]
    elif token == f"--{name}" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def _code_blocks(markdown: str) -> list[list[str]]:
  """The lines of each fenced code block, its fence's indentation removed (list items indent
  theirs)."""
  blocks, block, indent = [], None, 0
  for line in markdown.splitlines():
    if line.lstrip().startswith("```"):
      if block is None:
        block, indent = [], len(line) - len(line.lstrip())
      else:
        blocks.append(block)
        block = None
    elif block is not None:
      block.append(line[indent:] if not line[:indent].strip() else line.lstrip())
  return blocks


def _logical_lines(block: list[str]) -> list[str]:
  """Lines with backslash continuations joined, as a shell joins them."""
  lines, pending = [], ""
  for line in block:
    if line.rstrip().endswith("\\"):
      pending += line.rstrip()[:-1]
    else:
      lines.append(pending + line)
      pending = ""
  return lines + [pending] if pending else lines


def readme_commands(markdown: str) -> list[Command]:
  """The command lines of every fenced code block, in order, except NOT_COMMANDS blocks."""
  commands = []
  for block in _code_blocks(markdown):
    first = next((line for line in block if line.strip()), "")
    if any(re.match(pattern, first) for pattern in NOT_COMMANDS):
      continue
    for line in _logical_lines(block):
      words = shlex.split(line, comments=True)
      if not words:
        continue  # Blank, or a comment line ("# ... and the same with --process_id=1").
      env, argv = {}, list(words)
      while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
      commands.append(Command(shlex.join(words), env, tuple(argv)))
  return commands


# ------------------------------------------------------------------------------ running


@dataclasses.dataclass
class Session:
  """What later commands' checks need from earlier ones."""
  copy: pathlib.Path
  commands: list[Command]
  final_losses: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # job -> lines


def _environment(copy: pathlib.Path, command_env: dict[str, str]) -> dict[str, str]:
  env = dict(os.environ)
  # A user's shell: only what the README says to set. The test runner's own XLA_FLAGS (forced
  # devices) or PYTHONPATH (Bazel's runfiles) would change what the command does.
  for name in ("XLA_FLAGS", "PYTHONPATH"):
    env.pop(name, None)
  env["PYTHONPATH"] = str(copy)
  # `python` is this test's interpreter (the project's venv), as in an activated venv.
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
  env.update(command_env)
  return env


def _run_one(argv: Sequence[str], env: dict[str, str],
             copy: pathlib.Path) -> list[subprocess.CompletedProcess]:
  return [subprocess.run(list(argv), cwd=copy, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_processes(argv: Sequence[str], env: dict[str, str],
                   copy: pathlib.Path) -> list[subprocess.CompletedProcess]:
  """Every process of a jax.distributed command at once: `--process_id=I` for each I, and a
  free port instead of the README's (tests may run side by side)."""
  host = _flag(argv, "coordinator_address").rpartition(":")[0]
  address = f"{host}:{_free_port()}"
  argvs = []
  for process in range(int(_flag(argv, "num_processes"))):
    argvs.append([f"--process_id={process}" if t.startswith("--process_id=") else
                  f"--coordinator_address={address}" if t.startswith("--coordinator_address=")
                  else t for t in argv])
  # Output to files, not pipes: waiting on one process must not let another block on a full
  # pipe (it would stall the collectives both are in).
  files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in argvs]
  procs = [subprocess.Popen(a, cwd=copy, env=env, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=err, text=True) for a, (out, err) in zip(argvs, files)]
  try:
    deadline = time.monotonic() + TIMEOUT_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
      if any(p.returncode not in (None, 0) for p in procs):
        # A failed process: its peers stop soon on their own (or are killed: exit -9),
        # rather than wait out the timeout for it.
        deadline = min(deadline, time.monotonic() + 30)
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  results = []
  for a, p, streams in zip(argvs, procs, files):
    for f in streams:
      f.seek(0)
    results.append(subprocess.CompletedProcess(a, p.returncode, *(f.read() for f in streams)))
    for f in streams:
      f.close()
  return results


# ------------------------------------------------------------------------------- checks

Results = list[subprocess.CompletedProcess]


def _search(pattern: str, text: str, what: str) -> re.Match:
  match = re.search(pattern, text, re.MULTILINE)
  assert match, f"{what}: no line matches {pattern!r} in:\n{text[-2000:]}"
  return match


def _check_list(command: Command, results: Results, session: Session) -> None:
  del command
  names = [line.split()[0] for line in results[0].stdout.splitlines() if line.strip()]
  assert "lm.pycode.PyCodeTiny" in names, results[0].stdout
  # Every experiment the README's commands name is in the list, by a unique dotted suffix.
  for exp in {c.flag("exp") for c in session.commands} - {None}:
    found = [n for n in names if n == exp or n.endswith("." + exp)]
    assert len(found) == 1, f"--exp={exp}: {found or 'not'} in --mode=list"


def _check_print(command: Command, results: Results, session: Session) -> None:
  del session
  out = results[0].stdout
  _search(r"^model = <", out, "--mode=print")
  for token in command.argv:  # Each of the README's overrides, with its origin.
    if token.startswith("--fdl."):
      path = token[len("--fdl."):].partition("=")[0]
      _search(rf"^{re.escape(path)} = .*# command line: {re.escape(token)}", out, token)


def _run_to_file(argv: Sequence[str], env: dict[str, str],
                 copy: pathlib.Path) -> list[subprocess.CompletedProcess]:
  """A command whose output the README redirects (`... > config.svg`): run without the
  redirection, its stdout written where the README points it."""
  where = list(argv).index(">")
  results = _run_one([*argv[:where], *argv[where + 2:]], env, copy)
  (copy / argv[where + 1]).write_text(results[0].stdout)
  return results


def _check_print_svg(command: Command, results: Results, session: Session) -> None:
  del results
  svg = "{http://www.w3.org/2000/svg}"
  root = ElementTree.parse(session.copy / command.argv[command.argv.index(">") + 1]).getroot()
  assert root.tag == f"{svg}svg", root.tag
  texts = {(t.text or "").strip("\xa0 ") for t in root.iter(f"{svg}text")}
  assert {"Setup", "Llama", "model", "num_layers"} <= texts, sorted(texts)[:40]


def _check_fdl_help(command: Command, results: Results, session: Session) -> None:
  del command, session
  out = results[0].stdout
  _search(r"^\s*model\.dim\b", out, "--fdl_help: a field")
  _search(r"\btiny\b", out, "--fdl_help: the fiddlers that apply")


def _check_help(command: Command, results: Results, session: Session) -> None:
  del command
  out = results[0].stdout + results[0].stderr
  # Every flag the README's lingvo_lite commands use is documented.
  used = {t.partition("=")[0][2:] for c in session.commands if c.argv[:3] == LINGVO
          for t in c.argv[3:] if t.startswith("--") and not t.startswith("--fdl.")}
  for name in sorted(used - {"help", "helpfull"}):
    _search(rf"^\s+--(\[no\])?{re.escape(name)}:", out, f"--help: --{name}")


def _check_eval(command: Command, results: Results, session: Session) -> None:
  out = results[0].stdout
  if "--eval_continuous" in command.argv:
    # After the README's one-off eval of the final step: nothing is left to evaluate.
    _search(r"^evaluated the final step \d+; done$", out, "eval --eval_continuous")
  else:
    _search(r"^eval of (?:checkpoint step \d+|train.init_from \S+ as step 0) \(written to .*\):\n"
            r"  set +loss +perplexity .*\n"
            r"  validation +\d", out, "eval")
  job = command.flag("job_log_dir")
  assert (session.copy / job / "eval").is_dir(), f"no {job}/eval in the working copy"


def _check_decode(command: Command, results: Results, session: Session) -> None:
  """One JSON record per request, on stdout for --decode_out=-, else in the file the summary
  line names (relative to the working copy, as the user gave the job dir)."""
  out, err = results[0].stdout, results[0].stderr
  requests = sum(1 for t in command.argv if t.startswith("--prompt="))
  prompts_file = command.flag("prompts_file")
  if prompts_file:
    requests += sum(1 for line in (session.copy / prompts_file).read_text().splitlines()
                    if line.strip())
  summary = (rf"^decoded {requests} prompt\(s\) with (?:checkpoint step \d+|train.init_from "
             rf"\S+): .*; written to ")
  if command.flag("decode_out") == "-":
    _search(summary + "stdout$", err, "decode: the summary on stderr")
    lines = out.splitlines()
  else:
    path = _search(summary + r"(\S+\.jsonl)$", out, "decode").group(1)
    assert path.startswith(command.flag("job_log_dir") + "/decode/"), path
    lines = (session.copy / path).read_text().splitlines()
  rows = [json.loads(line) for line in lines]  # stdout holds JSON lines only.
  assert len(rows) == requests, f"{len(rows)} records for {requests} requests"
  assert all(row["completion_ids"] and row["stop_reason"] for row in rows), rows


def _run_decode(argv: Sequence[str], env: dict[str, str],
                copy: pathlib.Path) -> list[subprocess.CompletedProcess]:
  """Writes the README's example prompts file where the command names it (as a user copies
  it from the README), then runs the command."""
  prompts_file = _flag(argv, "prompts_file")
  if prompts_file and not (copy / prompts_file).exists():
    block = next(b for b in _code_blocks((copy / "README.md").read_text())
                 if b and b[0].startswith('{"prompt'))
    (copy / prompts_file).write_text("\n".join(block) + "\n")
  return _run_one(argv, env, copy)


def _check_built(command: Command, results: Results, session: Session, flag: str,
                 inside: str) -> None:
  """A bin/ tool wrote what its --out/--output names (relative to the working copy) and said
  so on one summary line."""
  path = session.copy / command.flag(flag) / inside if inside else session.copy / command.flag(
      flag)
  assert path.is_file(), f"no {path} in the copy: {results[0].stdout[-1000:]}"
  assert results[0].stdout.strip(), "no summary printed"


def _check_prompts(command: Command, results: Results, session: Session) -> None:
  """bin/make_prompts.py wrote its --out, or checked its --check and counted the records."""
  if command.flag("check") is None:
    _check_built(command, results, session, "out", "")
  else:
    _search(r"^\d[\d,]* prompt records, fingerprint [0-9a-f]{16}$", results[0].stdout,
            "make_prompts --check")


def _check_train(command: Command, results: Results, session: Session) -> None:
  out = results[0].stdout
  steps = _flag(results[0].args, "fdl.train.steps")
  _search(rf"^done: step {steps}$", out, "train")
  job = command.flag("job_log_dir")
  # Relative to the working directory, where the user looks for it.
  assert (session.copy / job / "config.json").is_file(), f"no {job}/config.json in the copy"
  finals = re.findall(r"^  final (?:train|eval) loss: .*$", out, re.MULTILINE)
  assert len(finals) == 2, out[-2000:]
  session.final_losses[os.path.normpath(job)] = finals
  # `--fdl_config_file=runs/a/config.json`: "re-run exactly" means the same losses.
  source = command.flag("fdl_config_file")
  if source and os.path.normpath(os.path.dirname(source)) in session.final_losses:
    assert finals == session.final_losses[os.path.normpath(os.path.dirname(source))], (
        f"{command.text}: not the run {source} came from")


def _check_compile(command: Command, results: Results, session: Session) -> None:
  out = results[0].stdout
  _search(r"^verdict: FITS: needs ", out, "compile verdict")
  if "int8" in (command.flag("fdl.model.quantization") or ""):
    _search(r"^  matmuls in the optimized HLO: [1-9]\d* int8, ", out, "int8 dots")
    _search(r"^  int8 step time at 50% of the peaks ", out, "int8 step time")
  if command.flag("compile_find_max_batch") is not None:
    for policy in (_flag(results[0].args, "compile_remat_policies") or "").split(","):
      _search(rf"^    {re.escape(policy)} +\d+ ", out, f"max batch for {policy}")
  job = command.flag("job_log_dir")
  if job:
    assert (session.copy / job / "compile" / "report.json").is_file(), f"no {job}/compile"
  step = command.flag("compiled_step_out")
  if step:
    assert (session.copy / step / "manifest.json").is_file(), f"no {step}/manifest.json"


def _check_processes(command: Command, results: Results, session: Session) -> None:
  first, *others = results
  _search(r"^done: step \d+$", first.stdout, "process 0")
  for other in others:  # "process 0 alone writes the config, logs and summaries"
    assert "done: step" not in other.stdout, other.stdout[-2000:]
  job = command.flag("job_log_dir")
  assert (session.copy / job / "config.json").is_file(), f"no {job}/config.json in the copy"


def _check_report(command: Command, results: Results, session: Session) -> None:
  """The page named on the summary line (relative, as the user gave the job dir) exists; the
  report of a job shows the final train loss its training printed."""
  job = command.flag("job_log_dir")
  page = "compare.html" if command.flag("compare") else "index.html"
  printed = "comparison" if command.flag("compare") else "report"
  _search(rf"^{printed}: {re.escape(job)}/report/{page}$", results[0].stdout, "report")
  text = (session.copy / job / "report" / page).read_text()
  finals = session.final_losses.get(os.path.normpath(job), [])
  if page == "index.html" and finals:
    loss = _search(r"final train loss: (\S+)", finals[0], "train").group(1)
    _search(rf'id="final-train-loss"[^>]*>{re.escape(loss)}<', text, "the report's final loss")


def _check_export(command: Command, results: Results, session: Session) -> None:
  """The folder holds what transformers' from_pretrained reads: the config, the weights, the
  generation config and the tokenizer (the pretrained model's, or the task's bytes or
  SentencePiece converted); or the GGUF file, with the pretrained model's tokenizer (slim
  weights: the parameters and the config)."""
  del results
  folder = session.copy / command.flag("export_dir")
  names = set(os.listdir(folder))
  if command.flag("export_format") == "gguf":
    assert names == {"model.gguf", "manifest.json"}, names
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["tokenizer"] == _pretrained(command), manifest
    return
  if command.flag("export_format") == "slim":
    assert {"params", "config.json", "manifest.json"} <= names, names
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["dtype"] == (command.flag("export_dtype") or "float32"), manifest
    return
  assert {"config.json", "generation_config.json", "manifest.json"} <= names, names
  assert any(n.endswith(".safetensors") for n in names), names
  assert {"tokenizer.json", "tokenizer_config.json"} <= names, names


def _check_bench(command: Command, results: Results, session: Session) -> None:
  del session
  out = results[0].stdout
  _search(r"^median ratio lingvo_lite / reference: \d+\.\d+ \(quartiles", out, "bench")
  devices = command.flag("devices") or "1"
  _search(rf"^jax \S+, {devices} \S+ device\(s\), mesh \{{.*'{command.flag('mesh') or 'data'}'"
          rf": {devices}", out, "bench devices and mesh")


def _check_lm_eval(command: Command, results: Results, session: Session) -> None:
  """lm_eval's results table has a row for each task asked for, with a metric value."""
  del session
  for task in command.flag("tasks").split(","):
    _search(rf"^\|{re.escape(task)}\s*\|.*\|\s*\d+\.\d+\|", results[0].stdout, task)


# -------------------------------------------------------------------------------- rules

LINGVO = ("python", "-m", "lingvo_lite")
BENCH = ("python", "bench/step_bench.py")
TPU_COMMANDS = (("bash", "bench/tpu_check.sh"), ("python3", "bench/tpu_numerics.py"))
POST_TRAINING_BENCHES = (("python", "bench/post_training.py"),
                         ("python", "bench/lora_step_bench.py"),
                         ("python", "bench/humaneval_chat_first_token.py"))
INT8_BENCHES = (("python", "bench/int8_convergence.py"), ("python", "bench/int8_decode.py"),
                ("python", "bench/int8_step_bench.py"))
# The commands use the compilation cache as written, that is its default folder: in tests,
# $JAX_COMPILATION_CACHE_DIR, the suite's shared cache (tests/conftest.py). A miss compiles.
# Rows of 32 tokens: the smoke run times steps, it does not measure them, and a step of the
# experiments' own 256 or 512 tokens takes seconds a side on 2 cores (compiles are the same).
BENCH_SMOKE = ("--pairs", "1", "--steps", "1", "--warmup", "1",
               "--set", "train_data.sequence_length=32")


def _lingvo(command: Command, mode: str) -> bool:
  return command.argv[:3] == LINGVO and (command.flag("mode") or "train") == mode


def _pretrained(command: Command) -> bool:
  """A command of the pretrained model's (SmolLM2's experiments, and the jobs they make):
  tests/test_readme_pretrained.py runs those, in a target of their own beside this one."""
  job = os.path.basename(os.path.normpath(command.flag("job_log_dir") or "."))
  return (command.flag("exp") or "").startswith("SmolLM2") or job.startswith("smol")


def _post_training(command: Command) -> bool:
  """A command of the post-training demonstration (its experiments, and the jobs and exports
  they make)."""
  names = {os.path.basename(os.path.normpath(command.flag(flag) or "."))
           for flag in ("job_log_dir", "export_dir")}
  return (command.flag("exp") in ("SmolLM2ChatSft", "SmolLM2Dpo")
          or bool(names & {"smol_sft", "smol_dpo"}))


def standalone(command: Command) -> bool:
  """A command that reads nothing an earlier one wrote, nor writes what a later one reads but
  its own kind (compiles, several processes, the bin/ tools, the benches):
  tests/test_readme_standalone.py runs those, in a target of their own beside this one, so
  that neither target is a long tail of the suite."""
  if command.argv[:2] in (("python", "bin/build_store.py"), ("python", "bin/train_vocab.py"),
                          ("python", "bin/make_prompts.py"), BENCH):
    return True
  return (_lingvo(command, "compile") or command.flag("compiled_step_in") is not None
          or command.flag("num_processes") is not None)


# SmolLM2's runs read 135M parameters; rows of 64 tokens, one batch, keep each a few seconds
# on 2 cores while still building its token stores and running every part of the program.
SMOL_SHAPES = ("--fdl.eval_data.num_batches=1", "--fdl.eval_data.global_batch_size=2",
               "--fdl.eval_data.sequence_length=64")
# SmolLM2's 30 blocks as one scanned block: each command traces and compiles one block, not
# 30 (~5 s less a command on 2 cores). The same computation: tests/models/test_layer_layout.py
# compares the layouts, and the export command unstacks the fine-tune's scanned checkpoint.
SMOL_SCANNED = ("--fdl.model.scan_layers=True",)


@dataclasses.dataclass(frozen=True)
class Rule:
  """How one kind of README command runs here.

  Attributes:
    kind: its name in reports.
    matches: whether a command is of this kind (the first rule that matches wins).
    check: asserts on the output of a run that exited 0; None: the command is not run here.
    extra: flags appended to the command, after the README's own.
    why: why those flags, or why it does not run here.
    run: runs the command in the working copy.
  """
  kind: str
  matches: Callable[[Command], bool]
  check: Callable[[Command, Results, Session], None] | None
  extra: tuple[str, ...] = ()
  why: str = ""
  run: Callable[[Sequence[str], dict[str, str], pathlib.Path], Results] = _run_one


RULES = (
    Rule("bin/test.sh", lambda c: c.argv[:2] == ("bash", "bin/test.sh"), None,
         why="runs the whole suite, this test included (it is what CI runs)"),
    Rule("bin/demo.sh", lambda c: c.argv[:2] == ("bash", "bin/demo.sh"), None,
         why="tests/programs/test_default_experiment.py runs it as written; its 800 steps take ~4 "
             "minutes, so the suite runs them once"),
    Rule("list", lambda c: _lingvo(c, "list"), _check_list),
    Rule("print as SVG", lambda c: _lingvo(c, "print") and c.flag("format") == "svg",
         _check_print_svg, run=_run_to_file),
    Rule("print", lambda c: _lingvo(c, "print"), _check_print),
    Rule("--fdl_help", lambda c: c.argv[:3] == LINGVO and "--fdl_help" in c.argv,
         _check_fdl_help),
    Rule("--help", lambda c: c.argv[:3] == LINGVO and "--help" in c.argv, _check_help),
    Rule("post-training, pretrained", _post_training, None,
         why="SmolLM2's chat SFT and DPO (README, 'Post-training'): each builds the stdlib "
             "chat or preference stores with SmolLM2's tokenizer and compiles a 135M-parameter "
             "LoRA step, over a minute of the suite's time even at the smallest shapes; "
             "bench/post_training.py runs these commands as written, and the same programs run "
             "on tiny models in tests/programs/test_post_training.py (LoRA train, resume, decode; "
             "QLoRA + DPO) and tests/weights/test_peft.py (the peft and hf exports)"),
    Rule("eval, pretrained", lambda c: _lingvo(c, "eval") and _pretrained(c), _check_eval,
         SMOL_SHAPES + SMOL_SCANNED,
         why="one batch of 2 x 64 tokens: the fixed validation subset (4 batches of 8 x 512) "
             "takes about a minute on 2 cores; scanned blocks (SMOL_SCANNED)"),
    Rule("eval", lambda c: _lingvo(c, "eval"), _check_eval),
    Rule("report", lambda c: _lingvo(c, "report"), _check_report),
    Rule("decode, pretrained", lambda c: _lingvo(c, "decode") and _pretrained(c),
         _check_decode, ("--fdl.decode.max_new_tokens=16",) + SMOL_SCANNED, run=_run_decode,
         why="as the decode rule below, with scanned blocks (SMOL_SCANNED)"),
    Rule("decode", lambda c: _lingvo(c, "decode"), _check_decode,
         ("--fdl.decode.max_new_tokens=16",), run=_run_decode,
         why="16 new tokens, not 128, per --prompt request: the 4-step model's tokens are noise "
             "either way, and 16 still run the prefill and the generate loop"),
    Rule("compile GPT-J-6B", lambda c: _lingvo(c, "compile") and c.flag("exp") == "GptJ6B",
         None, why="tests/programs/test_compile_experiments.py compiles GptJ6B for v5e-256 and asserts "
                   "FITS (about a minute on 2 cores); the suite does it once"),
    Rule("compile, max-batch search",
         lambda c: _lingvo(c, "compile") and c.flag("compile_find_max_batch") is not None,
         _check_compile, ("--fiddler=tiny", "--fdl.train_data.global_batch_size=8",
                          "--fdl.eval_data.global_batch_size=8", "--compile_remat_policies=full",
                          "--fdl.train_data.sequence_length=8192",
                          "--fdl.eval_data.sequence_length=8192"),
         why="Llama1B's ~30 s compiles, about seven per policy, would take many minutes; the "
             "tiny model searches the same way, for one policy, in under a minute. Rows of "
             "8192 tokens (6 GiB a row, for the 128256-token logits) put its boundary at 2 rows "
             "a chip, three compiles; at 64 tokens it lies at 341 rows, and the compiles "
             "there, next to the 16 GiB limit, take minutes"),
    Rule("compile", lambda c: _lingvo(c, "compile"), _check_compile, ("--fdl.train.steps=4",),
         why="the train command that loads the saved step runs 4 steps (the train rule), and "
             "train.steps is compiled into the step (its learning-rate schedule)"),
    Rule("train, several processes",
         lambda c: _lingvo(c, "train") and c.flag("job_log_dir") is not None
         and c.flag("num_processes") is not None,
         _check_processes, run=_run_processes,
         why="every process at once (README: 'the same with --process_id=1 in a second "
             "shell'), on a free port"),
    Rule("GRPO", lambda c: _lingvo(c, "train") and c.flag("exp") == "SmolLM2Grpo", None,
         why="a GRPO step of SmolLM2 samples 16 completions and trains on them (minutes on 2 "
             "cores); tests/test_grpo.py runs the objective's rollouts, loss and a resume "
             "in-process at tiny size, and this experiment through the CLI to its refusals"),
    Rule("train, pretrained", lambda c: _lingvo(c, "train") and _pretrained(c), _check_train,
         ("--fdl.train.steps=1", "--fdl.train_data.global_batch_size=2",
          "--fdl.train_data.sequence_length=64", *SMOL_SHAPES, *SMOL_SCANNED),
         why="1 step of 2 x 64 tokens: a step of the fine-tune's 8 x 512 takes ~50 s on 2 "
             "cores; this still loads the GGUF, trains, checkpoints and evaluates; scanned "
             "blocks (SMOL_SCANNED)"),
    Rule("export", lambda c: _lingvo(c, "export"), _check_export),
    Rule("serve", lambda c: _lingvo(c, "serve"), None,
         why="a server runs until it is stopped; tests/serving/test_server.py starts this program "
             "on a free port and drives it with a real HTTP client (SmolLM2's chat: "
             "tests/harness/test_humaneval.py)"),
    Rule("curl", lambda c: c.argv[:1] == ("curl",), None,
         why="a request to the server above; tests/serving/test_server.py sends these"),
    Rule("lm_eval", lambda c: c.argv[:2] == ("python", "bin/lm_eval.py"), _check_lm_eval),
    Rule("train", lambda c: _lingvo(c, "train") and c.flag("job_log_dir") is not None,
         _check_train,
         ("--fdl.train.steps=4", "--fdl.eval_data.num_batches=8"),
         why="PyCodeTiny's 800 steps take ~1.5 minutes; 4 steps still train, checkpoint, "
             "evaluate and write the job directory that later commands read; the 4-step "
             "model's eval over 8 of its 64 batches (~6 s less a run, and for the eval "
             "commands that read the job's config), as its numbers are noise either way"),
    Rule("build_store", lambda c: c.argv[:2] == ("python", "bin/build_store.py"),
         lambda c, r, s: _check_built(c, r, s, "out", "validation/manifest.json")),
    Rule("train_vocab", lambda c: c.argv[:2] == ("python", "bin/train_vocab.py"),
         lambda c, r, s: _check_built(c, r, s, "output", "")),
    Rule("make_prompts", lambda c: c.argv[:2] == ("python", "bin/make_prompts.py"),
         _check_prompts),
    Rule("int8 benchmarks", lambda c: c.argv[:2] in INT8_BENCHES, None,
         why="benchmark runs of minutes to half an hour each (the README's int8 figures, side "
             "by side); the code they drive runs in tests/models/test_quantization.py and "
             "tests/programs/test_quantization_programs.py"),
    Rule("post-training benchmarks", lambda c: c.argv[:2] in POST_TRAINING_BENCHES, None,
         why="the demonstration's hours (SFT and DPO of SmolLM2 with their evaluations), "
             "the LoRA step's memory against the full step's, side by side, and transformers' "
             "look at the chat HumanEval's first token (README figures); "
             "their code runs in the tests named by the rule above"),
    Rule("TPU VM", lambda c: c.argv[:2] in TPU_COMMANDS or c.argv[:4] == (
        "python3", "-m", "pip", "download"), None,
         why="a TPU VM's benchmarks, and the download of the wheels they carry (network); "
             "their code runs here in tests/models/test_flash_attention.py, test_remat.py, "
             "tests/test_partitioning.py (splash on a mesh) and bench/ on a CPU"),
    Rule("MaxText's table", lambda c: c.argv[:2] == ("python", "bench/maxtext_table.py"), None,
         why="each row compiles a MaxText shape for 256 to 8,192 chips from this CPU (3-7 "
             "minutes a row); the experiments' shapes are checked in tests/test_experiments.py "
             "and the report's next-knob line in tests/programs/test_compile.py"),
    Rule("bench BenchLarge",
         lambda c: c.argv[:2] == BENCH and c.flag("experiment") == "BenchLarge", _check_bench,
         BENCH_SMOKE + ("--set", "train_data.global_batch_size=2"),
         why="one pair of single steps of 32-token rows; BenchLarge's batch of 8 takes ~5 s a "
             "step per side on 2 cores"),
    Rule("bench", lambda c: c.argv[:2] == BENCH, _check_bench, BENCH_SMOKE,
         why="one pair of single steps of 32-token rows: builds, compiles and times both steps "
             "and prints the ratio line (the README's figures come from 9-31 pairs)"),
)


def rule_for(command: Command) -> Rule | None:
  return next((rule for rule in RULES if rule.matches(command)), None)


# -------------------------------------------------------------------------------- tests


def test_commands_are_read_as_a_shell_reads_them():
  markdown = "\n".join([
      "Text `python -m not_a_block`.", "```", "train step 1/1: loss 1.0", "```",
      "- item", "  ```", "  A=1 python -m lingvo_lite --x=1 \\",
      "      --y='a b'   # what it does", "  # a comment line", "", "  ```",
      "```", "bash bin/x.sh", "```"])
  commands = readme_commands(markdown)
  assert [(c.env, c.argv) for c in commands] == [
      ({"A": "1"}, ("python", "-m", "lingvo_lite", "--x=1", "--y=a b")),
      ({}, ("bash", "bin/x.sh"))]
  assert commands[0].flag("y") == "a b" and commands[0].flag("z") is None


def test_every_readme_command_has_a_rule():
  commands = readme_commands(README.read_text())
  unrecognised = [c.text for c in commands if rule_for(c) is None]
  assert not unrecognised, (
      "README commands that no rule in tests/test_readme.py recognises (add one, with the "
      "flags a test needs and what the output must show):\n  " + "\n  ".join(unrecognised))
  used = {rule_for(c).kind for c in commands}
  stale = [rule.kind for rule in RULES if rule.kind not in used]
  assert not stale, f"rules that match no README command (remove them): {stale}"


def _note_time(line: str) -> None:
  """Prints a command's time (pytest shows it on failure, or with -s), and under Bazel also
  appends it to command_times.txt in the target's outputs (bazel-testlogs/.../test.outputs),
  where a profile of the suite finds it."""
  print(line)
  outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
  if outputs:
    with open(os.path.join(outputs, "command_times.txt"), "a", encoding="utf-8") as f:
      f.write(line + "\n")


def run_readme_commands(tmp_path: pathlib.Path, chosen: Callable[[Command], bool]) -> None:
  """Runs the README's `chosen` commands in order in a working copy, with their rules."""
  copy = testing.make_working_copy(tmp_path / "repo")
  commands = readme_commands(README.read_text())
  session = Session(copy, commands)
  failures = []
  for command in filter(chosen, commands):
    rule = rule_for(command)
    if rule is None or rule.check is None:
      continue  # Unrecognised: test_every_readme_command_has_a_rule fails. Not run: see why.
    env = _environment(copy, command.env)
    assert shutil.which("python", path=env["PATH"]) == os.path.join(
        os.path.dirname(sys.executable), "python")
    started = time.monotonic()
    try:
      results = rule.run(command.argv + rule.extra, env, copy)
      for result in results:
        assert result.returncode == 0, (
            f"exit {result.returncode}: "
            + " | ".join(result.stderr.strip().splitlines()[-3:]))
      rule.check(command, results, session)
    except (AssertionError, subprocess.TimeoutExpired) as e:
      # The message only, not pytest's rewritten `assert ...` explanation after it.
      message = str(e).strip().split("\nassert ")[0]
      failures.append(f"{command.text}\n    {message[:1500]}")
    _note_time(f"{time.monotonic() - started:6.1f} s  [{rule.kind}] {command.text}")
  assert not failures, f"{len(failures)} README command(s) failed:\n" + "\n".join(failures)


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path):
  run_readme_commands(tmp_path,
                      lambda command: not _pretrained(command) and not standalone(command))
