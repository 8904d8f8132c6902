"""Small helpers every layer may use: safe file writes and output checks (``files.py``), the memory this
process can get (``host.py``), byte sizes read and printed (``units.py``)."""
