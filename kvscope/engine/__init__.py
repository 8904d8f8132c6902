"""The engine: ``Engine`` and its loop (``engine.py``; ``generate.py``: generate / stream / chat; ``profiling.py``:
torch.profiler windows over its steps), its configuration and requests (``config.py``, ``request.py``), the
checks at its edge (``validation.py``), how ``Engine()`` builds its parts (``build.py``) and sizes the KV pool
(``sizing.py``), and the engine as a telemetry source (``source.py``; ``batch.py``: a step's ``BatchSummary``).

- ``core/``: the scheduler, the KV cache manager and its block pool, KV cache groups, and the types a step
  hands from one part to the next (``output.py``). Needs no model.
- ``probe/``: the probe at ``Engine()``, which measures each attention layer of a model or refuses it.
- ``worker/``: the model runner, the paged attention registered in transformers, the sampler (and its rejection
  sampling of drafts) and the fused projections: the only part that runs a model.
- ``spec_decode/``: speculative decoding (n-gram and draft-model proposers; the worker verifies their drafts).
- ``protocols.py``: the seams, typed: the ``Worker`` an engine drives, the ``EngineClient`` the runs drive.

``from kvscope import Engine`` is the public way in.
"""
