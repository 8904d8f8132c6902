"""Telemetry of sliding-window freeing: the step records count the blocks freed by the window, the
summary totals them, the static counterfactual reserves only the window in sliding layers, and files
without the new field still load (the occupancy panel's line: tests/widgets/test_window_panels.py)."""

from __future__ import annotations

import json

import pytest
import torch

from kvscope import Engine, Run, SamplingParams
from kvscope.models.loader import build_tiny_model
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


def test_page_map_entries_name_their_kv_group():
    """A hybrid's blocks say which group's table they are in; files carry the group only where it is not 0."""
    from kvscope.models.zoo import tiny_model

    engine = Engine(tiny_model("gemma3_text"), block_size=BLOCK, num_blocks=256, max_model_len=256)
    engine.generate([list(range(5, 45))], SamplingParams(max_tokens=8, ignore_eos=True))
    run = Run.from_engine(engine)
    groups = engine.kv_config.num_groups
    held = [e for r in run.records for e in r.page_map.values() if e.state != "free"]
    assert groups > 1 and {e.kv_group for e in held} == set(range(groups))
    record = next(r for r in run.records if any(e.kv_group for e in r.page_map.values()))
    d = json.loads(json.dumps(step_to_dict(record)))
    assert {len(v) for v in d["page_map"].values()} == {4, 5}  # group 0 entries keep the 4-value form
    assert step_from_dict(d).page_map == record.page_map
    with pytest.raises(ValueError, match="4 or 5 expected"):
        step_from_dict({**d, "page_map": {"0": ["a", 1, "used", 1, 0, 9]}})


def test_a_single_group_model_writes_the_four_value_form(windowed_run):
    _, run = windowed_run
    d = step_to_dict(run.records[-1])
    assert d["page_map"] and all(len(v) == 4 for v in d["page_map"].values())
