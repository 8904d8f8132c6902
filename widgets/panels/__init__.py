"""The dashboard's panels: one module per plot, each a ``base.Panel`` owning its Bokeh sources.

- ``base``: ``Panel``, ``PanelContext``, ``DEFAULT_ROLLOVER``;
- ``kpi``, ``memory``, ``page_map``, ``occupancy``, ``batch``, ``latency``, ``timeline``, ``speculation``,
  ``prefix_misses``, ``queue_reasons``, ``slow_steps``, ``pd_page_maps``: a run's panels; ``watch_kpi``,
  ``fleet``, ``kv_transfer``, ``prefix_tree``, ``watch_latency``: a watch's;
- ``page_cells``: a page-map cell's look; ``wait_styles``: a wait reason's colour and label; ``engine_lanes``:
  what the panels drawn from a watch's engine lanes share; ``pd_timeline``: a P/D run's request lanes;
- ``registry``: each panel declared once (``PanelSpec``: class, row, report part), ``PANELS`` and
  ``WATCH_PANELS`` in display order, ``build_panels``, ``apply_tick``, ``report_rows``;
- ``report_parts``: how a panel appears in the report (``RecordedRun``, ``ReportContext``);
  ``replay``: the page map's replay slider in a static page;
- ``requests_table``: the requests table of reports and replays (a finished run only, not a panel).

Modules import ``base`` and their siblings directly, never this package, so no import goes in a circle.
"""

from .base import DEFAULT_ROLLOVER, Panel, PanelContext
from .registry import PANELS, PanelSpec, apply_tick, build_panels

__all__ = ["DEFAULT_ROLLOVER", "PANELS", "Panel", "PanelContext", "PanelSpec", "apply_tick", "build_panels"]
