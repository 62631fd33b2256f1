"""The config as a picture (`lingvo_lite.config.graph`) and `--mode=print --format=...`."""

import xml.etree.ElementTree as ElementTree

from etils import epath

from lingvo_lite.config import files as config_files, graph as config_graph
from lingvo_lite.testing import run_cli, tiny_config

SVG = "{http://www.w3.org/2000/svg}"
PRINT = ["--mode=print", "--exp=PyCodeTiny", "--fdl.model.num_layers=3"]


def _nodes_and_edges(svg: str) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
  """Each drawn node's texts in order, by Graphviz's node name, and the edges between them."""
  root = ElementTree.fromstring(svg)
  assert root.tag == f"{SVG}svg"
  nodes, edges = {}, []
  for group in root.iter(f"{SVG}g"):
    title = group.find(f"{SVG}title").text if group.find(f"{SVG}title") is not None else ""
    if group.get("class") == "node":
      nodes[title] = [(t.text or "").strip("\xa0 ") for t in group.iter(f"{SVG}text")]
    elif group.get("class") == "edge":
      ends = title.split("--")
      edges.append(tuple(end.partition(":")[0] for end in ends))
  return nodes, edges


def _node(nodes: dict[str, list[str]], header: str) -> str:
  found = [name for name, texts in nodes.items() if texts[:2] == ["Config:", header]]
  assert len(found) == 1, (header, nodes)
  return found[0]


def test_print_svg_draws_each_part_with_its_fields_and_where_it_is_used():
  result = run_cli(PRINT + ["--format=svg"])
  assert result.code == 0, result.stderr
  nodes, edges = _nodes_and_edges(result.stdout)
  setup, model = _node(nodes, "Setup"), _node(nodes, "GptJ")
  texts = nodes[model]
  # A field's value is the cell after its name; the command line's value is the one drawn.
  assert texts[texts.index("num_layers") + 1] == "3"
  assert texts[texts.index("dim") + 1] == "128"
  optimizer = nodes[_node(nodes, "AdamW")]
  assert optimizer[optimizer.index("peak_learning_rate") + 1] == "0.003"
  assert {"model", "optimizer", "train_data", "eval_data"} <= set(nodes[setup])
  assert (setup, model) in edges
  # The train and the eval data share one task: drawn once, with an edge from each.
  task = _node(nodes, "pycode_task")
  users = {end for edge in edges if task in edge for end in edge if end != task}
  assert {nodes[u][1] for u in users} == {"TokenStoreData"} and len(users) == 2


def test_a_long_value_is_cut_in_the_picture_only():
  cfg = tiny_config("PyCodeTiny")
  long_dir = "/data/" + "x" * 100 + "/corpus_end"
  cfg.train_data.task.source_dir = long_dir
  nodes, _ = _nodes_and_edges(config_graph.svg(cfg))
  texts = nodes[_node(nodes, "pycode_task")]
  shown = texts[texts.index("source_dir") + 1]
  assert shown.startswith("'/data/xxx") and shown.endswith("/corpus_end'") and "..." in shown
  assert len(shown) <= config_graph.MAX_VALUE_CHARS
  assert cfg.train_data.task.source_dir == long_dir  # The config itself is unchanged.


def test_print_json_reloads_as_the_same_config(tmp_path):
  printed = run_cli(PRINT + ["--format=json"])
  text = run_cli(PRINT)  # --format=text is the default.
  assert printed.code == 0 and text.code == 0, printed.stderr + text.stderr
  path = tmp_path / "config.json"
  path.write_text(printed.stdout)
  # Every field, value and origin (the command line's num_layers too) survives the reload.
  assert config_files.to_text(config_files.load(epath.Path(path))) == text.stdout
  assert "model.num_layers = 3" in text.stdout


def test_format_mistakes_are_one_line():
  bogus = run_cli(PRINT + ["--format=bogus"])
  assert bogus.code == 2 and bogus.stdout == ""
  assert bogus.stderr.strip().splitlines() == [
      "lingvo_lite: error: flag --format=bogus: value should be one of <text|json|svg>"]
  train = run_cli(["--mode=train", "--exp=PyCodeTiny", "--job_log_dir=unused", "--format=json"])
  assert train.code == 2 and len(train.stderr.strip().splitlines()) == 1
  assert train.stderr.startswith("lingvo_lite: error: --format: --mode=train does not use this "
                                 "flag (only --mode=print reads it)")


def test_without_graphviz_dot_svg_is_one_line_naming_the_fix(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # No `dot` here.
  result = run_cli(PRINT + ["--format=svg"])
  assert result.code == 2 and result.stdout == ""
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "dot program" in lines[0], lines
  assert lines[0].endswith("install Debian's graphviz: apt-get install graphviz, or run "
                           "bin/setup.sh")
