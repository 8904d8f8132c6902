"""Is a local folder a causal LM that kvscope can load? Checked from its files alone, before loading.

``check_model_folder`` reads ``config.json`` as plain JSON (``hf_config.read_config``: no transformers
config object is built, so nothing is printed and nothing is imported from the folder) and refuses, in one
``ValueError`` line naming the folder: a missing, corrupt or non-object ``config.json``; one without ``model_type``, or
of a type this transformers does not know; a model that is not a causal language model (an encoder
such as BERT saved as ``BertModel``, an encoder-decoder such as T5); a config that does not give the
model's size (``{"model_type": "llama"}`` alone would build a default 7B Llama); a folder without weights.
``load_model`` calls it for folders, and so does the run setup's early check (``runs.setup.check_model``).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.models.hf_config import gives_size, read_config, text_part

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


def _causal_lm_classes() -> tuple[dict[str, str], set[str]]:
    """(model_type -> its AutoModelForCausalLM class name, every such class name) of this transformers."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = {t: c for t, c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if t in CONFIG_MAPPING_NAMES}
    return causal, set(causal.values())


def check_model_folder(folder: str | os.PathLike) -> None:
    """Refuse (``ValueError``, one line) a folder that cannot hold a causal LM kvscope can load."""
    where = f"model folder {str(folder)!r}"
    config = read_config(folder)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"{where}: config.json has no model_type, so transformers cannot tell which model it is")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"{where}: model_type {model_type!r} is not a model this transformers knows "
                         "(a newer transformers, or a typo in config.json?)")
    causal, causal_classes = _causal_lm_classes()
    architectures = config.get("architectures")
    named = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    if config.get("is_encoder_decoder") or model_type not in causal:
        raise ValueError(f"{where} holds a {model_type} model, which is not a causal (decoder-only) language "
                         "model; kvscope runs models that AutoModelForCausalLM loads, such as Llama, Qwen or GPT-2")
    if named and not any(a in causal_classes for a in named):
        raise ValueError(f"{where} holds a {named[0]} ({model_type}), not a causal language model (such as "
                         f"{causal[model_type]}): an encoder or task model cannot generate text")
    if not gives_size(text_part(config)):
        raise ValueError(f"{where}: config.json does not give the model's size (hidden_size, num_hidden_layers); "
                         f"transformers would build a default {model_type} model instead of the one saved")
    if not any(next(Path(folder).glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ValueError(f"{where} has a config.json but no weights (model.safetensors or pytorch_model.bin)")


def load_folder_tokenizer(folder: str | os.PathLike):
    """The folder's tokenizer; ``ValueError`` in one line (the first of transformers' message) if it has
    none that loads, since prompts as text need one."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"model folder {str(folder)!r}: its tokenizer does not load ({first}); add the "
                         "tokenizer files (tokenizer.json, tokenizer_config.json)") from None
