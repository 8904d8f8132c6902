"""The options of ``kvscope run`` / ``%kvscope`` (``run.py``, with their value parsers in ``values.py``), of
sweeps (``sweep.py``), of watches (``watch.py``) and of simulations (``simulate.py``), declared once for both
faces, and ``OptionError`` / ``OptionParser`` (``parser.py``). Standard library only: parsing options never
imports torch."""
