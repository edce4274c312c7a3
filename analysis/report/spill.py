"""Every rank's results on disk while the analysis runs, so that what the analysing process
holds is bounded by the ranks in flight, not by the number of ranks.

The per-rank stage (``rank_work.rank_work``, on the local pool or a Dask cluster) sends back each
rank's small tables: its timeline (interval sets, step windows, idle by cause), its raw
operations, its GPU, operator and memory tables. Held as Python objects until the cross-rank
stage is done, they made the analysing process grow with the rank count (0.16 MB a rank of
synthetic CPU ranks; a 1.7M-event GPU rank's timeline alone is 13 MB). ``RankStore.put``
writes each result to a file of its own as it arrives and keeps only its small fields
(identity, problems, notes, overlap, metadata); the large ones (``LARGE``) are read back when
the cross-rank stage asks for them, each rank in turn (``Spilled``), and the aligned
timelines the cross-rank stage makes are stored the same way (``RankStore.timelines``: a
mapping rank → timeline read on access). A cache of the timelines read last (``CACHE_BYTES``
of their files) spares reading a small run's files again and again.

The files are pickles of what this process itself wrote in this run — the same objects the
worker processes already send it pickled — in a folder only this process may read
(``tempfile.mkdtemp``, mode 0700): under the report's cache (``<report>/.cache``, a name
``.tmp-<pid>-…`` that a later run removes if this one is killed) or, without a cache, the
system's temporary folder; ``close`` removes it. No file of a trace or of anyone else is ever
unpickled here. Where the folder cannot be made or written, the values stay in memory, as
before.

The folder is reached through descriptors held from its making (its own, and that of the
folder it was made in), never by its path again: another process replacing the report folder
(``crash_safe.write_folder`` moves ``.cache/`` into the new report, then exchanges the two)
moves this folder with it, and the files are still read, written and removed where they are
(issue 46, case 7: a concurrent run's exchange made a read fail with "No such file or
directory" and left the folder behind).
"""
from __future__ import annotations

import collections
import os
import pathlib
import pickle
import secrets
import tempfile
from typing import Iterator, Mapping

# The fields of a ``rank_work.RankResult`` kept on disk; the others stay in memory. (``meta``:
# the trace's process groups, each with its ranks — a 1,024-rank job's default group is 1,024
# numbers in every rank's result.)
LARGE = ("timeline", "operations", "gpu", "operators", "memory", "meta")
# Aligned timelines read back and kept, by the size of their files (the last read are kept):
# the cross-rank stage reads every rank's several times; the other values once or twice.
CACHE_BYTES = 32 << 20
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
# The names of this process' stores still open: a report written while one is (the report's
# tables kept in parts, ``table_parts``, live until written) leaves it where it is
# (``crash_safe.remove_leftovers`` removes this process' other ``.tmp-`` entries).
OPEN: set[str] = set()


class RankStore:
    """Files of per-rank values (module docstring), in a new private folder under
    ``parent`` (None: the system's temporary folder)."""

    def __init__(self, parent: pathlib.Path | None = None):
        self.dir: pathlib.Path | None = None
        self._parent_fd: int | None = None          # the folder it was made in
        self._fd: int | None = None                 # the folder itself
        try:
            parent = pathlib.Path(tempfile.gettempdir() if parent is None else parent)
            parent.mkdir(parents=True, exist_ok=True)
            self._parent_fd = os.open(parent, _DIR_FLAGS)
            name = f".tmp-{os.getpid()}-ranks-{secrets.token_hex(4)}"
            os.mkdir(name, 0o700, dir_fd=self._parent_fd)
            self._name = name
            self._fd = os.open(name, _DIR_FLAGS, dir_fd=self._parent_fd)
            self.dir = parent / name
            OPEN.add(name)
        except OSError:
            self._close_fds()
            self.dir = None
        self._held: dict[tuple, object] = {}        # values that could not be written
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cached_bytes = 0
        self._count = 0
        self.reads = 0                                  # files read back (for the tests)

    def put(self, result) -> "Spilled":
        """``result`` (a ``rank_work.RankResult``) with its ``LARGE`` fields on disk."""
        key = self._count
        self._count += 1
        for field in LARGE:
            self.write((key, field), getattr(result, field))
        small = {k: v for k, v in vars(result).items() if k not in LARGE}
        return Spilled(self, key, small)

    def write(self, key: tuple, value) -> None:
        self._forget(key)
        if self.dir is not None:
            try:
                fd = os.open(self._name_of(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC |
                             getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=self._fd)
                with open(fd, "wb") as f:
                    pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
                return
            except OSError:
                pass
        self._held[key] = value

    def read(self, key: tuple):
        if key in self._held:
            return self._held[key]
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key][0]
        fd = os.open(self._name_of(key), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0),
                     dir_fd=self._fd)
        with open(fd, "rb") as f:
            value = pickle.load(f)          # written by this process, above
            size = os.fstat(f.fileno()).st_size
        self.reads += 1
        if key[0] == "aligned" and size <= CACHE_BYTES:
            self._cache[key] = (value, size)
            self._cached_bytes += size
            while self._cached_bytes > CACHE_BYTES:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cached_bytes -= dropped
        return value

    def _forget(self, key: tuple) -> None:
        self._held.pop(key, None)
        hit = self._cache.pop(key, None)
        if hit is not None:
            self._cached_bytes -= hit[1]

    @staticmethod
    def _name_of(key: tuple) -> str:
        return "-".join(map(str, key))

    def timelines(self, items: Iterator[tuple[int, object]]) -> "Timelines":
        """A mapping rank → timeline of ``items``, each stored as it comes."""
        ranks = []
        for rank, tl in items:
            self.write(("aligned", rank), tl)
            ranks.append(rank)
        return Timelines(self, sorted(ranks))

    def close(self) -> None:
        self._held.clear()
        self._cache.clear()
        if self.dir is not None:
            OPEN.discard(self._name)
        if self._fd is not None:
            try:
                for name in os.listdir(self._fd):       # only files this store wrote
                    try:
                        os.unlink(name, dir_fd=self._fd)
                    except OSError:
                        pass
                os.rmdir(self._name, dir_fd=self._parent_fd)
            except OSError:
                pass
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self._fd, self._parent_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._parent_fd = None


class Spilled:
    """A ``rank_work.RankResult`` whose ``LARGE`` fields are in a ``RankStore``: read on
    access, written on assignment (the cross-rank stage lets go of a rank's raw operations and
    own-clock timeline by setting them to None, and replaces a rank's start-up steps)."""

    def __init__(self, store: RankStore, key: int, small: dict):
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_key", key)
        for k, v in small.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name: str):
        if name in LARGE:
            return self._store.read((self._key, name))
        raise AttributeError(name)

    def __setattr__(self, name: str, value) -> None:
        if name in LARGE:
            self._store.write((self._key, name), value)
        else:
            object.__setattr__(self, name, value)

    @property
    def rank(self) -> int:
        return self.identity.rank


class Timelines(Mapping):
    """rank → timeline, each read from its ``RankStore`` on access."""

    def __init__(self, store: RankStore, ranks: list[int]):
        self._store, self._ranks = store, ranks

    def __getitem__(self, rank: int):
        if rank not in self._ranks:
            raise KeyError(rank)
        return self._store.read(("aligned", rank))

    def __iter__(self):
        return iter(self._ranks)

    def __len__(self) -> int:
        return len(self._ranks)

    def __contains__(self, rank) -> bool:
        return rank in self._ranks
