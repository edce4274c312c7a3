"""meshscope: profiling and communication analysis for 5D-parallel LLM training.

The sub-packages are ``meshscope.parallel`` (the instrumented runner), ``meshscope.collectors``
(the run directory and what writes it), ``meshscope.analysis`` (traces → report) and
``meshscope.dashboard`` (the web app); ``meshscope.cli`` is the ``meshscope`` command.

In an installed wheel they sit inside this package. In a source checkout they are the folders
beside this one (``analysis/``, ``collectors/``…, as the repository lays them out), and the
package's search path is extended to that folder so that ``meshscope.analysis`` means
``analysis/`` there too — only the checkout's own folder, never the working directory, so a
user's own ``analysis/`` package never shadows ours.
"""
from __future__ import annotations

import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "analysis")) and \
        _os.path.isfile(_os.path.join(_checkout, "analysis", "__init__.py")):
    __path__.append(_checkout)  # noqa: F821 - the package's own search path


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
