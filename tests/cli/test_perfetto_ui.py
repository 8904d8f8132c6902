"""The local Perfetto UI (``kvscope.cli.perfetto_ui``): a kvscope trace opens in it offline.

The browser test loads the UI from 127.0.0.1 in headless Chromium with every request to anything but
loopback aborted, and finds kvscope's tracks in the UI's track list: the engine's steps and counters,
and one lane per request under the "kvscope requests" process (not under "Global Legacy Events");
screenshots are kept in ``artifacts/``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kvscope import Engine, SamplingParams
from kvscope.cli.perfetto_ui import PerfettoServer, serve, trace_bytes, ui_root
from kvscope.runs.result.run import Run

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A small run of the tiny model saved as a trace and as a metrics file."""
    folder = tmp_path_factory.mktemp("perfetto")
    engine = Engine("tiny", num_blocks=24, block_size=8, max_num_seqs=4, max_num_batched_tokens=64)
    engine.generate([[5, 6, 7, 8, 9] * 3, [11, 12, 13] * 4, [20 + i for i in range(20)]],
                    SamplingParams(max_tokens=6, ignore_eos=True))
    run = Run.from_engine(engine)
    return run.save_trace(folder / "run.trace.json"), run.save_metrics(folder / "run.metrics.jsonl")


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, b"", ""


def test_the_ui_build_is_there():
    root = ui_root()
    assert (root / "index.html").is_file()
    versions = [p for p in root.iterdir() if p.is_dir() and (p / "frontend_bundle.js").is_file()]
    assert versions, "no versioned UI folder next to index.html"
    assert (versions[0] / "trace_processor.wasm").is_file()


def test_serves_the_ui_and_only_the_trace(run_files):
    trace, _ = run_files
    with PerfettoServer(trace) as server:
        assert server.host == "127.0.0.1" and server.port > 0
        assert urlsplit(server.url).fragment == f"!/?url={server.trace_url}"
        status, body, _ = _get(f"http://127.0.0.1:{server.port}/")
        assert status == 200 and b"Perfetto UI" in body
        status, body, kind = _get(server.trace_url)
        assert status == 200 and kind == "application/json"
        served = json.loads(body)
        assert served["kvscope"]["records"] == json.loads(trace.read_text())["kvscope"]["records"]
        version = next(p.name for p in ui_root().iterdir() if p.is_dir())
        status, _, kind = _get(f"http://127.0.0.1:{server.port}/{version}/trace_processor.wasm")
        assert status == 200 and kind == "application/wasm"
        assert _get(f"http://127.0.0.1:{server.port}/{version}/assets/")[0] == 404  # no folder listings
        assert _get(f"http://127.0.0.1:{server.port}/kvscope-trace/other/run.trace.json")[0] == 404
        assert _get(f"http://127.0.0.1:{server.port}/live_reload")[0] == 204
    with pytest.raises(OSError):
        _get(server.trace_url)  # stopped


def test_a_metrics_file_is_served_as_a_trace(run_files):
    trace, metrics = run_files
    rebuilt = json.loads(trace_bytes(metrics))
    original = json.loads(trace.read_text())
    assert rebuilt["kvscope"]["records"] == original["kvscope"]["records"]
    names = {e["args"]["name"] for e in rebuilt["traceEvents"] if e.get("ph") == "M" and "name" in e["args"]}
    assert {"kvscope engine", "steps"} <= names


@pytest.mark.parametrize("content", ["", "{not json", '{"traceEvents": []}', "[1, 2]"])
def test_a_file_that_is_not_a_kvscope_run_is_refused_by_name(tmp_path, content):
    bad = tmp_path / "bad.trace.json"
    bad.write_text(content)
    with pytest.raises(ValueError, match=r"bad\.trace\.json"):
        PerfettoServer(bad)
    with pytest.raises(ValueError, match="no such file"):
        serve(tmp_path / "missing.json")


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_a_kvscope_trace_opens_in_the_local_ui_offline(run_files, chromium):
    trace, _ = run_files
    request_ids = list(dict.fromkeys(e["request_id"] for e in json.loads(trace.read_text())["kvscope"]["events"]))
    assert len(request_ids) == 3
    blocked: list[str] = []
    errors: list[str] = []

    def route(r):
        url = r.request.url
        if url.startswith(("data:", "blob:")) or urlsplit(url).hostname in ("127.0.0.1", "localhost"):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    with serve(trace) as server:
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        try:
            page = context.new_page()
            page.route("**/*", route)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server.url)
            engine = page.get_by_text("kvscope engine").first
            engine.wait_for(timeout=90_000)  # the UI loaded, its wasm trace processor parsed the trace
            engine.click()  # expand the process: its thread and counter tracks
            page.get_by_text("steps 1").first.wait_for(timeout=30_000)
            assert page.get_by_text("KV usage blocks").count() >= 1
            assert page.get_by_text("run.trace.json").count() >= 1  # the trace's name, as the UI shows it
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "perfetto_ui.png"))
            # The request lanes belong to their process (process-local async ids), not to the UI's
            # catch-all group of global async tracks.
            assert page.get_by_text("Global Legacy Events").count() == 0
            engine.click()  # fold the engine away again, so the request lanes are in view
            page.get_by_text("kvscope requests").first.click()  # expand: one lane per request
            for rid in request_ids:
                page.get_by_text(rid, exact=True).first.wait_for(timeout=30_000)
            group = page.get_by_text("kvscope requests").first.bounding_box()
            lanes = [page.get_by_text(rid, exact=True).first.bounding_box() for rid in request_ids]
            assert all(lane["y"] > group["y"] for lane in lanes)  # listed under the process, in order
            assert [lane["y"] for lane in lanes] == sorted(lane["y"] for lane in lanes)
            page.screenshot(path=str(ARTIFACTS / "perfetto_requests.png"))
        finally:
            context.close()
    assert errors == []
    # what the UI tried beyond loopback was only its optional internal-user probe (blocked), and the
    # trace opened all the same
    assert {urlsplit(u).hostname for u in blocked} <= {"storage.cloud.google.com"}, blocked


def test_view_perfetto_serves_until_interrupted(run_files, monkeypatch, capsys):
    import argparse

    from kvscope.cli.parser import CLIError
    from kvscope.cli.view import add_perfetto_options, cmd_view_perfetto

    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    add_perfetto_options(parser)
    opened, served = [], []

    def sleep(seconds):  # the foreground wait: fetch the UI once, then Ctrl-C
        url = capsys.readouterr().out.split(": ", 1)[1].split()[0]
        served.append(_get(url.split("#", 1)[0])[0])
        raise KeyboardInterrupt

    monkeypatch.setattr("kvscope.cli.view.time.sleep", sleep)
    monkeypatch.setattr("webbrowser.open", opened.append)
    trace, metrics = run_files
    assert cmd_view_perfetto(parser.parse_args([str(metrics), "--perfetto"])) == 0
    assert served == [200]
    assert len(opened) == 1 and opened[0].startswith("http://127.0.0.1:") and "/open/" in opened[0]
    assert cmd_view_perfetto(parser.parse_args([str(trace), "--perfetto", "--no-browser"])) == 0
    assert len(opened) == 1
    with pytest.raises(CLIError, match="does not exist"):
        cmd_view_perfetto(parser.parse_args(["missing.json", "--perfetto"]))
