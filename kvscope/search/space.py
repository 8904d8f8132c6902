"""The search space: ``--space "block_size=16,32 max_num_seqs=64,128 replicas=1,2 pd=none,1P1D tp=1,2"``.

The syntax: terms separated by spaces, each ``KEY=V1,V2,...`` (a key once, values once each); the configurations
are every combination, in the order written (the last key varies fastest), so a space has one meaning and one
order whoever runs it. The keys, named as vLLM's ``vllm serve`` flags are (underscores or dashes):

- engine: ``block_size``, ``max_num_seqs``, ``max_num_batched_tokens`` (whole numbers), ``kv_memory`` (a size:
  ``8GiB``, or a count of bytes), ``num_blocks``, ``chunked_prefill`` and ``prefix_caching`` (on / off);
- deployment: ``replicas`` (copies of the engine behind a router), ``router`` (its policy:
  ``kvscope.pd.replicas.POLICIES``), ``pd`` (``none`` or a layout ``<n>P<m>D``, each instance a replica's worth);
- hardware: ``gpu`` (a name of ``kvscope.planning.gpus``: a roofline step model), ``tp`` (tensor-parallel degree).

Standard library only (the face parses a space before importing torch).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvscope.pd.config import PDLayout
from kvscope.planning.gpus import find_gpu
from kvscope.utils.units import parse_bytes

POLICIES = ("round_robin", "least_outstanding", "prefix_aware")  # kvscope.pd.replicas' (standard library here)


def _whole(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise ValueError(f"must be a whole number from {low} to {high}")
        return int(text)
    return parse


def _switch(text: str) -> bool:
    if text.lower() not in ("on", "off", "true", "false"):
        raise ValueError("must be on or off")
    return text.lower() in ("on", "true")


def _size(text: str) -> int:
    value = parse_bytes(text)
    if value <= 0:
        raise ValueError("must be a size above 0 (e.g. 8GiB)")
    return value


def _pd(text: str) -> str | None:
    if text.lower() == "none":
        return None
    return str(PDLayout.parse(text))


def _gpu(text: str) -> str:
    return find_gpu(text).name


def _policy(text: str) -> str:
    name = text.lower().replace("-", "_")
    if name not in POLICIES:
        raise ValueError(f"must be one of {', '.join(POLICIES)}")
    return name


# key -> (what a value is, its parser)
KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "block_size": ("tokens per KV block", _whole(1, 1024)),
    "max_num_seqs": ("requests running at once", _whole(1, 1 << 16)),
    "max_num_batched_tokens": ("tokens per step", _whole(1, 1 << 20)),
    "kv_memory": ("KV cache bytes per instance", _size),
    "num_blocks": ("KV blocks per instance", _whole(1, 1 << 24)),
    "chunked_prefill": ("on / off", _switch),
    "prefix_caching": ("on / off", _switch),
    "replicas": ("engine copies behind the router", _whole(1, 64)),
    "router": ("the replicas' routing policy", _policy),
    "pd": ("none or <n>P<m>D", _pd),
    "gpu": ("a GPU of the roofline table", _gpu),
    "tp": ("tensor-parallel degree", _whole(1, 64)),
}
SYNTAX = 'KEY=V1,V2 ... separated by spaces, e.g. "block_size=16,32 max_num_seqs=64,128 replicas=1,2 pd=none,1P1D"'


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Each key (as written, in order) and its values (as written, parsed in ``values``)."""

    keys: tuple[str, ...]
    texts: tuple[tuple[str, ...], ...]  # the values as written, for the table
    values: tuple[tuple[Any, ...], ...]
    names: tuple[str, ...] = ()  # the keys as written (the table's column names)

    @classmethod
    def parse(cls, text: str) -> SearchSpace:
        """The space ``text`` describes; ``ValueError`` naming the term, the problem and the syntax."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the search space is empty: give {SYNTAX}")
        keys: list[str] = []
        names: list[str] = []
        texts: list[tuple[str, ...]] = []
        values: list[tuple[Any, ...]] = []
        for term in text.split():
            key, eq, rest = term.partition("=")
            name = key.strip().lower().replace("-", "_")
            if not eq or not name or not rest:
                raise ValueError(f"search space term {term!r} is not KEY=V1,V2: write {SYNTAX}")
            if name not in KEYS:
                raise ValueError(f"unknown search space key {key!r}; known: {', '.join(KEYS)}")
            if name in keys:
                raise ValueError(f"search space key {name!r} is given twice: list its values once, comma-separated")
            if (name == "kv_memory" and "num_blocks" in keys) or (name == "num_blocks" and "kv_memory" in keys):
                raise ValueError("give kv_memory or num_blocks in the space, not both")
            words = tuple(w.strip() for w in rest.split(","))
            if any(not w for w in words):
                raise ValueError(f"search space term {term!r} has an empty value: write {SYNTAX}")
            what, parse = KEYS[name]
            parsed = []
            for w in words:
                try:
                    parsed.append(parse(w))
                except ValueError as exc:
                    raise ValueError(f"search space {name}={w!r}: {exc} ({what})") from None
            if len(set(map(repr, parsed))) != len(parsed):
                raise ValueError(f"search space key {name!r} lists a value twice ({rest})")
            keys.append(name)
            names.append(key.strip())
            texts.append(words)
            values.append(tuple(parsed))
        return cls(tuple(keys), tuple(texts), tuple(values), tuple(names))

    def __len__(self) -> int:
        n = 1
        for v in self.values:
            n *= len(v)
        return n

    def points(self) -> Iterator[Point]:
        """Every configuration, in order (the last key varies fastest)."""
        for index, combo in enumerate(itertools.product(*(range(len(v)) for v in self.values))):
            yield Point(index, self.keys, tuple(self.values[k][i] for k, i in enumerate(combo)),
                        tuple(self.texts[k][i] for k, i in enumerate(combo)))


@dataclass(frozen=True, slots=True)
class Point:
    """One configuration of a space: its index (the table's order), and a value per key."""

    index: int
    keys: tuple[str, ...]
    values: tuple[Any, ...]
    texts: tuple[str, ...]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values[self.keys.index(key)] if key in self.keys else default

    def label(self) -> str:
        return " ".join(f"{k}={t}" for k, t in zip(self.keys, self.texts))
