"""``kvscope search``: the best serving configuration under a latency SLO, found by simulation
(``kvscope.search``): a progress bar over configurations, the table (``--csv``), the Pareto page (``-o``) and the
best configuration as a ``vllm serve`` command."""

from __future__ import annotations

import argparse
import os
import sys

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.paths import check_output, different
from kvscope.options.run import CLI, OptionError, add_run_options
from kvscope.options.search import add_search_options, refused_run_options
from kvscope.options.simulate import add_simulate_options, simulate_fields

EPILOG = """\
examples:
  kvscope search --space "block_size=16,32 max_num_seqs=64,128 replicas=1,2 pd=none,1P1D" \\
      --slo ttft_p99=0.5,itl_p99=0.05 --gpu a100 --model llama-7b --requests 1000 --csv s.csv -o s.html
  kvscope search --space "max_num_seqs=32,64 tp=1,2" --slo ttft_p90=1 --gpu h100 --model llama-3-70b --ray
  kvscope search --space "block_size=16,32 replicas=1,2" --slo e2e_p50=2 --step-model step.json \\
      --replay real.metrics.jsonl --ray 127.0.0.1:6379

--space: KEY=V1,V2 terms separated by spaces; keys block_size, max_num_seqs, max_num_batched_tokens, kv_memory,
num_blocks, chunked_prefill, prefix_caching (on/off), replicas, router (round_robin, least_outstanding,
prefix_aware), pd (none, 1P1D, 1P2D, ...), gpu, tp. Every combination is simulated.
--slo: METRIC_pQ=SECONDS,... (ttft, itl, e2e; p50, p90, p95, p99). Goodput: the highest arrival rate at which
every term holds and at least --goodput-fraction of requests meet every threshold (DistServe's), found by
bisection on the rate; a simulation stops as soon as its SLO is lost for sure."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_search_options(parser)
    add_simulate_options(parser)
    add_run_options(parser, CLI)
    o = parser.add_argument_group("search outputs")
    o.add_argument("--csv", metavar="PATH", help="the table, one row per configuration")
    o.add_argument("-o", "--output", metavar="HTML", help="the Pareto page (offline HTML)")


def cmd_search(args: argparse.Namespace) -> int:
    from kvscope.runs.setup.spec import OutputSpec, RunSpec

    given = refused_run_options(args)
    if given:
        raise CLIError(f"kvscope search sets the rate itself and writes --csv / -o: leave out {', '.join(given)}")
    csv = check_output(args.csv, "CSV", "--csv") if args.csv else None
    page = check_output(args.output, "page", "-o") if args.output else None
    if csv is not None and page is not None:
        different(page, csv)
    if page is None and args.reports != "front":
        raise CLIError(f"--reports {args.reports} chooses the run reports the page links: give -o PAGE.html too")
    from kvscope.runs.setup.simulated import SimSpec  # here: it brings torch
    from kvscope.search.executors import RayMissing
    from kvscope.search.session import prepare_search

    try:
        search = prepare_search(args, RunSpec.from_args(args, outputs=OutputSpec()), SimSpec(**simulate_fields(args)))
    except (ValueError, OptionError) as exc:
        raise CLIError(str(exc)) from None
    slo, n = search.problem.slo, len(search.space)
    print(f"kvscope search · {args.model} · {n} configurations {search.where} · SLO {slo} "
          f"(>= {slo.fraction:.0%} of requests)", file=sys.stderr)
    from tqdm.auto import tqdm

    bar = tqdm(total=n, unit="config", desc="search", dynamic_ncols=True, disable=args.quiet)

    def tick(outcome) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{outcome.point.label()}: {outcome.goodput:.3g} req/s", refresh=False)

    try:
        result = search.run(tick)
    except RayMissing as exc:
        raise CLIError(str(exc)) from None
    finally:
        bar.close()
    errors = [o for o in result.outcomes if o.error]
    if len(errors) == len(result.outcomes):
        raise CLIError(f"no configuration could run; {errors[0].point.label()}: {errors[0].error}", code=1)
    if csv is not None:
        result.csv(csv)
    if page is not None:
        if args.reports != "none" and not args.quiet:
            print(f"simulating the {'configurations with a goodput' if args.reports == 'all' else 'front and the best'}"
                  " again at their goodput, with telemetry, for the page's run reports", file=sys.stderr)
        result.save_html(page, args.reports)
    if not args.quiet:
        _print_table(result.outcomes, slo, result.best)
    wrote = "".join(f"; wrote {p}" for p in (csv, page) if p)
    if page is not None and args.reports != "none":
        from kvscope.search.reports import runs_folder

        wrote += f" (its run reports in {runs_folder(page)}{os.sep})"
    print(f"{n} configurations in {result.elapsed_s:.1f} s{wrote}", file=sys.stderr)
    chosen = result.best
    if chosen is None:
        print("no configuration met the SLO at the lowest rate tried", file=sys.stderr)
        return 0
    print(f"best ({args.objective}): {chosen.point.label()}: {chosen.goodput:.4g} req/s on {chosen.num_gpus} GPU(s)")
    print(result.serve_line())
    return 0


def _print_table(outcomes, slo, chosen) -> None:
    terms = [t.name for t in slo.terms]
    print(f"{'configuration':<48} {'GPUs':>4} {'goodput':>9} {'per GPU':>8} {'req/USD':>9}  " +
          " ".join(f"{t:>9}" for t in terms) + "  broke first")
    for o in outcomes:
        if o.error:
            print(f"{o.point.label():<48} error: {o.error}")
            continue
        usd = f"{o.per_dollar_hour:9.0f}" if o.per_dollar_hour is not None else f"{'-':>9}"
        pct = " ".join(f"{o.percentiles[t]:9.4f}" if t in o.percentiles else f"{'-':>9}" for t in terms)
        mark = " *" if o is chosen else ""
        print(f"{o.point.label():<48} {o.num_gpus:>4} {o.goodput:>9.3f} {o.per_gpu:>8.3f} {usd}  {pct}  "
              f"{o.broke or '-'}{mark}")


COMMAND = Command(
    name="search",
    help="the best serving configuration under a latency SLO, by simulation (local processes or Ray)",
    description="Search engine settings, replicas, P/D layouts and tensor parallelism for the configuration with "
                "the highest goodput (per dollar) under a latency SLO: each configuration is simulated on "
                "kvscope's own scheduler at arrival rates found by bisection.",
    epilog=EPILOG,
    add_options=_add_options,
    run=cmd_search,
)
