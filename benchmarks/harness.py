"""What the benchmarks share: the model, the workload, the memory meter, percentiles and tables.

Nothing here runs a system; ``systems.py`` does that. All times are ``time.perf_counter()`` seconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import itertools
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil
import torch

from kvscope.models.loader import build_tiny_model, load_model
from kvscope.runs.workload.items import WorkItem, synthetic_workload

# The default benchmark model: a randomly initialised Llama of 56.0M parameters. Intermediate size
# 1376 = 8/3 x 512 rounded up to a multiple of 32 (Llama's SwiGLU ratio); head size 64 = 512 / 8
# (set explicitly: ``tiny_config`` would keep its own 16). Random weights, init std 0.02, float32.
LLAMA_60M = dict(
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=32000,
    max_position_embeddings=2048,
)
# --quick: the same architecture, small enough for a smoke test.
LLAMA_QUICK = dict(LLAMA_60M, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=2048)


OMP_WAIT_CHOICES = ("default", "passive", "active")


def add_omp_wait_option(parser) -> None:
    parser.add_argument("--omp-wait", choices=OMP_WAIT_CHOICES, default="default",
                        help="OpenMP's wait policy for every system: default (as the environment says; unset: "
                             "libgomp spins briefly, then sleeps), passive (sleep at once: for a machine shared with "
                             "other work) or active")


def set_omp_wait(policy: str) -> None:
    """Re-run this script with ``OMP_WAIT_POLICY`` set for ``policy`` (``default``: the environment as it is).

    How OpenMP threads wait between parallel regions decides what a second thread is worth. On a quiet
    machine libgomp's default (spin a little, then sleep) is best: a step of many small ops would pay
    a wake-up (~40 us on the 2-core VM) for each with ``passive``, which made 2 threads slower than 1
    for small gathers. On a machine shared with other work, spinning threads collapse: a parallel
    region waits for whichever thread was descheduled, and the spinning one eats the core the other
    needs (torch ops ran 3-5x slower with 2 threads than 1 under load average 4-10); ``passive``
    avoids that. ``active`` spins forever: an idle thread team of one caller then starves the threads
    of another (HF continuous batching, whose loop runs on its own thread, halved). The setting is
    process-wide and must be in place before OpenMP starts, hence the re-exec.
    """
    if policy != "default" and os.environ.get("OMP_WAIT_POLICY") != policy.upper():
        os.environ["OMP_WAIT_POLICY"] = policy.upper()
        os.execv(sys.executable, [sys.executable, *sys.argv])


def build_model(name: str, seed: int = 0) -> tuple[torch.nn.Module, str]:
    """(model in eval mode, description). ``llama-60m`` / ``llama-quick`` are built in code; anything
    else goes through ``kvscope.models.loader.load_model`` (``tiny``, ``smollm2``, a folder, a cached hub id)."""
    if name in ("llama-60m", "llama-quick"):
        shape = LLAMA_60M if name == "llama-60m" else LLAMA_QUICK
        model = build_tiny_model("llama", seed=seed, init_std=0.02, **shape)
        params = sum(p.numel() for p in model.parameters())
        desc = (f"random Llama, {params / 1e6:.1f}M params (hidden {shape['hidden_size']}, "
                f"{shape['num_hidden_layers']} layers, {shape['num_attention_heads']} heads, "
                f"{shape['num_key_value_heads']} KV heads, intermediate {shape['intermediate_size']}, "
                f"vocab {shape['vocab_size']}), float32")
        return model, desc
    model, _tokenizer, label = load_model(name, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    return model.eval(), f"{label}, {params / 1e6:.1f}M params, float32"


def special_token_ids(model: torch.nn.Module) -> set[int]:
    """bos / eos / pad ids of the model's config: kept out of random prompts."""
    ids: set[int] = set()
    for cfg in (model.config, getattr(model, "generation_config", None)):
        for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(cfg, attr, None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
    return ids


def make_workload(model: torch.nn.Module, num_requests: int, prompt_len: tuple[int, int],
                  output_len: tuple[int, int], seed: int) -> list[WorkItem]:
    """vLLM's random-dataset convention: random token ids, uniform lengths, greedy, EOS ignored."""
    vocab = model.config.get_text_config().vocab_size
    return synthetic_workload(num_requests, prompt_len, output_len, vocab_size=vocab, seed=seed,
                              exclude_ids=special_token_ids(model))


# ---- memory -------------------------------------------------------------------------------------
MEMORY_METRIC = "peak resident memory (Linux VmHWM, reset at the start of the run) above the resident level then"


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _malloc_trim() -> None:
    """Hand memory that glibc keeps after ``free`` back to the OS, so the baseline is what is in use."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


def _reset_peak() -> bool:
    """Reset the kernel's resident high-water mark (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Context manager: the peak resident set size during the block, above its value at entry.

    On Linux the kernel tracks the peak itself (VmHWM), so nothing runs beside the measured code and
    no short peak is missed. Elsewhere a daemon thread samples RSS every ``interval_s``.
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()
        _malloc_trim()
        self._kernel = _reset_peak() and _status_bytes("VmHWM") is not None
        self.base = self.peak = self._rss()
        if not self._kernel:
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    @staticmethod
    def _rss() -> int:
        return _status_bytes("VmRSS") or psutil.Process(os.getpid()).memory_info().rss

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc) -> None:
        if self._kernel:
            self.peak = max(self.peak, _status_bytes("VmHWM") or 0)
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.peak = max(self.peak, self._rss())

    @property
    def delta(self) -> int:
        return self.peak - self.base


# ---- results ------------------------------------------------------------------------------------
@dataclass(slots=True)
class RunResult:
    """One run of one system over the whole workload."""

    name: str
    tokens: list[list[int]]  # output token ids per request, in workload order
    wall_s: float  # first request submitted -> last token returned
    cpu_s: float  # CPU time of the whole process (all threads; vLLM: its process tree) over the same span
    ttft_s: list[float] = field(default_factory=list)  # per request, from submission of all requests
    tpot_s: list[float] = field(default_factory=list)  # per request with >= 2 tokens
    itl_s: list[float] = field(default_factory=list)  # every gap between consecutive tokens, pooled
    peak_mem_bytes: int | None = None
    resident_bytes: int | None = None  # resident size at the end of the run (the vLLM peer reports it)
    note: str = ""

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def tokens_per_cpu_s(self) -> float:
        """Output tokens per CPU-second: far steadier than wall time when other work shares the
        machine (time spent descheduled does not count), the same when the machine is quiet and
        every thread is busy."""
        return self.output_tokens / self.cpu_s if self.cpu_s > 0 else math.nan


def latencies_from_times(t0: float, token_times: Sequence[Sequence[float]], result: RunResult) -> None:
    """Fill TTFT / TPOT / ITL (vLLM's definitions) from per-request token arrival times."""
    for times in token_times:
        if not times:
            continue
        result.ttft_s.append(times[0] - t0)
        if len(times) > 1:
            result.tpot_s.append((times[-1] - times[0]) / (len(times) - 1))
            result.itl_s.extend(b - a for a, b in itertools.pairwise(times))


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.0f}"


def fmt_mib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None or math.isnan(num_bytes) else f"{num_bytes / 2**20:.0f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, columns padded for reading in a terminal."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def machine_line() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return (f"{os.cpu_count()} CPU cores, torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
            f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}")
