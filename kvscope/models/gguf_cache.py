"""The embedded model, converted once: SmolLM2's GGUF file dequantized by transformers, kept as a plain model folder.

Reading the GGUF file is most of a ``kvscope demo``'s start: transformers parses its metadata twice (config and
weights), maps every tensor name and dequantizes in numpy, 20-70 s on a 2-core machine. The result is an ordinary
float32 model and tokenizer, so the first load saves them (``save_pretrained``: safetensors, ``config.json``,
``tokenizer.json`` with the chat template) under ``$KVSCOPE_CACHE_DIR/models`` (default
``~/.cache/kvscope/models``), and later loads read that folder in a second or two.

The folder's name holds a key of everything the conversion depends on: the GGUF file's SHA-256, and the
transformers and torch versions that converted it. A new package version or another file gets a new folder.

Trust, as for kernel builds (``kvscope.kernels.build_trust``): a converted folder is used only when it and every
folder above it could not have been written by another user; otherwise the GGUF file is read again and the
reason is said once. A folder is written under a temporary name and renamed when whole, so an interrupted or
concurrent conversion never leaves a half folder in use. Writing is best effort: a full or read-only disk
leaves the run on the model it already converted in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from kvscope.kernels.build_trust import UntrustedBuildFolder, check_contents, check_folder

MARKER = "kvscope-converted.txt"  # written last, inside the temporary folder: its presence means whole


def cache_root() -> Path:
    """Where converted models live: ``$KVSCOPE_CACHE_DIR/models``, else ``$XDG_CACHE_HOME/kvscope/models``."""
    base = os.environ.get("KVSCOPE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvscope")
    return Path(base) / "models"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def converted_folder(gguf: Path) -> Path:
    """The folder this GGUF file converts to with this transformers and torch (it may not exist yet)."""
    key = hashlib.sha256(f"{_sha256(gguf)} transformers {transformers.__version__} torch {torch.__version__}"
                         .encode()).hexdigest()[:20]
    return cache_root() / f"{gguf.stem}-{key}"


def _say(message: str) -> None:
    print(f"kvscope: {message}", file=sys.stderr)


def usable(folder: Path) -> bool:
    """Is ``folder`` a whole conversion that only this user could have written? (Says why not, when it exists.)"""
    if not (folder / MARKER).is_file():
        return False
    try:
        check_folder(str(folder))
        check_contents(str(folder))
    except (UntrustedBuildFolder, OSError) as exc:
        _say(f"not using the converted model at {folder} ({exc}); reading the GGUF file instead")
        return False
    return True


@contextlib.contextmanager
def _as_plain_model(model: torch.nn.Module):
    """The GGUF load leaves a "gguf" quantizer on the model, which transformers refuses to save, though its weights
    are already plain float32: save it as the plain model it is (the quantizer is put back after)."""
    quantizer = getattr(model, "hf_quantizer", None)
    config = model.config  # type: ignore[union-attr]
    quantization = config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None  # type: ignore[assignment]
    try:
        yield
    finally:
        model.hf_quantizer = quantizer  # type: ignore[assignment]
        if quantization is not None:
            config.quantization_config = quantization


def save_converted(model: torch.nn.Module, tokenizer, folder: Path) -> bool:
    """Write ``model`` and ``tokenizer`` as ``folder`` (atomically); False, said once, when that cannot be done."""
    tmp: str | None = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent)
        with _as_plain_model(model):
            model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        Path(tmp, MARKER).write_text(f"converted from GGUF by kvscope with transformers {transformers.__version__}, "
                                     f"torch {torch.__version__}\n")
        try:
            os.rename(tmp, folder)
        except OSError:
            if (folder / MARKER).is_file():  # another process converted it first: theirs is as good
                shutil.rmtree(tmp, ignore_errors=True)
                return True
            raise
        tmp = None
        return True
    except OSError as exc:
        _say(f"could not keep the converted model in {folder.parent} ({exc}); the next run reads the GGUF file "
             "again (set KVSCOPE_CACHE_DIR to a writable folder)")
        return False
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
