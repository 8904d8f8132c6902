"""Checks shared by the interrupt, bad-input, file and thread tests: an engine that ended
consistent, a final record that shows everything freed, files that are whole, no threads left.

(A module of its own, not ``conftest``: conftest names clash between test folders.)
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from torch.utils.hooks import RemovableHandle

import kvscope
from kvscope import Engine, SamplingParams
from kvscope.runs.background.live import LiveRun
from kvscope.runs.result.run import Run
from kvscope.runs.workload.items import WorkItem, synthetic_workload

# What the reliability tests tried, printed at the end of the run (conftest.pytest_terminal_summary)
FIGURES: Counter = Counter()
ENGINE_KW = dict(block_size=8, num_blocks=48, max_num_seqs=4, max_num_batched_tokens=64)


def tiny_engine(**kwargs) -> Engine:
    return Engine("tiny", **{**ENGINE_KW, **kwargs})


def workload(n: int, out: int, seed: int = 3, prompt_len: tuple[int, int] = (8, 24)) -> list[WorkItem]:
    """``n`` synthetic token-id prompts, each running exactly ``out`` greedy tokens."""
    return synthetic_workload(n, prompt_len, (out, out), vocab_size=512, exclude_ids=[0, 1, 2], seed=seed)


def reference_tokens(items: list[WorkItem]) -> list[list[int]]:
    """Each item's greedy output when it runs alone on a fresh engine without telemetry."""
    engine = Engine("tiny", block_size=8, num_blocks=64, enable_prefix_caching=False, telemetry=False)
    return [engine.generate([item.prompt], item.params)[0].token_ids for item in items]


def assert_engine_clean(engine: Engine) -> None:
    """No request left anywhere and every block back in the pool."""
    pool = engine.pool
    assert not engine.has_unfinished_requests() and engine.requests == {}
    assert pool.num_free_blocks == pool.num_blocks, f"{pool.num_blocks - pool.num_free_blocks} blocks leaked"
    assert all(block.ref_cnt == 0 for block in pool.blocks)


def assert_final_record_shows_all_freed(run: Run) -> None:
    """Step indices unique and consecutive, and the last record (the one a dashboard, a report or a
    loaded file ends on) shows empty queues and a page map with no block held."""
    steps = [r.step for r in run.records]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "step indices are not unique and consecutive"
    last = run.records[-1]
    assert (last.num_running, last.num_waiting, last.kv.blocks_used) == (0, 0, 0), (
        f"stale last record: running {last.num_running}, waiting {last.num_waiting}, used {last.kv.blocks_used}"
    )
    held = [e for e in run.page_map_at(last.step) if e.state in ("used", "shared")]
    assert held == [], f"the final page map still shows {len(held)} blocks held"


def assert_every_request_ended(run: Run, reasons: Iterable[str]) -> Counter:
    """Each queued request has exactly one ``finished`` event, with a reason among ``reasons``;
    returns the count per reason."""
    queued = [e.request_id for e in run.events if e.kind == "queued"]
    finished = {}
    for e in run.events:
        if e.kind == "finished":
            assert e.request_id not in finished, f"{e.request_id} finished twice"
            finished[e.request_id] = e.reason
    assert sorted(finished) == sorted(queued), "a request has no finished event"
    counts = Counter(finished.values())
    assert set(counts) <= set(reasons), counts
    FIGURES["requests whose end was checked"] += len(queued)
    return counts


def assert_trace_complete(path: Path) -> dict:
    """A Chrome trace that opens: JSON with ``traceEvents``, non-negative slices, and every async
    begin matched by an end (an unmatched ``b`` shows as a slice that never ends)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    assert all(e["dur"] >= 0 for e in events if e.get("ph") == "X")
    opened = Counter((_lane(e), e["name"]) for e in events if e.get("ph") == "b")
    closed = Counter((_lane(e), e["name"]) for e in events if e.get("ph") == "e")
    assert opened == closed, "async slices without an end"
    return doc


def assert_files_valid(run: Run, trace: Path | None = None, metrics: Path | None = None,
                       html: Path | None = None) -> None:
    """The files a run wrote are whole, load back to the same run, and no temp file is left."""
    for path in (trace, metrics, html):
        if path is not None:
            FIGURES["files checked whole"] += 1
            assert path.is_file(), f"{path} was not written"
            leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
            assert leftovers == [], f"temp files left behind: {leftovers}"
    if trace is not None:
        assert_trace_complete(trace)
    if metrics is not None:
        last = json.loads(metrics.read_text(encoding="utf-8").splitlines()[-1])
        assert last["type"] == "end" and last["num_steps"] == len(run.records), last
    for path in (trace, metrics):
        if path is not None:
            back = kvscope.load(path)
            assert [r.step for r in back.records] == [r.step for r in run.records]
            assert len(back.events) == len(run.events)
            assert_final_record_shows_all_freed(back)
    if html is not None:
        page = html.read_text(encoding="utf-8")
        assert page.rstrip().endswith("</html>") and "Bokeh" in page


def assert_new_run_works(engine: Engine, items: list[WorkItem], expected: list[list[int]]) -> LiveRun:
    """A new live run on the same engine finishes and gives the isolated greedy outputs."""
    run = LiveRun(engine, items, dashboard=False).start().wait(timeout=60)
    FIGURES["new runs after an interrupt"] += 1
    assert run.status == "finished", run.status
    assert [o.token_ids for o in run.outputs] == expected
    assert_engine_clean(engine)
    return run


def kvscope_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("kvscope"))


# Started once per process by IPython itself when the first widget or shell is made; not ours.
PROCESS_SINGLETONS = {"IPythonHistorySavingThread"}


def threads_left(before: set[threading.Thread], timeout: float = 10.0) -> list[str]:
    """Names of threads started since ``before`` that are still alive after ``timeout`` seconds."""
    FIGURES["thread checks"] += 1
    deadline = time.monotonic() + timeout
    while True:
        extra = [t for t in threading.enumerate()
                 if t not in before and t.is_alive() and t.name not in PROCESS_SINGLETONS]
        if not extra or time.monotonic() > deadline:
            return sorted(t.name for t in extra)
        time.sleep(0.02)


def wait_for_steps(run: LiveRun, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while run.step < n:
        assert not run.done, f"the run ended after {run.step} steps, before {n}: {run.status}"
        assert time.monotonic() < deadline, f"only {run.step} steps after {timeout} s"
        time.sleep(0.01)


def failing_forward(engine: Engine, exc: BaseException, after_calls: int) -> RemovableHandle:
    """Make the model's forward raise ``exc`` on call number ``after_calls + 1``: a forward pre-hook
    on the first decoder layer, so the failure comes from inside the real forward pass. Returns the
    hook's handle (``.remove()`` it to heal the model)."""
    calls = [0]

    def hook(module, args, kwargs):
        calls[0] += 1
        if calls[0] == after_calls + 1:
            FIGURES[f"{type(exc).__name__}s raised in the forward pass"] += 1
            raise exc

    return engine.model.model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _lane(event: dict) -> tuple:
    """An async event's lane: its process and its id (a process-local ``id2``, or a global ``id``)."""
    return event["pid"], json.dumps(event.get("id2", event.get("id")))
