"""The lock that keeps one process on a run directory, and the check that what moves checkpoints
holds it.

Two fcntl locks, both dropped by the kernel when the holder dies (a killed process never leaves a
lock in the way): the one that counts is flock on the run directory itself (opened O_RDONLY), which
deleting a file cannot defeat; RUN/.lock is also flocked (what a catchat before this one checks) and
holds the holder's pid, host and start time, for the refusal's message and for `catchat watch`.
Deleting `.lock` used to let a second process in: it branched, moved the first one's checkpoints
away and logged steps twice (issue 39 item 4).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from catchat.errors import UsageError

_held: dict[str, list] = {}  # run directory -> [dir fd, .lock fd, count]: one process may reopen its own run


def _holder(lock_path: Path) -> tuple[str | None, str]:
    """(pid or None, ' on HOST, since T') from a `.lock` file, if there is one to read."""
    try:
        words = lock_path.read_bytes()[:512].decode("utf-8", "replace").split()
    except OSError:
        return None, ""
    if not words:
        return None, ""
    where = f" on {words[1]}" if len(words) > 1 else ""
    return words[0], where + (f", since {words[2]}" if len(words) > 2 else "")


def _refuse(root: Path, lock_path: Path) -> UsageError:
    pid, where = _holder(lock_path)
    if pid is None:  # `.lock` deleted or emptied: the directory's lock still says someone holds it
        return UsageError(f"{root} is in use by another catchat process (its .lock file, which names the pid, "
                          "is gone)", hint=f"wait for it to end, or find it (fuser -v {root}) and stop it with "
                                           "kill -INT; one process trains a run at a time")
    return UsageError(f"{root} is in use by another catchat process (pid {pid}{where})",
                      hint=f"wait for it to end, or stop it (kill -INT {pid}); one process trains a run at a time")


class RunLock:
    """Exclusive locks on RUN (the directory) and RUN/.lock for as long as a process trains the run.

    `path` is RUN/.lock. `stale_pid` is the pid a dead holder left in `.lock`; a live holder is
    named in the refusal (exit 2), and a refused process creates and writes nothing."""

    def __init__(self, path: Path):
        self.path, self.root, self.stale_pid = Path(path), Path(path).parent, None
        self.key = str(self.root.resolve())
        if self.key in _held:
            _held[self.key][2] += 1
            return
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dir_fd)
            raise _refuse(self.root, self.path) from None
        except OSError:  # a file system that cannot lock a directory (NFS emulates flock with write
            os.close(dir_fd)  # locks: EBADF on a read-only descriptor): .lock alone, as before
            dir_fd = None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            _close(dir_fd)
            raise
        try:  # a catchat from before the directory lock locks only .lock
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            _close(dir_fd)
            raise _refuse(self.root, self.path) from None
        old = os.pread(fd, 512, 0).decode("utf-8", "replace").split()
        if old and old[0].isdigit() and int(old[0]) != os.getpid():
            self.stale_pid = int(old[0])
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {stamp}\n".encode(), 0)
        _held[self.key] = [dir_fd, fd, 1]

    def release(self) -> None:
        entry = _held.get(self.key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] == 0:
            del _held[self.key]
            os.close(entry[1])
            _close(entry[0])  # closing the last descriptors drops the flocks


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def check_no_other_writer(root: Path) -> None:
    """Refuse (UsageError naming the holder) when another live process holds `root`'s run lock:
    the branch and prune code calls this before it moves or removes a checkpoint, so a process that
    got past the lock some other way never moves a live writer's checkpoints. A directory nobody
    locks (a checkpoints/ outside any run, as tests make) passes."""
    root = Path(root)
    try:
        key = str(root.resolve())
    except OSError:
        return
    if key in _held:
        return
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:  # a probe on our own descriptor: flock conflicts between descriptors even in one process
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _refuse(root, root / ".lock") from None
    except OSError:  # a directory that cannot be locked here (RunLock fell back to .lock): cannot tell
        pass
    finally:
        os.close(fd)  # closing drops the probe's lock
