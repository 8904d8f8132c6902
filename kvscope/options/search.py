"""The options of a search (``kvscope search`` and ``%kvscope search``), declared once: the space, the SLO, the
objective and the bisection, and who runs the simulations. Standard library only."""

from __future__ import annotations

import argparse


def add_search_options(parser: argparse.ArgumentParser) -> None:
    s = parser.add_argument_group("search")
    s.add_argument("--space", required=True, metavar="SPACE", help='the configurations: "KEY=V1,V2 KEY=V1,V2 ..." '
                   "(block_size, max_num_seqs, max_num_batched_tokens, kv_memory, num_blocks, chunked_prefill, "
                   "prefix_caching, replicas, router, pd, gpu, tp)")
    s.add_argument("--slo", required=True, metavar="SLO", help="latency objective, e.g. ttft_p99=0.5,itl_p99=0.05 "
                   "(ttft, itl, e2e; p50, p90, p95, p99; seconds)")
    s.add_argument("--goodput-fraction", type=float, default=0.9, metavar="F",
                   help="share of requests that must meet every threshold (default 0.9, DistServe's)")
    s.add_argument("--objective", choices=("per_dollar", "per_gpu", "goodput"), default="per_dollar",
                   help="what 'best' maximises: goodput per dollar (default; per GPU where no cost is known), "
                        "per GPU, or goodput")
    s.add_argument("--gpu-cost", type=float, metavar="USD_PER_HOUR", help="one GPU's cost per hour (default: "
                   "kvscope.planning.gpus.USD_PER_HOUR for --gpu / gpu=)")
    s.add_argument("--router", default="least_outstanding", metavar="POLICY", help="the replicas' router policy "
                   "unless the space varies router=: round_robin, least_outstanding (default), prefix_aware")
    s.add_argument("--rate-start", type=float, default=1.0, metavar="RPS", help="the bisection's first rate (1)")
    s.add_argument("--rate-max", type=float, default=4096.0, metavar="RPS", help="highest rate tried (4096)")
    s.add_argument("--bisect-steps", type=int, default=6, metavar="N", help="bisections after the bracket (6)")
    s.add_argument("--reports", choices=("front", "all", "none"), default="front",
                   help="with the page: which configurations get a simulated run report (HTML, metrics, trace) in "
                        "PAGE.runs/, linked from their points and rows: the Pareto front and the best (default, at "
                        "most 32), all with a goodput, or none")
    x = parser.add_argument_group("execution")
    x.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the simulations as Ray tasks: a local Ray (every core) or the cluster at ADDRESS "
                        '(needs pip install -e ".[ray]")')
    x.add_argument("--workers", type=int, metavar="N", help="processes (default: every core; 1: sequential)")
    x.add_argument("--sequential", action="store_true", help="one configuration after another in this process")


def refused_run_options(args: argparse.Namespace) -> list[str]:
    """Run options a search sets itself or has no use for, given anyway."""
    return [flag for flag, name in (("--rate", "rate"), ("--trace", "trace"), ("--metrics", "metrics"),
                                    ("--html", "html"), ("--profile", "profile"), ("--step-delay", "step_delay"),
                                    ("--capture-slow", "capture_slow"), ("--speculative", "speculative"))
            if getattr(args, name, None)]
