"""Records to dicts and back: speculative-decoding fields round-trip, and files without them still load."""

from __future__ import annotations

import pytest

from kvscope.telemetry.records import KVState, PageEntry, ScheduledItem, SpecDecodeStats, StepRecord
from kvscope.telemetry.serialize import step_from_dict, step_to_dict

KV = KVState(8, 4, 2, 0, 6, 0.25, 0.19, 0.25, 0, 0, 0, 0, 0)


def record(spec: SpecDecodeStats | None, items: list[ScheduledItem]) -> StepRecord:
    return StepRecord(3, 0, 10, 1, 2, 3, 2, 2, 0, 0, 1, 5, 1, 0, 0, 0, 3, items, KV,
                      page_map={1: PageEntry("a", 3, "used", 1)}, spec_decode=spec)


def test_speculative_fields_round_trip():
    spec = SpecDecodeStats(4, num_drafts=1, num_draft_tokens=4, num_accepted_tokens=2,
                           num_draft_tokens_per_pos=[1, 1, 1, 1], num_accepted_tokens_per_pos=[1, 1, 0, 0],
                           draft_slots={1: [2, 2], 2: [2, 0]}, freed_blocks=[2], propose_ns=1234, draft_num_blocks=8,
                           draft_blocks_used=3, draft_page_map={0: PageEntry("a", 4, "used", 1)},
                           draft_page_map_full=True)
    items = [ScheduledItem("a", "decode", 5, 9, True, 4, 2), ScheduledItem("b", "prefill", 3, 3, False)]
    d = step_to_dict(record(spec, items))
    assert d["scheduled"] == [["a", "decode", 5, 9, True, 4, 2], ["b", "prefill", 3, 3, False]]
    back = step_from_dict(d)
    assert back.spec_decode == spec and back.scheduled == items and back.spec_decode.num_rejected_tokens == 2


def test_a_step_without_speculation_is_written_as_before_and_old_files_load():
    items = [ScheduledItem("a", "decode", 1, 9, True)]
    d = step_to_dict(record(None, items))
    assert "spec_decode" not in d and d["scheduled"] == [["a", "decode", 1, 9, True]]
    back = step_from_dict(d)
    assert back.spec_decode is None and back.scheduled[0].num_draft_tokens == 0


def test_malformed_speculative_fields_are_refused():
    d = step_to_dict(record(SpecDecodeStats(2), []))
    d["spec_decode"]["num_draft_tokens"] = "many"
    with pytest.raises(ValueError, match="malformed"):
        step_from_dict(d)
    d = step_to_dict(record(None, [ScheduledItem("a", "decode", 1, 9, True)]))
    d["scheduled"][0].append(3)  # 6 values: neither the old 5 nor the speculative 7
    with pytest.raises(ValueError, match="5 or 7 expected"):
        step_from_dict(d)


@pytest.mark.parametrize("ids", [[1, -2], [1, True], [1, 2.0], [1, 2**63], "ab", [[1]], [1, None]])
def test_prompt_token_ids_that_are_not_non_negative_64_bit_integers_are_refused(ids):
    from kvscope.telemetry.serialize import event_from_dict

    event = {"t_ns": 1, "step": 0, "request_id": "r", "kind": "queued", "num_prompt_tokens": 2,
             "num_output_tokens": 0, "prompt_token_ids": ids}
    with pytest.raises(ValueError, match=r"prompt_token_ids|malformed"):
        event_from_dict(event)
    assert event_from_dict({**event, "prompt_token_ids": [0, 5, 2**63 - 1]}).prompt_token_ids == [0, 5, 2**63 - 1]
    assert event_from_dict({**event, "prompt_token_ids": []}).prompt_token_ids == []
