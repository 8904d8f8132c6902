"""A run's data: ``Run`` (records, events and metadata as DataFrames, a summary, exports), ``WatchedRun`` (a
watched server's), ``RunBuffer`` (the run so far, bounded), ``load``, and ``Comparison`` (runs side by side)."""
