"""The dashboard's panels: one module per plot, each a ``base.Panel`` owning its Bokeh sources.

- ``base``: ``Panel``, ``PanelContext``, ``DEFAULT_ROLLOVER``;
- ``kpi``, ``memory``, ``page_map``, ``occupancy``, ``batch``, ``latency``, ``timeline``: one panel each;
- ``registry``: ``PANELS`` (the display order), ``build_panels``, ``apply_tick``;
- ``requests_table``: the requests table of reports and replays (a finished run only, not a panel).

Modules import ``base`` and their siblings directly, never this package, so no import goes in a circle.
"""

from .base import DEFAULT_ROLLOVER, Panel, PanelContext
from .registry import PANELS, apply_tick, build_panels

__all__ = ["DEFAULT_ROLLOVER", "PANELS", "Panel", "PanelContext", "apply_tick", "build_panels"]
