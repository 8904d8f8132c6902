"""What ``kvscope simulate --replay RUN`` starts from besides the run's requests (``kvscope.runs.workload.recorded``):
the recorded run's engine settings, its header checked first.

A replay is the run again unless told otherwise. Its engine settings (the pool in blocks, the block size, the
batch limits, the longest sequence, prefix caching, chunked prefill, the seed) are read from the run's header
(``meta``: ``block_size``, ``num_blocks``, ``max_model_len`` and ``config``); the engine options the user gave
(``EngineSpec``'s fields that are not ``None``) are the what-if and override them one by one. ``ReplaySettings``
lists each setting that ends up different from the run's and why (``changes``); the face prints it and the
simulated run's meta keeps it, with the run's identity (``kvscope.runs.result.lineage``).

The pool: the run's ``num_blocks``, unless ``--num-blocks``, ``--kv-memory`` or ``--gpu`` give another; a new
``--block-size`` alone keeps the run's KV memory (a block-size what-if at equal memory, not equal block count).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.engine.config import EngineConfig
from kvscope.options.parser import OptionError
from kvscope.runs.setup.prepare import engine_config
from kvscope.runs.setup.spec import EngineSpec

# EngineConfig's name -> (EngineSpec's field, the flag that sets it; None: no option, always the run's)
SETTINGS: dict[str, tuple[str | None, str]] = {
    "num_blocks": ("num_blocks", "--num-blocks"),
    "block_size": ("block_size", "--block-size"),
    "max_num_seqs": ("max_num_seqs", "--max-num-seqs"),
    "max_num_batched_tokens": ("max_num_batched_tokens", "--max-num-batched-tokens"),
    "max_model_len": ("max_model_len", "--max-model-len"),
    "enable_prefix_caching": ("prefix_caching", "--prefix-caching"),
    "enable_chunked_prefill": (None, "chunked prefill"),
    "seed": (None, "seed"),
}
DEFAULTS = EngineConfig()
RECORD_AGAIN = "record the run again with `kvscope run ... --out NAME` and replay NAME.metrics.jsonl"


def _fail(path: str, name: str, value: Any, must: str) -> OptionError:
    """The refusal of a header field: the file, the field, what it must be and the fix."""
    if value is None:
        return OptionError(f"cannot replay {path}: its header (the run's metadata) has no {name} ({must}); the "
                           f"file is damaged, edited or not a run of kvscope's engine: {RECORD_AGAIN}")
    return OptionError(f"cannot replay {path}: its header (the run's metadata) has {name}={value!r}, which must be "
                       f"{must}; the file is damaged or edited: {RECORD_AGAIN}")


def _int(meta: Mapping[str, Any], name: str, path: str, lo: int, *, label: str | None = None,
         required: bool = True) -> int | None:
    value = meta.get(name)
    label = label or name
    if value is None:
        if required:
            raise _fail(path, label, None, f"an integer of at least {lo}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < 2**63:
        raise _fail(path, label, value, f"an integer from {lo} to 2**63 - 1")
    return value


def check_replay_header(meta: Mapping[str, Any], path: str) -> None:
    """``OptionError`` naming the file, the field and the fix when the header cannot be replayed: what the
    simulation, its step-model fit and its model shape divide by or size with."""
    block = meta.get("block_size")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1) or block > 256:
        raise _fail(path, "block_size", block, "a power of two from 1 to 256")
    _int(meta, "num_blocks", path, 1)
    _int(meta, "max_model_len", path, 2)
    _int(meta, "kv_bytes_per_token", path, 1)
    spec = meta.get("spec")
    if not isinstance(spec, Mapping):
        raise _fail(path, "spec", None, "the model's shape: layers, heads, head size")
    for name in ("num_layers", "num_kv_heads", "head_dim", "num_heads"):
        _int(spec, name, path, 1, label=f"spec.{name}")
    config = meta.get("config")
    if config is not None and not isinstance(config, Mapping):
        raise _fail(path, "config", type(config).__name__, "an object of the engine's settings")
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        _int(config or {}, name, path, 1, label=f"config.{name}", required=False)
    for name in ("enable_prefix_caching", "enable_chunked_prefill"):
        value = (config or {}).get(name)
        if value is not None and not isinstance(value, bool):
            raise _fail(path, f"config.{name}", value, "true or false")


@dataclass(slots=True)
class ReplaySettings:
    """The recorded run's engine settings and the replay's, with why each that differs does."""

    path: str
    run: dict[str, Any]  # EngineConfig's name -> the run's value
    config: EngineConfig  # the replay's, before --static and the pool of --gpu
    reasons: dict[str, str] = field(default_factory=dict)  # name -> why it may differ from the run's
    assumed: list[str] = field(default_factory=list)  # settings the run's header lacks (the engine's default)
    changes: dict[str, tuple[Any, Any, str]] = field(default_factory=dict)  # name -> (run's, replay's, why)

    def finish(self, config: EngineConfig, pool_blocks: int) -> None:
        """Settle ``changes`` against the final config (after ``--static``) and the pool's real block count."""
        final = {name: getattr(config, name) for name in self.run}
        final["num_blocks"] = pool_blocks
        if final["max_model_len"] is None:
            final["max_model_len"] = self.run["max_model_len"]
        self.changes = {name: (self.run[name], final[name], self.reasons.get(name, "the engine's default"))
                        for name in self.run if final[name] != self.run[name]}

    def notes(self) -> list[str]:
        """What the face prints before the run: the settings it starts from and what the what-if changed."""
        kept = ", ".join(f"{name} {_shown(value)}" for name, value in self.run.items()
                         if name not in self.changes)
        lines = [f"kvscope: replaying {self.path} with the run's engine settings ({kept})"]
        if self.changes:
            lines.append("kvscope: what-if, changed from the run: " + "; ".join(
                f"{name} {_shown(old)} -> {_shown(new)} ({why})" for name, (old, new, why) in self.changes.items()))
        else:
            lines.append("kvscope: no setting changed from the run: this replay should reproduce it")
        if self.assumed:
            lines.append(f"kvscope: the run's header does not record {', '.join(self.assumed)}: the replay uses "
                         "the engine's default")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"settings": dict(self.run),
                "changed": {name: {"run": old, "replay": new, "why": why}
                            for name, (old, new, why) in self.changes.items()}}


def _shown(value: Any) -> str:
    return "on" if value is True else "off" if value is False else str(value)


def replay_settings(meta: Mapping[str, Any], path: str, given: EngineSpec, *, gpu: str | None) -> ReplaySettings:
    """The replay's engine settings: the run's (``meta``, checked by ``check_replay_header``) with the options
    in ``given`` over them; ``gpu``: the pool is that GPU's unless --num-blocks or --kv-memory."""
    config_meta = meta.get("config")
    recorded: Mapping[str, Any] = config_meta if isinstance(config_meta, Mapping) else {}
    run: dict[str, Any] = {"num_blocks": meta["num_blocks"], "block_size": meta["block_size"],
                           "max_model_len": meta["max_model_len"]}
    assumed = []
    for name in ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill",
                 "seed"):
        value = recorded.get(name)
        if value is None or (name == "seed" and (isinstance(value, bool) or not isinstance(value, int))):
            assumed.append(name)
            value = getattr(DEFAULTS, name)
        run[name] = value
    fields = {name: field_name for name, (field_name, _) in SETTINGS.items() if field_name is not None}
    chosen = {fields[name]: run[name] for name in fields if getattr(given, fields[name]) is None}
    reasons = {name: SETTINGS[name][1] for name in fields if getattr(given, fields[name]) is not None}
    spec = dataclasses.replace(given, **chosen)
    if given.num_blocks is None and (given.kv_memory is not None or gpu):  # the pool from memory, not the run's
        spec = dataclasses.replace(spec, num_blocks=None)
        reasons["num_blocks"] = "--kv-memory" if given.kv_memory is not None else f"--gpu {gpu}: its KV memory"
    elif given.num_blocks is None and spec.block_size != run["block_size"]:
        per_block = meta.get("kv_bytes_per_block")
        if isinstance(per_block, bool) or not isinstance(per_block, int) or per_block < 1:
            per_block = meta["kv_bytes_per_token"] * run["block_size"]
        memory = run["num_blocks"] * per_block
        spec = dataclasses.replace(spec, num_blocks=None, kv_memory=memory)
        reasons["num_blocks"] = f"the run's KV memory ({memory:,} bytes) in blocks of {spec.block_size} tokens"
    config = engine_config(spec)
    config = dataclasses.replace(config, enable_chunked_prefill=run["enable_chunked_prefill"], seed=run["seed"])
    return ReplaySettings(path, run, config, reasons, assumed)
