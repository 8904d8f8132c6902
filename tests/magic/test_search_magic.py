"""``%kvscope search``: the same search as the command, its result a table (HTML in a notebook, a DataFrame), the
best configuration's vllm serve line, the files; bad lines refused as one UsageError."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

LINE = ('search --space "max_num_seqs=8,32" --slo ttft_p99=0.3,itl_p99=0.03 --gpu a100 --model llama-7b -n 24 '
        "--prompt-len 64-256 --output-len 8-24 --rate-start 4 --bisect-steps 2 --sequential -q")


def test_the_magic_returns_the_table_and_writes_the_files(ip, tmp_path):
    result = ip.run_line_magic("kvscope", f"{LINE} --csv {tmp_path / 's.csv'} --html {tmp_path / 's.html'} "
                               "--reports none")
    df = result.table()
    assert list(df["max_num_seqs"]) == [8, 32] and df["best"].sum() == 1
    assert result.serve_line().startswith("vllm serve llama-7b --max-num-seqs")
    assert (tmp_path / "s.csv").read_text() == result.csv()
    assert "Pareto front" in (tmp_path / "s.html").read_text() and "<table" in result._repr_html_()
    assert not (tmp_path / "s.runs").exists()  # --reports none: the page links no run


@pytest.mark.parametrize(("extra", "message"), [("--rate 3", "leave out --rate"), ("--space x=1", "unknown search")])
def test_bad_lines_are_one_usage_error(ip, extra, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("kvscope", f"{LINE} {extra}")
