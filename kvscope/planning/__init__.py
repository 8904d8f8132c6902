"""The capacity planner: KV bytes per token of a model shape, and how many requests fit with static
reservation vs paged blocks (``kvscope plan``). Imports no torch."""
