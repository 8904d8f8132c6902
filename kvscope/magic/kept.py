"""What a kernel keeps between ``%kvscope`` runs, and the two commands about it: ``%kvscope show`` displays the
running (or last) run's dashboard again (a page reloaded during a run of an unsaved notebook lost its output, not
the run: ``kvscope.magic.history``), ``%kvscope release`` lets go of the loaded engines kept for the next run
(``kvscope.runs.setup.engine_cache``)."""

from __future__ import annotations

from IPython.core.error import UsageError

from kvscope.magic.history import HISTORY
from kvscope.runs.setup.engine_cache import ENGINES


def magic_show(rest: str):
    """``%kvscope show``: display the last run's dashboard again (the same live widgets, still updating)."""
    if rest.strip() in ("-h", "--help"):
        print("usage: %kvscope show\n\nDisplay the dashboard of the running (or last) %kvscope run again, "
              "for instance after the page was reloaded during a run.")
        return None
    if rest.strip():
        raise UsageError(f"%kvscope show takes no options (got {rest.strip()!r}): it shows the running or last run")
    run = HISTORY.last
    view = HISTORY.newest_view() if run is None else None
    if view is not None:  # the last run is over and was let go of (%kvscope release): its widgets remain
        from IPython.display import display

        from kvscope.widgets.bokehjs import ensure_bokehjs

        ensure_bokehjs()
        for model in view.models:
            model.expect_view()  # a new view: its patches wait for the browser (widgets/transport.py)
        display(view.box)
        return None
    if run is None:
        raise UsageError("no %kvscope run in this kernel yet: start one with %kvscope (or %kvscope simulate)")
    if run.dashboard is None:
        raise UsageError(f"the last run ({run.status_text}) was started with -q: it has no dashboard; "
                         "rerun it without -q to watch it")
    from IPython.display import display

    display(run)
    HISTORY.displayed(run)
    return None


def magic_release(rest: str) -> None:
    """``%kvscope release``: let go of every loaded engine kept for reuse (those in use when their run ends)."""
    if rest.strip() in ("-h", "--help"):
        print("usage: %kvscope release\n\nLet go of the models %kvscope keeps loaded for the next run "
              "(one still running is let go of when its run ends); the next run loads its model again.")
        return
    if rest.strip():
        raise UsageError(f"%kvscope release takes no options (got {rest.strip()!r})")
    HISTORY.let_go_of_last()  # a finished last run no longer holds its engine here
    said = ENGINES.release_all()
    if not said:
        print("kvscope: no loaded engine is kept")
        return
    print(f"kvscope: released {len(said)} engine{'s' * (len(said) > 1)}: " + "; ".join(said)
          + " (a run object you still hold keeps its engine until you drop it)")
