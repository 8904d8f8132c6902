"""kvscope: an interactive profiler for paged-KV LLM inference."""

from .config import EngineConfig, ModelSpec
from .engine import Engine
from .request import RequestOutput, SamplingParams

__all__ = ["Engine", "EngineConfig", "ModelSpec", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
