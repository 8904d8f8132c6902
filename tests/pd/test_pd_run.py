"""``kvscope run --pd 1P1D``: the transfers in the trace and the metrics, both loading back; options that do
not combine with --pd are refused in one line before anything starts."""

import pytest

import kvscope
from kvscope.cli.main import main


def test_kvscope_run_pd_writes_transfers_into_both_files(tmp_path, capsys):
    trace, metrics = tmp_path / "t.json", tmp_path / "m.jsonl"
    code = main(["run", "--model", "tiny", "--pd", "1P1D", "--requests", "4", "--prompt-len", "20-60",
                 "--output-len", "4-8", "--block-size", "8", "--out", str(tmp_path / "run"), "--trace", str(trace),
                 "--metrics", str(metrics), "-q"])
    assert code == 0, capsys.readouterr().err
    runs = [kvscope.load(trace), kvscope.load(metrics)]
    for run in runs:
        s = run.summary()
        assert s["requests"] == s["finished"] == 4 and s["errors"] == 0
        assert s["kv_transfers"] == 4 and s["kv_transfer_bytes"] > 0
        assert [i["role"] for i in run.meta["pd"]["instances"]] == ["kv_producer", "kv_consumer"]
    assert runs[0].meta["pd"]["transfers"] == runs[1].meta["pd"]["transfers"]
    assert '"KV transfers"' in trace.read_text()


@pytest.mark.parametrize(("extra", "clash"), [(["--speculative", "ngram:2"], "--speculative"),
                                              (["--prefix-caching", "off"], "--prefix-caching off"),
                                              (["--profile", "2"], "--profile")])
def test_options_that_do_not_combine_with_pd(tmp_path, capsys, extra, clash):
    code = main(["run", "--pd", "1P1D", "--out", str(tmp_path / "run"), "-q", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"--pd 1P1D does not combine with {clash}" in err[0]
    assert list(tmp_path.iterdir()) == []
