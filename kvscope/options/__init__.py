"""The options of ``kvscope run`` / ``%kvscope`` (``run.py``), of sweeps (``sweep.py``) and of watches
(``watch.py``), declared once for both faces, with their value parsers and ``OptionError``. Standard
library only: parsing options never imports torch."""
