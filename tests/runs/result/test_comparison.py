"""``kvscope.runs.result.comparison``: the summary table equals each run's own summary, ratios, warnings, bad input,
the HTML page's parts and the ``kvscope compare`` command (``kvscope/cli/compare.py``)."""

from __future__ import annotations

import math
import os

import pandas as pd
import pytest
import torch

from kvscope import Engine
from kvscope.cli.compare import COMMAND, cmd_compare
from kvscope.cli.parser import CLIError, Parser
from kvscope.runs.result.comparison import METRICS, Comparison, compare, unique_labels
from kvscope.runs.result.differences import workload_signature
from kvscope.runs.result.run import Run
from kvscope.runs.workload.items import synthetic_workload

torch.set_num_threads(1)


def _run(model: str = "tiny", block_size: int = 8, requests: int = 6, seed: int = 0) -> Run:
    engine = Engine(model, num_blocks=256 // block_size, block_size=block_size, max_num_seqs=4,
                    max_num_batched_tokens=64)
    items = synthetic_workload(requests, (12, 40), (4, 12), vocab_size=engine.spec.vocab_size, seed=seed,
                               shared_prefix_len=16, exclude_ids=engine.eos_token_ids)
    for item in items:
        engine.add_request(item.prompt, item.params)
    while engine.has_unfinished_requests():
        engine.step()
    return Run.from_engine(engine)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmp")
    out = {"bs8": _run(block_size=8), "bs16": _run(block_size=16), "fewer": _run(requests=3),
           "qwen": _run(model="tiny-qwen2")}
    out["bs8"].save_trace(folder / "bs8.trace.json")
    out["bs16"].save_metrics(folder / "bs16.metrics.jsonl")
    out["folder"] = folder
    return out


def test_table_values_are_the_runs_own_summaries(runs):
    cmp = compare(runs["bs8"], runs["bs16"], labels=["8", "16"])
    table = cmp.table
    assert list(table.columns) == ["8", "16", "16 / 8"]
    for label, run in (("8", runs["bs8"]), ("16", runs["bs16"])):
        summary = run.summary()
        for m in METRICS:
            if m.key in summary:
                got, want = table.at[m.key, label], summary[m.key]
                assert got == want or (math.isnan(got) and math.isnan(want)), (m.key, label)
    pool = runs["bs8"].meta["kv_pool_bytes"]
    assert table.at["static_reservation_x_pool", "8"] == runs["bs8"].summary()["peak_static_reservation_bytes"] / pool


def test_ratios_are_against_the_first_run(runs):
    cmp = compare(runs["bs8"], runs["bs16"], runs["fewer"], labels=["a", "b", "c"])
    table = cmp.table
    for other in ("b", "c"):
        for m in METRICS:
            base, value, ratio = table.at[m.key, "a"], table.at[m.key, other], table.at[m.key, f"{other} / a"]
            if base and base == base and value == value:
                assert ratio == pytest.approx(value / base), m.key
            elif base == 0 and value == 0:
                assert ratio == 1.0
            else:
                assert math.isnan(ratio)
    assert table.at["requests", "c / a"] == pytest.approx(3 / 6)
    assert (cmp.ratios["a"].dropna() == 1.0).all()
    assert cmp.ratios.at["requests", "c"] == pytest.approx(0.5)


def test_per_run_and_csv(runs, tmp_path):
    cmp = Comparison([runs["bs8"], runs["bs16"]], ["8", "16"], swept=("block_size", [8, 16]))
    frame = cmp.per_run
    assert list(frame["run"]) == ["8", "16"] and list(frame["block_size"]) == [8, 16]
    assert frame.loc[1, "output_tokens"] == runs["bs16"].summary()["output_tokens"]
    back = pd.read_csv(cmp.save_csv(tmp_path / "s.csv"))
    assert list(back.columns) == list(frame.columns)
    assert back["ttft_p50_s"].tolist() == pytest.approx(frame["ttft_p50_s"].tolist())


def test_like_for_like_runs_have_no_warning_and_name_what_differs(runs):
    cmp = compare(runs["bs8"], runs["bs16"])
    assert cmp.warnings == []
    assert cmp.differences["block_size"] == [8, 16]
    assert cmp.differences["num_blocks"] == [32, 16]
    assert "model" not in cmp.differences
    assert workload_signature(runs["bs8"]) == workload_signature(runs["bs16"])


def test_different_models_and_workloads_are_warned_about(runs):
    warnings = compare(runs["bs8"], runs["qwen"], labels=["llama", "qwen"]).warnings
    assert any("different models" in w and "qwen" in w for w in warnings), warnings
    warnings = compare(runs["bs8"], runs["fewer"], labels=["six", "three"]).warnings
    assert warnings == ["different workloads: six: 6 requests, three: 3 requests"]
    other_prompts = _run(seed=1)
    assert compare(runs["bs8"], other_prompts).warnings == [
        "different workloads: the same number of requests, but different prompts"]


def test_files_and_runs_mix_and_a_file_may_be_compared_with_itself(runs):
    folder = runs["folder"]
    cmp = compare(folder / "bs8.trace.json", str(folder / "bs8.trace.json"), runs["bs16"])
    assert cmp.labels == ["bs8.trace.json", "bs8.trace.json (2)", "run 3"]
    assert cmp.table.at["output_tokens_per_s", "bs8.trace.json (2) / bs8.trace.json"] == 1.0
    assert cmp.warnings == []
    assert unique_labels(["a", "a", "a (2)"]) == ["a", "a (2)", "a (2) (2)"]


@pytest.mark.parametrize("content", ["", "{cut", '{"traceEvents": []}', '{"type": "header"}\n'])
def test_a_corrupt_or_foreign_file_is_one_error_naming_it(runs, tmp_path, content):
    bad = tmp_path / "other.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match=r"other\.json"):
        compare(runs["folder"] / "bs8.trace.json", bad)


def test_kvscope_compare_is_the_function():
    import kvscope

    assert kvscope.compare is compare and kvscope.Comparison is Comparison


def test_bad_arguments(runs):
    with pytest.raises(ValueError, match="at least one run"):
        compare()
    with pytest.raises(ValueError, match="2 labels for 1 runs"):
        compare(runs["bs8"], labels=["a", "b"])
    with pytest.raises(TypeError, match="not int"):
        compare(runs["bs8"], 3)
    with pytest.raises(ValueError, match="recorded no steps"):
        compare(Run([], [], {}))


def test_html_page_and_notebook_repr(runs, tmp_path):
    cmp = compare(runs["bs8"], runs["qwen"], labels=["<b>x</b>", "qwen"])
    page = cmp.save_html(tmp_path / "cmp.html").read_text(encoding="utf-8")
    assert "cdn.bokeh.org" not in page and "<script src=" not in page  # BokehJS inlined: opens offline
    assert "&lt;b&gt;x&lt;/b&gt;" in page  # escaped in the header and the table (the browser test runs it)
    assert "different models" in page
    assert "kvs-compare-table" in cmp._repr_html_() and "not like for like" in cmp._repr_html_()
    assert repr(cmp) == "<Comparison of 2 runs: <b>x</b>, qwen>"


def test_show_displays_the_layout(runs, monkeypatch):
    from bokeh.plotting import figure as Figure

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    compare(runs["bs8"], runs["bs16"]).show()
    (widget,) = shown
    figures = [m for m in widget._model.references() if isinstance(m, Figure)]
    assert len(figures) >= 12  # series, step time, two distributions, two page maps


# ---- kvscope compare ------------------------------------------------------------------------------
def _cli(argv: list[str]) -> int:
    parser = Parser(prog="kvscope")
    COMMAND.add_parser(parser.add_subparsers(dest="command", parser_class=Parser))
    return cmd_compare(parser.parse_args(["compare", *argv]))


def test_cli_writes_the_page_and_csv(runs, tmp_path, capsys):
    folder = runs["folder"]
    a, b = str(folder / "bs8.trace.json"), str(folder / "bs16.metrics.jsonl")
    out, csv = tmp_path / "cmp.html", tmp_path / "cmp.csv"
    assert _cli([a, b, "-o", str(out), "--csv", str(csv), "--label", "eight", "--label", "sixteen"]) == 0
    text = capsys.readouterr().out
    assert "throughput (output tokens/s)" in text and "sixteen" in text and str(out) in text
    assert "kvscope comparison" in out.read_text(encoding="utf-8")
    assert list(pd.read_csv(csv)["run"]) == ["eight", "sixteen"]
    assert _cli([a, a, "-o", str(out), "-q"]) == 0  # the same file twice
    assert capsys.readouterr().out.strip() == str(out)


def test_cli_refuses_bad_input_and_outputs(runs, tmp_path):
    folder = runs["folder"]
    a = str(folder / "bs8.trace.json")
    bad = tmp_path / "bad.trace.json"
    bad.write_text("[1, 2]")
    with pytest.raises(CLIError, match=r"bad\.trace\.json") as err:
        _cli([a, str(bad), "-o", str(tmp_path / "x.html")])
    assert err.value.code == 1
    with pytest.raises(CLIError, match="is the input") as err:
        _cli([a, str(folder / "bs16.metrics.jsonl"), "-o", a])
    assert err.value.code == 2
    link = tmp_path / "link.json"
    os.symlink(a, link)
    with pytest.raises(CLIError, match="is the input"):
        _cli([a, a, "-o", str(link)])  # the same file under another name
    with pytest.raises(CLIError, match="is the input"):
        _cli([a, a, "-o", str(tmp_path / "ok.html"), "--csv", a])
    with pytest.raises(CLIError, match="at least two runs"):
        _cli([a])
    with pytest.raises(CLIError, match="1 --label for 2 runs"):
        _cli([a, a, "--label", "x"])
    with pytest.raises(CLIError, match="does not exist"):
        _cli([a, str(tmp_path / "missing.json")])
    with pytest.raises(CLIError, match="the folder of"):
        _cli([a, a, "-o", str(tmp_path / "no" / "cmp.html")])
    assert not (tmp_path / "x.html").exists()
