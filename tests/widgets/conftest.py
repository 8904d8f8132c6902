"""Fixtures for the dashboard, report and notebook tests: runs of the ``tiny`` model, headless
Chromium with the network blocked, and the artifacts folder where screenshots are kept."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from widget_util import XSS_PROMPTS

# On a shared 2-core machine torch's intra-op threads spin against the dashboard thread and other
# processes (a 1 ms step can take 500 ms); one thread keeps these tests fast and stable.
torch.set_num_threads(1)

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """``artifacts/`` at the repository root (git-ignored): screenshots kept for people to look at."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def _local(url: str) -> bool:
    if url.startswith(("file:", "data:", "blob:", "about:")):
        return True
    return urlsplit(url).hostname in ("127.0.0.1", "localhost")


@pytest.fixture
def page(chromium):
    """A fresh page whose requests to anything but local files and loopback are aborted; every
    blocked URL, console error, page error and dialog is recorded on ``page.kvscope_log``."""
    context = chromium.new_context(viewport={"width": 1150, "height": 1400})
    page = context.new_page()
    log: dict[str, list[str]] = {"blocked": [], "errors": [], "dialogs": []}

    def route(r):
        if _local(r.request.url):
            r.continue_()
        else:
            log["blocked"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda exc: log["errors"].append(str(exc)))
    page.on("console", lambda m: log["errors"].append(m.text) if m.type == "error" else None)
    page.on("dialog", lambda d: (log["dialogs"].append(d.message), d.dismiss()))
    page.kvscope_log = log
    yield page
    context.close()


@pytest.fixture(scope="session")
def finished_run():
    """A finished ``LiveRun`` of the tiny model: text prompts (two of them hostile HTML), a shared
    system prompt (prefix caching), a pool small enough to preempt."""
    from kvscope import Engine, SamplingParams
    from kvscope.runs.background.live import LiveRun
    from kvscope.runs.workload.items import prompts_workload

    system = "You are a helpful assistant. Answer in one short sentence. " * 2
    prompts = XSS_PROMPTS + [system + q for q in ("What is a KV cache?", "Why page it?", "What is TTFT?",
                                                  "What is ITL?", "Why batch?", "What is prefill?")]
    engine = Engine("tiny", num_blocks=40, block_size=8, max_num_seqs=8, max_num_batched_tokens=128)
    items = prompts_workload(prompts, (24, 48), params=SamplingParams(), ignore_eos=True)
    return LiveRun(engine, items, dashboard=False).start().wait(timeout=120)
