"""kvscope: an interactive profiler for paged-KV LLM inference."""

from .config import EngineConfig, ModelSpec
from .engine import Engine
from .request import RequestOutput, SamplingParams
from .run import Run, load

__all__ = ["Engine", "EngineConfig", "ModelSpec", "RequestOutput", "Run", "SamplingParams", "load"]
__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """``%load_ext kvscope``: the ``%kvscope`` magic, and BokehJS loaded into the notebook page."""
    from .magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .magic import unload_ipython_extension as unload

    unload(ipython)
