"""Per-rank tasks for tests/test_engines.py that must be importable by the workers of a Dask
cluster or a process pool (they are sent by reference): one that kills its worker the first
time it meets a file, one that leaves a marker when it starts."""
import os
import pathlib
import time

from meshscope.analysis.report import rank_work

# The real per-rank work, taken at import: a test puts ``dies_once`` in its place.
RANK_WORK = rank_work.rank_work


def dies_once(markers: pathlib.Path, victim: str, path: pathlib.Path, *job):
    """``rank_work.rank_work(path, *job)``, except that the first worker to get the file named
    ``victim`` ends its own process mid-task (``os._exit``, as a worker killed for memory
    would vanish), after leaving ``markers/killed``. Whoever runs it after that leaves
    ``markers/done-<pid>``, so a test can tell where the retry ran."""
    markers = pathlib.Path(markers)
    if path.name == victim:
        killed = markers / "killed"
        try:
            fd = os.open(killed, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            (markers / f"done-{os.getpid()}").touch()
        else:
            os.close(fd)
            os._exit(9)
    return RANK_WORK(path, *job)


def marks_start(markers: pathlib.Path, path: pathlib.Path, seconds: float) -> str:
    """Leave ``markers/<file name>`` when started, then take ``seconds``; returns the name."""
    (pathlib.Path(markers) / pathlib.Path(path).name).touch()
    time.sleep(seconds)
    return pathlib.Path(path).name
