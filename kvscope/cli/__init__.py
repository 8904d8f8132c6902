"""The ``kvscope`` command: ``main.py`` (the parser, the subcommand registry, exit codes), one module per
command (``demo``, ``run``, ``plan``, ``view``, ``compare``, ``sweep``, ``watch``), each defining a ``Command``
(``command.py``), and what they share: ``parser.py`` (``CLIError`` and the one-line-error parser),
``paths.py`` (input and output checks), ``signals.py`` (SIGTERM / SIGHUP stop a run like Ctrl-C).
Imports nothing of the magic."""
