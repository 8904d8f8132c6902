"""Runs: a ``Run`` (records, events and metadata as DataFrames, a summary, exports; ``load``), comparisons,
and the runs that fill in while you watch, all on one lifecycle (``lifecycle.py``): ``LiveRun`` (the engine
on a background thread), ``WatchRun`` (vLLM servers watched from outside) and ``Sweep``. Also the workload
(synthetic requests, prompt files), the run setup (a run spec -> engine config, sampling, workload) and the
demo's choices."""
