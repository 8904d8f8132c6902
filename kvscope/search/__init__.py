"""``kvscope search``: the best serving configuration under a latency SLO, found by simulation (docs/ARCHITECTURE.md,
"Search"). ``space`` -> ``Point`` s; ``deployment`` makes one concrete; ``trial`` simulates it at one rate;
``goodput.evaluate`` bisects the rate; ``executors.run_search`` runs the points sequentially, in local processes or
on Ray; ``table`` / ``page`` / ``session`` turn the outcomes into the CSV, the Pareto page and the vllm serve line."""
