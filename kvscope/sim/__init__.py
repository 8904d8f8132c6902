"""The simulator: the engine's own scheduler, KV cache manager and block pool, driven by a model-free
worker on a virtual clock (``kvscope simulate``); step-time models (fitted, roofline) and calibration."""
