"""The thread settings kvscope chooses and the user's that it leaves alone (kvscope/utils/threads.py,
kvscope/engine/threads.py.for_engine). The OpenMP runtime reads its environment once per process, so each case
runs in a fresh interpreter (started together: the cases take about as long as one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvscope.utils import threads as settings

SCRIPT = r"""
import json, os, sys
first = sys.argv[1]
if first == "torch_set1":
    import torch
    torch.set_num_threads(1)
import kvscope
from kvscope.utils import threads as settings
import torch
before = torch.get_num_threads()
from kvscope.engine.threads import for_engine
policy = for_engine("cpu")
print(json.dumps({"policy": policy.describe(), "before": before, "after": torch.get_num_threads(),
                  "env_wait": os.environ.get("OMP_WAIT_POLICY"), "default": settings.torch_default_threads()}))
"""
CLEAN = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", settings.POLICY_ENV)
CASES = {  # name: (first argument, environment added); each a fresh interpreter, so kept to three
    "user_env": ("kvscope", {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}),
    "torch_first": ("torch_set1", {}),  # import torch; torch.set_num_threads(1); then import kvscope
    "nothing": ("kvscope", {}),
}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    procs = {name: subprocess.Popen([sys.executable, "-c", SCRIPT, first], env={**base, **extra},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (first, extra) in CASES.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{name}: {stderr[-2000:]}"
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_the_users_omp_num_threads_and_wait_policy_are_kept(results: dict[str, dict]) -> None:
    r = results["user_env"]
    assert r["policy"]["mode"] == "fixed" and "OMP_NUM_THREADS=1" in r["policy"]["reason"]
    assert r["before"] == r["after"] == 1 and r["policy"]["changes"] == []
    assert r["env_wait"] == "ACTIVE"
    assert r["policy"]["omp_wait"] == {"policy": "ACTIVE", "source": "user",
                                       "reason": "set by the user: OMP_WAIT_POLICY=ACTIVE"}


def test_torch_first_and_the_users_set_num_threads_are_kept(results: dict[str, dict]) -> None:
    r = results["torch_first"]
    assert r["policy"]["mode"] == "fixed" and r["after"] == 1
    if r["default"] > 1:  # on a one-core machine 1 is torch's default: fixed for that reason instead
        assert "torch.set_num_threads(1) called before the engine" in r["policy"]["reason"]
    assert r["env_wait"] is None and r["policy"]["omp_wait"]["source"] == "runtime"
    assert "imported before kvscope" in r["policy"]["omp_wait"]["reason"]


def test_kvscope_thread_policy_fixed_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from kvscope.engine.threads import for_engine

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(settings.POLICY_ENV, "fixed")
    before = torch.get_num_threads()
    policy = for_engine("cpu")
    assert policy.mode == "fixed" and policy.reason == "KVSCOPE_THREAD_POLICY=fixed"
    assert torch.get_num_threads() == before and policy.describe()["changes"] == []
    assert for_engine("cuda").reason == "the model runs on cuda"


def test_with_no_user_setting_the_policy_is_kvscopes_and_recorded(results: dict[str, dict]) -> None:
    r = results["nothing"]
    assert r["policy"]["omp_wait"]["source"] == "kvscope"
    assert r["env_wait"] is None  # what kvscope set is taken back once torch is loaded (children choose their own)
    if r["default"] > 1:
        assert r["policy"]["mode"] == "adaptive"
        first = r["policy"]["changes"][0]
        assert first["step"] == 0 and first["reason"].startswith("start:") and first["threads"] == r["after"]
        assert 1 <= r["after"] <= r["default"]


def test_the_wait_choice_follows_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged from the load average at import: passive on a loaded machine, libgomp's default on a quiet one."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch")  # as at `import kvscope` before torch (restored afterwards)
    monkeypatch.setattr(settings, "usable_cores", lambda: 2.0)
    monkeypatch.setattr(settings, "_wait", None)
    quiet = settings.prepare_openmp(load_average=0.3)
    assert (quiet.policy, quiet.source) == ("default", "kvscope") and "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setattr(settings, "_wait", None)
    busy = settings.prepare_openmp(load_average=3.1, others_busy_now=1.9)
    assert (busy.policy, busy.source) == ("PASSIVE", "kvscope") and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "3.10 >= 2 usable cores" in busy.reason


def test_a_load_average_left_by_work_that_ended_is_not_a_loaded_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 1-minute load average lags: right after a test suite or a build it says loaded while the cores are free.
    The present decides (a 0.1 s /proc/stat sample): spinning waits, which a quiet machine runs fastest with."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(settings, "usable_cores", lambda: 2.0)
    monkeypatch.setattr(settings, "_wait", None)
    choice = settings.prepare_openmp(load_average=2.3, others_busy_now=0.1)
    assert (choice.policy, choice.source) == ("default", "kvscope") and "OMP_WAIT_POLICY" not in os.environ
    assert "only 0.10 of them busy now" in choice.reason
    monkeypatch.setattr(settings, "_wait", None)
    now = settings.others_now(0.2)  # the real sample: a figure of cores, never negative
    assert now is None or 0.0 <= now <= 2.0 + os.cpu_count()


def test_a_bad_policy_name_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.POLICY_ENV, "fast")
    with pytest.raises(ValueError, match=r"KVSCOPE_THREAD_POLICY='fast' is not a thread policy: use one of "
                                         r"adaptive, fixed"):
        settings.policy_mode()


def test_user_threads_tells_kvscopes_own_count_from_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(settings, "torch_default_threads", lambda: 4)
    monkeypatch.setattr(settings, "_kvscope_threads", None)
    assert settings.user_threads(4) is None
    assert "torch.set_num_threads(3) called before the engine" in settings.user_threads(3)
    settings.set_by_kvscope(2)
    assert settings.user_threads(2) is None  # kvscope's own
    assert "called after kvscope set 2" in settings.user_threads(3)
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    assert settings.user_threads(2) == "MKL_NUM_THREADS=2 in the environment"


def test_inside_a_vllm_process_nothing_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """kvscope's stat-logger plugin runs inside a watched vLLM server: its import must not change the server."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setitem(sys.modules, "vllm", object())
    monkeypatch.setattr(settings, "_wait", None)
    choice = settings.prepare_openmp(load_average=99.0)
    assert choice.source == "runtime" and "vLLM" in choice.reason and "OMP_WAIT_POLICY" not in os.environ
