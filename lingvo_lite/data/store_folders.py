"""Where a token store may be built, and what its build leaves: the store's folders, its lock,
its partial copy.

A store replaces only a store (never the user's folder, nor a folder inside another store);
one builder at a time holds a local store's lock; a failed build removes the folders it made,
its lock file and its partial store, even while writers it interrupted still finish.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from etils import epath

from lingvo_lite import paths
from lingvo_lite.data import token_store
from lingvo_lite.errors import DataError, UsageError, config_error


def make_folders(path: epath.Path) -> list[epath.Path]:
  """Makes the store's folder's missing folders; returns those it made, outermost first."""
  made = []
  if not paths.is_remote(os.fspath(path)):
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
      made.insert(0, folder)
      folder = folder.parent
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    for folder in reversed(made):  # Those made before the failure (a full disk) go too.
      try:
        os.rmdir(folder)
      except OSError:
        pass  # Not made after all, or not empty: left as it is.
    raise config_error("store_dir", os.fspath(path), f"its folder cannot be made ({e})",
                       "give a writable place for the store") from None
  return made


def remove_file(path: str | os.PathLike) -> None:
  try:
    os.remove(path)
  except OSError:
    pass  # Already gone, or never made: nothing to leave behind either way.


def _enclosing_store(folder: epath.Path) -> epath.Path | None:
  """The published token store that a local `folder` is, or lies inside, if any."""
  if paths.is_remote(os.fspath(folder)):
    return None
  for candidate in [folder, *folder.parents]:
    try:
      if (candidate / "manifest.json").is_file() and (
          token_store.read_manifest(candidate) or {}).get("schema") == token_store.SCHEMA:
        return candidate
    except (OSError, DataError):
      continue  # Some other program's manifest.json: not a store.
  return None


def check_outside_stores(folder: epath.Path, field: str, value: object) -> None:
  """Refuses a folder for new stores that is a token store or lies inside one (a build there
  would write into that store): before anything is read.

  Raises:
    UsageError: naming `field` and `value`.
  """
  enclosing = _enclosing_store(folder)
  if enclosing == folder:
    raise config_error(field, value, "is a token store itself, not the folder of the stores",
                       f"give the folder that holds it, {folder.parent}")
  if enclosing is not None:
    raise _inside_store(field, value, enclosing)


def _inside_store(field: str, value: object, store: epath.Path) -> UsageError:
  return config_error(field, value, f"is inside the token store {store}, which a build there "
                      "would change", "give a folder outside every token store")


def refuse_foreign_folder(path: epath.Path) -> None:
  """A store replaces only a store: never a folder of something else (the user's data), nor
  a folder inside another store."""
  try:
    foreign = (path.exists() and token_store.read_manifest(path) is None and
               (not path.is_dir() or any(path.iterdir())))
  except (OSError, DataError) as e:
    raise config_error("store_dir", os.fspath(path), f"cannot be read ({e})") from None
  if foreign:
    raise config_error("store_dir", os.fspath(path), "exists and is not a token store (it "
                       "has no manifest.json); a build would replace it",
                       "point the store at a new or empty folder")
  enclosing = _enclosing_store(path.parent)
  if enclosing is not None:
    raise _inside_store("store_dir", os.fspath(path), enclosing)


def _inode(path: epath.Path) -> tuple[int, int] | None:
  try:
    stat = os.stat(path)
  except OSError:
    return None
  return stat.st_dev, stat.st_ino


@contextlib.contextmanager
def build_lock(path: epath.Path):
  """One builder per local store at a time (concurrent runs, the processes of one job, the
  bin/ tool): the others wait, then find it built. On object stores `publish` settles a race
  (there is no lock there). Yields the lock file (None on object stores).

  A failed build removes its lock file while it holds it (and the store's folder, if it made
  it and nothing else is there), so a builder that was waiting may get the lock of a file no
  longer there, while a later one makes and locks a new file. So a builder checks, once it
  holds the lock, that the file it opened is still the lock file, and otherwise locks the
  one that is.
  """
  if paths.is_remote(os.fspath(path)):
    yield None
    return
  lock_file = path.parent / f".{path.name}.lock"
  while True:
    before = _inode(lock_file)
    with contextlib.ExitStack() as held:
      try:
        held.enter_context(paths.exclusive_lock(lock_file))
      except FileNotFoundError:  # A failed build removed the folder just now: make it again.
        path.parent.mkdir(parents=True, exist_ok=True)
        continue
      if before is None or _inode(lock_file) != before:
        continue  # Made by this open, or replaced meanwhile: make sure of the file now there.
      yield lock_file
      return


def remove_partial(partial: epath.Path, tries: int = 5) -> None:
  """Removes a partial store, also while the writers a failure interrupted (Ctrl-C) still
  finish: their files (tensorstore's `*.__lock`) come and go, so a file gone meanwhile is no
  error, and a folder that filled again is tried again. One that outlasts every try is left to
  the next build, which removes dead partials under the lock; the cleanup never hides the
  failure that led here behind an error of its own."""
  for attempt in range(tries):
    if not partial.exists():
      return
    try:
      if paths.is_remote(os.fspath(partial)):
        partial.rmtree()
      else:
        shutil.rmtree(partial, onerror=_ignore_vanished)
    except OSError:
      time.sleep(0.1 * (attempt + 1))


def _ignore_vanished(function, path, exc_info) -> None:
  """shutil.rmtree's onerror: a file or folder that is gone already is what was wanted."""
  del function, path
  if not isinstance(exc_info[1], FileNotFoundError):
    raise exc_info[1]
