"""The runs that fill in on a background thread, all on one lifecycle (``lifecycle.py``; ``recording.py``: one
whose result is a ``Run``): ``LiveRun`` (``live.py``: the engine stepping; its workload submitted by
``submitter.py``, its profiling windows opened by ``profiling.py``), ``WatchRun`` (``watch.py``: vLLM servers
watched from outside, polled by ``polling.py``; ``watch()`` is ``kvscope.watch``), ``Sweep`` (``sweep.py``: one
run per value of one option, planned by ``sweep_plan.py``); their small state in the standard library only
(``status.py``)."""
