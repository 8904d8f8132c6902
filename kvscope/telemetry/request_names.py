"""Request ids unique in a run's records, though a source may reuse one.

A source may reuse a request id once its request has finished (kvscope's engine refuses only ids still in
use). The recorder then records the new request as ``id#2`` (``id#3``, ...) from its ``queued`` event to its
``finished`` one, in events, scheduled items and the page map alike. Only unfinished renamed requests are
kept (``_renamed``), and the ids already recorded are remembered only as far back as the event ring reaches
(``_recorded``, a bounded LRU): an id whose events left the ring cannot be merged with any more.

``RequestNames`` is a part of ``Recorder`` (``recorder.py``), kept here so the recorder reads as the
making of records and events; it holds no state of its own beyond those two maps.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable

from kvscope.telemetry.inputs import BatchSummary


class RequestNames:
    """The recorder's map from source ids to recorded ids (see the module docstring)."""

    _renamed: dict[str, str]  # source id -> recorded id, for unfinished requests renamed
    _recorded: OrderedDict[str, int]  # recorded id -> the last suffix given for it, least recently finished first
    _names_limit: int  # how many recorded ids are remembered: as many as the event ring holds events

    def _reset_names(self, limit: int) -> None:
        self._renamed = {}
        self._recorded = OrderedDict()
        self._names_limit = limit

    def _recorded_id(self, kind: str, request_id: str) -> str:
        """The recorded id of an event of ``request_id``: ``queued`` starts a request (its own id, or the
        first free ``id#N``); any other event keeps the name its request was queued under."""
        if kind != "queued":
            return self._renamed.get(request_id, request_id)
        recorded = self._recorded
        rid, n = request_id, recorded.get(request_id, 0)
        while rid in recorded:
            n += 1
            rid = f"{request_id}#{n}"
        if rid != request_id:
            recorded[request_id] = n
            self._renamed[request_id] = rid
        self._remember(rid)
        return rid

    def _remember(self, rid: str) -> None:
        """``rid`` was recorded just now (queued, or finished: its last event)."""
        self._recorded[rid] = self._recorded.pop(rid, 1)
        while len(self._recorded) > self._names_limit:
            self._recorded.popitem(last=False)

    def _forget_name(self, request_id: str) -> None:
        """A request finished: its source id names no recorded request any more."""
        self._renamed.pop(request_id, None)

    def _forget_names(self, ended: Iterable[str]) -> None:
        """Requests finished (by their recorded ids): drop their source ids' renames."""
        ended = set(ended)
        for source in [k for k, rid in self._renamed.items() if rid in ended]:
            del self._renamed[source]

    def _rename(self, batch: BatchSummary) -> BatchSummary:
        """``batch`` with the recorded ids of renamed requests (reused source ids)."""
        names = self._renamed

        def fix(items: list) -> list:
            return [dataclasses.replace(x, request_id=names[x.request_id]) if x.request_id in names else x
                    for x in items]

        counts = batch.counts
        if counts is not None:
            counts = dataclasses.replace(counts, sampled_ids=[names.get(rid, rid) for rid in counts.sampled_ids])
        return dataclasses.replace(batch, scheduled=fix(batch.scheduled), admitted=fix(batch.admitted),
                                   preempted=fix(batch.preempted), counts=counts)
