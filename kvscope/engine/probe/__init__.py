"""The probe at ``Engine()``: a few short forward passes through the engine's own attention that measure each
attention layer (``LayerSpec``) or refuse the model (``probe.py``); ``calls.py`` records the calls,
``masks.py`` reads transformers' mask functions."""
