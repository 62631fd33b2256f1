"""Job-dir paths that cannot serve a mode are one UsageError before anything is written:
what `paths.resolve` makes of the flag's text, and what `job_dirs.check` finds on disk."""

import os

import pytest
from etils import epath

from lingvo_lite import paths, programs
from lingvo_lite.errors import UsageError
from lingvo_lite.runtime import job_dirs
from tests.trained_jobs import tree_digest


def _files(mode):
  """What the program of `mode` does with a job dir, as its module declares it."""
  return programs.PROGRAMS[mode].job_files


def _refused(job_dir, mode="train", profile=False, message=""):
  with pytest.raises(UsageError) as error:
    job_dirs.check(epath.Path(job_dir), _files(mode), str(job_dir), profile=profile,
                   eval_sets=("validation", "held_out"))
  text = str(error.value)
  assert text.startswith(f"--job_log_dir={job_dir}: ") and "\n" not in text, text
  assert message in text, text
  return text


# ----------------------------------------------------------------------------- paths.resolve


def test_file_urls_are_local_paths(tmp_path):
  assert paths.resolve(f"file://{tmp_path}/a%20b#c") == epath.Path(f"{tmp_path}/a b#c")
  assert paths.resolve("file://localhost/x/y") == epath.Path("/x/y")
  assert not paths.is_remote(str(paths.resolve(f"file://{tmp_path}")))


@pytest.mark.parametrize("text, message", [
    ("file://otherhost/x", "--job_log_dir=file://otherhost/x: names host 'otherhost'"),
    ("foo://bucket/x", "--job_log_dir=foo://bucket/x: unknown URL scheme 'foo://'; give a local "
     "path, a file:// URL, or a URL of one of"),
    ("j\udcff", "--job_log_dir=j\\xff: the path "),
])
def test_paths_no_program_could_use_are_one_usage_error(text, message):
  with pytest.raises(UsageError) as error:
    paths.resolve(text, "--job_log_dir")
  assert str(error.value).startswith(message), str(error.value)


def test_a_relative_path_in_a_deleted_working_directory_is_one_usage_error(tmp_path,
                                                                            monkeypatch):
  gone = tmp_path / "gone"
  gone.mkdir()
  monkeypatch.chdir(gone)
  gone.rmdir()
  with pytest.raises(UsageError, match="--job_log_dir=new: is relative, but the working "
                                       "directory is gone"):
    paths.resolve("new", "--job_log_dir")
  assert paths.resolve(str(tmp_path / "abs")) == epath.Path(tmp_path / "abs")


def test_remote_urls_are_kept():
  assert str(paths.resolve("gs://bucket/job")) == "gs://bucket/job"


# ----------------------------------------------------------------------------- job_dirs.check


# What each program creates or writes in a job dir (parents first), written out here as
# job_dirs' own table held it before each program declared its own (JOB_FILES).
_F, _D = job_dirs.FILE, job_dirs.FOLDER
WRITTEN = {
    "train": (("checkpoints", _D), ("summaries", _D), ("summaries/train", _D),
              ("config.json", _F), ("config.txt", _F), ("metrics.jsonl", _F),
              ("run_info.jsonl", _F), ("stacks", _D), (".lingvo_lite.lock", _F),
              ("train.log", _F)),
    "eval": (("eval", _D), ("eval/summaries", _D), ("eval/evaluated.json", _F),
             ("eval/.lingvo_lite.lock", _F)),
    "report": (("report", _D), ("report/index.html", _F), ("report/compare.html", _F),
               ("report/config.svg", _F), ("report/.verified.json", _F)),
    "compile": (("compile", _D), ("compile/report.txt", _F), ("compile/report.json", _F)),
    # A job dir export makes (a weight source's model) records its config.
    "export": (("config.json", _F), ("config.txt", _F)),
}


def test_each_program_declares_what_it_writes_in_the_job_dir():
  for name, program in programs.PROGRAMS.items():
    files = program.job_files
    assert files.written == WRITTEN.get(name, ()), name
    assert files.creates == (name in ("train", "compile", "export")), name
    assert files.kind_only == ((("decode", _D),) if name == "decode" else ()), name
    # Decode, serve and eval run on a new job dir from --exp (a weight source's model) and
    # record its config there; one with a config they only read.
    assert files.records_config == (name in ("decode", "serve", "eval")), name
    assert files.eval_sets_under == {"train": "", "eval": "eval/"}.get(name), name
    assert files.when_profiling == ((
        ("summaries/train/plugins", _D), ("summaries/train/plugins/profile", _D))
        if name == "train" else ()), name


@pytest.fixture(name="job")
def fixture_job(tmp_path):
  """A job dir as training leaves it."""
  job = tmp_path / "job"
  for folder in ("checkpoints/2", "summaries/train", "summaries/eval_validation",
                 "summaries/eval_held_out"):
    (job / folder).mkdir(parents=True)
  for name in ("config.json", "config.txt", "metrics.jsonl", "eval_validation.jsonl",
               "eval_held_out.jsonl"):
    (job / name).write_text("{}")
  return job


@pytest.mark.parametrize("mode", ["train", "eval", "print"])
def test_a_trained_job_serves_every_mode_and_stays_as_it_was(job, mode):
  before = tree_digest(job.parent)
  job_dirs.check(epath.Path(job), _files(mode), str(job), profile=mode == "train",
                 eval_sets=("validation", "held_out"))
  assert tree_digest(job.parent) == before  # The creatability probe is gone again.


def test_a_new_job_dir_is_checked_where_it_would_be_created(tmp_path):
  before = tree_digest(tmp_path)
  job_dirs.check(epath.Path(tmp_path / "a" / "b"), _files("train"), "a/b")
  assert tree_digest(tmp_path) == before and not os.listdir(tmp_path)
  _refused(tmp_path / "missing", mode="report", message="no such folder")


@pytest.mark.parametrize("mode", ["decode", "eval"])
def test_decode_and_eval_record_a_config_only_where_there_is_none(tmp_path, mode):
  # A missing job dir: where it would be created is checked, nothing is made.
  job_dirs.check(epath.Path(tmp_path / "new"), _files(mode), "new")
  assert not os.listdir(tmp_path)
  # A job dir with its config: the config is read, never written, so what is in the way of
  # writing one does not matter.
  job = tmp_path / "job"
  (job / "config.txt").mkdir(parents=True)
  (job / "config.json").write_text("{}")
  job_dirs.check(epath.Path(job), _files(mode), str(job))
  # Without a config, one is to be written there: what is in the way is refused in one line.
  (job / "config.json").unlink()
  _refused(job, mode=mode, message="config.txt is a folder, not a file")


@pytest.mark.parametrize("mode, relative, profile, message", [
    ("train", "summaries/train", False, "summaries/train is a file, not a folder"),
    ("train", "summaries/eval_held_out", False, "summaries/eval_held_out is a file, not a "
     "folder"),
    ("train", "summaries/train/plugins", True, "summaries/train/plugins is a file, not a "
     "folder"),
    ("eval", "eval", False, "eval is a file, not a folder"),
    ("eval", "eval/summaries", False, "eval/summaries is a file, not a folder"),
    ("eval", "eval/summaries/eval_held_out", False, "eval/summaries/eval_held_out is a file, "
     "not a folder"),
    ("eval", "checkpoints", False, "checkpoints is a file, not a folder"),
])
def test_every_folder_a_mode_creates_must_not_be_a_file(job, mode, relative, profile, message):
  path = job / relative
  if path.is_dir():
    for child in sorted(path.rglob("*"), reverse=True):
      child.rmdir()
    path.rmdir()
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("x")
  _refused(job, mode, profile, message)


def test_profile_is_checked_only_when_the_run_profiles(job):
  (job / "summaries" / "train").mkdir(parents=True, exist_ok=True)
  (job / "summaries" / "train" / "plugins").write_text("x")
  job_dirs.check(epath.Path(job), _files("train"), str(job))


@pytest.mark.parametrize("relative", ["eval/eval_held_out.jsonl", "eval/evaluated.json",
                                      "eval_validation.jsonl", ".lingvo_lite.lock",
                                      "train.log"])
def test_every_file_a_mode_writes_must_not_be_a_folder(job, relative):
  if (job / relative).exists():
    (job / relative).unlink()
  (job / relative).mkdir(parents=True)
  _refused(job, "eval" if relative.startswith("eval/") else "train",
           message=f"{relative} is a folder, not a file")


def test_symlinks_that_lead_nowhere_are_refused(tmp_path, job):
  (tmp_path / "dangling").symlink_to(tmp_path / "no_such_target")
  _refused(tmp_path / "dangling", message="is a symlink whose target does not exist (-> ")
  _refused(tmp_path / "dangling", mode="eval", message="is a symlink whose target")
  _refused(tmp_path / "dangling" / "job", message="is a symlink whose target")
  (tmp_path / "loop").symlink_to("loop")
  _refused(tmp_path / "loop", message="is a symlink loop (-> loop)")
  (job / "checkpoints").rename(tmp_path / "moved")
  (job / "checkpoints").symlink_to(tmp_path / "gone")
  _refused(job, message="checkpoints is a symlink whose target does not exist")
  _refused(job, mode="eval", message="checkpoints is a symlink whose target does not exist")
  (job / "checkpoints").unlink()
  (job / "checkpoints").symlink_to(tmp_path / "moved")  # A link to a folder is fine.
  job_dirs.check(epath.Path(job), _files("train"), str(job))


def test_names_and_paths_longer_than_the_file_system_takes_are_refused(tmp_path):
  _refused(tmp_path / ("j" * 300), message="the name jjjjjjjjjjjjjjjjjjjjjjjj... is 300 bytes "
           "long, and this file system allows 255")
  deep = tmp_path.joinpath(*["d" * 200] * 21)
  _refused(deep, message="bytes long with the 160 bytes a run writes below it, and this system "
           "allows paths of 4095")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_only_looks_writable_is_refused():
  # access() tells root that /proc is writable; creating a folder there fails.
  if os.access("/proc", os.W_OK):
    _refused("/proc/lingvo_lite_job", message="cannot create folders in /proc: that file "
             "system takes no new files (ENOENT); choose another --job_log_dir")
  else:
    _refused("/proc/lingvo_lite_job", message="this user may not create folders in /proc")


def test_a_remote_job_dir_that_cannot_be_reached_is_one_line(monkeypatch):
  def unreachable(self):
    raise RuntimeError("Could not resolve host:\n\twww.googleapis.com")
  monkeypatch.setattr(type(epath.Path("gs://b/job")), "exists", unreachable)
  text = _refused("gs://b/job", mode="eval", message="cannot be reached (RuntimeError: Could "
                  "not resolve host: www.googleapis.com); check the URL")
  assert "\t" not in text
