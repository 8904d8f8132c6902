"""Runs, one folder per idea: ``result/`` (a run's data: ``Run``, ``load``, comparisons), ``background/`` (the
runs that fill in on a thread: ``LiveRun``, ``WatchRun``, ``Sweep``), ``setup/`` (a run spec -> engine config,
sampling, workload; simulated or real; the demo's) and ``workload/`` (synthetic requests, prompt files, a recorded
run's requests)."""
