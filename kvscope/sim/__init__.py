"""The simulator: the engine's own scheduler, KV cache manager and block pool, driven by a model-free
worker (``worker.py``, with placeholder drafts for speculative decoding: ``speculative.py``) on a virtual clock
(``kvscope simulate``); ``build.py`` makes such an engine, ``shape.py`` the model shape it stands for; step-time
models (``step_model.py``: fitted; ``roofline.py``: a GPU's data sheet) and calibration (``calibrate.py``)."""
