"""The options of ``kvscope watch`` and ``%kvscope watch``, declared once (both faces add them to their
parser), and the ``WatchRun`` arguments they make. Imports no face and nothing heavy."""

from __future__ import annotations

import argparse
import math
from typing import Any

from kvscope.options.run import OptionError, out_path


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:  # also refuses NaN
        raise OptionError(f"{text!r} must be a number of seconds > 0")
    return value


def add_watch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", metavar="URL", help="a vLLM server, like http://127.0.0.1:8000")
    events = parser.add_argument_group("KV cache events (ZMQ)")
    events.add_argument("--kv-events", action="append", default=[], metavar="tcp://HOST:PORT",
                        help="connect to a publisher that binds (vLLM with tcp://*:PORT); once per URL or rank")
    events.add_argument("--kv-events-bind", action="append", default=[], metavar="tcp://HOST:PORT",
                        help="bind for a publisher that connects (vLLM given this concrete address)")
    events.add_argument("--replay", action="append", default=[], metavar="tcp://HOST:PORT",
                        help="vLLM's replay endpoint: catch up at the start and after a gap (one per event endpoint)")
    events.add_argument("--topic", default="", help="only events of this topic (default: all)")
    parser.add_argument("--interval", type=positive_seconds, default=0.5, metavar="S",
                        help="seconds between polls of /metrics (default 0.5)")
    parser.add_argument("--duration", type=positive_seconds, default=None, metavar="S",
                        help="stop after S seconds (default: until stopped)")
    parser.add_argument("--plugin-log", action="append", default=[], metavar="FILE",
                        help="the JSONL that kvscope's vLLM plugin appends to (KVSCOPE_VLLM_PLUGIN=FILE on the "
                             "server): vLLM's own steps and requests; once per URL")
    requests = parser.add_argument_group("requests (without the plugin: vLLM's OpenTelemetry spans; the prompts sent)")
    requests.add_argument("--otlp", default=None, metavar="HOST:PORT",
                          help="receive vLLM's request spans (OTLP/HTTP protobuf) on HOST:PORT: start vLLM with "
                               "--otlp-traces-endpoint http://HOST:PORT/v1/traces and "
                               "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf")
    requests.add_argument("--prompts", default=None, metavar="FILE",
                          help="the prompts the load generator sent, in sending order (one per line, or .jsonl "
                               "with prompt or prompt_token_ids): matched to the requests so a replay has them")
    requests.add_argument("--tokenizer", default=None, metavar="MODEL_OR_DIR",
                          help="counts the tokens of text prompts as the server does: tiny, smollm2 or a local "
                               "model folder")
    requests.add_argument("--chat-template", action="store_true",
                          help="text prompts were sent in the tokenizer's chat template (vllm bench serve's "
                               "custom dataset without --skip-chat-template)")
    files = parser.add_argument_group("files (written at the end, and when a server is lost)")
    files.add_argument("--trace", type=out_path, default=None, metavar="FILE", help="Perfetto trace JSON")
    files.add_argument("--metrics", type=out_path, default=None, metavar="FILE", help="metrics JSON Lines")
    files.add_argument("--html", type=out_path, default=None, metavar="FILE", help="standalone HTML report")


def watch_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``WatchRun`` keyword arguments (all but the files) from parsed watch options."""
    return {"urls": args.urls, "kv_events": args.kv_events, "kv_events_bind": args.kv_events_bind,
            "replay": args.replay, "topic": args.topic, "interval": args.interval, "duration": args.duration,
            "plugin_log": args.plugin_log, "otlp": args.otlp, "prompts": args.prompts, "tokenizer": args.tokenizer,
            "chat_template": args.chat_template}
