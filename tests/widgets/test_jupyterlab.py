"""The proof of "live": JupyterLab in headless Chromium (network blocked) runs the example notebook's
cells, and the dashboard's plots appear and their numbers change while the run goes on.

The server runs on loopback with a token, a temporary root, and its own settings, workspace and
runtime folders (news fetching off), so it neither reads nor writes the user's Jupyter state.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from widget_util import COUNT_CANVASES_JS, COUNT_VIEWS_JS

from kvscope.widgets.panels.registry import PANELS

HIDDEN_WITHOUT_SPECULATION = 3  # SpeculationPanel, DraftPageMapPanel; SlowStepsPanel (no --capture-slow)
# the explain panels (prefix-cache misses, why requests waited) draw only once there is something to explain, and
# recompute at most every 2 s: in a short window either may not have changed yet
QUIET_EXPLAIN_PANELS = 2

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(150)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "00_live_dashboard.ipynb"
KPI_TEXT_JS = """() => {
  const found = [];
  const walk = (root) => root.querySelectorAll('*').forEach(e => {
    if (e.classList && e.classList.contains('kvs-kpi')) found.push(e.innerText);
    if (e.shadowRoot) walk(e.shadowRoot);
  });
  walk(document);
  return found.join(' | ');
}"""


# Every ColumnDataSource in the page's Bokeh documents: {columns: {name: [values]}} (typed arrays as lists).
SOURCES_JS = """() => {
  const docs = new Set([...Bokeh.index.all_views()].map(v => v.model.document).filter(d => d != null));
  const out = [];
  for (const doc of docs) for (const m of doc._all_models.values())
    if (m.type == "ColumnDataSource")
      out.push(Object.fromEntries(Object.entries(m.data).map(([k, v]) => [k, Array.from(v)])));
  return out;
}"""

# What each panel's view shows: {root model id: its Div texts and ColumnDataSource data, as JSON}. A
# view whose document stops taking patches keeps this unchanged while the run goes on.
PANELS_JS = """() => {
  const out = {};
  const docs = new Set([...Bokeh.index.all_views()].map(v => v.model.document).filter(d => d != null));
  for (const doc of docs) {
    const roots = doc.roots();
    if (roots.length == 0) continue;
    const shown = [];
    for (const m of doc._all_models.values()) {
      if (m.type == "Div") shown.push(m.text);
      if (m.type == "ColumnDataSource")
        shown.push(Object.entries(m.data).map(([k, v]) => [k, Array.from(v)]));
    }
    out[roots[0].type + " " + roots[0].id] = JSON.stringify(shown);
  }
  return out;
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """(base url, token, root) of a JupyterLab server holding a copy of the example notebook."""
    root = tmp_path / "root"
    root.mkdir()
    # The example, with its engine slowed further: on a loaded 2-core machine the page, BokehJS and
    # the first views take a while, and the run must still be going when the test looks at it.
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "--step-delay 0.05" in text
    (root / EXAMPLE.name).write_text(text.replace("--step-delay 0.05", "--step-delay 0.25"), encoding="utf-8")
    settings = tmp_path / "settings"
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, OMP_NUM_THREADS="1", JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
           "--LabApp.extension_manager=readonly", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    log = open(tmp_path / "lab.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("jupyter lab did not start:\n" + (tmp_path / "lab.log").read_text()) from None
                time.sleep(0.5)
        yield base, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _accept_kernel_dialog(page) -> None:
    """The first open of a notebook may ask which kernel to start: take the proposed one."""
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.wait_for(state="visible", timeout=8000)
    except Exception:
        return  # the kernel started without asking
    dialog.locator(".jp-mod-accept").click()
    dialog.wait_for(state="hidden", timeout=5000)


def _numbers(text: str) -> list[str]:
    return re.findall(r"[\d,.]+", text)


def test_dashboard_updates_live_in_jupyterlab(lab, page, artifacts):
    base, token, _root = lab
    page.set_viewport_size({"width": 1600, "height": 2400})  # the whole dashboard, two panels a row
    page.set_default_timeout(30_000)
    page.goto(f"{base}/lab/tree/{EXAMPLE.name}?token={token}")
    page.locator(".jp-NotebookPanel").first.wait_for(state="visible", timeout=60_000)
    _accept_kernel_dialog(page)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=60_000)

    # Run the first two code cells (%load_ext, then %kvscope) as a user would, with Shift+Enter; the
    # later cell that waits for the end is left alone, so the kernel is idle while the run goes on.
    page.locator(".jp-CodeCell").first.click()
    page.keyboard.press("Escape")  # command mode
    for _ in range(2):
        page.keyboard.press("Shift+Enter")
        page.wait_for_timeout(300)

    # The plots appear: one Bokeh figure view per plot of the dashboard (BokehJS loaded by %load_ext).
    page.wait_for_function(f"() => window.Bokeh !== undefined && ({COUNT_VIEWS_JS})('Figure') >= 8",
                           timeout=60_000)
    page.wait_for_function(f"() => ({KPI_TEXT_JS})().includes('output tokens/s')", timeout=30_000)
    first, panels_before = page.evaluate(KPI_TEXT_JS), page.evaluate(PANELS_JS)
    assert len(panels_before) == len([s for s in PANELS if s.when is None]), sorted(panels_before)  # one per widget
    # Every panel's content moves on, not only some: a view that stops applying patches (e.g. one
    # created in the middle of a patch message) freezes its panel while the others go on.
    deadline = time.monotonic() + 20  # a loaded machine's browser can lag the kernel by seconds
    status_line = page.locator(".kvscope-dashboard .widget-html").first
    while time.monotonic() < deadline:
        second, panels_after = page.evaluate(KPI_TEXT_JS), page.evaluate(PANELS_JS)
        frozen = sorted(k for k, v in panels_before.items() if panels_after.get(k) == v)
        # the status line is its own widget, whose updates can reach a loaded browser later than the panels'
        if not frozen and second != first and "loading" not in status_line.inner_text():
            break
        time.sleep(0.5)
    status = status_line.inner_text()
    page.screenshot(path=str(artifacts / "jupyterlab_live.png"), full_page=True)
    assert "running" in status and "error" not in status, f"the run should still be going: {status!r}"
    assert _numbers(first) != _numbers(second), f"the KPIs did not change while running:\n{first}\n{second}"
    # the speculation panels and the slow-step one stay hidden and unchanged in a run without speculation or
    # --capture-slow; every other panel changes,
    # but for the explain panels, which may not have redrawn yet
    assert HIDDEN_WITHOUT_SPECULATION <= len(frozen) <= HIDDEN_WITHOUT_SPECULATION + QUIET_EXPLAIN_PANELS, \
        f"panels that did not change while running ({status!r}): {frozen}"
    assert page.evaluate(COUNT_CANVASES_JS) >= 8

    # What the browser holds mid-run is whole: no stream lost or applied twice, the page map complete.
    sources = page.evaluate(SOURCES_JS)
    batch = next(s for s in sources if "prefill" in s and "decode" in s)
    assert batch["step"] == list(range(len(batch["step"]))) and len(batch["step"]) > 5
    cells = next(s for s in sources if s.get("outline"))  # the page map (the draft one is empty)
    assert {len(column) for column in cells.values()} == {96}  # --num-blocks 96 in the example
    assert any(owner for owner in cells["owner"])

    # Stop works while the kernel is idle: the button's click reaches the kernel, the run ends.
    page.get_by_role("button", name="Stop").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.kvscope-dashboard .widget-html')]"
        ".some(e => e.innerText.includes('stopped'))",
        timeout=30_000)
    page.screenshot(path=str(artifacts / "jupyterlab_stopped.png"), full_page=True)
    blocked = [u for u in page.kvscope_log["blocked"] if "127.0.0.1" not in u]
    assert all(not u.startswith(("http://127.0.0.1", "ws://127.0.0.1")) for u in blocked)


def _run_first_cells(page, count: int, first: int = 0) -> None:
    """Run ``count`` code cells from the ``first`` with Shift+Enter, as a user would."""
    page.locator(".jp-CodeCell").nth(first).click()
    page.keyboard.press("Escape")  # command mode
    for _ in range(count):
        page.keyboard.press("Shift+Enter")
        page.wait_for_timeout(300)


def _dashboard_shows(page, what: str) -> None:
    """Every plot of a dashboard drawn (BokehJS in the page, no "Click to show javascript error") and its
    status line running."""
    page.wait_for_function(f"() => window.Bokeh !== undefined && ({COUNT_VIEWS_JS})('Figure') >= 8",
                           timeout=60_000)
    page.wait_for_function(f"() => ({KPI_TEXT_JS})().includes('output tokens/s')", timeout=30_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.kvscope-dashboard .widget-html')]"
        ".some(e => e.innerText.includes('running'))",
        timeout=60_000)
    assert page.get_by_text("javascript error").count() == 0, what


def test_the_dashboard_works_after_a_reload_and_a_second_run(lab, page, artifacts):
    """A second ``%kvscope`` in the same page, then the page reloaded (a new page on the same kernel, without
    BokehJS) and the cells run again: the already loaded ``%load_ext`` does nothing, and ``%kvscope``'s
    display must load BokehJS into the new page itself. At the end of the run the replay slider appears."""
    base, token, _root = lab
    url = f"{base}/lab/tree/{EXAMPLE.name}?token={token}"
    page.set_viewport_size({"width": 1600, "height": 2000})
    page.set_default_timeout(30_000)
    page.goto(url)
    page.locator(".jp-NotebookPanel").first.wait_for(state="visible", timeout=60_000)
    _accept_kernel_dialog(page)
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=60_000)
    _run_first_cells(page, 2)
    _dashboard_shows(page, "first run")
    _run_first_cells(page, 1, first=1)  # a second %kvscope in the same page
    page.wait_for_timeout(3000)  # the first dashboard leaves the output, the second comes
    _dashboard_shows(page, "second run, same page")

    # The reload: this page goes (no beforeunload prompt), a new one opens the notebook on the same kernel.
    fresh = page.context.new_page()
    fresh.set_viewport_size({"width": 1600, "height": 2000})
    fresh.set_default_timeout(30_000)
    errors: list[str] = []
    fresh.on("pageerror", lambda exc: errors.append(str(exc)))
    page.close()
    fresh.goto(url)
    fresh.locator(".jp-NotebookPanel").first.wait_for(state="visible", timeout=60_000)
    _accept_kernel_dialog(fresh)
    fresh.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=60_000)
    assert fresh.evaluate("() => window.Bokeh === undefined")  # a new page: no BokehJS yet
    _run_first_cells(fresh, 2)  # %load_ext kvscope (already loaded: "already loaded"), %kvscope
    _dashboard_shows(fresh, "after the reload")
    assert fresh.get_by_text("already loaded").count() >= 1
    fresh.wait_for_timeout(1500)
    fresh.screenshot(path=str(artifacts / "jupyterlab_after_reload.png"))

    fresh.get_by_role("button", name="Stop").click()  # the end of the run: tiles of the run, the replay slider
    fresh.get_by_text("page map at step").first.wait_for(timeout=30_000)
    fresh.wait_for_function(f"() => ({KPI_TEXT_JS})().includes('peak KV blocks used')", timeout=30_000)
    fresh.wait_for_timeout(1000)
    fresh.screenshot(path=str(artifacts / "jupyterlab_run_end.png"))
    assert not [e for e in errors if "Bokeh" in e], errors
