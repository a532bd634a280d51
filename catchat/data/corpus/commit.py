"""Where a build's files land: a new output is a temporary sibling renamed into place; an existing
empty directory, or a corpus rebuilt with --force, is replaced in place through a committed swap
(`replace_in_place`) that the next reader or build finishes after a crash (`finish_replacement`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from catchat.data.corpus.layout import CORPUS_FILES, MANIFEST_FILE
from catchat.errors import UsageError
from catchat.fsutil import fsync_dir

_BUILD_PREFIX = ".catchat-build-"  # DIR/.catchat-build-<pid>: a replacement being built (ours)
_COMMIT_DIR = ".catchat-commit"  # DIR/.catchat-commit: a replacement committed, still moving in

Summary = TypeVar("Summary")  # what the build callback returns (builder.BuildSummary)


def is_corpus_dir(p: Path) -> bool:
    """A corpus (or one whose --force rebuild a crash interrupted after its commit)."""
    return (p / MANIFEST_FILE).is_file() or (p / _COMMIT_DIR / MANIFEST_FILE).is_file()


def _refuse_shared_dir(out: Path) -> None:
    """-o must name a directory of the corpus's own. The current directory, one above it, a
    filesystem root or the home directory hold the user's other files (and the first two cannot
    be renamed: EBUSY), so they are refused whatever they hold."""
    try:
        real, cwd = out.resolve(), Path.cwd().resolve()
    except (OSError, RuntimeError):  # a symlink loop, a deleted cwd: the checks that follow report it
        return
    try:
        home = Path.home().resolve()
    except (OSError, RuntimeError, KeyError):  # no $HOME and no passwd entry
        home = None
    what = ("a filesystem root" if real.parent == real else
            "the current directory" if real == cwd else
            "your home directory" if real == home else
            "a parent of the current directory" if real in cwd.parents else None)
    if what:
        raise UsageError(f"output {out} is {what} ({real}): a corpus needs a directory of its own",
                         "choose a new directory, e.g. -o corpora/mine")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        pass
    return True


def _remove_dead_builds(out: Path) -> None:
    """Remove DIR/.catchat-build-<pid> directories whose process is gone (a killed --force build)."""
    for p in out.glob(_BUILD_PREFIX + "*"):
        pid = p.name[len(_BUILD_PREFIX):]
        if p.is_dir() and pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
            shutil.rmtree(p, ignore_errors=True)


def finish_replacement(out: Path) -> None:
    """Complete a committed replacement (see `replace_in_place`) that a crash interrupted: move
    the rest of DIR/.catchat-commit into place, manifest last. A no-op when there is none; safe to
    run twice at once (a file already moved is skipped)."""
    commit = out / _COMMIT_DIR
    if not commit.is_dir():
        return
    for name in CORPUS_FILES:
        try:
            os.replace(commit / name, out / name)
        except FileNotFoundError:
            pass
    fsync_dir(out)
    try:
        commit.rmdir()
    except OSError:  # gone already, or a newer commit landed in it: that one is the corpus now
        pass


def corpus_file(path: Path, name: str) -> Path:
    """Where a corpus's file is: still in a committed replacement (a read-only directory we could
    not finish it in), else in place. Either way it is the newest build's file, never a mix."""
    staged = path / _COMMIT_DIR / name
    return staged if staged.is_file() else path / name


def _fsync_files(d: Path) -> None:
    for p in d.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    fsync_dir(d)


def replace_in_place(out: Path, build_into: Callable[[Path], Summary]) -> Summary:
    """Build into `out` (an empty directory or a corpus being rebuilt with --force), replacing
    only the corpus's own files (CORPUS_FILES) and leaving every other file in it alone.

    1. Build into DIR/.catchat-build-<pid> (inside DIR, so every rename below stays on one
       filesystem, DIR a mount point included); fsync it. A failure or crash here leaves the old
       corpus untouched (a killed build's directory is removed by the next build).
    2. Commit: rename it to DIR/.catchat-commit, one atomic rename, then fsync DIR.
    3. Move its files over the old ones (os.replace, manifest last) and remove it.
    A crash in 3 leaves some new files in place and the rest in .catchat-commit: `Corpus.open`
    reads each file from .catchat-commit when it is there (`corpus_file`) and finishes the move
    first where it can (`finish_replacement`), as does the next build. So a reader sees the old
    corpus (before 2) or the new one (after), never a mix. Other files, subdirectories included,
    are never renamed, opened or deleted."""
    _remove_dead_builds(out)
    stage = out / f"{_BUILD_PREFIX}{os.getpid()}"
    stage.mkdir()
    try:
        summary = build_into(stage)
        _fsync_files(stage)
        try:
            os.rename(stage, out / _COMMIT_DIR)
        except OSError as e:  # ENOTEMPTY/EEXIST: another build committed and is moving in
            raise UsageError(f"another build is replacing corpus {out} right now ({e.strerror})",
                             "run this build again when it has finished") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    fsync_dir(out)
    finish_replacement(out)
    return summary


def build_fresh(out: Path, build_into: Callable[[Path], Summary]) -> Summary:
    """Build into a temporary sibling of `out` (which does not exist), then rename it into place:
    a failed build leaves nothing behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        summary = build_into(tmp)
        if out.exists():  # it appeared while we were building (another process)
            raise UsageError(f"output {out} was created by another process during this build",
                             "run the build again (with --force to replace a corpus)")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def check_output(out: Path, force: bool) -> bool:
    """Refuse an output that is not ours to write; True when it exists (build in place)."""
    _refuse_shared_dir(out)
    if not out.exists():
        return False
    if not out.is_dir():
        raise UsageError(f"output {out} exists and is not a directory", "choose another -o DIR")
    finish_replacement(out)  # a rebuild a crash interrupted: complete it before judging the directory
    # Empty but for our own build directories (a killed build's, a concurrent one's): build in place.
    if any(not p.name.startswith(_BUILD_PREFIX) and p.name != _COMMIT_DIR for p in out.iterdir()):
        if not is_corpus_dir(out):
            raise UsageError(f"output directory {out} is not empty and is not a corpus", "choose a new or empty -o DIR")
        if not force:
            raise UsageError(f"corpus {out} already exists", "pass --force to rebuild it, or choose another -o DIR")
    return True
