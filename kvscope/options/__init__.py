"""The options of ``kvscope run`` / ``%kvscope`` (``run.py``, with their value parsers in ``values.py``), of
sweeps (``sweep.py``) and of watches (``watch.py``), declared once for both faces, and ``OptionError`` /
``OptionParser`` (``parser.py``). Standard library only: parsing options never imports torch."""
