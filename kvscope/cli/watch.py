"""``kvscope watch URL [URL ...]``: running vLLM servers watched from the terminal, with files at the end.

A ``WatchRun`` polls and listens on its own thread; the main thread prints a status line now and then.
Ctrl-C, SIGTERM and SIGHUP end the watch the same way: the files are written, the summary printed, and
the exit code is 128 + the signal's number (130, 143, 129), as for ``kvscope run``; ``--duration`` ends it
with 0. A server that does not answer at the start: one line, exit 1. Bad options: one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import suppress

from kvscope.cli.command import Command
from kvscope.cli.parser import CLIError
from kvscope.cli.signals import signal_number, stop_signals, wait_until_done
from kvscope.options.watch import add_watch_options, watch_kwargs
from kvscope.utils.files import check_outputs

EPILOG_WATCH = """\
examples:
  kvscope watch http://127.0.0.1:8000 --html watch.html
  kvscope watch http://127.0.0.1:8000 --kv-events tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 \\
      --interval 0.5 --duration 60 --trace watch.trace.json --metrics watch.metrics.jsonl
  kvscope watch http://a:8000 http://b:8000 --kv-events tcp://a:5557 --kv-events tcp://b:5557
  KVSCOPE_VLLM_PLUGIN=/tmp/steps.jsonl python -m vllm.entrypoints.openai.api_server ...   # then
  kvscope watch http://127.0.0.1:8000 --plugin-log /tmp/steps.jsonl --html watch.html
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf python -m vllm.entrypoints.openai.api_server ... \
      --otlp-traces-endpoint http://127.0.0.1:4318/v1/traces   # then
  kvscope watch http://127.0.0.1:8000 --otlp 127.0.0.1:4318 --prompts sent.jsonl --metrics watch.metrics.jsonl

vLLM side: --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
  "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}' (it binds: use --kv-events); with a
  concrete address ("tcp://127.0.0.1:5557") vLLM connects: use --kv-events-bind with that address.
  A data-parallel rank r publishes on port + r: give one --kv-events per rank.
exact: token counts, prefix hits, preemptions, cached blocks, and with --otlp or --plugin-log each request's
times; estimated (≈): latency percentiles of /metrics (histogram buckets); unknowable from outside: block ids,
fragmentation. See docs/vllm.md."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_watch_options(parser)
    parser.add_argument("-q", "--quiet", action="store_true", help="no status line or table; print the files")


def cmd_watch(args: argparse.Namespace) -> int:
    from kvscope.runs.background.status import Outputs
    from kvscope.runs.background.watch import WatchRun

    outputs = {"--trace": args.trace, "--metrics": args.metrics, "--html": args.html}
    try:
        check_outputs({f"--plugin-log {p}": p for p in args.plugin_log}, outputs)
        run = WatchRun(**watch_kwargs(args), outputs=Outputs(trace=args.trace, metrics=args.metrics, html=args.html))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    stopped_by = None
    with stop_signals():
        try:
            run.start()
            _follow(run, args.quiet)
        except KeyboardInterrupt as exc:
            stopped_by = signal_number(exc)
            run.stop()
            with suppress(OSError):
                print("kvscope: stopping the watch and writing the files", file=sys.stderr, flush=True)
            wait_until_done(run)
    return _report(run, args.quiet, stopped_by)


def _follow(run, quiet: bool) -> None:
    """Until the watch ends: a status line every few seconds (in place on a terminal)."""
    tty = sys.stderr.isatty()
    last = 0.0
    while not run.done:
        time.sleep(0.1)
        now = time.monotonic()
        if quiet or now - last < (1.0 if tty else 10.0) or run.status.value != "running":
            continue
        last = now
        with suppress(OSError):
            line = _status_line(run)
            print(("\r" + line.ljust(110)) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
    if tty and not quiet:
        with suppress(OSError):
            print(file=sys.stderr)


def _status_line(run) -> str:
    from kvscope.watched.summary import fleet_kpis

    v = fleet_kpis(run.source.watch)

    def num(key: str, fmt: str) -> str:
        return "–" if v[key] is None else fmt.format(v[key])

    return (f"{run.status_text} · running {num('running', '{:.0f}')} waiting {num('waiting', '{:.0f}')} · "
            f"KV {num('kv_usage', '{:.1%}')} · {num('generation_tokens_per_s', '{:,.0f}')} gen tok/s · "
            f"{num('blocks_cached', '{:,}')} blocks cached")


def _report(run, quiet: bool, stopped_by: int | None) -> int:
    if run.error is not None:
        raise CLIError(str(run.error), code=1) from None
    try:
        if not quiet:
            print_watch_summary(run)
        for kind in ("html", "trace", "metrics"):
            path = run.files.written.get(kind)
            if path is not None:
                print(path if quiet else f"{kind:<8} {path}")
    except OSError:  # a hung-up terminal (SIGHUP): the files are written all the same
        pass
    if run.files.errors:
        raise CLIError("could not write " + "; ".join(f"{k}: {v}" for k, v in run.files.errors.items()), code=1)
    return 0 if stopped_by is None else 128 + stopped_by


def print_watch_summary(run) -> None:
    s = run.summary()

    def count(value) -> str:
        return "–" if value is None else f"{value:,}"

    def ms(value) -> str:
        return "–" if value is None or value != value else f"≈{value * 1e3:.1f} ms"

    print(f"kvscope watch · {run.run.meta.get('model', 'vLLM')} · {run.status_text}")
    rows = [("fleet", s), *s["engines"].items()] if len(s["engines"]) > 1 else list(s["engines"].items())
    print(f"{'engine':<28} {'prompt tok':>11} {'gen tok':>9} {'hit tok':>9} {'preempt':>8} {'finished':>8} "
          f"{'blocks':>7} {'TTFT p50':>10} {'ITL p50':>9}")
    for name, e in rows:
        print(f"{name[:28]:<28} {count(e['prompt_tokens']):>11} {count(e['generation_tokens']):>9} "
              f"{count(e['prefix_cache_hit_tokens']):>9} {count(e['preemptions']):>8} "
              f"{count(e['requests_finished']):>8} {count(e['kv_blocks_stored']):>7} "
              f"{ms(e['ttft_p50_s_estimate']):>10} {ms(e['itl_p50_s_estimate']):>9}")
    quiet_counts = ("event_batches", "plugin_lines", "otlp_posts", "otlp_spans", "otlp_spans_other")
    faults = {k: v for k, v in s["faults"].items() if v and k not in quiet_counts}
    if faults or s["connection_lost"]:
        print("faults: " + ", ".join([f"connection lost {s['connection_lost']}x"] * bool(s["connection_lost"])
                                     + [f"{k} {v}" for k, v in faults.items()]))
    watch = run.run.meta.get("watch", {})
    if run.otlp is not None:
        print(f"requests: {len(run.run.requests)} from vLLM's spans at {run.otlp_endpoint}")
    match = watch.get("prompts")
    if match:
        print(f"prompts: {match['matched']} of {match['num_requests']} requests matched to the {match['num_prompts']} "
              f"sent ({match['reordered']} out of sending order, {match['unmatched']} without a prompt of their "
              "length: check --tokenizer / --chat-template if many)")
    print()


COMMAND = Command(
    name="watch",
    help="watch running vLLM servers: KV cache, prefix tree, latency; files",
    description="Attach to running vLLM servers from outside: poll their Prometheus "
                "/metrics, follow their KV cache events, read kvscope's vLLM plugin; write the same "
                "trace, metrics and HTML report as a kvscope run.",
    epilog=EPILOG_WATCH,
    add_options=_add_options,
    run=cmd_watch,
)
