"""Telemetry of sliding-window freeing: the step records count the blocks freed by the window, the
summary totals them, the static counterfactual reserves only the window in sliding layers, and files
without the new field still load (the occupancy panel's line: tests/widgets/test_window_panels.py)."""

from __future__ import annotations

import json

import pytest
import torch

from kvscope import Engine, Run, SamplingParams
from kvscope.models import build_tiny_model
from kvscope.telemetry.serialize import step_from_dict, step_to_dict

torch.set_num_threads(1)
WINDOW, BLOCK = 16, 4


@pytest.fixture(scope="module")
def windowed_run():
    model = build_tiny_model("mistral", sliding_window=WINDOW)
    engine = Engine(model, block_size=BLOCK, num_blocks=64, max_model_len=256)
    engine.generate([list(range(5, 85))], SamplingParams(max_tokens=40, ignore_eos=True))
    return engine, Run.from_engine(engine)


def test_records_and_summary_count_the_blocks_the_window_freed(windowed_run):
    _, run = windowed_run
    counts = [r.kv.num_window_freed_blocks for r in run.records]
    assert counts == sorted(counts) and counts[-1] > 0  # cumulative, and it did free
    # 120 tokens in blocks of 4 = 30 blocks; the window keeps at most 16 / 4 + 1 of them at once
    assert run.summary()["window_freed_blocks"] == counts[-1] >= 30 - (WINDOW // BLOCK + 1) - 1
    assert "kv_num_window_freed_blocks" in run.steps.columns


def test_static_counterfactual_reserves_only_the_window(windowed_run):
    engine, run = windowed_run
    spec = engine.spec
    per_request = spec.kv_bytes_for_tokens(spec.max_model_len)
    assert per_request == WINDOW * spec.kv_bytes_per_token < spec.max_model_len * spec.kv_bytes_per_token
    busy = [r for r in run.records if r.num_running]
    assert busy and all(r.kv.static_reservation_bytes == r.num_running * per_request for r in busy)


def test_older_files_without_the_field_still_load(windowed_run):
    _, run = windowed_run
    d = json.loads(json.dumps(step_to_dict(run.records[-1])))
    assert d["kv"]["num_window_freed_blocks"] > 0
    del d["kv"]["num_window_freed_blocks"]
    assert step_from_dict(d).kv.num_window_freed_blocks == 0
