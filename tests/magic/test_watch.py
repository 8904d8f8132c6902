"""``%kvscope watch``: its options, a timed watch in wait mode, the live dashboard showing a server that
does not answer as its error state, and usage errors before anything starts."""

from __future__ import annotations

import os
import sys
import time

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "watched"))
from fakes import FakeServer, free_port

from kvscope.runs.background.status import RunStatus


def test_help_lists_the_options(ip, capsys):
    assert ip.run_line_magic("kvscope", "watch --help") is None
    out = capsys.readouterr().out
    for option in ("--kv-events", "--kv-events-bind", "--replay", "--interval", "--duration", "--trace",
                   "--metrics", "--html", "--plugin-log", "--wait", "-q", "-o"):
        assert option in out, option


def test_a_timed_watch_in_wait_mode(ip, tmp_path):
    server = FakeServer(1).start()
    server.engines["0"].generation_tokens = 3
    try:
        run = ip.run_line_magic("kvscope", f"watch {server.url} --interval 0.05 --duration 0.4 "
                                           f"--metrics {tmp_path / 'm.jsonl'} --wait -q -o")
    finally:
        server.stop()
    assert run.status == RunStatus.FINISHED and (tmp_path / "m.jsonl").exists()
    assert run.summary()["num_engines"] == 1


def test_the_dashboard_shows_a_server_that_does_not_answer(ip):
    url = f"http://127.0.0.1:{free_port()}"
    with capture_output() as captured:
        run = ip.run_line_magic("kvscope", f"watch {url} -o")
    assert any("application/vnd.jupyter.widget-view+json" in o.data for o in captured.outputs)
    deadline = time.monotonic() + 30
    while not (run.done and run.dashboard.finished) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.status == RunStatus.FAILED
    status = " · ".join(run.dashboard.status_parts())
    assert status.startswith("failed: WatchError: cannot reach " + url)
    assert "cannot reach" in run.dashboard.view.status.value  # what the status line shows
    with pytest.raises(UsageError, match="cannot reach"):  # in wait mode the cell fails with the line
        ip.run_line_magic("kvscope", f"watch {url} --wait -q")


@pytest.mark.parametrize("line, why", [
    ("watch", "the following arguments are required: URL"),
    ("watch http://x:1 --interval -1", "must be a number of seconds > 0"),
    ("watch http://x:1 --kv-events nope", "not a ZMQ endpoint"),
    ('watch "http://x:1', "No closing quotation"),
])
def test_bad_lines_raise_usage_error(ip, line, why):
    with pytest.raises(UsageError, match=why):
        ip.run_line_magic("kvscope", line)


def test_the_cell_magic_is_refused(ip):
    with pytest.raises(UsageError, match="takes no cell"):
        ip.run_cell_magic("kvscope", "watch http://x:1", "a prompt")


def test_the_live_dashboard_fills_in(ip):
    server = FakeServer(["0", "1"]).start()
    try:
        with capture_output():
            run = ip.run_line_magic("kvscope", f"watch {server.url} --interval 0.05 -o")
        deadline = time.monotonic() + 30
        while run.dashboard.num_ticks < 3 and time.monotonic() < deadline:
            server.engines["1"].generation_tokens += 5
            time.sleep(0.1)
        run.stop()
        run.wait(30)
    finally:
        server.stop()
    dash = run.dashboard
    assert dash.finished and dash.error is None
    assert list(dash.panel["fleet"].sources) == [f"127.0.0.1:{server.port}/0", f"127.0.0.1:{server.port}/1"]
    assert dash.panel["watch_kpi"].values["running"] == 0
    assert "stopped" in dash.view.status.value
    assert [b.disabled for b in dash.view.buttons] == [True, True]
