"""Each recorded TPU compile judged by the earlier rule and by today's (compile_report.deciding).

  python bench/results/2026-12-07/rejudge/rejudge.py [REPORT_OR_FOLDER ...]

Before 41006c8 a TPU step with no host-memory state was judged by the larger of XLA:TPU's
heap-simulated peak and arguments + outputs - aliased + temporaries + generated code (the
report's `total`); since, by the peak (less the host-memory arguments and outputs, as both
rules did for offloaded state). A compile XLA:TPU refused (RESOURCE_EXHAUSTED) is judged by
the bytes its error states under both. Reads a compile report.json (its `memory`, and each row
of `optimizer_options` / `remat_policies` and `max_batch` where present), a folder of them, or
a JSON of named reports (bench/results/2026-12-06/gptj_finetune_lora_compile.json); with no
argument, the reports beside this file and that GPT-J file.
"""

import glob
import json
import os
import sys

GIB = 2**30
HERE = os.path.dirname(os.path.abspath(__file__))


def judged(memory: dict) -> tuple[float, float, float]:
  """(the earlier rule's bytes, today's, the available bytes) of a report's `memory`, in GiB."""
  available = memory["available"] / GIB
  if memory.get("source") != "memory_analysis" or not memory.get("peak"):
    return memory["deciding"] / GIB, memory["deciding"] / GIB, available
  host = memory.get("host", {})
  offloaded = host.get("arguments", 0) + host.get("outputs", 0) - host.get("aliased", 0)
  new = (memory["peak"] - offloaded) / GIB
  old = new if offloaded else max(memory["peak"], memory["total"]) / GIB
  return old, new, available


def line(name: str, memory: dict) -> str:
  old, new, available = judged(memory)
  verdict = lambda gib: "FITS" if gib <= available else "DOES NOT FIT"  # pylint: disable=unnecessary-lambda-assignment
  how = memory.get("source")
  return (f"{name}: earlier {verdict(old)} {old:.3f} -> today {verdict(new)} {new:.3f} of "
          f"{available:.2f} GiB ({how})")


def rows(name: str, report: dict):
  """A line per judged compile of a report: its own, each table row's, each batch searched."""
  if report.get("memory"):
    memory = dict(report["memory"])
    for function, each in (report.get("functions") or {}).items():  # A decode report.
      if "peak" in each:
        memory = {**each, "available": memory["available"], "source": memory["source"]}
      yield line(f"{name} [{function}]", memory)
    if not report.get("functions"):
      yield line(name, memory)
  for table in ("optimizer_options", "remat_policies"):
    for row in (report.get(table) or {}).get("rows", []):
      label = row.get(report[table]["column"], "?")
      yield (f"{name} [{table} {label}]: today {row['verdict']} {row['bytes'] / GIB:.3f} of "
             f"{row['available'] / GIB:.2f} GiB")
  for row in (report.get("max_batch") or {}).get("policies", []):
    label = next((row[k] for k in ("optimizer_option", "remat_policy") if k in row), "?")
    tried = ", ".join(f"{c['per_device_batch_size']}: {c['bytes'] / GIB:.2f} of "
                      f"{c['available'] / GIB:.2f} {'fits' if c['fits'] else 'no'}"
                      for c in row["compiles"])
    yield f"{name} [max batch {label}]: {row['max_per_device_batch_size']} ({tried})"


def main(paths: list[str]) -> None:
  if not paths:
    paths = sorted(glob.glob(os.path.join(HERE, "*", "report.json"))) + [
        os.path.join(HERE, "..", "..", "2026-12-06", "gptj_finetune_lora_compile.json")]
  for path in paths:
    if os.path.isdir(path):
      path = os.path.join(path, "report.json")
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if "memory" in data or "verdict" in data and "schema" in data:
      for text in rows(os.path.basename(os.path.dirname(path)), data):
        print(text)
    else:
      for name, report in data.items():
        for text in rows(name, report):
          print(text)


if __name__ == "__main__":
  main(sys.argv[1:])
