"""When does prefill/decode disaggregation pay? TTFT and ITL, colocated vs 1P1D on the same cores (issue 24).

For each arrival rate (Poisson, ``--rate`` of kvscope run), one seeded workload of long prompts and short outputs
runs twice through ``LiveRun`` (requests submitted at their arrival times): on one colocated ``Engine`` with all
the cores, and on ``PDEngine(model, pd="1P1D")`` whose two instances get half the cores each. The table prints
TTFT p50 / p99 (arrival to first token, end to end) and ITL p50 / p99 (the decode side's steps), and the
crossover: the lowest rate from which 1P1D's ITL p99 beats the colocated one. Before that, the cost per MB of
each transport (``kvscope.pd.connector``: pack, move, unpack, in one process).

    python benchmarks/pd.py --quick      # the tiny model, 3 rates, ~1 minute
    python benchmarks/pd.py              # smollm2 (135M), 5 rates (docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import time

import torch

from kvscope.engine.engine import Engine
from kvscope.engine.request import SamplingParams
from kvscope.pd.config import KVTransferConfig
from kvscope.pd.connector import Connector
from kvscope.pd.engine import PDEngine
from kvscope.runs.background.live import LiveRun
from kvscope.runs.workload.items import synthetic_workload, with_arrivals

KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")


def transport_cost(mb: int, repeats: int = 5) -> dict[str, float]:
    """Milliseconds per MB (10**6 bytes) of each transport: ``repeats`` round trips of ``mb`` MiB of 16 KiB
    pages (pack, move, unpack, in one process), the best one."""
    out = {}
    pages = [torch.randn(mb * 64, 16, 16, 16)]  # 16 KiB pages, 64 per MiB
    dst = [torch.empty_like(pages[0])]
    ids = list(range(pages[0].shape[0]))
    for transport in ("shm", "zmq"):
        extra = {"transport": transport}
        producer = Connector(KVTransferConfig(kv_role="kv_producer", kv_connector_extra_config=extra))
        consumer = Connector(KVTransferConfig(kv_role="kv_consumer", kv_connector_extra_config=extra))
        best, nbytes = float("inf"), 0
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                handle = producer.send(pages, ids, consumer.address)
                consumer.receive(dst, ids, handle)
                best, nbytes = min(best, time.perf_counter() - t0), handle.num_bytes
        finally:
            producer.close()
            consumer.close()
        assert torch.equal(dst[0], pages[0])
        out[transport] = best * 1e3 / (nbytes / 1e6)
    return out


def measure(make_engine, items) -> dict[str, float]:
    run = LiveRun(make_engine, items, dashboard=False)
    run.start()
    run.wait()
    s = run.run.summary()
    engine = run.engine
    if isinstance(engine, PDEngine):
        engine.close()
    if s["finished"] != len(items) or s["errors"]:
        raise RuntimeError(f"{s['finished']} of {len(items)} finished, {s['errors']} errors")
    return {k: s[k] for k in KEYS} | {"kv_transfer_mb_per_s": s.get("kv_transfer_mb_per_s", float("nan"))}


def workload(n: int, rate: float, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab: int):
    items = synthetic_workload(n, prompt_len, output_len, vocab_size=vocab, seed=7,
                               params=SamplingParams(ignore_eos=True))
    return with_arrivals(items, rate, "poisson", seed=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, fewer requests and rates")
    parser.add_argument("--model", default=None)
    parser.add_argument("--rates", default=None, help="comma-separated requests/s")
    parser.add_argument("--requests", type=int, default=None)
    args = parser.parse_args()
    model = args.model or ("tiny" if args.quick else "smollm2")
    rates = [float(r) for r in (args.rates or ("2,8,32" if args.quick else "0.5,1,2,4,8")).split(",")]
    n = args.requests or (24 if args.quick else 32)
    prompt_len, output_len = ((200, 400), (16, 32)) if args.quick else ((256, 512), (16, 32))
    cores = torch.get_num_threads()

    for transport, ms_per_mb in transport_cost(8 if args.quick else 64).items():
        print(f"transport {transport}: {ms_per_mb:.3f} ms per MB ({1e3 / ms_per_mb:.0f} MB/s)")
    kw = dict(block_size=16, max_num_batched_tokens=512)
    probe = Engine(model, **kw)
    vocab = probe.spec.vocab_size
    del probe
    print(f"\n{model}, {n} requests, prompts {prompt_len[0]}-{prompt_len[1]}, outputs {output_len[0]}-"
          f"{output_len[1]}, {cores} cores (colocated: {cores} threads; 1P1D: {max(1, cores // 2)} per instance)")
    print(f"{'rate/s':>7} {'system':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'MB/s':>7}")
    results = []
    for rate in rates:
        items = workload(n, rate, prompt_len, output_len, vocab)
        co = measure(lambda: Engine(model, **kw), items)
        pd = measure(lambda: PDEngine(model, pd="1P1D", num_threads=cores, **kw), items)
        for name, r in (("colocated", co), ("1P1D", pd)):
            print(f"{rate:>7g} {name:>10} {r['ttft_p50_s'] * 1e3:>7.0f}ms {r['ttft_p99_s'] * 1e3:>7.0f}ms "
                  f"{r['itl_p50_s'] * 1e3:>6.1f}ms {r['itl_p99_s'] * 1e3:>6.1f}ms {r['kv_transfer_mb_per_s']:>7.0f}")
        results.append((rate, co, pd))
    print()
    for key in KEYS:
        print(f"crossover of {key[:-2]}: {crossover(results, key)}")


def crossover(results: list[tuple[float, dict, dict]], key: str) -> str:
    """The lowest rate from which 1P1D stays better (lower) than colocated on ``key``."""
    better = [pd[key] < co[key] for _, co, pd in results]
    if all(better):
        return f"1P1D better at every rate (from {results[0][0]:g}/s)"
    if not better[-1]:
        return "none: colocated better at the highest rate"
    i = max(i for i, b in enumerate(better) if not b) + 1
    return f"between {results[i - 1][0]:g} and {results[i][0]:g} requests/s (1P1D better from {results[i][0]:g}/s)"


if __name__ == "__main__":
    main()
