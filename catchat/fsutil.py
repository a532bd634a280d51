"""File writes that a crash cannot leave half done: atomic replace, whole-line appends, fsync.

Every file a run keeps is either replaced whole (written aside, fsynced, renamed over the old one,
the directory fsynced) or only appended to, one whole line per `os.write` (a Python signal handler
runs between bytecodes, never inside the system call, so Ctrl-C cannot cut a line in two).
A group of changes that must happen whole runs under `deferred_signals`.
"""

from __future__ import annotations

import errno
import os
import signal
from contextlib import contextmanager
from pathlib import Path

from catchat.errors import UsageError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, `ulimit -f`


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or create in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data`: readers see the old file or the new one, never a mix or nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a write's error names no file: name it
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line (a newline is added) with a single write to a file opened O_APPEND. Its errors
    name the file (write(2)'s own, e.g. ENOSPC on a full disk, name none)."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):  # a full disk mid-line: take the fragment back out
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(28, os.strerror(28), str(path))
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    finally:
        os.close(fd)


def disk_full_error(exc: OSError, where: str | os.PathLike) -> UsageError:
    """The one-line refusal for a write that failed for want of space (`exc.errno` in DISK_FULL), naming
    the file (or `where`, when the error does not) and where to make room: a start-up or a corpus
    build that cannot write has done nothing yet worth keeping, so it is bad input (exit 2)."""
    target = Path(exc.filename or where)
    room = target if target.is_dir() else target.parent
    return UsageError(f"could not write {target}: {exc.strerror or os.strerror(exc.errno)}",
                      hint=f"make room in {room} (free disk space, a quota, ulimit -f), or use a directory on "
                           "another disk; then run the command again")


def remove_stale_temporaries(directory: str | os.PathLike) -> None:
    """Remove `.NAME.PID.tmp` files left by an atomic write that was killed."""
    for p in Path(directory).glob(".*.tmp"):
        if p.is_file():
            p.unlink(missing_ok=True)


@contextmanager
def deferred_signals():
    """Hold SIGINT/SIGTERM until the block is done (then raise KeyboardInterrupt if one came), so a
    Ctrl-C never stops a group of file changes half way. Only in the main thread (signals go there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    old = {s: signal.signal(s, lambda signum, _f: caught.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if caught:
        raise KeyboardInterrupt
