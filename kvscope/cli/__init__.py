"""The ``kvscope`` command: ``main.py`` (the parser, the subcommand registry, exit codes), one module per
command, each defining a ``Command`` (``command.py``): ``demo``, ``run``, ``plan``, ``view`` (with
``perfetto_ui.py``, the offline Perfetto UI), ``compare``, ``sweep``, ``watch``, ``simulate``, ``calibrate`` and
``explain`` (with ``explain_offline.py``, its offline simulation and slow-step report, and ``explain_report.py``,
what it prints and writes); and what they share: ``parser.py`` (``CLIError`` and the one-line-error parser),
``paths.py`` (input and output checks), ``signals.py`` (SIGTERM / SIGHUP stop a run like Ctrl-C).
Imports nothing of the magic."""
