"""BokehJS in the notebook page, loaded into every page that shows a dashboard.

jupyter_bokeh's widgets need BokehJS in the page ("Failed to create view for 'BokehView'", shown as
"Click to show javascript error", when it is missing). ``bokeh.io.output_notebook`` puts it there as an
output of the cell that calls it, so it lives as long as that page: a browser reload, or a second tab on
the same kernel, is a new page without it, while the kernel (which loaded it once) goes on. So the
kernel loads it again whenever a new page may have connected since the last load:

- each page's widget manager opens ipywidgets' control comm (``jupyter.widget.control``) when it
  connects to the kernel, to fetch the widgets' state: ``watch_pages`` wraps that comm's target, and a
  new connection marks the page as not loaded;
- ``ensure_bokehjs`` is called by every display of a dashboard (and of a comparison, a replay, a
  sweep), before the widget's own output, so the load runs first in the same cell; it publishes the load
  only when no load reached the page connected now.

The load is inline (works offline) and holds only the parts the panels use (core, widgets, tables:
about 2 MB, not the 4 MB with MathJax and WebGL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CONTROL_TARGET = "jupyter.widget.control"
COMPONENTS = ["bokeh", "bokeh-widgets", "bokeh-tables"]

_page_has_bokehjs = False  # a load reached the page(s) connected since the last new connection


def page_connected() -> None:
    """A page connected to the kernel (a reload, another tab): the next display loads BokehJS again."""
    global _page_has_bokehjs
    _page_has_bokehjs = False


def _hooked(target: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def opened(comm: Any, msg: Any) -> Any:
        page_connected()
        return target(comm, msg)

    opened.kvscope_page_hook = True  # type: ignore[attr-defined]
    return opened


def watch_pages() -> bool:
    """Wrap the control comm's target (once; again if ipywidgets registered it anew); ``False`` outside
    a kernel with ipywidgets, where nothing tells a new page apart."""
    try:
        from ipywidgets import comm
    except ImportError:
        return False
    manager = comm.get_comm_manager()
    target = getattr(manager, "targets", {}).get(CONTROL_TARGET) if manager is not None else None
    if target is None:
        return False
    if not getattr(target, "kvscope_page_hook", False):
        manager.register_target(CONTROL_TARGET, _hooked(target))
    return True


def ensure_bokehjs() -> bool:
    """Load BokehJS into the notebook page unless the page connected now has it (see the module
    docstring); returns whether a load was published."""
    global _page_has_bokehjs
    watch_pages()
    if _page_has_bokehjs:
        return False
    from bokeh.io import output_notebook
    from bokeh.resources import Resources

    output_notebook(Resources(mode="inline", components=list(COMPONENTS)), hide_banner=True)
    _page_has_bokehjs = True
    return True
