"""``kvscope explain`` as a user runs it: a recorded run, a prompts file offline (the simulator's engine), and
vLLM's rules; the JSON it writes reads back."""

from __future__ import annotations

import pytest

from kvscope import Engine, SamplingParams
from kvscope.cli.main import main
from kvscope.explain.report import read_explain
from kvscope.runs.result.run import Run

BS = 4


def tokens(start: int, n: int) -> list[int]:
    return [3 + (start + i) % 500 for i in range(n)]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """A run with an eviction: A, four fillers through a 12-block pool one at a time, A again."""
    engine = Engine("tiny", num_blocks=12, block_size=BS, max_num_seqs=1)
    a = tokens(0, 13)
    engine.generate(
        [a, *[tokens(100 * (i + 1), 13) for i in range(4)], [*a[:12], 499]],
        SamplingParams(max_tokens=1, ignore_eos=True),
    )
    return Run.from_engine(engine).save_metrics(tmp_path_factory.mktemp("explain") / "run.metrics.jsonl")


def test_explain_a_recorded_run(run_file, tmp_path, capsys):
    out = tmp_path / "why.json"
    assert main(["explain", str(run_file), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "12 of 78 prompt tokens hit" not in printed  # A's blocks were evicted: nothing hit
    assert "0 of 78 prompt tokens hit (0.0%)" in printed
    assert "first lookups: 0 of 78 hit, 12 reusable, 12 missed, over 6 requests" in printed
    evicted = next(line for line in printed.splitlines() if line.startswith("evicted"))
    assert evicted.split() == ["evicted", "1", "12"]
    assert "token 12: 1 requests" in printed
    doc = read_explain(str(out))
    assert (doc["prefix_cache_queries"], doc["prefix_cache_hits"]) == (78, 0)
    assert [r["miss_cause"] for r in doc["requests"]] == [None] * 5 + ["evicted"]
    assert doc["requests"][5]["evicted_at_step"] == 3 and doc["requests"][5]["text"] is not None
    # one request at a time: the other five waited for max_num_seqs
    assert "why requests waited" in printed and doc["queue_totals"]["queue_max_num_seqs_s"] > 0
    assert (
        len(doc["queue"]) == 6
        and doc["queue"][5]["queue_max_num_seqs_s"] > doc["queue"][1]["queue_max_num_seqs_s"]
    )


def test_explain_prompts_offline_finds_the_timestamp(tmp_path, capsys):
    lines = [
        f"You are a helpful assistant. Current time: 10:0{i}:17. Answer briefly. Question {i}."
        for i in range(4)
    ]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "why.json"
    assert (
        main(
            [
                "explain",
                "--prompts",
                str(prompts),
                "--tokenizer",
                "tiny",
                "--block-size",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    doc = read_explain(str(out))
    points = doc["top_divergences"]  # where the tiny tokenizer merges digits, the split moves by a token
    assert sum(p["num_requests"] for p in points) == 3
    for p in points:
        assert "10:" in p["text"] and "|" in p["text"] and p["text"] != p["text_from"]
        assert f"token {p['diverged_at']}: {p['num_requests']} requests" in printed
    fixed = tmp_path / "fixed.txt"
    fixed.write_text(
        "\n".join(
            f"You are a helpful assistant. Answer briefly. Current time: 10:0{i}:17. Question {i}."
            for i in range(4)
        )
        + "\n"
    )
    assert (
        main(
            [
                "explain",
                "--prompts",
                str(fixed),
                "--tokenizer",
                "tiny",
                "--block-size",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert read_explain(str(out))["prefix_cache_hits"] > doc["prefix_cache_hits"]


def test_explain_offline_under_a_small_pool_shows_evictions(tmp_path, capsys):
    first = "A long shared instruction that fills several blocks of the pool. "
    lines = [first + "one", *(f"filler {i} " * 8 for i in range(6)), first + "two"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "why.json"
    assert (
        main(
            [
                "explain",
                "--prompts",
                str(prompts),
                "--tokenizer",
                "tiny",
                "--block-size",
                "4",
                "--num-blocks",
                "40",
                "--max-num-seqs",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = read_explain(str(out))["requests"]
    assert (
        rows[-1]["miss_cause"] == "evicted"
        and rows[-1]["num_cached_tokens"] < rows[-1]["num_reusable_tokens"]
    )


def test_explain_vllm_rules(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the same prompt, sent twice over\nthe same prompt, sent twice over\n")
    out = tmp_path / "why.json"
    assert (
        main(
            [
                "explain",
                "--prompts",
                str(prompts),
                "--tokenizer",
                "tiny",
                "--engine",
                "vllm",
                "--block-size",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "vLLM prefix cache (predicted, block size 4" in capsys.readouterr().out
    doc = read_explain(str(out))
    n = doc["requests"][0]["num_prompt_tokens"]
    assert doc["prefix_cache_queries"] == 2 * n and doc["prefix_cache_hits"] == (n - 1) // 4 * 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["explain"], "give a run"),
        (["explain", "--prompts", "p.txt"], "needs --tokenizer"),
        (["explain", "run.jsonl", "--num-blocks", "4"], "size an offline simulation"),
    ],
)
def test_usage_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
