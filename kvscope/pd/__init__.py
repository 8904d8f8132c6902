"""Prefill/decode disaggregation: ``kvscope.PDEngine("tiny", pd="1P1D")`` (``Engine``'s request API over
instances; ``Engine(..., pd=...)`` says to use it). Instances run in their own processes; a KV connector with
vLLM's names (``kv_transfer_config``, ``kv_producer`` / ``kv_consumer``) moves blocks over shared memory or ZMQ.
``kvscope simulate --pd 1P1D`` runs the same router over simulated instances on one virtual clock.

The modules:

- ``config.py``: the layout (``PDLayout``, "2P1D") and the connector's configuration (``KVTransferConfig``).
- ``routes.py``: what the router records: a request's route and times (``PDRequest``), a hand-over
  (``TransferRecord``).
- ``protocols.py``: the seams mypy checks: ``Instance`` (what the router asks of an instance),
  ``TransferConfig``, ``RouterView`` (what the recorder reads of a router).
- ``router.py``: ``Router``, both P/D engines' base: its state, routing decisions and ``Engine``'s request API.
- ``engine.py``: ``PDEngine``, the router over instance processes: starting them, its step, the hand-over.
- ``process.py``: ``InstanceProcess``, the router's side of an instance's process (satisfies ``Instance``).
- ``instance_core.py``: ``InstanceCore``, what every instance does with its ``Engine`` (tracked requests,
  pins, the step's outcome, the commands asked by name).
- ``instance.py``: ``InstanceServer``, an instance in its own process (``InstanceCore`` + the hand-over's
  ends), and ``serve``, that process's loop.
- ``connector.py``: the KV connector: blocks packed, moved (shared memory or ZMQ) and unpacked.
- ``blocks.py``: a prompt's blocks as a hand-over sees them on any block pool (held, attached).
- ``sim_engine.py``: ``SimPDEngine``, the router over simulated instances on one virtual clock (``SimLink``).
- ``sim_instance.py``: ``SimInstance``, a simulated instance (``InstanceCore`` + in-process hand-over ends;
  satisfies ``Instance``).
- ``recorder.py``: ``PDRecorder``, a P/D run's records, events and ``meta["pd"]``.
- ``page_maps.py``: each instance's page map around the transfers (``meta["pd"]["page_maps"]``).
- ``summary.py``: the summary keys and trace track of ``meta["pd"]`` (standard library only).

P/D's telemetry and widgets live with the others: the request lanes in ``kvscope/telemetry/pd_lanes.py``, the
report's panels in ``widgets/panels/pd_timeline.py`` (lanes and transfers) and ``widgets/panels/pd_page_maps.py``
(the page maps side by side).

``PDEngine`` is imported on first use, so that reading a P/D run's file (``kvscope.pd.summary``) needs no torch.
"""

from typing import TYPE_CHECKING, Any

from kvscope.pd.config import KVTransferConfig, PDLayout
from kvscope.pd.routes import TransferRecord

if TYPE_CHECKING:
    from kvscope.pd.engine import PDEngine

__all__ = ["KVTransferConfig", "PDEngine", "PDLayout", "TransferRecord"]


def __getattr__(name: str) -> Any:
    if name == "PDEngine":  # the one name that needs torch
        from kvscope.pd.engine import PDEngine

        globals()["PDEngine"] = PDEngine
        return PDEngine
    raise AttributeError(f"module 'kvscope.pd' has no attribute {name!r}")
