"""A run set up before it starts: ``spec`` (``RunSpec``: one run, typed, as a face hands it on), ``prepare`` (the
spec -> model check, ``EngineConfig``, sampling, workload, outputs checked), ``simulated`` (the same with a
simulated engine: ``SimSpec``, ``prepare_simulation``), ``outputs`` (the files a run writes at its end) and
``demo`` (the demo's model choice and workload, as a prepared run)."""
