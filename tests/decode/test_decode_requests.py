"""Decode requests from --prompt and --prompts_file, and the records the decode writes.

Every bad request is one UsageError line naming the flag, the line and the field, before any
device time; every record is strict JSON of the documented keys; nothing is overwritten.
"""

import json
import math
import os
import sys

import numpy as np
import pytest
from etils import epath

from lingvo_lite.decode import (records as decode_records, requests as decode_requests,
                                sampling_checks)
from lingvo_lite.decode.records import Completion, CompletionWriter
from lingvo_lite.decode.requests import Request
from lingvo_lite.errors import UsageError

RECORD_KEYS = {"schema_version", "index", "source", "prompt", "prompt_ids", "completion",
               "completion_ids", "logprobs", "stop_reason", "stop_string", "settings",
               "checkpoint_step", "timing"}


def _refused(call, *args, **kwargs) -> str:
  with pytest.raises(UsageError) as error:
    call(*args, **kwargs)
  text = str(error.value)
  assert "\n" not in text and len(text) < 600, text
  return text


def _file(tmp_path, lines: list[str] | str, name="p.jsonl") -> str:
  path = tmp_path / name
  if isinstance(lines, str):
    path.write_text(lines)
  else:
    path.write_text("\n".join(lines) + "\n")
  return str(path)


def _from_file(tmp_path, lines):
  return decode_requests.from_flags(None, _file(tmp_path, lines), shown_file="p.jsonl")


# ----------------------------------------------------------------------------- valid requests


def test_a_file_with_blank_lines_keeps_its_own_line_numbers(tmp_path):
  requests = _from_file(tmp_path, [
      "", '{"prompt": "a", "stop": "\\n"}', "   \t", '{"prompt_ids": [1, 2], "stop": ["x", "y"],'
      ' "temperature": 1, "top_p": 0.9, "top_k": 0, "seed": 7, "max_new_tokens": 5}',
      '{"prompt": " ", "stop": [], "temperature": null}'])
  assert [r.source for r in requests] == ["p.jsonl:2", "p.jsonl:4", "p.jsonl:5"]
  assert requests[0] == Request(source="p.jsonl:2", prompt="a", stop=("\n",))
  second = requests[1]
  assert second.prompt_ids == (1, 2) and second.stop == ("x", "y")
  assert isinstance(second.temperature, float) and second.temperature == 1.0
  assert second.overrides() == {"max_new_tokens": 5, "temperature": 1.0, "top_k": 0,
                                "top_p": 0.9, "seed": 7, "stop": ("x", "y")}
  # [] turns the config's stop strings off; whitespace is a prompt; null is "not given".
  assert requests[2].stop == () and requests[2].prompt == " "
  assert requests[2].temperature is None


def test_prompts_come_first_then_the_file_and_a_byte_order_mark_is_skipped(tmp_path,
                                                                            monkeypatch):
  path = tmp_path / "p.jsonl"
  path.write_bytes(b'\xef\xbb\xbf{"prompt": "from file \xe2\x80\xa8 ok"}\r\n')
  monkeypatch.chdir(tmp_path)  # A relative path is the working directory's.
  requests = decode_requests.from_flags(["one", "two"], "p.jsonl")
  assert [r.source for r in requests] == ["--prompt #1", "--prompt #2", "p.jsonl:1"]
  assert requests[2].prompt == "from file \u2028 ok"


# ----------------------------------------------------------------------------- refused requests


def test_no_prompts_at_all_says_which_flags_to_pass():
  for prompts in (None, []):
    text = _refused(decode_requests.from_flags, prompts, None)
    assert "--prompt=TEXT" in text and "--prompts_file=FILE.jsonl" in text, text


def test_an_empty_prompt_flag_is_refused():
  text = _refused(decode_requests.from_flags, ["ok", ""], None)
  assert text.startswith("--prompt #2='': an empty prompt; "), text
  text = _refused(decode_requests.from_flags, ["j\udcff"], None)
  assert text.startswith("--prompt #1='j\\udcff': holds"), text


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d / "missing.jsonl"), "no such file; give a JSON-lines file"),
    (lambda d: str(d), "is a directory"),
    (lambda d: _file(d, "\n \n\n"), "holds no requests"),
    (lambda d: _file(d, ""), "holds no requests"),
])
def test_files_that_hold_no_requests_are_refused(tmp_path, make, message):
  path = make(tmp_path)
  text = _refused(decode_requests.from_flags, None, path)
  assert text.startswith(f"--prompts_file={path}: {message}"), text


def test_an_unreadable_file_is_refused(tmp_path, monkeypatch):
  path = _file(tmp_path, ['{"prompt": "a"}'])

  real_open = os.open

  def refuse(name, *args, **kwargs):
    if os.fspath(name) == os.path.abspath(path):
      raise PermissionError(13, "Permission denied", os.fspath(name))
    return real_open(name, *args, **kwargs)

  # Not chmod: these tests may run as root, who reads any file.
  monkeypatch.setattr(os, "open", refuse)
  text = _refused(decode_requests.from_flags, None, path, "p.jsonl")
  assert text.startswith("--prompts_file=p.jsonl: cannot be read (Permission denied)"), text


def test_a_line_that_is_not_utf8_is_refused(tmp_path):
  path = tmp_path / "p.jsonl"
  path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
  text = _refused(decode_requests.from_flags, None, str(path), "p.jsonl")
  assert text.startswith("--prompts_file=p.jsonl line 2: byte 13 (0xff) is not UTF-8"), text


_ALL_FIELDS = ("prompt, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, stop")


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "a",}', "'{\"prompt\": \"a\",}' is not JSON (Expecting property name"),
    ("[1, 2]", "[1, 2] is a list, not a JSON object"),
    ('"text"', "'text' is a string, not a JSON object"),
    ("[" * 100_000 + "]" * 100_000, "is not a request (nests too deeply)"),
    ('{"prompt_ids": [' + "9" * 5000 + "]}", "is not a request (Exceeds the limit"),
    ('{"prompt": "a", "tmperature": 1}',
     f"unknown field 'tmperature'; did you mean 'temperature'? valid fields: {_ALL_FIELDS}"),
    ('{"prompt": "a", "prompt": "b"}', "field 'prompt' is given twice"),
    ('{"prompt": "a", "prompt_ids": [1]}', "gives both prompt and prompt_ids"),
    ('{"stop": "x"}', "gives neither prompt nor prompt_ids"),
    ('{"prompt": 3}', "prompt=3: must be a string, not an int"),
    ('{"prompt": ""}', "prompt='': is empty; give the text to continue"),
    ('{"prompt": "\\ud800"}', "prompt='\\ud800': holds '\\ud800' at character 0"),
    ('{"prompt_ids": []}', "prompt_ids=[]: is empty; give a non-empty list of token ids"),
    ('{"prompt_ids": "1 2"}', "prompt_ids='1 2': must be a list, not a string"),
    ('{"prompt_ids": [1, -2]}', "prompt_ids=[1, -2]: entry 1 is -2, not a token id"),
    ('{"prompt_ids": [1, 2.0]}', "prompt_ids=[1, 2.0]: entry 1 is 2.0, not a token id"),
    ('{"prompt_ids": [true]}', "prompt_ids=[True]: entry 0 is True, not a token id"),
    ('{"prompt_ids": [' + "1, " * 300 + "-1]}",
     "prompt_ids=<list of 301 items>: entry 300 is -1, not a token id"),
    ('{"prompt": "a", "max_new_tokens": 3.0}', "max_new_tokens=3.0: must be an int, not a "
     "float; write 3"),
    ('{"prompt": "a", "max_new_tokens": 1e3}', "max_new_tokens=1000.0: must be an int, not a "
     "float; write 1000"),
    ('{"prompt": "a", "max_new_tokens": 0}', "max_new_tokens=0: must be >= 1; give the most "
     "tokens"),
    ('{"prompt": "a", "max_new_tokens": true}', "max_new_tokens=True: must be an int, not a "
     "bool"),
    ('{"prompt": "a", "max_new_tokens": ' + "9" * 300 + "}",
     "max_new_tokens=<int of 997 bits>: must be below 2**31"),
    ('{"prompt": "a", "temperature": -0.5}', "temperature=-0.5: must be >= 0; give 0 to "
     "decode greedily"),
    ('{"prompt": "a", "temperature": NaN}', "temperature=nan: must be finite"),
    ('{"prompt": "a", "temperature": 1e999}', "temperature=inf: must be finite"),
    ('{"prompt": "a", "temperature": ' + "9" * 400 + "}",
     "temperature=<int of 1329 bits>: must be finite"),
    ('{"prompt": "a", "temperature": "0.5"}', "temperature='0.5': must be a number, not a "
     "string"),
    ('{"prompt": "a", "top_k": -1}', "top_k=-1: must be >= 0; give 0 to keep every token"),
    ('{"prompt": "a", "top_k": 4.5}', "top_k=4.5: must be an int, not a float"),
    ('{"prompt": "a", "top_p": 1.5}', "top_p=1.5: must be in (0, 1]; give 1 to keep"),
    ('{"prompt": "a", "top_p": 0}', "top_p=0: must be in (0, 1]"),
    ('{"prompt": "a", "top_p": false}', "top_p=False: must be a number, not a bool"),
    ('{"prompt": "a", "seed": -1}', "seed=-1: must be >= 0; give an int in [0, 2**63)"),
    ('{"prompt": "a", "seed": 9223372036854775808}',
     "seed=9223372036854775808: must be below 2**63"),
    ('{"prompt": "a", "top_k": 2147483648}', "top_k=2147483648: must be below 2**31"),
    ('{"prompt": "a", "temperature": 1e39}', "temperature=1e+39: is too large for float32"),
    ('{"prompt": "a", "top_p": 1e-40}', "top_p=1e-40: is too small for float32"),
    ('{"prompt": "a", "stop": ["x", ""]}', "stop=['x', '']: entry 1 is '', which would stop "
     "before any token; drop it"),
    ('{"prompt": "a", "stop": ""}', "stop='': is empty, which would stop before any token"),
    ('{"prompt": "a", "stop": [3]}', "stop=[3]: entry 0 is 3, not a string"),
    ('{"prompt": "a", "stop": {"x": 1}}', "stop={'x': 1}: must be a list of strings, not an "
     "object"),
])
def test_a_bad_line_is_one_line_naming_the_line_and_field(tmp_path, line, message):
  text = _refused(_from_file, tmp_path, ['{"prompt": "fine"}', "", line])
  assert text.startswith(f"--prompts_file=p.jsonl line 3: {message}"), text


def test_check_sampling_reads_well_for_the_config_too():
  sampling_checks.check_sampling("decode.", temperature=0, top_k=40, top_p=1, max_new_tokens=8,
                                 seed=0, stop=("\n",))
  sampling_checks.check_sampling("decode.")  # Nothing given, nothing to refuse.
  text = _refused(sampling_checks.check_sampling, "decode.", top_p=1.5)
  assert text.startswith("decode.top_p=1.5: must be in (0, 1]; give 1"), text
  text = _refused(sampling_checks.check_sampling, "decode.", stop="\n")
  assert text.startswith("decode.stop='\\n': must be a list of strings, not a string"), text
  sampling_checks.check_sampling("decode.", max_new_tokens=np.int64(3), temperature=np.float32(1))


def test_a_request_is_valid_once_constructed():
  text = _refused(Request, source="x", prompt="a", top_p=2.0)
  assert text.startswith("x: top_p=2.0: must be in (0, 1]"), text
  _refused(Request, source="x")


# ----------------------------------------------------------------------------- records


def _completion(**changes) -> Completion:
  fields = dict(
      request=Request(source="p.jsonl:3", prompt="Hi"), prompt_ids=(np.int32(5), 6),
      prompt_text="Hi", completion_ids=(7, 8, 9), completion_text=" there\x1b[31m\nend",
      logprobs=(np.float32(-0.5), -math.inf, math.nan), stop_reason="stop", stop_string="\n\n",
      settings={"max_new_tokens": 16, "temperature": np.float32(0.5), "top_k": 0, "top_p": 1.0,
                "seed": 0, "stop": ("\n\n",)},
      checkpoint_step=np.int64(100), prefill_seconds=0.25, decode_seconds=0.5)
  fields.update(changes)
  return Completion(**fields)


def test_a_record_is_strict_json_of_the_documented_keys():
  row = decode_records.record(_completion(), 4)
  assert set(row) == RECORD_KEYS
  text = json.dumps(row, allow_nan=False)
  assert json.loads(text) == row
  assert row["schema_version"] == 1 and row["index"] == 4 and row["source"] == "p.jsonl:3"
  assert row["prompt_ids"] == [5, 6] and row["completion_ids"] == [7, 8, 9]
  assert row["logprobs"] == [-0.5, None, None]  # Non-finite values are null, not NaN.
  assert row["settings"]["stop"] == ["\n\n"] and row["settings"]["temperature"] == 0.5
  assert row["checkpoint_step"] == 100
  assert row["timing"] == {"prefill_seconds": 0.25, "decode_seconds": 0.5,
                           "tokens_per_second": 4.0}
  one = decode_records.record(_completion(completion_ids=(7,), logprobs=(-1.0,),
                                           decode_seconds=0.0, prompt_text=None,
                                           completion_text=None), 0)
  assert one["timing"]["tokens_per_second"] is None and one["prompt"] is None
  with pytest.raises(ValueError):
    decode_records.record(_completion(stop_reason="length"), 0)
  with pytest.raises(ValueError):
    decode_records.record(_completion(logprobs=(0.0,)), 0)


def test_the_human_form_escapes_control_characters():
  text = decode_records.format_human(_completion())
  assert text.splitlines()[0] == ("p.jsonl:3: 3 tokens, stopped at stop string '\\n\\n', "
                                  "4.0 tokens/s")
  assert "\x1b" not in text and "\\x1b[31m" in text
  assert "completion:  there\\x1b[31m\n              end" in text
  ids = decode_records.format_human(_completion(prompt_text=None, completion_text=None,
                                                 stop_reason="eos"))
  assert "prompt:     [5, 6]" in ids and "completion: [7, 8, 9]" in ids and "at eos" in ids


# ----------------------------------------------------------------------------- the writer

_NOW = 1796156353.0  # 2026-12-01 20:19:13 UTC.


def test_the_default_is_a_new_file_in_job_decode_never_an_existing_one(tmp_path, capsys):
  job = epath.Path(tmp_path / "job")
  (job / "decode").mkdir(parents=True)
  (job / "decode" / "20261201T201913Z.jsonl").write_text("old\n")
  (job / "decode" / "20261201T201913Z-2.jsonl.partial").write_text("running\n")
  with CompletionWriter("", job, "job", now=lambda: _NOW) as writer:
    assert writer.path == job / "decode" / "20261201T201913Z-3.jsonl"
    assert not writer.path.exists()  # Only `.partial` until the close.
    writer.write(_completion(), 0)
    writer.write(_completion(), 1)
    lines = (job / "decode" / "20261201T201913Z-3.jsonl.partial").read_text().splitlines()
    assert len(lines) == 2  # Flushed line by line, readable as it goes.
  rows = [json.loads(line) for line in writer.path.read_text().splitlines()]
  assert [row["index"] for row in rows] == [0, 1] and set(rows[0]) == RECORD_KEYS
  assert rows[0]["completion"] == " there\x1b[31m\nend"
  assert (job / "decode" / "20261201T201913Z.jsonl").read_text() == "old\n"
  assert capsys.readouterr().out == ""  # Not a terminal: nothing on stdout.
  assert sorted(p.name for p in (job / "decode").iterdir()) == [
      "20261201T201913Z-2.jsonl.partial", "20261201T201913Z-3.jsonl", "20261201T201913Z.jsonl"]


def test_the_job_decode_folder_is_made_with_the_first_completion_only(tmp_path):
  job = epath.Path(tmp_path / "job")
  job.mkdir()
  with CompletionWriter(None, job, "job", now=lambda: _NOW):
    pass
  assert not list(job.iterdir())  # Nothing to write: no folder, no empty file.
  with pytest.raises(RuntimeError):
    with CompletionWriter(None, job, "job", now=lambda: _NOW):
      raise RuntimeError("a corrupt checkpoint, before any completion")
  assert not list(job.iterdir())
  with CompletionWriter(None, job, "job", now=lambda: _NOW) as writer:
    writer.write(_completion(), 0)
  assert len(writer.path.read_text().splitlines()) == 1 and writer.path.parent.name == "decode"
  text = _refused(CompletionWriter, None, None, None)
  assert text.startswith("--decode_out=: no job dir"), text


def test_a_failed_run_leaves_a_partial_file_or_none(tmp_path):
  out = tmp_path / "out.jsonl"
  with pytest.raises(RuntimeError):
    with CompletionWriter(str(out), None, None) as writer:
      writer.write(_completion(), 0)
      raise RuntimeError("killed")
  assert not out.exists() and len((tmp_path / "out.jsonl.partial").read_text().splitlines()) == 1
  with pytest.raises(RuntimeError):
    with CompletionWriter(str(tmp_path / "b.jsonl"), None, None):
      raise RuntimeError("failed before any completion")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl.partial"]


def test_a_given_path_is_never_overwritten(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "taken.jsonl").write_text("keep")
  text = _refused(CompletionWriter, "taken.jsonl", None, None)
  assert text.startswith("--decode_out=taken.jsonl: already exists"), text
  assert (tmp_path / "taken.jsonl").read_text() == "keep"
  (tmp_path / "busy.jsonl.partial").write_text("another run's")
  text = _refused(CompletionWriter, "busy.jsonl", None, None)
  assert text.startswith("--decode_out=busy.jsonl: busy.jsonl.partial exists"), text
  text = _refused(CompletionWriter, "no/such/out.jsonl", None, None)
  assert text.startswith(f"--decode_out=no/such/out.jsonl: its folder {tmp_path}/no/such "
                         "does not exist"), text
  text = _refused(CompletionWriter, ".", None, None)
  assert text.startswith("--decode_out=.: is a directory"), text
  with CompletionWriter("new.jsonl", None, None) as writer:  # Relative to the cwd.
    writer.write(_completion(), 0)
  assert writer.path == epath.Path(tmp_path / "new.jsonl") and writer.count == 1


def test_a_terminal_also_gets_the_human_form(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
  with CompletionWriter(str(tmp_path / "out.jsonl"), None, None) as writer:
    writer.write(_completion(), 0)
  out = capsys.readouterr().out
  assert out.startswith("p.jsonl:3: 3 tokens, stopped at stop string") and "{" not in out, out


def test_dash_is_json_lines_on_stdout_even_at_a_terminal(capsys, monkeypatch):
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
  with CompletionWriter("-", None, None) as writer:
    writer.write(_completion(), 0)
    writer.write(_completion(completion_text="\u00e9"), 1)
  assert writer.path is None
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 and all(line.isascii() for line in lines)
  rows = [json.loads(line) for line in lines]
  assert set(rows[0]) == RECORD_KEYS and rows[1]["completion"] == "\u00e9"
