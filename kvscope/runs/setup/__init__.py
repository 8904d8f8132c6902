"""A run set up before it starts: ``RunSpec`` (one run, typed, as a face hands it on), ``prepare`` (the spec ->
model check, ``EngineConfig``, sampling, workload, outputs checked), ``simulated`` (the same with a simulated
engine: ``SimSpec``, ``prepare_simulation``)."""
