"""Validation at the edge: hostile values for ``SamplingParams``, ``EngineConfig``, prompts and devices
are refused where they are given, in one line naming the field (``TypeError`` for a wrong type,
``ValueError`` for a wrong value), so nothing fails deep inside a step; a bad request fails alone at
``add_request`` and the others finish. Model folders that hold no causal LM are refused in one line
before anything loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reliability_util import FIGURES, assert_engine_clean, params, reference_tokens, tiny_engine, workload

from kvscope import Engine, EngineConfig, SamplingParams
from kvscope.engine.request import TEMPERATURE_FLOOR
from kvscope.engine.worker.sampler import sample
from kvscope.models.folder import check_model_folder
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import WorkItem

pytestmark = pytest.mark.timeout(120)
PROMPT = [5, 40, 80, 120, 7, 9]

BAD_SAMPLING = [
    # (fields, exception, what the message must say)
    (dict(seed=2**64), ValueError, r"seed=18446744073709551616 must be an unsigned 64-bit integer"),
    (dict(seed=-1), ValueError, r"seed=-1 must be an unsigned 64-bit integer"),
    (dict(seed=True), TypeError, r"seed=True .* not bool"),
    (dict(seed=1.5), TypeError, r"seed=1.5 .* not float"),
    (dict(temperature="0.5"), TypeError, r"temperature='0.5' must be a finite number >= 0 .* not str"),
    (dict(temperature=float("inf")), ValueError, r"temperature=inf"),
    (dict(temperature=-1e-30), ValueError, r"temperature=-1e-30"),
    (dict(temperature=10**400), ValueError, r"temperature=1000+\.\.\.\(401 characters\)"),  # no float
    (dict(top_p="1"), TypeError, r"top_p='1' .* not str"),
    (dict(top_p=float("nan")), ValueError, r"top_p=nan"),
    (dict(top_k=2.0), TypeError, r"top_k=2.0 must be a non-negative integer .* not float"),
    (dict(top_k=True), TypeError, r"top_k=True"),
    (dict(max_tokens=True), TypeError, r"max_tokens=True must be an integer of at least 1, not bool"),
    (dict(max_tokens="8"), TypeError, r"max_tokens='8'"),
    (dict(max_tokens=8.0), TypeError, r"max_tokens=8.0"),
    (dict(stop_token_ids="abc"), TypeError, r"stop_token_ids='abc' must be token ids .* not str"),
    (dict(stop_token_ids=b"ab"), TypeError, r"stop_token_ids=b'ab' must be token ids"),
    (dict(stop_token_ids=7), TypeError, r"stop_token_ids=7 must be a list of token ids, e.g. \[7\]"),
    (dict(stop_token_ids=[1.5]), TypeError, r"stop_token_ids must hold integer token ids; item 0 is 1.5"),
    (dict(stop_token_ids=[True]), TypeError, r"item 0 is True"),
    (dict(stop_token_ids=[-3]), ValueError, r"non-negative"),
    (dict(ignore_eos="no"), TypeError, r"ignore_eos='no' must be True or False"),
]


@pytest.mark.parametrize(("fields", "error", "match"), BAD_SAMPLING)
def test_sampling_params_refuse_bad_types_and_values_naming_the_field(fields, error, match):
    FIGURES["hostile values refused at the edge"] += 1
    with pytest.raises(error, match=match) as info:
        SamplingParams(**fields)
    assert "\n" not in str(info.value)


def test_sampling_params_accept_numpy_scalars_and_arrays_as_plain_values():
    p = SamplingParams(max_tokens=np.int64(4), temperature=np.float32(0.5), top_k=np.int32(3), seed=np.uint64(2**63),
                       stop_token_ids=np.array([3, 4]), ignore_eos=np.bool_(True))
    assert (type(p.max_tokens), type(p.temperature), type(p.seed), p.seed) == (int, float, int, 2**63)
    assert p.stop_token_ids == [3, 4] and all(type(t) is int for t in p.stop_token_ids) and p.ignore_eos is True
    assert SamplingParams(stop_token_ids={9, 3}).stop_token_ids == [3, 9]
    assert SamplingParams(seed=0).seed == 0 and SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


def test_temperatures_below_the_floor_are_greedy_and_the_sampler_never_makes_nan():
    for t in (1e-300, 5e-324, TEMPERATURE_FLOOR / 2):
        p = SamplingParams(temperature=t)
        assert p.temperature == 0.0 and p.greedy
    assert not SamplingParams(temperature=TEMPERATURE_FLOOR).greedy
    engine = tiny_engine()
    greedy = engine.generate([PROMPT], params(6))[0].token_ids
    tiny = SamplingParams(max_tokens=6, temperature=1e-40, seed=1, ignore_eos=True)
    floor = SamplingParams(max_tokens=6, temperature=TEMPERATURE_FLOOR, seed=2**64 - 1, ignore_eos=True)
    outs = engine.generate([PROMPT, PROMPT, PROMPT], [params(6), tiny, floor])  # one batch: nothing fails
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert outs[0].token_ids == outs[1].token_ids == greedy
    assert_engine_clean(engine)
    # logits far beyond any model's, at the floor temperature: probabilities stay finite
    logits = torch.tensor([[3e38, -3e38, 0.0, 1e30]], dtype=torch.float32)
    requests = [engine.make_request([5], floor)]
    assert sample(logits, requests) == [0]


BAD_CONFIG = [
    (dict(kv_cache_memory=float("inf")), TypeError, r"kv_cache_memory=inf must be a positive number of bytes"),
    (dict(kv_cache_memory=float("nan")), TypeError, r"kv_cache_memory=nan"),
    (dict(kv_cache_memory=10**400), ValueError, r"kv_cache_memory=1000+\.\.\.\(401 characters\) must be"),
    (dict(kv_cache_memory=True), TypeError, r"kv_cache_memory=True"),
    (dict(kv_cache_memory="1GiB"), TypeError, r"kv_cache_memory='1GiB'"),
    (dict(num_blocks=2**63), ValueError, r"num_blocks=9223372036854775808 must be a positive integer below 2\*\*63"),
    (dict(num_blocks=4.0), TypeError, r"num_blocks=4.0"),
    (dict(max_num_seqs=1.5), TypeError, r"max_num_seqs=1.5 must be an integer >= 1"),
    (dict(max_num_seqs=True), TypeError, r"max_num_seqs=True .* not bool"),
    (dict(max_num_batched_tokens=float("inf")), TypeError, r"max_num_batched_tokens=inf"),
    (dict(max_model_len="5"), TypeError, r"max_model_len='5' .* not str"),
    (dict(block_size=True), TypeError, r"block_size=True must be a power of two"),
    (dict(block_size=16.0), TypeError, r"block_size=16.0 must be a power of two"),
    (dict(gpu_memory_utilization=float("nan")), ValueError, r"gpu_memory_utilization=nan must be in \(0, 1\]"),
    (dict(gpu_memory_utilization="0.9"), TypeError, r"gpu_memory_utilization='0.9'"),
    (dict(enable_prefix_caching="yes"), TypeError, r"enable_prefix_caching='yes' must be True or False"),
    (dict(telemetry=1), TypeError, r"telemetry=1 must be True or False"),
    (dict(device=0), TypeError, r"device=0 must be a device name"),
    (dict(device="bogus"), ValueError, r"device='bogus' is not a device name"),
    (dict(dtype=32), TypeError, r"dtype=32"),
    (dict(seed=2**64), ValueError, r"seed=18446744073709551616 must be an unsigned 64-bit integer"),
]


@pytest.mark.parametrize(("fields", "error", "match"), BAD_CONFIG)
def test_engine_config_refuses_bad_types_and_values_naming_the_field(fields, error, match):
    FIGURES["hostile values refused at the edge"] += 1
    with pytest.raises(error, match=match) as info:
        EngineConfig(**fields)
    assert "\n" not in str(info.value)
    with pytest.raises(error, match=match):  # Engine(**kwargs) checks the same, before loading
        Engine("tiny", **fields)


def test_engine_config_keeps_good_values_as_plain_ints():
    config = EngineConfig(kv_cache_memory=2.5e6, num_blocks=np.int64(8), max_num_seqs=np.int32(4))
    assert (config.kv_cache_memory, config.num_blocks, config.max_num_seqs) == (2_500_000, 8, 4)
    assert all(type(v) is int for v in (config.kv_cache_memory, config.num_blocks, config.max_num_seqs))


@pytest.mark.parametrize("device", ["meta", "mps", "xpu", "cuda:64"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_unusable_devices_are_refused_at_engine_in_one_line(device):
    FIGURES["hostile values refused at the edge"] += 1
    with pytest.raises(ValueError, match=rf"device='{device}'") as info:
        Engine("tiny", device=device, num_blocks=8)
    assert "\n" not in str(info.value) and "cpu" in str(info.value)


def test_numpy_and_torch_prompts_run_like_lists():
    engine = tiny_engine()
    expected = engine.generate([PROMPT], params(5))[0].token_ids
    for prompt in (np.array(PROMPT), np.array(PROMPT, dtype=np.int32), torch.tensor(PROMPT), tuple(PROMPT),
                   [np.int64(t) for t in PROMPT], [torch.tensor(t) for t in PROMPT]):
        assert engine.generate(prompt, params(5))[0].token_ids == expected  # one prompt
        outs = engine.generate([prompt, PROMPT], params(5))  # a list of prompts
        assert [o.token_ids for o in outs] == [expected, expected]
        assert outs[0].prompt_token_ids == PROMPT and all(type(t) is int for t in outs[0].prompt_token_ids)
    assert_engine_clean(engine)


BAD_PROMPTS = [
    (np.array([PROMPT]), ValueError, r"prompts is an array of shape \(1, 6\)"),
    ([np.array([PROMPT])], ValueError, r"prompt 0: the prompt must be 1-D token ids; got an array of shape \(1, 6\)"),
    ([np.array([5.0, 6.0])], TypeError, r"prompt 0: the prompt must hold integer token ids; got an array of float64"),
    ([torch.tensor([5.0, 6.0])], TypeError, r"an array of torch.float32"),
    ([torch.tensor([True, False])], TypeError, r"an array of torch.bool"),
    ([5.7, 6.2], TypeError, r"prompt 0: the prompt must hold integer token ids; item 0 is 5.7"),
    ([[True, False]], TypeError, r"item 0 is True"),
    ([b"abc"], TypeError, r"prompt 0: the prompt must be a string or token ids .* decode bytes to str first"),
    ([{"text": "hi"}], TypeError, r"prompt 0: the prompt must be a string or token ids .* not dict"),
    ([PROMPT, ["a", "b"]], TypeError, r"prompt 1: the prompt must hold integer token ids; item 0 is 'a'"),
    (42, TypeError, r"prompts must be a string, token ids, or a list of those; not int"),
]


@pytest.mark.parametrize(("prompts", "error", "match"), BAD_PROMPTS)
def test_bad_prompts_are_refused_naming_them_and_nothing_starts(prompts, error, match):
    FIGURES["hostile values refused at the edge"] += 1
    engine = tiny_engine()
    with pytest.raises(error, match=match) as info:
        engine.generate(prompts, params(4))
    assert "\n" not in str(info.value)
    assert_engine_clean(engine)


def test_a_bad_request_fails_alone_at_add_request_and_the_others_finish():
    items = workload(3, out=6, seed=5)
    expected = reference_tokens(items)
    engine = tiny_engine()
    ids = [engine.add_request(item.prompt, item.params) for item in items[:2]]
    outputs: dict[str, list[int]] = {}

    def step() -> None:
        for delta in engine.step():
            if delta.token_id is not None:
                outputs.setdefault(delta.request_id, []).append(delta.token_id)

    step()
    changed = SamplingParams(max_tokens=4)
    changed.temperature = float("nan")  # changed after construction: caught when a request is made
    for prompt, p, error in [([5, 6], changed, ValueError), ([5, 6], {"max_tokens": 4}, TypeError),
                             ([5.5], params(4), TypeError), ([5, 6], SamplingParams(seed=7), None)]:
        if error is None:
            p.seed = 2**70
            error = ValueError
        with pytest.raises(error):
            engine.add_request(prompt, p)
        FIGURES["hostile values refused at the edge"] += 1
    with pytest.raises(ValueError, match="already in use by an unfinished request"):
        engine.add_request([5, 6], params(2), request_id=ids[0])
    with pytest.raises(TypeError, match="request_id=7 must be a non-empty string"):
        engine.add_request([5, 6], params(2), request_id=7)
    ids.append(engine.add_request(items[2].prompt, items[2].params))
    while engine.has_unfinished_requests():
        step()
    assert [outputs[i] for i in ids] == expected
    assert_engine_clean(engine)


def test_a_bad_call_among_good_ones_refuses_only_itself():
    engine = tiny_engine()
    good = engine.generate([PROMPT, PROMPT[:3]], params(5))
    with pytest.raises(TypeError, match=r"prompt 1: sampling params must be a SamplingParams, not dict"):
        engine.generate([PROMPT, PROMPT[:3]], [params(5), {"max_tokens": 5}])
    assert_engine_clean(engine)  # nothing was queued
    again = engine.generate([PROMPT, PROMPT[:3]], [params(5), SamplingParams(max_tokens=5, temperature=1e-9,
                                                                              ignore_eos=True)])
    assert [o.token_ids for o in again] == [o.token_ids for o in good]


def test_a_live_run_fails_a_prompt_of_the_wrong_type_alone():
    items = workload(2, out=4, seed=9)
    bad = [WorkItem([1.5, 2.5], params(4), source="item 2"), WorkItem(np.zeros((2, 2), dtype=np.int64), params(4))]
    run = LiveRun(tiny_engine(), [items[0], *bad, items[1]], dashboard=False).start().wait(timeout=60)
    assert run.status == "finished"
    assert [o.finish_reason for o in run.outputs] == ["length", "error", "error", "length"]
    assert run.outputs[1].error.startswith("item 2: the prompt must hold integer token ids; item 0 is 1.5")
    assert run.outputs[2].error.startswith("request 3 of 4: the prompt must be 1-D token ids")
    assert [run.outputs[i].token_ids for i in (0, 3)] == reference_tokens(items)


# ---- model folders ---------------------------------------------------------------------------------------
def _folder(tmp_path, name: str, config, weights: bool = True):
    folder = tmp_path / name
    folder.mkdir()
    text = config if isinstance(config, str) else json.dumps(config)
    (folder / "config.json").write_text(text, encoding="utf-8")
    if weights:
        (folder / "model.safetensors").write_bytes(b"\0" * 8)  # refused before any weight is read
    return str(folder)


def _bert_folder(tmp_path) -> str:
    from transformers import BertConfig, BertModel

    folder = tmp_path / "bert"
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100)).save_pretrained(folder)
    return str(folder)


MODEL_FOLDERS = [
    # (name, config.json text or object, weights present, what the line says)
    ("only-type", {"model_type": "llama"}, True, r"does not give the model's size .* default llama model"),
    ("corrupt", '{"model_type": "llama", ', True, r"config.json is not valid JSON \(.* line 1, column 25\)"),
    ("list", [1, 2], True, r"config.json holds a JSON list, not an object"),
    ("deep", "[" * 100_000 + "]" * 100_000, True, r"config.json (is nested too deeply|holds a JSON list)"),
    ("no-type", {"hidden_size": 64, "num_hidden_layers": 2}, True, r"config.json has no model_type"),
    ("unknown", {"model_type": "no-such-model"}, True, r"model_type 'no-such-model' is not a model this transformers"),
    ("t5", {"model_type": "t5", "is_encoder_decoder": True, "d_model": 32, "num_layers": 1}, True,
     r"holds a t5 model, which is not a causal \(decoder-only\) language model"),
    ("classifier", {"model_type": "llama", "architectures": ["LlamaForSequenceClassification"],
                    "hidden_size": 64, "num_hidden_layers": 2}, True,
     r"holds a LlamaForSequenceClassification \(llama\), not a causal language model"),
    ("no-weights", {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}, False,
     r"has a config.json but no weights"),
]


@pytest.mark.parametrize(("name", "config", "weights", "match"), MODEL_FOLDERS, ids=[m[0] for m in MODEL_FOLDERS])
def test_model_folders_that_hold_no_causal_lm_fail_in_one_line_before_loading(tmp_path, name, config, weights,
                                                                              match):
    FIGURES["model folders refused before loading"] += 1
    folder = _folder(tmp_path, name, config, weights)
    with pytest.raises(ValueError, match=match) as info:
        check_model_folder(folder)
    assert "\n" not in str(info.value) and folder in str(info.value)
    with pytest.raises(ValueError, match=match):
        Engine(folder, num_blocks=8)


def test_an_encoder_saved_to_a_folder_is_refused_and_a_real_causal_lm_folder_loads(tmp_path):
    FIGURES["model folders refused before loading"] += 1
    bert = _bert_folder(tmp_path)
    with pytest.raises(ValueError, match=r"holds a BertModel \(bert\), not a causal language model") as info:
        Engine(bert, num_blocks=8)
    assert "\n" not in str(info.value)
    from kvscope.models.loader import build_tiny_model, build_tiny_tokenizer

    good = tmp_path / "llama"
    build_tiny_model().save_pretrained(good)
    check_model_folder(good)
    with pytest.raises(ValueError, match=r"its tokenizer does not load .*add the tokenizer files") as info:
        Engine(str(good), num_blocks=8)  # weights but no tokenizer
    assert "\n" not in str(info.value)
    build_tiny_tokenizer().save_pretrained(good)
    assert Engine(str(good), num_blocks=8).generate([PROMPT], params(3))[0].finish_reason == "length"
