"""``%kvscope`` / ``%%kvscope`` in IPython: ``%load_ext kvscope`` lands here (``run.py``), ``%kvscope simulate``
(``simulate.py``), ``%kvscope sweep`` (``sweep.py``) and ``%kvscope watch`` (``watch.py``), all parsed by
``base.py``'s ``MagicParser``. Imports nothing of the CLI."""
