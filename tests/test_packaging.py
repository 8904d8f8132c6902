"""The package as installed: ``kernels/`` and ``widgets/`` become ``kvscope.kernels`` / ``kvscope.widgets``
in a built wheel (as in the editable install the tests run from, through the links ``kvscope/kernels`` and
``kvscope/widgets``), with the ``kvscope`` console script. Both are namespace packages (no ``__init__.py``), so
that the top-level folders never shadow an installed ``kernels`` or ``widgets`` (tests/test_fresh_clone.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_maps_kernels_and_widgets_under_kvscope(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("kvscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("kvscope-")}
    assert tops == {"kvscope"}  # nothing generic like "widgets" lands in site-packages
    for module in (
        "kernels/backend.py",
        "kernels/paged_attention.py",
        "kernels/store_kv.py",
        "kernels/reference.py",
        "widgets/dashboard.py",
        "widgets/report.py",
        "telemetry/export.py",
    ):
        assert f"kvscope/{module}" in names
    entry_points = (
        zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    )
    assert "kvscope = kvscope.cli.main:main" in entry_points

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        f"import sys; sys.path.insert(0, {str(site)!r}); import kvscope.kernels.backend, kvscope.widgets.report; "
        "print(kvscope.kernels.backend.__file__); print(kvscope.widgets.report.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120
    ).stdout.split()
    assert all(path.startswith(str(site)) for path in out), out


def test_editable_install_maps_them_too():
    import kvscope.kernels.backend
    import kvscope.widgets.report

    assert Path(kvscope.kernels.backend.__file__).resolve().parent == ROOT / "kernels"
    assert Path(kvscope.widgets.report.__file__).resolve().parent == ROOT / "widgets"
