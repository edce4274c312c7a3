"""Collectors: what every run leaves behind (docs/run-directory.md).

``Recorder`` (collectors/recorder.py) is imported on first use, so that ``import collectors``
stays free of torch for the analysis side.
"""


def __getattr__(name):
    if name == "Recorder":
        from .recorder import Recorder
        return Recorder
    raise AttributeError(f"module 'collectors' has no attribute {name!r}")
