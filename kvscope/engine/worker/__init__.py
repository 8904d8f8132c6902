"""The worker: everything that runs a model. ``ModelRunner`` (paged KV tensors, packing a step, forward,
sampling, verification), the "kvscope" attention registered in transformers' ``AttentionInterface``, the
sampler and the rejection sampling of drafts (``rejection.py``), and the fused projections."""
