"""The runs that fill in on a background thread, all on one lifecycle (``lifecycle.py``): ``LiveRun`` (the engine
stepping), ``WatchRun`` (vLLM servers watched from outside), ``Sweep`` (one run per value of one option); their
small state in the standard library only (``status.py``)."""
