"""A run never waits for the C++ kernel's build (kernels/background_build.py): with the build held back, the
first steps run on the torch kernel at once, later steps on the C++ kernel once the build is done, the step
records say which, and the greedy tokens are those of a run on either kernel alone."""

from __future__ import annotations

import threading
import time

import pytest

from kvscope import Engine, SamplingParams
from kvscope.kernels import background_build, cpu_paged
from kvscope.kernels.backend import resolve_backend
from kvscope.models.loader import build_tiny_model
from kvscope.telemetry.serialize import step_from_dict, step_to_dict

if not cpu_paged.load():  # tests/conftest.py built it; where no compiler exists, test_cpu_paged.py says why
    pytest.skip("the C++ decode-attention kernel did not build here", allow_module_level=True)


@pytest.fixture
def cold(monkeypatch):
    """As on a fresh install: the kernel is not built, and its build waits for ``release`` (or fails)."""
    release, result = threading.Event(), {"ok": True}

    def held_build() -> bool:
        release.wait(30)
        return result["ok"] and cpu_paged.load()

    monkeypatch.setattr(cpu_paged, "ready", lambda: False)
    background_build.set_builder(held_build)
    yield release, result
    release.set()
    background_build.cpu_kernel_build().wait(30)
    background_build.set_builder(None)


def _generate(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [o.token_ids for o in outs]


def test_the_first_steps_run_on_torch_and_switch_once_built(cold):
    release, _ = cold
    model = build_tiny_model("llama")
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13], [3] * 20]
    start = time.monotonic()
    engine = Engine(model, num_blocks=64, block_size=4, telemetry=True)
    assert engine.runner.backend.name == "torch" and engine.runner.backend.pending is not None
    first = [o for o in engine.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))]
    assert time.monotonic() - start < 20  # not held by the build (the fake one waits 30 s)
    assert all(len(o.token_ids) == 4 for o in first)
    release.set()
    assert background_build.cpu_kernel_build().wait(30) is True
    rest = _generate(engine, prompts, 12)
    assert engine.runner.backend.name == "cpu" and engine.runner.backend.run_plan is cpu_paged.run_plan

    records = list(engine.recorder.steps)
    kernels = [r.attention_backend for r in records]
    switch = kernels.index("cpu")
    assert set(kernels[:switch]) == {"torch"} and set(kernels[switch:]) == {"cpu"} and switch > 0
    meta = engine.recorder.meta
    assert meta["attention_backend"] == "torch"
    (moved,) = meta["attention_backend_switches"]
    assert moved["from"] == "torch" and moved["to"] == "cpu" and moved["step"] == records[switch].step
    # the field loads back, and a record written before it existed loads as None
    assert step_from_dict(step_to_dict(records[-1])).attention_backend == "cpu"
    old = step_to_dict(records[-1])
    del old["attention_backend"]
    assert step_from_dict(old).attention_backend is None

    # the same tokens as a run on either kernel alone
    for name in ("torch", "cpu"):
        alone = Engine(model, num_blocks=64, block_size=4, attention_backend=name)
        assert _generate(alone, prompts, 4) == [o.token_ids for o in first], name
        assert _generate(alone, prompts, 12) == rest, name


def test_a_switch_in_the_middle_of_requests_keeps_the_tokens(cold):
    release, _ = cold
    model = build_tiny_model("llama")
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13, 14]]
    engine = Engine(model, num_blocks=64, block_size=4)
    tokens: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True), request_id=str(i))

    def step() -> None:
        for d in engine.step():
            tokens.setdefault(d.request_id, []).append(d.token_id)

    for _ in range(4):  # prefill and a few decodes on torch
        step()
    assert engine.runner.backend.name == "torch"
    release.set()
    background_build.cpu_kernel_build().wait(30)
    while engine.has_unfinished_requests():
        step()
    assert engine.runner.backend.name == "cpu"
    ref = _generate(Engine(model, num_blocks=64, block_size=4, attention_backend="torch"), prompts, 16)
    assert [tokens[str(i)] for i in range(len(prompts))] == ref


def test_a_failed_build_keeps_torch(cold):
    release, result = cold
    result["ok"] = False
    engine = Engine(build_tiny_model("llama"), num_blocks=32, block_size=4)
    release.set()
    assert background_build.cpu_kernel_build().wait(30) is False
    _generate(engine, [[5, 6, 7]], 3)
    assert engine.runner.backend.name == "torch" and engine.runner.backend.pending is None
    assert resolve_backend("auto", "cpu").pending is None  # later engines do not wait for it either


def test_no_switch_while_a_profiler_wraps_the_kernels(cold):
    from kvscope.engine.source import wrap_backend

    release, _ = cold
    engine = Engine(build_tiny_model("llama"), num_blocks=32, block_size=4)
    calls: list[str] = []
    restore = wrap_backend(engine.runner, lambda kind, fn: lambda *a, **k: (calls.append(kind), fn(*a, **k))[1])
    release.set()
    assert background_build.cpu_kernel_build().wait(30) is True
    _generate(engine, [[5, 6, 7]], 3)
    assert engine.runner.backend.name == "torch" and "paged_attention" in calls  # the wrapped kernels kept
    restore()
    _generate(engine, [[5, 6, 7]], 3)
    assert engine.runner.backend.name == "cpu"


def test_a_process_that_ends_during_the_build_finishes_it_first(tmp_path):
    """A short run (a demo) ends while the kernel builds: the process waits for the build at exit and says so,
    rather than leaving the compiler behind with the build folder locked (the next run would build again)."""
    import subprocess
    import sys

    done = tmp_path / "built"
    script = (
        "import time\n"
        "from pathlib import Path\n"
        "from kvscope.kernels import background_build\n"
        f"def slow():\n    time.sleep(2)\n    Path({str(done)!r}).write_text('ok')\n    return True\n"
        "background_build.set_builder(slow)\n"
        "background_build.cpu_kernel_build()\n"
        "print('run over')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "run over" in out.stdout, out.stderr
    assert "finishing the cpu kernel's build" in out.stderr and "Ctrl-C skips" in out.stderr
    assert done.read_text() == "ok"
