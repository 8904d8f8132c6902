"""DashboardView: the header's buttons drive the run, the status line shows what the dashboard tells
it (escaped), and once the run is over the buttons are disabled."""

from __future__ import annotations

import threading

import pytest
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
    assert "stopped · could not write html · 0/0 requests finished" in dash.view.status.value
    replay = Dashboard()  # no control: no buttons, "replay"
    replay.widget  # noqa: B018
    assert replay.view.buttons == () and "replay" in replay.view.status.value
    dash.close()
    replay.close()
