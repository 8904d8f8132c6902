"""Models: loading them (``loader.py``: embedded tiny models, SmolLM2, local folders), checking a folder before
loading it (``folder.py``), reading a model's ``config.json`` (``hf_config.py``), and the zoo of tiny random models
of every registered causal-LM type (``zoo.py``; the probe that measures each attention layer at ``Engine()`` is
the engine's: ``kvscope.engine.probe``). This package never imports the engine.

``kvscope.models.load_model`` / ``build_tiny_model`` / ``build_tiny_tokenizer`` / ``tiny_config`` /
``smollm2_path`` are the public names; they are imported on first use, so that reading a config or checking a
folder does not pay for torch and transformers.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.models.loader import (
        TINY_ARCHS,
        build_tiny_model,
        build_tiny_tokenizer,
        load_model,
        smollm2_path,
        tiny_config,
    )

__all__ = ["TINY_ARCHS", "build_tiny_model", "build_tiny_tokenizer", "load_model", "smollm2_path", "tiny_config"]


def __getattr__(name: str):
    if name in __all__:
        value = getattr(import_module("kvscope.models.loader"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvscope.models' has no attribute {name!r}")
