"""A watched vLLM run as a replay's starting point (``kvscope simulate --replay WATCH.metrics.jsonl``).

A run of kvscope's engine carries its model's shape (``meta["spec"]``, ``kv_bytes_per_token``) and its engine
settings in its header; a watched vLLM carries neither shape (the server never tells it) nor kvscope's header,
only the server's settings as kvscope's plugin read them (``meta["config"]``, ``kvscope.watched.plugin_config``).
``for_replay`` gives such a run the header ``kvscope.runs.setup.replay`` reads:

- the model's shape from ``--model`` (the folder the server served; without it, the model path the watch
  recorded, if that folder is here): its layers, heads and head size, so a what-if of KV memory counts bytes;
- the pool: vLLM's ``num_gpu_blocks`` less its one "null" block (``BlockPool``'s block 0, never handed out), so
  the simulated pool holds as many tokens as the server's did;
- block size, batch limits, the longest sequence, prefix caching and chunked prefill from the plugin's config.

Requests whose prompt the watch does not know (not matched to its ``--prompts``) are left out of the replay,
and a note says how many. A run of kvscope's engine comes back unchanged. What cannot be replayed is refused with
the fix: a watch without the plugin (no settings), or no model folder.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from kvscope.options.parser import OptionError
from kvscope.sim.shape import resolve_shape

if TYPE_CHECKING:
    from kvscope.runs.result.run import Run

NULL_BLOCKS = 1  # vLLM 0.32's BlockPool keeps block 0 as its null block (vllm/v1/core/block_pool.py)
SETTINGS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_prefix_caching",
            "enable_chunked_prefill")


def is_watched(meta: Mapping[str, Any]) -> bool:
    return isinstance(meta.get("watch"), Mapping)


def _count(config: Mapping[str, Any], name: str) -> int | None:
    value = config.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_folder(meta: Mapping[str, Any], model: str, path: str) -> str:
    """The served model's folder: ``--model`` if given (not kvscope's default ``tiny``), else the model the watch
    recorded when it is a folder here; ``OptionError`` with the fix otherwise."""
    if model != "tiny":
        return model
    recorded = meta.get("model")
    if isinstance(recorded, str) and os.path.isdir(os.path.expanduser(recorded)):
        return os.path.expanduser(recorded)
    raise OptionError(f"cannot replay {path}: a watched vLLM does not record its model's shape, and the model it "
                      f"served ({recorded!r}) is no folder here: give --model DIR, the folder the server served (its "
                      "config.json gives the layers and heads), or a known shape such as llama-7b")


def replay_meta(meta: Mapping[str, Any], model: str, dtype: str | None, path: str) -> dict[str, Any]:
    """``meta`` of a watched run with the header of a kvscope run (the module doc)."""
    config = meta.get("config")
    if not isinstance(config, Mapping):
        raise OptionError(f"cannot replay {path}: the watch did not record the server's settings (block size, pool, "
                          "batch limits): watch the server with kvscope's stat-logger plugin loaded "
                          "(KVSCOPE_VLLM_PLUGIN=FILE on the server, `kvscope watch URL --plugin-log FILE`; "
                          "docs/vllm.md) and replay that run")
    pool = _count(config, "num_blocks")
    if pool is None or pool <= NULL_BLOCKS:
        raise OptionError(f"cannot replay {path}: its server settings have num_blocks={config.get('num_blocks')!r} "
                          f"(vLLM's num_gpu_blocks, more than {NULL_BLOCKS} with its null block); the file is damaged "
                          "or edited: watch the server again")
    try:
        shape = resolve_shape(model_folder(meta, model, path), dtype, default_dtype=torch.float32)
    except ValueError as exc:
        raise OptionError(f"cannot replay {path}: --model: {exc}") from None
    spec = shape.spec
    settings = {name: config[name] for name in SETTINGS if config.get(name) is not None}
    settings["num_blocks"] = pool - NULL_BLOCKS
    out = dict(copy.deepcopy(dict(meta)))
    out.update(
        block_size=settings.get("block_size", meta.get("block_size")),
        num_blocks=settings["num_blocks"],
        max_model_len=settings.get("max_model_len") or spec.max_model_len,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        spec={**{k: v for k, v in asdict(spec).items() if k != "dtype"}, "dtype": str(spec.dtype).split(".")[-1]},
        config={**dict(config), **settings},
        replay_model=shape.name,
    )
    return out


def for_replay(run: Run, model: str, dtype: str | None, path: str) -> Run:
    """``run`` as ``kvscope simulate --replay`` reads it: unchanged unless it is a watched vLLM (the module doc)."""
    if not is_watched(run.meta):
        return run
    adapted = copy.copy(run)
    adapted.meta = replay_meta(run.meta, model, dtype, path)
    adapted._frames = {}  # (the copy's own cache of frames)
    unknown = {e.request_id for e in run.events if e.kind == "queued" and e.prompt_token_ids is None}
    if unknown:  # requests the sent prompts did not match (or sent by others): their prompts are unknown
        adapted.events = [e for e in run.events if e.request_id not in unknown]
        adapted.meta["replay_notes"] = [
            f"kvscope: {len(unknown)} of the watched requests have no prompt (not matched to the watch's --prompts, "
            "or never finished): the replay leaves them out"]
    return adapted
