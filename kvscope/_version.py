"""The package version, in a module of its own: reading it imports nothing else (``from kvscope import
__version__`` would import the package module, and with it the IPython extension hook and the magic)."""

__version__ = "0.1.0"
