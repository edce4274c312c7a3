"""One writer of a report folder at a time (issue 46, case 7).

``meshscope analyze`` replaces a report folder whole (``analysis/report/crash_safe.py``): what
the folder holds (the trace cache, the per-rank files of a run in progress) is moved into the
new folder and the two are exchanged. Two runs writing one folder at once broke each other:
one's files vanished for a moment under the other's exchange ("cannot write the report (No
such file or directory)", its temporary folder left behind). ``ReportLock`` makes them take
turns: an exclusive ``flock`` of ``.NAME.lock`` beside the folder, held from the check of the
folder to the end of the write; the next run waits, then finds the fresh report (its key
matches) or, with ``--no-cache``, writes it again. A killed run's lock goes with its process
(the kernel releases it); its file is removed by whoever holds it last.
"""
from __future__ import annotations

import os
import pathlib


# (lock file, thread) → [descriptor, depth]: the locks this process holds, re-entered by the
# same thread (``analysed`` holds it, and the write inside takes it again).
_REPORT_LOCKS: dict[tuple[str, int], list[int]] = {}


def report_lock_path(out: pathlib.Path) -> pathlib.Path:
    """The lock file of the report folder ``out``: ``.NAME.lock`` in the folder that holds it
    (``RUN/.report.lock``; hidden, so never an input: ``reuse._walk`` and the trace finders
    skip hidden names)."""
    full = pathlib.Path(os.path.abspath(out))
    return pathlib.Path(os.path.realpath(full.parent)) / f".{full.name}.lock"


class ReportLock:
    """``with ReportLock(out, on_wait):`` — the block runs while no other process writes the
    report folder ``out`` (module section above). ``on_wait(pid)`` is called once when another
    holds it (its process id, None when unknown), before waiting for it. Re-entered freely by
    the thread that holds it. Where no lock can be taken (no ``fcntl``, a folder that cannot
    be written, a file system without locks), the block runs unlocked, as before."""

    def __init__(self, out: pathlib.Path, on_wait=None):
        self.path = report_lock_path(out)
        self.on_wait = on_wait
        self._key: tuple[str, int] | None = None

    def __enter__(self) -> "ReportLock":
        import threading

        key = (str(self.path), threading.get_ident())
        held = _REPORT_LOCKS.get(key)
        if held is not None:
            held[1] += 1
        else:
            fd = _take_lock(self.path, self.on_wait)
            if fd is None:
                return self
            _REPORT_LOCKS[key] = [fd, 1]
        self._key = key
        return self

    def __exit__(self, *exc) -> bool:
        if self._key is None:
            return False
        held = _REPORT_LOCKS[self._key]
        held[1] -= 1
        if held[1] == 0:
            del _REPORT_LOCKS[self._key]
            fd = held[0]
            try:
                # Removed while still held, and only if it is still this file: whoever waits
                # on it then finds it gone and takes the lock of the path anew (``_take_lock``).
                if _same_file(fd, self.path):
                    os.unlink(self.path)
            except OSError:
                pass
            finally:
                os.close(fd)
        self._key = None
        return False


def _same_file(fd: int, path: pathlib.Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _take_lock(path: pathlib.Path, on_wait) -> int | None:
    """A descriptor of ``path`` holding its exclusive ``flock``, once it is this process' turn
    (None: no lock can be taken here). The file may have been removed by the holder it waited
    for: the lock is then taken again on the file now at ``path``, so two holders never hold
    two files of one name."""
    try:
        import fcntl
    except ImportError:             # pragma: no cover - not a POSIX system
        return None
    waited = False
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)     # the report's write makes it too
            fd = os.open(path, flags, 0o644)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None and not waited:
                    on_wait(_lock_holder(fd))
                waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:             # a file system without locks
            os.close(fd)
            return None
        except BaseException:       # interrupted while waiting (Ctrl-C)
            os.close(fd)
            raise
        if _same_file(fd, path):
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass
            return fd
        os.close(fd)                # removed (or replaced) by the holder it waited for


def _lock_holder(fd: int) -> int | None:
    """The process id the holder of the lock wrote into it (None when not known yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None


def remove_stale_report_lock(out: pathlib.Path) -> None:
    """Remove the lock file of the report folder ``out`` that a killed run left, unless a
    process holds it (this one included): taken for a moment, then removed as its holder
    would remove it."""
    path = report_lock_path(out)
    if any(key[0] == str(path) for key in _REPORT_LOCKS):
        return
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_CLOEXEC", 0))
    except (ImportError, OSError):
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, path):
            os.unlink(path)
    except OSError:                 # held by a live process (or no locks here): left as is
        pass
    finally:
        os.close(fd)
