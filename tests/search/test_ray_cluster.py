"""A real two-node Ray cluster on this machine (``ray start --head``, then a second ``ray start --address``, both on
127.0.0.1 with one CPU each): a search on it gives the sequential table. Bounded in time; the cluster is stopped
(``ray stop --force``) whatever happens."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.search.executors import ray_start_env, run_search
from kvscope.search.table import csv_text
from tests.search.conftest import small_problem
from tests.search.test_executors import SPACE, ray_or_skip

pytestmark = pytest.mark.timeout(420)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(monkeypatch):
    # Ray turns token authentication on for a local cluster once a token exists (~/.ray/auth_token, which an
    # embedded ray.init, as in test_executors, generates); the nodes and this driver must then agree on it. This
    # cluster listens on 127.0.0.1 only and lives for one test: no authentication, said to every process alike.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray_or_skip()
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert ray_bin, "the ray command is not next to this Python"
    port = free_port()
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    try:
        start([ray_bin, "start", "--head", "--port", str(port), "--include-dashboard=false", *common])
        start([ray_bin, "start", "--address", f"127.0.0.1:{port}", *common])
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_bin, "stop", "--force"], timeout=60, capture_output=True)


def start(command: list[str]) -> None:
    """Run a ``ray start``; a failure names the command and the end of what it said."""
    done = subprocess.run(command, timeout=150, capture_output=True, text=True, env=ray_start_env())
    if done.returncode:
        pytest.fail(f"{' '.join(command[1:4])} failed ({done.returncode}): {(done.stdout + done.stderr)[-1500:]}",
                    pytrace=False)


# The driver runs in a process of its own: Ray keeps the authentication mode of the first ray.init a process
# made (test_executors' embedded Ray, with a token), and this cluster has none.
DRIVER = """
import sys
import ray
from kvscope.search.executors import run_search
from kvscope.search.table import csv_text
from tests.search.conftest import small_problem
from tests.search.test_executors import SPACE

address = sys.argv[1]
problem = small_problem(requests=24)
ray.init(address=address, include_dashboard=False, log_to_driver=False)
try:
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2 and ray.cluster_resources().get("CPU") == 2, (alive, ray.cluster_resources())
    outcomes = run_search(problem, list(SPACE.points()), executor="ray", address=address)
finally:
    ray.shutdown()
sys.stdout.write(csv_text(outcomes, SPACE.names, problem.slo, None))
"""


def test_a_two_node_cluster_gives_the_sequential_table(cluster):
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", DRIVER, cluster], cwd=root, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    problem = small_problem(requests=24)
    here = run_search(problem, list(SPACE.points()), executor="sequential")
    assert done.stdout == csv_text(here, SPACE.names, problem.slo, None)
