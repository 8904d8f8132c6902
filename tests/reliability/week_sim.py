"""A simulated week of a busy vLLM server, watched: the memory the watch's state comes to.

``python tests/reliability/week_sim.py [days]`` prints the figure of docs/reliability.md. The fake server's
page (``tests/watched/fakes.py``: every family vLLM 0.32 serves, TTFT / ITL histograms) is parsed once and its
counters advanced at each poll; the fast publisher's batches are ``BlockStored`` events of new, distinct
blocks that are never evicted (the worst case: a server that omits ``BlockRemoved`` fills every bound).
Time is compressed: the week's polls (one every 0.5 s, 1,209,600 of them) all happen, each through
``WatchSource.on_scrape`` / ``on_events`` / ``tick`` and into a ``RunBuffer`` as ``WatchRun`` does, without
waiting between them; the blocks are ``blocks_per_poll`` per poll, far past every bound of
``kvscope/watched/limits.py`` (a week at 1,000 new blocks/s would be 605 M; the bounds are reached after
0.5 M). ``test_watch_memory.py`` runs a shorter one and checks that the memory stops growing.
"""

from __future__ import annotations

import copy
import gc
import os
import sys
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "watched"))

from fakes import EngineMetrics, render

from kvscope.runs.result.buffer import RunBuffer
from kvscope.watched.events import BlockStored, EventBatch
from kvscope.watched.limits import MAX_RECORDS
from kvscope.watched.metrics import parse
from kvscope.watched.source import WatchSource

POLL_S = 0.5
WEEK_POLLS = int(7 * 86400 / POLL_S)


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / (1 << 20)


class Week:
    """A watch of one busy engine, driven ``polls`` at a time (``run``)."""

    def __init__(self, blocks_per_poll: int = 8) -> None:
        metrics = EngineMetrics(running=12, waiting=3, kv_usage=0.9, ttft=[0.02] * 50, itl=[0.01] * 500,
                                num_gpu_blocks=100_000, block_size=16)
        self.page = parse(render({"0": metrics})).samples[0]
        self.source = WatchSource(["http://127.0.0.1:8000/metrics"], t0_ns=0, interval_s=POLL_S)
        self.buffer = RunBuffer({"watch": self.source.watch}, capacity=MAX_RECORDS)
        self.blocks_per_poll = blocks_per_poll
        self.poll = 0
        self.block = 0

    def run(self, polls: int) -> None:
        src, page = self.source, self.page
        for _ in range(polls):
            self.poll += 1
            sample = copy.copy(page)
            sample.counters = {k: v + 1000.0 * self.poll for k, v in page.counters.items()}
            src.on_scrape(0, [sample])
            hashes = [f"{h:016x}" for h in range(self.block, self.block + self.blocks_per_poll)]
            parent = f"{self.block - 1:016x}" if self.block % 1024 else None  # chains of 1,024 blocks
            self.block += self.blocks_per_poll
            batch = EventBatch(0.0, [BlockStored(hashes, parent, 16 * len(hashes), 16)], 0, self.poll)
            src.on_events(0, batch, time.perf_counter_ns())
            records, events = src.tick(time.perf_counter_ns(), force=False)
            for item in (*records, *events):
                self.buffer.add(item)


def main(days: float = 7.0) -> None:
    polls = int(days * 86400 / POLL_S)
    start = rss_mib()
    week = Week()
    t = time.monotonic()
    step = max(polls // 14, 1)
    while week.poll < polls:
        week.run(min(step, polls - week.poll))
        print(f"{week.poll * POLL_S / 86400:5.2f} days ({week.poll:,} polls, {week.block:,} blocks): "
              f"{rss_mib() - start:7.1f} MiB above the start, {time.monotonic() - t:6.0f} s", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 7.0)
