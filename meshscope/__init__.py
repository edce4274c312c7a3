"""meshscope: profiling and communication analysis for 5D-parallel LLM training.

The sub-packages are ``meshscope.parallel`` (the instrumented runner), ``meshscope.collectors``
(the run directory and what writes it), ``meshscope.analysis`` (traces → report) and
``meshscope.dashboard`` (the web app); ``meshscope.cli`` is the ``meshscope`` command.

The repository keeps ``analysis/``, ``collectors/``, ``dashboard/`` and ``parallel/`` as
top-level folders (as the product lays them out) and ``meshscope/`` links to each (a relative
symbolic link), so the tree under ``meshscope/`` is one plain package: an interpreter, a type
checker or an import linter resolves ``meshscope.analysis`` to ``analysis/`` with no search path
of our own, and a wheel holds the linked folders' files in place.
"""
from __future__ import annotations


def __getattr__(name: str):
    """``meshscope.__version__``, looked up when first asked for: ``importlib.metadata`` costs
    about 60 ms to import, a third of a cached ``meshscope analyze``."""
    if name != "__version__":
        raise AttributeError(f"module 'meshscope' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version
    try:
        value = version("meshscope")
    except PackageNotFoundError:  # a checkout that was never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
