"""A run's data: ``Run`` (records, events and metadata as DataFrames, a summary, exports), ``WatchedRun`` (a
watched server's) and ``load`` (run.py), ``RunBuffer`` (the run so far, bounded; buffer.py), and ``Comparison``
(runs side by side; comparison.py)."""
