"""The capacity planner (``planner.py``): KV bytes per token of a model shape, and how many requests fit with
static reservation vs paged blocks (``kvscope plan``); the model shapes it plans (``shapes.py``: ``ModelShape``,
the known shapes) and the GPU table (``gpus.py``), which the simulator and the options share. Imports no torch."""
