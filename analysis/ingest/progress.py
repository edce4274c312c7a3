"""A progress bar for slow work, on stderr, only for a person watching.

``Progress(total, label)`` is a context manager with ``advance()``. It draws nothing unless
stderr is a terminal, and nothing before ``delay_s`` (1 s) has passed, so quick runs, pipes,
CI logs and ``--json`` output stay clean. It is drawn with rich from a timer thread, so it
appears on time even while the main thread is busy in one long step.
"""
from __future__ import annotations

import sys
import threading


class Progress:
    def __init__(self, total: int, label: str, *, delay_s: float = 1.0, stream=None,
                 enabled: bool = True):
        self.total, self.label, self.done = total, label, 0
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = enabled and _is_tty(self._stream)
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._bar = None
        self._task = None

    def __enter__(self) -> "Progress":
        if self._enabled:
            self._timer = threading.Timer(self._delay_s, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                   SpinnerColumn, TextColumn, TimeElapsedColumn)

        with self._lock:
            if self._timer is None:          # already finished
                return
            self._bar = RichProgress(SpinnerColumn(), TextColumn("{task.description}"),
                                     BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=Console(file=self._stream), transient=True)
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done)
            self._bar.start()

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done)

    def __exit__(self, *exc) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
            if timer is not None:
                timer.cancel()
            if self._bar is not None:
                self._bar.stop()


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
