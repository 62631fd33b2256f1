"""A program's options (programs/options.py) become its flags: the kind of each flag follows the
field's type, the executor defines one flag per option with the program's help text, a flag
two programs share is declared alike, and a program gets its own options filled from the
command line."""

import dataclasses
from typing import Literal

import pytest
from absl import flags

from lingvo_lite import command_line, programs
from lingvo_lite.programs import options as program_options
from lingvo_lite.programs.options import option


@dataclasses.dataclass(frozen=True)
class _Every:
  """One option of each kind."""

  switch: bool = option(False, "a bool")
  count: int | None = option(None, "an int")
  ratio: float = option(0.5, "a float")
  text: str | None = option(None, "a plain string")
  name: str | None = option(None, "a string refused empty", non_empty=True)
  choice: Literal["a", "b"] = option("a", "an enum")
  items: list[str] | None = option(None, "a comma-separated list")
  names: list[str] = option([], "a list refused empty", non_empty=True)
  each: list[str] | None = option(None, "one flag per value", repeated=True)


def test_the_kind_of_each_flag_follows_the_fields_type():
  declared = {d.name: d for d in program_options.declared(_Every)}
  assert {name: d.kind for name, d in declared.items()} == {
      "switch": "bool", "count": "integer", "ratio": "float", "text": "string",
      "name": "string", "choice": "enum", "items": "list", "names": "list",
      "each": "multi_string"}
  assert [name for name, d in declared.items() if d.non_empty] == ["name", "names"]
  assert declared["choice"].choices == ("a", "b")
  assert (declared["ratio"].default, declared["ratio"].help) == (0.5, "a float")
  # A list default is each instance's own.
  assert _Every().names == [] and _Every().names is not _Every().names


def test_a_field_without_a_flag_kind_or_help_is_refused():
  @dataclasses.dataclass(frozen=True)
  class Untyped:
    pairs: dict[str, int] | None = option(None, "no flag kind")

  @dataclasses.dataclass(frozen=True)
  class Undocumented:
    count: int = 3

  with pytest.raises(TypeError, match=r"Untyped\.pairs: type .* has no flag kind"):
    program_options.declared(Untyped)
  with pytest.raises(TypeError, match=r"Undocumented\.count: declare it with "):
    program_options.declared(Undocumented)


def test_a_flag_two_programs_declare_is_one_flag_declared_alike():
  @dataclasses.dataclass(frozen=True)
  class First:
    step: int | None = option(None, "the step")

  @dataclasses.dataclass(frozen=True)
  class Same:
    step: int | None = option(None, "the step")
    other: bool = option(False, "another")

  @dataclasses.dataclass(frozen=True)
  class OtherHelp:
    step: int | None = option(None, "a step")

  assert [d.name for d in program_options.declared_options([First, Same])] == ["step", "other"]
  with pytest.raises(TypeError, match=r"^--step: declared differently by "):
    program_options.declared_options([First, OtherHelp])


def test_the_executor_defines_each_programs_options_with_their_help():
  from lingvo_lite import executor  # pylint: disable=import-outside-toplevel  # Defines flags.
  own = {flag.name for flag in flags.FLAGS.get_key_flags_for_module(executor)}
  readers: dict[str, list[str]] = {}
  for program in programs.PROGRAMS.values():
    for declared in program_options.declared(program.options_class):
      readers.setdefault(declared.name, []).append(program.name)
      flag = flags.FLAGS[declared.name]
      assert declared.name in own, declared.name  # --help lists it with the executor's.
      # absl adds words of its own to an enum's help (the choices) and a repeated flag's.
      assert declared.help in flag.help, declared.name
      assert flag.default == declared.default, declared.name
      if declared.non_empty:  # Refuses `--name=`, as the executor's other names do.
        parser = (command_line.NonEmptyListParser if declared.kind == "list"
                  else command_line.NonEmptyParser)
        assert isinstance(flag.parser, parser), declared.name
  # Flags that several programs read, each declared once (programs/options.py).
  shared = {"checkpoint_step": ["eval", "decode", "serve", "export"],
            "init_from": ["train", "eval", "decode", "serve", "export", "compile", "print"]}
  assert {flag: readers[flag] for flag in shared} == shared
  assert all(len(names) == 1 for flag, names in readers.items() if flag not in shared)
  assert programs.PROGRAMS["list"].flags == ()
  assert programs.PROGRAMS["compile"].flags[:2] == ("compile_topology", "compile_num_slices")
