"""Helpers of the real-vLLM tests (the fixtures are in conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscope.watch.vllm_demo import VllmServer, start_vllm


def serve(python: Path, model: Path, workdir: Path, **kwargs) -> Iterator[VllmServer]:
    """A server for a fixture to yield from: started (or the test fails with its log), always stopped."""
    try:
        server = start_vllm(model, workdir, python=python, **kwargs)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def prompt(start: int, n: int) -> list[int]:
    """``n`` consecutive token ids from ``start`` on (modulo the tiny vocabulary, clear of its specials 0-2)."""
    return [3 + (start + i) % 509 for i in range(n)]
