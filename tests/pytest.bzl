"""`py_pytest_test`: a py_test that runs pytest on one test file."""

# What a test that runs `python -m lingvo_lite`'s programs in its own process
# (`lingvo_lite.testing.run_cli`) on the registered experiments imports.
CLI_DEPS = [
    "//experiments",
    "//lingvo_lite:main",
    "//lingvo_lite:testing",
]

# What a test that runs the README's commands, or bin/demo.sh, in a working copy of the
# repository reads: the README, the lock (setup), bench/ and bin/ ...
README_DATA = [
    "//:readme",
    "//:requirements_lock",
    "//bench:files",
    "//bin:scripts",
]

# ... and what those commands import.
README_DEPS = [
    "//bin:tools",
    "//lingvo_lite:tool_arguments",
    "//experiments",
    "//lingvo_lite",
    "//tasks",
]

def py_pytest_test(name, src = None, deps = [], args = [], data = [], **kwargs):
    """One test file, run by pytest (so fixtures, parametrize and markers work as usual), with
    tests/conftest.py.

    Args:
      name: target name; the file is `<name>.py` unless `src` says otherwise.
      src: the test file.
      deps: libraries the test imports (third-party packages come from the venv).
      args: extra pytest arguments.
      data: extra runtime files.
      **kwargs: passed to py_test (size, timeout, tags, env, ...).
    """
    src = src or name + ".py"
    native.py_test(
        name = name,
        srcs = [
            "//tests:pytest_runner.py",
            "//tests:__init__.py",
            src,
        ] + ([] if native.package_name() == "tests" else ["__init__.py"]),
        main = "//tests:pytest_runner.py",
        args = ["$(rootpath %s)" % src] + args,
        # pyproject.toml: pytest's rootdir and [tool.pytest.ini_options] (markers).
        data = data + ["//:pyproject"],
        # tests/conftest.py: the caches every test process shares (standard library only).
        deps = deps + ["//tests:conftest"],
        **kwargs
    )

def py_pytest_shards(name, shards, **kwargs):
    """One test file as several targets, each running the tests a `-k` expression selects, so
    that no one of them is a long tail of the suite.

    Args:
      name: the file is `<name>.py`; each target is `<name><suffix>`.
      shards: suffix -> pytest `-k` expression (Bazel splits args as a shell does: quote an
        expression with spaces).
      **kwargs: passed to py_pytest_test (size, timeout, deps, ...).
    """
    for suffix, expression in shards.items():
        py_pytest_test(
            name = name + suffix,
            src = name + ".py",
            args = ["-k", expression],
            **kwargs
        )

def python_files():
    """This package's Python files as the filegroup `python_files`, for //tests:test_house (its
    function rule reads every test file)."""
    native.filegroup(
        name = "python_files",
        srcs = native.glob(["*.py"]),
        visibility = ["//tests:__pkg__"],
    )
