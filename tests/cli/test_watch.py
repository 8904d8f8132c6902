"""``kvscope watch``: a timed watch with files and a summary table, one clear line and exit 1 for a server
that does not answer, exit 2 for bad options, and SIGTERM / Ctrl-C ending the watch with its files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "watched"))
from fakes import FakeServer, free_port

import kvscope
from kvscope.cli.main import main


@pytest.fixture
def server():
    s = FakeServer(1).start()
    s.engines["0"].prompt_tokens = 10
    yield s
    s.stop()


def test_a_timed_watch_writes_its_files(server, tmp_path, capsys):
    trace, metrics = tmp_path / "w.trace.json", tmp_path / "w.metrics.jsonl"
    code = main(["watch", server.url, "--interval", "0.05", "--duration", "0.5", "--trace", str(trace),
                 "--metrics", str(metrics)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"127.0.0.1:{server.port}/0" in out and "prompt tok" in out
    assert f"trace    {trace}" in out and f"metrics  {metrics}" in out
    assert kvscope.load(trace).meta["watch"]["urls"] == [server.url + "/metrics"]
    assert kvscope.load(metrics).summary()["num_engines"] == 1


def test_unreachable_server_is_one_line_and_exit_1(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["watch", url, "--duration", "5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvscope: error: cannot reach {url}/metrics")


@pytest.mark.parametrize("argv, message", [
    (["watch"], "the following arguments are required: URL"),
    (["watch", "http://x:1", "--interval", "0"], "must be a number of seconds > 0"),
    (["watch", "http://x:1", "--duration", "nan"], "must be a number of seconds > 0"),
    (["watch", "http://x:1", "--kv-events", "x:1"], "not a ZMQ endpoint"),
    (["watch", "http://x:1", "http://y:1", "--kv-events", "tcp://x:2"], "one per URL"),
])
def test_bad_options_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_an_output_that_is_the_plugin_log_is_refused(tmp_path, capsys):
    log = tmp_path / "steps.jsonl"
    log.write_text("")
    assert main(["watch", "http://x:1", "--plugin-log", str(log), "--metrics", str(log)]) == 2
    assert "same file" in capsys.readouterr().err and log.read_text() == ""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_watch_with_its_files(server, tmp_path, signum):
    html, metrics = tmp_path / "w.html", tmp_path / "w.metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kvscope", "watch", server.url, "--interval", "0.1",
                             "--html", str(html), "--metrics", str(metrics)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while server.num_requests < 3:  # it is watching
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, err
    assert f"html     {html}" in out and "kvscope watch" in html.read_text()
    assert kvscope.load(metrics).summary()["num_engines"] == 1


def test_otlp_spans_and_the_sent_prompts_become_the_watchs_requests(server, tmp_path, capsys):
    import threading

    from otlp_spans import body, post, request_span

    from kvscope.models.loader import build_tiny_tokenizer

    (tmp_path / "sent.txt").write_text("hello world\nabc\n")
    lengths = [len(build_tiny_tokenizer()(p)["input_ids"]) for p in ("hello world", "abc")]
    port = free_port()

    def send() -> None:  # once the watch listens
        spans = [request_span(f"r{i}", time.time() + i / 10, prompt=n, ttft=0.02, e2e=0.1)
                 for i, n in enumerate(lengths)]
        for _ in range(100):
            try:
                if post(f"http://127.0.0.1:{port}/v1/traces", body(*spans))[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)

    sender = threading.Thread(target=send)
    sender.start()
    metrics = tmp_path / "w.metrics.jsonl"
    code = main(["watch", server.url, "--interval", "0.05", "--duration", "1.5", "--otlp", f"127.0.0.1:{port}",
                 "--prompts", str(tmp_path / "sent.txt"), "--tokenizer", "tiny", "--metrics", str(metrics)])
    sender.join()
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"requests: 2 from vLLM's spans at http://127.0.0.1:{port}/v1/traces" in out
    assert "prompts: 2 of 2 requests matched to the 2 sent" in out
    run = kvscope.load(metrics)
    assert list(run.requests["ttft_s"]) == pytest.approx([0.02, 0.02])
    tok = build_tiny_tokenizer()
    assert [e.prompt_token_ids for e in run.events if e.kind == "queued"] == [
        tok("hello world")["input_ids"], tok("abc")["input_ids"]]


@pytest.mark.parametrize("argv, message", [
    (["--otlp", "4318"], "give HOST:PORT to listen on"),
    (["--prompts", "SENT"], "holds text: give --tokenizer"),
    (["--prompts", "SENT", "--tokenizer", "org/model"], "give tiny, smollm2 or a local model folder"),
])
def test_bad_request_options_exit_2(argv, message, tmp_path, capsys):
    (tmp_path / "sent.txt").write_text("hello\n")
    argv = [str(tmp_path / "sent.txt") if a == "SENT" else a for a in argv]
    assert main(["watch", "http://x:1", *argv]) == 2
    assert message in capsys.readouterr().err
