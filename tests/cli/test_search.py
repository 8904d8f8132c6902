"""``kvscope search`` end to end (in process, sequential: seconds): the table, the CSV, the Pareto page (offline:
BokehJS inlined, the front drawn), the vllm serve line; and bad input refused before any work."""

from __future__ import annotations

import csv

import pytest

from kvscope.cli.main import main

ARGS = ["search", "--space", "max_num_seqs=8,32 replicas=1,2", "--slo", "ttft_p99=0.3,itl_p99=0.03", "--gpu", "a100",
        "--model", "llama-7b", "--requests", "24", "--prompt-len", "64-256", "--output-len", "8-24",
        "--rate-start", "4", "--bisect-steps", "2", "--sequential"]


def test_search_writes_the_table_the_page_and_the_serve_line(tmp_path, capsys):
    out_csv, page = tmp_path / "s.csv", tmp_path / "s.html"
    assert main([*ARGS, "--csv", str(out_csv), "-o", str(page)]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["max_num_seqs"], r["replicas"]) for r in rows] == [("8", "1"), ("8", "2"), ("32", "1"), ("32", "2")]
    chosen = [r for r in rows if r["best"] == "1"]
    assert len(chosen) == 1 and float(chosen[0]["goodput_rps"]) > 0
    assert max(float(r["requests_per_usd"]) for r in rows) == float(chosen[0]["requests_per_usd"])
    assert all(r["broke_first"] in ("ttft_p99", "itl_p99", "fraction") for r in rows if r["capped"] == "0")
    line = next(x for x in printed.splitlines() if x.startswith("vllm serve"))
    assert line.startswith("vllm serve llama-7b --max-num-seqs " + chosen[0]["max_num_seqs"])
    assert ("--data-parallel-size 2" in line) == (chosen[0]["replicas"] == "2")
    text = page.read_text()
    assert "Pareto front" in text and "https://cdn.bokeh.org" not in text and "Bokeh" in text
    reports = sorted(p.name for p in (tmp_path / "s.runs").glob("*.html"))  # the front's and the best's runs
    best_name = f"{[r['best'] for r in rows].index('1'):04d}_"
    assert any(n.startswith(best_name) for n in reports) and all(f"s.runs/{n}" in text for n in reports)


@pytest.mark.parametrize(("extra", "message"), [
    (["--space", "colour=red"], "unknown search space key 'colour'"),
    (["--slo", "ttft=1"], "not METRIC_pQ"),
    (["--rate", "5"], "leave out --rate"),
    (["--goodput-fraction", "2"], "goodput-fraction"),
    (["--router", "random"], "known policies"),
    (["--reports", "all"], "give -o PAGE.html too"),
])
def test_bad_input_is_refused_before_any_work(extra, message, capsys):
    assert main([*ARGS, *extra]) == 2
    assert message in capsys.readouterr().err
