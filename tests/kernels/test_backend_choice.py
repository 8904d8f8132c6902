"""``resolve_backend("triton", "cpu")`` gives the Triton kernels under the interpreter and a clear error
without it; the launchers themselves refuse CPU tensors when the kernels were compiled for a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kvscope.kernels.backend import resolve_backend
from kvscope.kernels.paged_attention import paged_attention
from kvscope.kernels.store_kv import store_kv


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the kernels are compiled, not interpreted")
def test_triton_backend_on_cpu_under_the_interpreter():
    backend = resolve_backend("triton", "cpu")
    assert backend.name == "triton"
    assert backend.store_kv is store_kv and backend.paged_attention is paged_attention


def test_without_the_interpreter_the_errors_say_what_to_do():
    script = textwrap.dedent(
        """
        import torch
        from kvscope.kernels.backend import resolve_backend
        try:
            resolve_backend("triton", "cpu")
        except ValueError as exc:
            print("resolve:", exc)
        from kvscope.kernels.store_kv import store_kv
        cache = torch.zeros(2, 8, 1, 64)
        try:
            store_kv(torch.ones(1, 1, 64), torch.ones(1, 1, 64), cache, cache.clone(), torch.tensor([3]))
        except ValueError as exc:
            print("launch:", exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert "TRITON_INTERPRET=1" in lines["resolve"] and "attention_backend='torch'" in lines["resolve"]
    assert "TRITON_INTERPRET=1" in lines["launch"] and "cpu tensors" in lines["launch"]
