"""The model sweep (benchmarks/model_sweep.py), all of it: every causal-LM type of the installed
transformers through Engine(model) against transformers' own generate. It takes about 1.5 minutes on
two cores, so CI runs the whole sweep rather than a subset. It fails on any mismatch and on any error
that is not a clear refusal at Engine(); with the transformers that docs/models.md was made with, every
type must also land where the committed table says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MUST_RUN = ("gemma2", "gemma3", "gemma3_text", "gpt_oss", "cohere2", "ministral", "olmo3", "llama4_text",
            "deepseek_v3", "gemma4_text", "llama", "qwen3", "mistral", "gpt2")  # fmt: skip
pytestmark = pytest.mark.slow


def rows(markdown: str) -> dict[str, tuple[str, str]]:
    """model type -> (result, details) from a models.md table."""
    found = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (.*) \|$", markdown, flags=re.M)
    return {t: (r.strip(), d.strip()) for t, r, d in found}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    table = tmp_path_factory.mktemp("sweep") / "models.md"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_sweep.py"), "--markdown", str(table)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    return proc, table.read_text() if table.exists() else ""


def test_no_type_differs_or_fails_after_engine_accepts_it(sweep):
    proc, markdown = sweep
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    totals = re.search(r"totals: (\d+) identical, (\d+) refused, (\d+) not buildable, 0 MISMATCH, 0 FAILED",
                       proc.stdout)
    assert totals, proc.stdout[-2000:]
    table = rows(markdown)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert set(table) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    for model_type in MUST_RUN:
        assert table[model_type][0] == "identical", (model_type, table[model_type])
    refused = [d for r, d in table.values() if r == "refused"]
    assert refused and all(d for d in refused)  # every refusal says why


def test_the_committed_table_is_what_the_sweep_makes(sweep):
    import transformers

    committed = (ROOT / "docs" / "models.md").read_text()
    made_with = re.search(r"with transformers (\S+) and torch", committed)
    if made_with is None or made_with.group(1) != transformers.__version__:
        pytest.skip(f"docs/models.md was made with transformers {made_with and made_with.group(1)}, "
                    f"this is {transformers.__version__}")  # fmt: skip
    now, then = rows(sweep[1]), rows(committed)
    changed = {t: (then.get(t, ("absent",))[0], r) for t, (r, _) in now.items() if then.get(t, ("",))[0] != r}
    assert not changed, f"rerun the command in docs/models.md; (committed, now): {changed}"
    counts = [r for r, _ in now.values()]
    assert counts.count("identical") >= 110
