"""kvscope: an interactive profiler for paged-KV LLM inference."""

from importlib import import_module
from typing import TYPE_CHECKING

from ._version import __version__ as __version__

if TYPE_CHECKING:
    from .comparison import Comparison, compare
    from .config import EngineConfig, ModelSpec
    from .engine import Engine
    from .request import RequestOutput, SamplingParams
    from .run import Run, load
    from .watching import WatchRun

__all__ = ["Comparison", "Engine", "EngineConfig", "ModelSpec", "RequestOutput", "Run", "SamplingParams", "WatchRun",
           "compare", "load", "watch"]

# Imported on first use, so that `kvscope plan` and `kvscope --help` do not pay for torch + transformers.
_LAZY = {"EngineConfig": ".config", "ModelSpec": ".config", "Engine": ".engine", "RequestOutput": ".request",
         "SamplingParams": ".request", "Run": ".run", "load": ".run", "compare": ".comparison",
         "Comparison": ".comparison", "WatchRun": ".watching"}


def __getattr__(name: str):
    if name == "watch":  # the package kvscope.watch, which is callable: kvscope.watch(urls, ...) (see its docstring)
        return import_module(".watch", __name__)
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvscope' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext kvscope``: the ``%kvscope`` magic, and BokehJS loaded into the notebook page."""
    from .magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .magic import unload_ipython_extension as unload

    unload(ipython)
