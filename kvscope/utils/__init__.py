"""Small helpers every layer may use: safe file writes and output checks (``files.py``), the memory this
process can get (``host.py``), byte sizes read and printed (``units.py``), the wall and virtual clocks
(``clock.py``), the garbage collector kept out of a long simulation's way (``collector.py``) and a value one
thread sees for a ``with`` (``thread_scope.py``)."""
