"""``Engine(model, pd="1P1D")``: where the engine finds the disaggregated engine it returns instead.

``kvscope.pd`` composes engines, a layer above this one, so this package never imports it: ``kvscope.pd.engine``
registers ``PDEngine`` here when imported (``kvscope.Engine`` imports it on first use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_PD_FACTORY: list[Callable[..., Any]] = []


def register_pd_factory(factory: Callable[..., Any]) -> None:
    """What ``Engine(..., pd=...)`` returns an instance of (``kvscope.pd`` registers ``PDEngine``)."""
    _PD_FACTORY[:] = [factory]


def make_pd_engine(*args: Any, pd: str, **kwargs: Any) -> Any:
    """The registered disaggregated engine for ``Engine(*args, pd=pd, **kwargs)``."""
    if not _PD_FACTORY:
        raise TypeError("Engine(..., pd=...) needs kvscope.pd: import it first (`import kvscope.pd.engine`), "
                        "or use kvscope.Engine (which does) or kvscope.pd.PDEngine")
    return _PD_FACTORY[0](*args, pd=pd, **kwargs)
