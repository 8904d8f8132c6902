"""The draft model's proposer on its own pool, with no engine: drafts, rollback, freeing, refusals."""

from __future__ import annotations

import pytest
import torch
from helpers import hf_greedy

from kvscope.engine.request import Request, SamplingParams
from kvscope.engine.spec_decode.config import SpeculativeConfig
from kvscope.engine.spec_decode.draft_model import build_draft_proposer, early_exit_draft
from kvscope.kernels.backend import resolve_backend
from kvscope.models.loader import build_tiny_model, build_tiny_tokenizer

BS = 4


def make_proposer(model, k=3, num_blocks=32, caching=True, tokenizer=None):
    config = SpeculativeConfig(model=model, num_speculative_tokens=k)
    return build_draft_proposer(config, 512, tokenizer, BS, num_blocks, caching, resolve_backend("torch", "cpu"),
                                torch.device("cpu"), torch.float32, 256, telemetry=True)


@pytest.fixture(scope="module")
def draft():
    return build_tiny_model("qwen2", seed=3)


def test_greedy_drafts_are_the_draft_models_own_greedy_continuation(draft):
    reference = {n: hf_greedy(draft, list(range(10, 10 + n)), 3) for n in (5, 9)}
    proposer = make_proposer(draft)
    requests = [Request(f"r{n}", list(range(10, 10 + n)), SamplingParams()) for n in (5, 9)]
    drafts = proposer.propose(requests, [3, 2])
    assert drafts == [reference[5], reference[9][:2]]
    shadow = proposer.shadows["r5"]
    assert shadow.num_computed_tokens == 5 + 2  # the prompt and two drafts fed back; the last one not
    assert len(shadow.block_ids) == 2  # 7 tokens; r9's 10 take 3 blocks, the first shared with r5 (a hit)
    assert proposer.pool.num_used_blocks == 2 + 3 - 1 and proposer.pool.prefix_cache_hits == BS


def test_rejected_drafts_roll_back_and_their_blocks_return(draft):
    proposer = make_proposer(draft, k=4)
    target = Request("a", list(range(20, 27)), SamplingParams())  # 7 tokens: blocks of 4
    first = proposer.propose([target], [4])[0]
    shadow = proposer.shadows["a"]
    assert shadow.num_computed_tokens == 7 + 3 and len(shadow.block_ids) == 3
    # the target accepted the first draft and then emitted another token
    target.append_token(first[0])
    target.append_token((first[1] + 1) % 512)
    used_before = proposer.pool.num_used_blocks
    second = proposer.propose([target], [1])[0]
    assert len(second) == 1
    # rolled back to 8 agreed tokens, then the new token computed: 9 tokens in 3 blocks, none freed...
    assert shadow.num_computed_tokens == 9 and shadow.all_token_ids == target.all_token_ids + second
    assert proposer.pool.num_used_blocks == used_before
    # ... until the target rejects everything after token 7: the third block held only rejected drafts
    target2 = Request("b", list(range(20, 27)), SamplingParams())
    proposer.free("a")
    proposer.propose([target2], [4])
    target2.append_token((proposer.shadows["b"].all_token_ids[7] + 1) % 512)  # the first draft rejected
    freed_before = proposer.pool.num_free_blocks
    proposer._sync(target2)
    assert proposer.shadows["b"].num_computed_tokens == 7
    assert len(proposer.shadows["b"].block_ids) == 2 and proposer.pool.num_free_blocks == freed_before + 1


def test_requests_that_leave_free_their_draft_blocks(draft):
    proposer = make_proposer(draft)
    requests = [Request(f"x{i}", [5 + i] * 6, SamplingParams()) for i in range(3)]
    proposer.propose(requests, [3, 3, 3])
    assert proposer.pool.num_used_blocks > 0
    proposer.propose(requests[:1], [3])  # the others finished or were preempted
    assert set(proposer.shadows) == {"x0"}
    proposer.free("x0")
    assert proposer.pool.num_free_blocks == proposer.pool.num_blocks
    changes, _ = proposer.page_map_update()
    assert all(entry.state in ("free", "cached") for entry in changes.values())  # nothing held


def test_draft_prefix_cache_is_shared_and_never_holds_drafts(draft):
    proposer = make_proposer(draft)
    system = list(range(40, 52))  # three full blocks
    a = Request("a", [*system, 1, 2], SamplingParams())
    b = Request("b", [*system, 3], SamplingParams())
    proposer.propose([a], [3])
    proposer.propose([a, b], [3, 3])
    assert proposer.pool.prefix_cache_hits == 12  # b found a's three prompt blocks
    cached = [blk.block_hash.token_ids for blk in proposer.pool.cached.values()]
    prompt_blocks = {tuple(a.all_token_ids[i:i + BS]) for i in range(0, 12, BS)}
    assert set(cached) <= prompt_blocks | {tuple(b.all_token_ids[i:i + BS]) for i in range(0, 12, BS)}


def test_sampled_requests_keep_their_draft_distributions(draft):
    proposer = make_proposer(draft, k=3)
    r = Request("s", list(range(30, 36)), SamplingParams(temperature=0.8, top_k=5, seed=11))
    drafts = proposer.propose([r], [3])[0]
    q = proposer.draft_probs["s"]
    assert q.shape == (3, 512) and torch.allclose(q.sum(-1), torch.ones(3))
    assert all(q[i, d] > 0 for i, d in enumerate(drafts)) and ((q > 0).sum(-1) <= 5).all()
    again = make_proposer(draft, k=3)  # the request's own seeded generator: the same drafts again
    assert again.propose([Request("s", list(range(30, 36)), r.sampling_params)], [3])[0] == drafts


def test_other_vocabulary_and_short_context_are_refused():
    small = build_tiny_model("llama", vocab_size=256)
    with pytest.raises(ValueError, match="vocabulary of 256 tokens but the target 512"):
        make_proposer(small)
    short = build_tiny_model("llama", max_position_embeddings=128)
    with pytest.raises(ValueError, match="handles 128 positions, fewer than max_model_len=256"):
        make_proposer(short)


def test_tokenizers_must_agree(draft):
    class Other:
        def get_vocab(self):
            return {"a": 0}

    config = SpeculativeConfig(model="tiny", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="maps tokens to other ids"):
        build_draft_proposer(config, 512, Other(), BS, 8, True, resolve_backend("torch", "cpu"),
                             torch.device("cpu"), torch.float32, 256, telemetry=False)
    assert build_tiny_tokenizer().get_vocab()  # the embedded tiny models share this one


def test_early_exit_draft_shares_weights_and_leaves_the_target_whole():
    target = build_tiny_model("llama", seed=5)
    layers_before = len(target.model.layers)
    draft = early_exit_draft(target, 1)
    assert len(draft.model.layers) == 1 and len(target.model.layers) == layers_before
    assert draft.model.layers[0] is target.model.layers[0] and draft.lm_head is target.lm_head
    assert draft.config is target.config and target.config.num_hidden_layers == layers_before
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert draft(ids).logits.shape == target(ids).logits.shape
    with pytest.raises(ValueError, match="between 1 and"):
        early_exit_draft(target, 9)
