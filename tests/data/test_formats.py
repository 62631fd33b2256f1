"""tasks/formats/: each FORMATS entry makes the task its factory makes, with the flag values
given; bin/build_store.py takes its choices and flags from the table, so a new entry needs no
edit of the tool."""

import importlib.util
import json
import os
import sys

import pytest

from lingvo_lite.data.pretrained_tokenizer import PretrainedTokenizer
from tasks import formats
from tasks.formats import chat, jsonl, parquet, preference, prompt_completion
from tasks.formats import text as text_format, tfrecord
from tests.data import chat_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _files(tmp_path):
  """One small file of each format; the JSON and Parquet ones hold their text under names that
  are not the defaults, so an entry that passed a default instead of the flag would fail."""
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet  # pylint: disable=g-import-not-at-top,unused-import
  (tmp_path / "a.txt").write_text("one document\nin two lines\n")
  (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x", "q": "1+1=", "a": "2"}) + "\n")
  pyarrow.parquet.write_table(pyarrow.table({"content": ["a row"]}), tmp_path / "a.parquet")
  (tmp_path / "a.tfrecord").write_bytes(b"not read until the task is made")
  files = {name: {"train": str(tmp_path / f"a.{name}")}
           for name in ("txt", "jsonl", "parquet", "tfrecord")}
  # The chat-templated formats read with a pretrained tokenizer's template.
  files["tokenizer"] = PretrainedTokenizer(chat_tokenizers.byte_level_folder(tmp_path / "tok"))
  return files


# (format, its settings as flags give them, the factory call the table must amount to).
CASES = [
    ("text", {}, lambda f: text_format.text_files_task(f["txt"], None, unit="file")),
    ("lines", {}, lambda f: text_format.text_files_task(f["txt"], None, unit="line")),
    ("jsonl", {"text_field": "body"},
     lambda f: jsonl.json_lines_task(f["jsonl"], None, text_field="body")),
    ("prompt_completion", {"prompt_field": "q", "completion_field": "a"},
     lambda f: prompt_completion.prompt_completion_task(f["jsonl"], None, "q", "a")),
    ("parquet", {"text_column": "content"},
     lambda f: parquet.parquet_task(f["parquet"], None, text_column="content")),
    ("tfrecord", {"vocab_size": 300},
     lambda f: tfrecord.pretokenized_tfrecord_task(f["tfrecord"], 300)),
    ("chat", {"skip_bad_records": True},
     lambda f: chat.chat_task(f["jsonl"], f["tokenizer"], skip_bad_records=True)),
    ("preference", {"skip_bad_records": False},
     lambda f: preference.preference_task(f["jsonl"], f["tokenizer"], skip_bad_records=False)),
]


def test_every_format_is_a_case_here():
  assert [name for name, _, _ in CASES] == list(formats.FORMATS)


@pytest.mark.parametrize("name, settings, reference", CASES, ids=[c[0] for c in CASES])
def test_an_entry_makes_the_task_its_factory_makes(tmp_path, name, settings, reference):
  files = _files(tmp_path)
  entry = formats.FORMATS[name]
  assert sorted(s.name for s in entry.settings) == sorted(settings)
  source = {"text": "txt", "lines": "txt", "prompt_completion": "jsonl", "chat": "jsonl",
            "preference": "jsonl"}.get(name, name)
  vocabulary = files["tokenizer"] if name in ("chat", "preference") else None
  made = entry.read(files[source], vocabulary, settings)
  # The name hashes the kind, the matched files and every setting: the same name is the same
  # task, and another text field or column would give another one.
  assert made.name == reference(files).name
  assert made.name.startswith("local_")


def test_tfrecord_without_vocab_size_is_the_tools_one_line():
  with pytest.raises(Exception, match=r"^--vocab_size: required with --format=tfrecord \(ids "
                     r"are kept as they are\)$"):
    formats.FORMATS["tfrecord"].read({"train": "x"}, None, {"vocab_size": None})


def test_settings_are_listed_once_in_table_order_and_conflicts_refused(monkeypatch):
  assert [s.name for s in formats.all_settings()] == [
      "text_field", "prompt_field", "completion_field", "text_column", "vocab_size",
      "skip_bad_records"]
  shared = formats.Format(lambda *_: None, (formats.Setting("text_column", "text", help=(
      "the Parquet column holding the text (default: text)")),))
  monkeypatch.setitem(formats.FORMATS, "feather", shared)
  assert [s.name for s in formats.all_settings()].count("text_column") == 1
  clash = formats.Format(lambda *_: None, (formats.Setting("text_column", "body"),))
  monkeypatch.setitem(formats.FORMATS, "feather", clash)
  with pytest.raises(ValueError, match="FORMATS\\['feather'\\] declares the setting "
                                       "'text_column' unlike an earlier format"):
    formats.all_settings()


def _load_tool(monkeypatch):
  """bin/build_store.py as a module, its changes to sys.path and the environment undone after."""
  monkeypatch.setattr(sys, "path", list(sys.path))
  for key in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES"):
    monkeypatch.setenv(key, os.environ.get(key, ""))
  spec = importlib.util.spec_from_file_location("build_store_under_test",
                                                os.path.join(ROOT, "bin", "build_store.py"))
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  return tool


def test_a_new_entry_is_a_format_of_the_tool_with_its_flag(monkeypatch, capsys):
  made = []

  def read(files, vocabulary, settings):
    made.append((files, vocabulary, dict(settings)))
    return "the task"

  monkeypatch.setitem(formats.FORMATS, "csv", formats.Format(
      read, (formats.Setting("csv_column", "text", help="the CSV column of the text"),)))
  tool = _load_tool(monkeypatch)
  args = tool._parse(["--format=csv", "--files=train=a.csv", "--csv_column=body", "--out=x"])
  assert tool._task(args) == "the task"
  assert made == [({"train": "a.csv"}, None, {"csv_column": "body"})]
  args = tool._parse(["--format=csv", "--files=train=a.csv", "--out=x"])
  tool._task(args)
  assert made[-1][2] == {"csv_column": "text"}  # The table's default.
  with pytest.raises(SystemExit):
    tool._parse(["--help"])
  assert "--csv_column CSV_COLUMN" in capsys.readouterr().out
  # With --task the format's flag would be ignored, and is refused like the others.
  with pytest.raises(Exception, match="--task: --csv_column would be ignored"):
    tool._parse(["--task=tasks.pycode.pycode_task", "--csv_column=body", "--out=x"])
