"""kvscope: an interactive profiler for paged-KV LLM inference."""

import os
import sys
from importlib import import_module
from typing import TYPE_CHECKING

from kvscope._version import __version__ as __version__
from kvscope.utils.threads import prepare_openmp as _prepare_openmp

if TYPE_CHECKING:
    from kvscope.engine.config import EngineConfig, ModelSpec
    from kvscope.engine.engine import Engine
    from kvscope.engine.request import RequestOutput, SamplingParams
    from kvscope.pd.engine import PDEngine
    from kvscope.runs.background.watch import WatchRun, watch
    from kvscope.runs.result.comparison import Comparison, compare
    from kvscope.runs.result.run import Run, load

__all__ = ["Comparison", "Engine", "EngineConfig", "ModelSpec", "PDEngine", "RequestOutput", "Run", "SamplingParams",
           "WatchRun", "compare", "load", "watch"]

# Imported on first use, so that `kvscope plan` and `kvscope --help` do not pay for torch + transformers.
_LAZY = {"EngineConfig": "kvscope.engine.config", "ModelSpec": "kvscope.engine.config",
         "Engine": "kvscope.engine.engine", "PDEngine": "kvscope.pd.engine",
         "RequestOutput": "kvscope.engine.request", "SamplingParams": "kvscope.engine.request",
         "Run": "kvscope.runs.result.run", "load": "kvscope.runs.result.run",
         "compare": "kvscope.runs.result.comparison", "Comparison": "kvscope.runs.result.comparison",
         "WatchRun": "kvscope.runs.background.watch", "watch": "kvscope.runs.background.watch"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvscope' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext kvscope``: the ``%kvscope`` magic, and BokehJS loaded into the notebook page."""
    from kvscope.magic.run import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from kvscope.magic.run import unload_ipython_extension as unload

    unload(ipython)


def _warn_if_shadowed() -> None:
    """Warn when a folder named ``kvscope`` in the working folder (or the script's) is not this package.

    Python run there (a script, ``python -m kvscope``, a notebook started there) imports that folder instead
    of this package, which an editable install (``pip install -e .``) finds only after it, and then
    ``from kvscope import Engine`` fails with "cannot import name 'Engine' from 'kvscope' (unknown location)",
    before any of kvscope runs. Only a process that got this package (the ``kvscope`` command, Python started
    elsewhere) can say so: it warns on stderr, naming the folder to rename."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        bases = {os.getcwd(), os.path.abspath(sys.path[0] or os.curdir) if sys.path else os.getcwd()}
        for base in sorted(bases):
            folder = os.path.join(base, "kvscope")
            if os.path.isdir(folder) and not os.path.samefile(folder, here):
                print(f"kvscope: warning: the folder {folder} is not the kvscope package ({here}) but has its "
                      f"name: Python started in {base} (a script, python -m kvscope, a notebook) imports it instead, "
                      "and 'from kvscope import Engine' fails there with \"cannot import name 'Engine' from "
                      "'kvscope' (unknown location)\"; rename that folder", file=sys.stderr, flush=True)
    except OSError:  # the working folder was deleted, a path cannot be read: nothing to say
        pass


_warn_if_shadowed()
# OpenMP's wait policy is read once, when torch's runtime starts: chosen here, before torch is imported, unless the
# user set it (kvscope/utils/threads.py; standard library only)
_prepare_openmp()
