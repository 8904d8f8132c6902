"""The table's parts: the best configuration by objective, the vllm serve command of each deployment shape, and the
Pareto front."""

from __future__ import annotations

from kvscope.search.goodput import Outcome
from kvscope.search.page import pareto
from kvscope.search.space import SearchSpace
from kvscope.search.table import best, serve_line


def outcome(text: str, goodput: float, gpus: int, usd: float | None) -> Outcome:
    return Outcome(next(SearchSpace.parse(text).points()), goodput=goodput, num_gpus=gpus, usd_per_hour=usd)


def test_best_by_objective():
    cheap, big = outcome("replicas=1", 10, 1, 1.0), outcome("replicas=4", 60, 4, 8.0)
    assert best([cheap, big], "per_dollar") is cheap  # 36,000 requests per USD against 27,000
    assert best([cheap, big], "per_gpu") is big and best([cheap, big], "goodput") is big
    assert best([outcome("replicas=1", 0, 1, 1.0)]) is None


def test_serve_lines():
    o = outcome("block_size=32 max_num_seqs=128 kv_memory=8GiB chunked_prefill=off tp=2 replicas=3", 1, 6, None)
    assert serve_line("meta-llama/Llama-2-7b-hf", o) == (
        "vllm serve meta-llama/Llama-2-7b-hf --block-size 32 --max-num-seqs 128 --kv-cache-memory-bytes 8589934592 "
        "--no-enable-chunked-prefill --tensor-parallel-size 2 --data-parallel-size 3")
    pd = serve_line("m", outcome("pd=1P2D replicas=2", 1, 6, None)).splitlines()
    assert pd[0].startswith("# 1P2D x 2: 2 prefill and 4 decode servers")
    assert all('"kv_connector": "NixlConnector"' in line for line in pd[1:])


def test_pareto_front():
    points = [(0.1, 5.0), (0.2, 4.0), (0.3, 9.0), (0.05, 1.0), (0.4, 9.0)]
    assert pareto(points) == [3, 0, 2]  # (0.2, 4) and (0.4, 9) are dominated
