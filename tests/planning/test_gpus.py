"""The one GPU table (kvscope/planning/gpus.py): found by name or alias, and what the options list."""

from __future__ import annotations

import pytest

from kvscope.options.simulate import GPU_NAMES
from kvscope.planning.gpus import GPUS, find_gpu


def test_the_options_list_the_table_itself():
    assert GPU_NAMES == "a100-40gb, a100-80gb, h100, h100-pcie, h200, l4, a10g, rtx-4090, mi300x"
    assert GPU_NAMES.split(", ") == list(GPUS)


def test_names_and_aliases_in_any_case():
    assert find_gpu(" H100-SXM ") is GPUS["h100"] and find_gpu("4090") is GPUS["rtx-4090"]
    assert find_gpu("a100").memory_bytes == 40 * 10**9
    with pytest.raises(ValueError, match="unknown GPU 'b300'; known: a100-40gb, "):
        find_gpu("b300")
