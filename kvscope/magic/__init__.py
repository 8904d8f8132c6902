"""``%kvscope`` / ``%%kvscope`` in IPython: ``%load_ext kvscope`` lands here (``run.py``), ``%kvscope sweep``
(``sweep.py``) and ``%kvscope watch`` (``watch.py``). Imports nothing of the CLI."""
