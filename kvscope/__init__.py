"""kvscope: an interactive profiler for paged-KV LLM inference."""

from importlib import import_module
from typing import TYPE_CHECKING

from kvscope._version import __version__ as __version__

if TYPE_CHECKING:
    from kvscope.engine.config import EngineConfig, ModelSpec
    from kvscope.engine.engine import Engine
    from kvscope.engine.request import RequestOutput, SamplingParams
    from kvscope.runs.comparison import Comparison, compare
    from kvscope.runs.run import Run, load
    from kvscope.runs.watch_run import WatchRun

__all__ = ["Comparison", "Engine", "EngineConfig", "ModelSpec", "RequestOutput", "Run", "SamplingParams", "WatchRun",
           "compare", "load", "watch"]

# Imported on first use, so that `kvscope plan` and `kvscope --help` do not pay for torch + transformers.
_LAZY = {"EngineConfig": "kvscope.engine.config", "ModelSpec": "kvscope.engine.config",
         "Engine": "kvscope.engine.engine", "RequestOutput": "kvscope.engine.request",
         "SamplingParams": "kvscope.engine.request", "Run": "kvscope.runs.run", "load": "kvscope.runs.run",
         "compare": "kvscope.runs.comparison", "Comparison": "kvscope.runs.comparison",
         "WatchRun": "kvscope.runs.watch_run"}


def __getattr__(name: str):
    if name == "watch":  # the package kvscope.watch, which is callable: kvscope.watch(urls, ...) (see its docstring)
        return import_module("kvscope.watch")
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
