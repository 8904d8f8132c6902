"""``SpeculativeConfig``: how the engine drafts tokens, with vLLM's names, checked at construction.

``Engine(..., speculative_config={"method": "ngram", "num_speculative_tokens": 4})`` or
``{"method": "draft_model", "model": "tiny", "num_speculative_tokens": 3}``. A wrong type is a
``TypeError``, a wrong value or an unknown key a ``ValueError``, each naming the field; what can only be
checked against the models (the draft's vocabulary, its context length) is checked when the engine
loads the draft (``draft_model.check_compatible``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kvscope.engine.validation import check_int

METHODS = ("ngram", "draft_model")
DEFAULT_PROMPT_LOOKUP = 5  # vLLM's default for both ends when neither is given
MAX_SPECULATIVE_TOKENS = 64  # a draft longer than this is never accepted in practice


@dataclass(slots=True)
class SpeculativeConfig:
    """``method``: ``"ngram"`` (prompt lookup: copy what followed the last n tokens the previous time
    they occurred; ``prompt_lookup_min <= n <= prompt_lookup_max``) or ``"draft_model"`` (a smaller model
    with the target's vocabulary proposes; ``model``: an embedded name, a folder, a cached hub id or a
    ``torch.nn.Module``). ``num_speculative_tokens``: drafts per request per step (k). Without a method,
    a ``model`` means ``draft_model`` (``model="ngram"`` means ``ngram``), as in vLLM."""

    method: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: Any = None  # str | torch.nn.Module | None

    def __post_init__(self) -> None:
        if self.method is None and isinstance(self.model, str) and self.model in ("ngram", "[ngram]"):
            self.method, self.model = "ngram", None
        elif self.method is None and self.model is not None:
            self.method = "draft_model"
        if self.method == "[ngram]":
            self.method = "ngram"
        if self.method is None:
            raise ValueError(f"speculative_config needs a method: one of {METHODS} (or a draft model)")
        if not isinstance(self.method, str):
            raise TypeError(f"speculative_config method={self.method!r} must be a string, one of {METHODS}")
        if self.method not in METHODS:
            raise ValueError(f"speculative_config method={self.method!r} is not one of {METHODS}")
        if self.num_speculative_tokens is None:
            raise ValueError("speculative_config needs num_speculative_tokens (draft tokens per step, k >= 1)")
        self.num_speculative_tokens = check_int(
            "num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS,
            must=f"an integer between 1 and {MAX_SPECULATIVE_TOKENS} (draft tokens per step)")
        if self.method == "ngram":
            self._check_ngram()
        else:
            self._check_draft_model()

    def _check_ngram(self) -> None:
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        self.prompt_lookup_min = check_int("prompt_lookup_min", lo, 1, must="an integer >= 1 (tokens matched)")
        self.prompt_lookup_max = check_int("prompt_lookup_max", hi, 1, must="an integer >= 1 (tokens matched)")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} must be <= "
                             f"prompt_lookup_max={self.prompt_lookup_max}")
        if self.model is not None:
            raise ValueError("speculative_config method='ngram' takes no model (it drafts from the prompt); "
                             "use method='draft_model' for a draft model")

    def _check_draft_model(self) -> None:
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ValueError("prompt_lookup_min / prompt_lookup_max belong to method='ngram', not 'draft_model'")
        if self.model is None:
            raise ValueError("speculative_config method='draft_model' needs a model: an embedded name, a "
                             "folder, a cached hub id or a torch.nn.Module with the target's vocabulary")
        if isinstance(self.model, str):
            if not self.model.strip():
                raise ValueError("speculative_config model='' is empty; name the draft model")
        elif not callable(getattr(self.model, "forward", None)):
            raise TypeError(f"speculative_config model={type(self.model).__name__} must be a model name or a "
                            "torch.nn.Module")

    @classmethod
    def coerce(cls, value: Any) -> SpeculativeConfig | None:
        """``None``, a ``SpeculativeConfig`` or a dict of its fields -> a checked config (or ``None``)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"speculative_config={value!r} must be a dict such as {{'method': 'ngram', "
                            "'num_speculative_tokens': 4}, a SpeculativeConfig or None")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; it takes {sorted(known)}")
        return cls(**value)

    @property
    def k(self) -> int:
        """Drafts per request per step: ``num_speculative_tokens``, which ``__post_init__`` requires."""
        return _given("num_speculative_tokens", self.num_speculative_tokens)

    @property
    def prompt_lookup(self) -> tuple[int, int]:
        """``(prompt_lookup_min, prompt_lookup_max)`` of an ``ngram`` config (``__post_init__`` fills both)."""
        return _given("prompt_lookup_min", self.prompt_lookup_min), _given("prompt_lookup_max", self.prompt_lookup_max)

    def describe(self) -> dict[str, Any]:
        """JSON values for the run's metadata (a module is named by its class)."""
        model = self.model if self.model is None or isinstance(self.model, str) else type(self.model).__name__
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max,
                "model": model}

    @property
    def label(self) -> str:
        """Short text for tables: ``ngram k=4 (n 2-5)`` / ``draft tiny k=3``."""
        k = self.num_speculative_tokens
        if self.method == "ngram":
            return f"ngram k={k} (n {self.prompt_lookup_min}-{self.prompt_lookup_max})"
        return f"draft {self.describe()['model']} k={k}"


def _given(name: str, value: int | None) -> int:
    """A field ``__post_init__`` filled in; ``None`` only on a config of the other method."""
    if value is None:
        raise ValueError(f"this speculative_config has no {name}")
    return value
