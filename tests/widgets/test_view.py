"""DashboardView: the header's buttons drive the run, the status line shows what the dashboard tells
it (escaped), and once the run is over the buttons are disabled. BokehJS goes into every page that shows
a dashboard (``widgets/bokehjs.py``): once per page, again when a new page connects to the kernel (a
reload, another tab), told by ipywidgets' control comm; the browser side is
``test_jupyterlab.py::test_the_dashboard_works_after_a_reload_and_a_second_run``."""

from __future__ import annotations

import threading

import pytest
from ipywidgets import comm

from kvscope.widgets import bokehjs
from kvscope.widgets.dashboard import Dashboard
from kvscope.widgets.view import DashboardView

pytestmark = pytest.mark.timeout(60)


class FakeRun:
    """A ``view.Control``: records what the buttons asked."""

    def __init__(self) -> None:
        self.done, self.paused, self.status_text, self.calls = False, False, "running", []

    def stop(self) -> None:
        self.calls.append("stop")

    def pause(self) -> None:
        self.calls.append("pause")
        self.paused = True

    def resume(self) -> None:
        self.calls.append("resume")
        self.paused = False


def test_buttons_drive_the_control_and_the_status_line_is_escaped():
    control = FakeRun()
    dash = Dashboard(control=control)
    view = DashboardView(dash.panels, threading.RLock(), control=control, refresh_hz=5.0,
                         on_refresh=dash.set_refresh)
    stop, pause = view.buttons
    pause.click()
    assert control.calls == ["pause"] and pause.description == "Resume"
    pause.click()
    assert control.calls == ["pause", "resume"] and pause.description == "Pause"
    view.show_status(["failed: <b>x</b>", "step 3"])
    assert "failed: &lt;b&gt;x&lt;/b&gt; · step 3" in view.status.value and not stop.disabled
    control.done = True
    view.show_status(["finished"])
    assert stop.disabled and pause.disabled
    assert [m._model for m in view.models] == [p.model for p in dash.panels]  # one BokehModel per panel
    view.close()


def test_the_dashboard_tells_its_view_the_run_status():
    control = FakeRun()
    dash = Dashboard(control=control)
    dash.widget  # noqa: B018 (builds the view)
    assert dash.view is not None and dash.view.status.value.count("running") == 1
    control.status_text = "stopped · could not write html"
    dash.tick(final=True)
    assert "stopped · could not write html</span>" in dash.view.status.value  # no count of its own: the tiles'
    assert "step" not in dash.view.status.value and "requests" not in dash.view.status.value
    replay = Dashboard()  # no control: no buttons, "replay"
    replay.widget  # noqa: B018
    assert replay.view.buttons == () and "replay" in replay.view.status.value
    dash.close()
    replay.close()


def test_bokehjs_is_loaded_once_per_page_and_again_after_a_reload(monkeypatch):
    loads: list[list[str]] = []
    monkeypatch.setattr("bokeh.io.output_notebook", lambda resources, hide_banner: loads.append(resources.components))
    manager = comm.get_comm_manager()
    answered: list[dict] = []
    monkeypatch.setitem(manager.targets, bokehjs.CONTROL_TARGET, lambda c, msg: answered.append(msg))
    monkeypatch.setattr(bokehjs, "_page_has_bokehjs", False)

    assert bokehjs.ensure_bokehjs()  # the first display (or %load_ext) in a page
    assert not bokehjs.ensure_bokehjs()  # a second %kvscope in the same page: it has BokehJS
    assert loads == [bokehjs.COMPONENTS]  # inline, without MathJax and WebGL

    manager.targets[bokehjs.CONTROL_TARGET](None, {"content": "request_states"})  # a reloaded page connects
    assert answered == [{"content": "request_states"}]  # ipywidgets still gets its control comm
    assert bokehjs.ensure_bokehjs() and len(loads) == 2  # the next display loads it into the new page
    assert not bokehjs.ensure_bokehjs()
    assert bokehjs.watch_pages() and getattr(manager.targets[bokehjs.CONTROL_TARGET], "kvscope_page_hook", False)
    hooked = manager.targets[bokehjs.CONTROL_TARGET]
    bokehjs.watch_pages()
    assert manager.targets[bokehjs.CONTROL_TARGET] is hooked  # wrapped once, not once per display
