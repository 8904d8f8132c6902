"""Prefill/decode disaggregation: ``kvscope.PDEngine("tiny", pd="1P1D")`` (``Engine``'s request API over
instances; ``Engine(..., pd=...)`` says to use it). Instances run in their own processes; a KV connector with vLLM's names (``kv_transfer_config``,
``kv_producer`` / ``kv_consumer``) moves blocks over shared memory or ZMQ.

Names are imported on first use, so that reading a P/D run's file (``kvscope.pd.summary``) needs no torch."""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.pd.config import KVTransferConfig, PDLayout
    from kvscope.pd.engine import PDEngine, TransferRecord

__all__ = ["KVTransferConfig", "PDEngine", "PDLayout", "TransferRecord"]
_LAZY = {"KVTransferConfig": "kvscope.pd.config", "PDLayout": "kvscope.pd.config",
         "PDEngine": "kvscope.pd.engine", "TransferRecord": "kvscope.pd.engine"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvscope.pd' has no attribute {name!r}")
