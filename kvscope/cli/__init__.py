"""The ``kvscope`` command: ``main.py`` (the parser, one subcommand per module, exit codes) and one module per
command. Imports nothing of the magic."""
