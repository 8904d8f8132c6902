"""The worker: everything that runs a model. ``ModelRunner`` (``model_runner.py``: paged KV tensors, packing a
step into a ``ModelInput``, ``model_input.py``, forward, sampling, verification), the "kvscope" attention
registered in transformers' ``AttentionInterface`` (``attention.py``), the sampler (``sampler.py``) and the
rejection sampling of drafts (``rejection.py``), and the fused projections (``fusion.py``)."""
