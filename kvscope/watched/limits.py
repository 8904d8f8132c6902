"""What a watched server may send, and what the watch keeps: every bound in one place (and ``Remembered``,
the bounded set of block hashes the residency and the fleet share).

A watched server is not trusted (it may be damaged, misconfigured or hostile), and a watch may run for
weeks. Every value from outside is checked against these at the edge (a bad one is counted as malformed
and dropped), and everything the watch keeps is bounded by them, so its memory has a ceiling whatever the
servers send (docs/reliability.md, "A watched server").
"""

from __future__ import annotations

from collections.abc import Iterable

# /metrics pages (metrics.py)
MAX_PAGE_BYTES = 16 << 20  # a real vLLM page is ~100 KiB per engine; the rest of a longer one is cut
MAX_SAMPLE_LINES = 200_000  # lines of the families kvscope reads per page (~10 us each to parse)
MAX_LABEL = 256  # characters of a label value (engine, model_name, finished_reason, ...)
MAX_COUNTERS = 64  # counter (and gauge) keys per engine past which no split one is added (fixed names always are)
MAX_BUCKETS = 256  # bounds per histogram
MAX_HISTOGRAMS = 32  # histograms per engine (the split ones, e.g. per transfer_type, included)
MAX_INFO_LABELS = 64  # labels of vllm:cache_config_info
MAX_VALUE = float(2**53)  # counts, sums, bucket counts: beyond this a float is no longer a whole number
MAX_QUEUE = float(2**31)  # running / waiting requests
MAX_BLOCK_SIZE = 1 << 16  # tokens per KV block
MAX_NUM_BLOCKS = 1 << 32  # KV blocks per engine (x block size x engines stays below 2**63)

# engines (source.py)
MAX_ENGINES = 64  # engines of a watch (metrics labels, plugin labels, data-parallel ranks together)
ENGINE_TTL_S = 60.0  # an engine nothing was heard of for this long leaves the fleet (kept as "gone")
MAX_LANE_ROWS = 8192  # rows per lane; then its older half is merged pairwise (coarser, never dropped)
MAX_LOST = 1000  # connection-lost spans kept (the latest)
MAX_RECORDS = 20_000  # records a watch keeps (the latest; the events: 4x)

# plugin lines (source.py, plugin_steps.py)
MAX_UNIX_TIME = 4e9  # a plugin time ``t`` (Unix seconds) after this (the year 2096), or before 0, is damaged
MAX_SPAN_S = 7 * 86400.0  # a duration in a plugin line (latency, queue time, step time)

# OTLP request spans (otlp.py, otlp_receiver.py)
MAX_OTLP_BODY = 8 << 20  # bytes of one POST (after gzip); vLLM's exporter sends at most 512 spans (~300 KiB)
MAX_OTLP_SPANS = 4096  # spans read from one body (the rest are rejected)
MAX_OTLP_PENDING = 100_000  # request rows waiting for the watch thread (it takes them at every poll)
OTLP_SOCKET_TIMEOUT_S = 5.0  # a client that sends nothing for this long is dropped

# KV events (events.py, residency.py)
MAX_FRAME_BYTES = 4 << 20  # a ZMQ message (zmq.MAXMSGSIZE: a longer one is dropped by ZMQ)
RCVHWM = 1000  # ZMQ messages queued per publisher before ZMQ drops (then seen as a gap)
MAX_HASH_BYTES = 64  # a block hash (vLLM's are 8-byte ints or 32-byte digests)
MAX_MEDIUM = 32  # characters of a KV event's medium ("GPU", "CPU", ...; a longer one is malformed)
MAX_MEDIA = 8  # media counted apart per engine (blocks in further ones are counted under "other")
MAX_BLOCKS_PER_EVENT = 1 << 17  # hashes in one BlockStored / BlockRemoved
MAX_RESIDENT = 1 << 18  # cached blocks tracked per engine (then those stored longest ago are forgotten)
MAX_REMEMBERED = 1 << 19  # hashes remembered (depths, distinct counts) per engine and for the fleet
MAX_GUARD_STEPS = 256  # blocks walked up a chain by the cycle guard
MAX_REPLAY_BATCHES = 10_000  # batches taken from one replay answer
REPLAY_TIMEOUT_S = 1.0  # the longest one replay request waits
REPLAY_MAX_FAILURES = 3  # replays unanswered in a row before the watch stops asking (a counted fault)
MAX_COUNT = 1 << 53  # a count the watch writes (totals, lane cells, record fields): files load back
MAX_RANK = 1 << 10  # data-parallel ranks / plugin engine indices


class Remembered:
    """Block hashes seen (and their depth): the last ``limit`` to ``limit / 2`` of them (two generations of
    plain dicts, the older dropped whole: O(1), no per-key order kept), and how many distinct ones were
    ever seen (``num_distinct``; a hash seen again after it was dropped counts again)."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._new: dict[str, int] = {}
        self._old: dict[str, int] = {}
        self.num_distinct = 0

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def get(self, key: str) -> int | None:
        depth = self._new.get(key)
        return self._old.get(key) if depth is None else depth

    def note(self, key: str, depth: int = 0) -> bool:
        """Remember ``key`` (at ``depth``); ``True`` if it was remembered already."""
        before = key in self._new or key in self._old
        self.num_distinct += not before
        if len(self._new) >= self.limit // 2:
            self._old, self._new = self._new, {}
        self._new[key] = depth
        return before

    def note_all(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.note(key)
